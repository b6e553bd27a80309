#pragma once
// The KV cache. Storage is flat: per layer one key array and one value array,
// laid out per kv head with head_dim as the stride, so attention for one kv head
// scans its positions contiguously:
//
//   keys, values: [L, G, Cap, E]
//
// Two front ends share that storage:
//   kv<C, Cap, T>  capacity and length in the type. push() exists only while
//                  T < Cap and yields kv<C, Cap, T+1>; reads see exactly T positions.
//   kv_cache<C>    the same with run-time capacity and length, for loops whose
//                  length is only known at run time; the same bound is checked
//                  at run time and reported as a capacity_error.
#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "config.hpp"
#include "error.hpp"
#include "shape.hpp"

namespace tlm {

template <LlamaConfig C>
class kv_storage {
 public:
  kv_storage() = default;
  explicit kv_storage(std::size_t capacity)
      : capacity_(checked(capacity)), keys_(C::layers * capacity * kv_dim<C>), values_(keys_.size()) {}

  std::size_t capacity() const { return capacity_; }

  // [E] key / value of one position of one kv head of one layer.
  float* key(std::size_t layer, std::size_t g, std::size_t pos) { return keys_.data() + offset(layer, g, pos); }
  float* value(std::size_t layer, std::size_t g, std::size_t pos) { return values_.data() + offset(layer, g, pos); }
  // [n, E] the first n positions of one kv head of one layer.
  std::span<const float> keys(std::size_t layer, std::size_t g, std::size_t n) const {
    return {keys_.data() + offset(layer, g, 0), n * head_dim<C>};
  }
  std::span<const float> values(std::size_t layer, std::size_t g, std::size_t n) const {
    return {values_.data() + offset(layer, g, 0), n * head_dim<C>};
  }
  // Copies the first n positions of every (layer, kv head) from `from`, which has
  // the same capacity: what a clone needs, and no more (the unwritten tail is never read).
  void copy_positions(const kv_storage& from, std::size_t n) {
    if (from.capacity_ != capacity_ || n > capacity_)
      throw capacity_error("KV cache copy: capacities " + std::to_string(from.capacity_) + " and " +
                           std::to_string(capacity_) + " differ, or " + std::to_string(n) + " positions do not fit");
    for (std::size_t l = 0; l < C::layers; ++l) {
      for (std::size_t g = 0; g < C::kv_heads; ++g) {
        const std::size_t at = offset(l, g, 0);
        std::copy_n(from.keys_.data() + at, n * head_dim<C>, keys_.data() + at);
        std::copy_n(from.values_.data() + at, n * head_dim<C>, values_.data() + at);
      }
    }
  }
  std::size_t key_values() const { return keys_.size(); }
  std::size_t value_values() const { return values_.size(); }

 private:
  static std::size_t checked(std::size_t capacity) {
    if (capacity == 0 || capacity > C::context) {
      throw capacity_error("KV cache capacity " + std::to_string(capacity) + " is outside 1.." +
                           std::to_string(C::context) + " (the model's context length); choose a capacity in that range");
    }
    return capacity;
  }
  std::size_t offset(std::size_t layer, std::size_t g, std::size_t pos) const {
    return ((layer * C::kv_heads + g) * capacity_ + pos) * head_dim<C>;
  }

  std::size_t capacity_ = 0;
  detail::f32_buffer keys_;    // [L, G, Cap, E]
  detail::f32_buffer values_;  // [L, G, Cap, E]
};

// A cache of capacity Cap holding T positions has room for one more only while T < Cap.
template <std::size_t Cap, std::size_t T>
concept cache_has_room = (T < Cap);

// Position P of a cache holding T positions has been written only when P < T.
template <std::size_t P, std::size_t T>
concept position_written = (P < T);

template <LlamaConfig C, std::size_t Cap, std::size_t T = 0>
class kv {
  static_assert(Cap >= 1 && Cap <= C::context, "tlm cache rule: capacity must be between 1 and the config's context");
  static_assert(T <= Cap, "tlm cache rule: a cache cannot hold more positions than its capacity");

 public:
  static constexpr std::size_t capacity = Cap;
  static constexpr std::size_t length = T;
  // Each of the key and value arrays holds exactly L * Cap * K values.
  static constexpr std::size_t values_per_array = C::layers * Cap * kv_dim<C>;

  kv()
    requires(T == 0)
      : store_(Cap) {}

  // Claims position T for the next token. Only a cache with room has push().
  kv<C, Cap, T + 1> push() &&
    requires cache_has_room<Cap, T>
  {
    return kv<C, Cap, T + 1>(std::move(store_));
  }

  // Attention reads exactly the T written positions: [T, E] per kv head.
  std::span<const float, T * head_dim<C>> keys(std::size_t layer, std::size_t g) const {
    return std::span<const float, T * head_dim<C>>(store_.keys(layer, g, T).data(), T * head_dim<C>);
  }
  std::span<const float, T * head_dim<C>> values(std::size_t layer, std::size_t g) const {
    return std::span<const float, T * head_dim<C>>(store_.values(layer, g, T).data(), T * head_dim<C>);
  }

  // One written position, checked at compile time: [E]
  template <std::size_t P>
    requires position_written<P, T>
  std::span<const float, head_dim<C>> key_at(std::size_t layer, std::size_t g) const {
    return std::span<const float, head_dim<C>>(store_.keys(layer, g, T).data() + P * head_dim<C>, head_dim<C>);
  }
  template <std::size_t P>
    requires position_written<P, T>
  std::span<const float, head_dim<C>> value_at(std::size_t layer, std::size_t g) const {
    return std::span<const float, head_dim<C>>(store_.values(layer, g, T).data() + P * head_dim<C>, head_dim<C>);
  }

  // The newest position, T-1, claimed by the push that made this cache: [E]
  std::span<float, head_dim<C>> newest_key(std::size_t layer, std::size_t g)
    requires(T >= 1)
  {
    return std::span<float, head_dim<C>>(store_.key(layer, g, T - 1), head_dim<C>);
  }
  std::span<float, head_dim<C>> newest_value(std::size_t layer, std::size_t g)
    requires(T >= 1)
  {
    return std::span<float, head_dim<C>>(store_.value(layer, g, T - 1), head_dim<C>);
  }

  // A copy holding the same T written positions, for a branch (a beam) that continues
  // on its own; only those positions are copied.
  kv clone() const {
    kv out{kv_storage<C>(Cap)};
    out.store_.copy_positions(store_, T);
    return out;
  }

  kv_storage<C>& storage() { return store_; }
  const kv_storage<C>& storage() const { return store_; }

 private:
  template <LlamaConfig, std::size_t, std::size_t>
  friend class kv;
  explicit kv(kv_storage<C>&& s) : store_(std::move(s)) {}

  kv_storage<C> store_;
};

template <LlamaConfig C>
class kv_cache {
 public:
  explicit kv_cache(std::size_t capacity) : store_(capacity) {}

  std::size_t capacity() const { return store_.capacity(); }
  std::size_t length() const { return length_; }
  std::size_t room() const { return capacity() - length_; }

  // Claims the next position, or explains why there is none.
  void push() {
    if (length_ >= capacity()) {
      throw capacity_error("KV cache full: all " + std::to_string(capacity()) +
                           " positions are written, no room for another token; create the cache with a larger "
                           "capacity (at most the context, " + std::to_string(C::context) +
                           ") or start a new sequence");
    }
    ++length_;
  }
  // Forgets positions from n on (n <= length), for example to reuse a shared prefix.
  void truncate(std::size_t n) {
    if (n > length_) {
      throw capacity_error("cannot truncate a KV cache of " + std::to_string(length_) + " positions to " +
                           std::to_string(n) + "; truncation only shortens");
    }
    length_ = n;
  }
  void clear() { length_ = 0; }

  // A copy with the same capacity and the same written positions (only those are
  // copied), for a branch such as a beam that continues on its own.
  kv_cache clone() const {
    kv_cache out(capacity());
    out.store_.copy_positions(store_, length_);
    out.length_ = length_;
    return out;
  }

  // [length, E] the written positions of one kv head.
  std::span<const float> keys(std::size_t layer, std::size_t g) const { return store_.keys(layer, g, length_); }
  std::span<const float> values(std::size_t layer, std::size_t g) const { return store_.values(layer, g, length_); }
  // [E] the newest position, claimed by the last push.
  std::span<float, head_dim<C>> newest_key(std::size_t layer, std::size_t g) {
    return std::span<float, head_dim<C>>(store_.key(layer, g, newest()), head_dim<C>);
  }
  std::span<float, head_dim<C>> newest_value(std::size_t layer, std::size_t g) {
    return std::span<float, head_dim<C>>(store_.value(layer, g, newest()), head_dim<C>);
  }

  kv_storage<C>& storage() { return store_; }
  const kv_storage<C>& storage() const { return store_; }

 private:
  std::size_t newest() const {
    if (length_ == 0) throw capacity_error("KV cache is empty: push a position before writing its key and value");
    return length_ - 1;
  }

  kv_storage<C> store_;
  std::size_t length_ = 0;
};

}  // namespace tlm
