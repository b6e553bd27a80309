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
//
// The element type is chosen at run time (kv_type), because it is a memory/accuracy
// trade-off a user makes per session, not a property of the model:
//   f32  float keys and values, as the block computed them.
//   q8   each key and each value vector of one (layer, kv head, position) stored as
//        symmetric int8 with one float scale, absmax / 127: codes [L, G, Cap, E]
//        and scales [L, G, Cap]. 4E / (E + 4) times smaller: 3.76x at E = 64.
//        Attention reads the codes directly (ops/attention.hpp, attention_row_q8).
// The typed kv<C, Cap, T> is f32 only: its spans of floats are its interface.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/heads.hpp>
#include <tlm/ops/rope.hpp>
#include <tlm/shape.hpp>

namespace tlm {

enum class kv_type { f32, q8 };

inline std::string_view to_string(kv_type t) { return t == kv_type::q8 ? "q8" : "f32"; }

// Symmetric int8 of n values: code = round(x / scale), scale = absmax / 127, so the
// largest magnitude maps to +-127 and the error of each value is at most scale / 2.
// An all-zero vector gets scale 0 and codes 0. Returns the scale.   x: [n]  codes: [n]
inline float quantize_q8_row(const float* x, std::size_t n, std::int8_t* codes) {
  float top = 0.0f;
  for (std::size_t i = 0; i < n; ++i) top = std::max(top, std::fabs(x[i]));
  if (!(top > 0.0f)) {
    std::fill(codes, codes + n, std::int8_t{0});
    return 0.0f;
  }
  const float inv = 127.0f / top;
  for (std::size_t i = 0; i < n; ++i)
    codes[i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
  return top / 127.0f;
}

// codes: [n]  out: [n]
inline void dequantize_q8_row(const std::int8_t* codes, float scale, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(codes[i]) * scale;
}

template <LlamaConfig C>
class kv_storage {
  static constexpr std::size_t E = head_dim<C>;

 public:
  kv_storage() = default;
  explicit kv_storage(std::size_t capacity, kv_type type = kv_type::f32) : capacity_(checked(capacity)), type_(type) {
    const std::size_t n = C::layers * capacity * kv_dim<C>;
    if (type == kv_type::f32) {
      keys_ = detail::f32_buffer(n);
      values_ = detail::f32_buffer(n);
    } else {
      key_codes_.assign(n, 0);
      value_codes_.assign(n, 0);
      key_scales_.assign(n / E, 0.0f);
      value_scales_.assign(n / E, 0.0f);
    }
  }

  std::size_t capacity() const { return capacity_; }
  kv_type type() const { return type_; }

  // Bytes one position takes in every layer and kv head, keys and values together:
  // 2 L G E 4 for f32; 2 L G (E + 4) for q8 (E codes and one float scale).
  static constexpr std::size_t bytes_per_position(kv_type t) {
    return t == kv_type::f32 ? 2 * C::layers * C::kv_heads * E * sizeof(float)
                             : 2 * C::layers * C::kv_heads * (E * sizeof(std::int8_t) + sizeof(float));
  }
  std::size_t bytes() const { return capacity_ * bytes_per_position(type_); }

  // f32 storage only. [E] key / value of one position of one kv head of one layer.
  float* key(std::size_t layer, std::size_t g, std::size_t pos) {
    require(kv_type::f32, "key");
    return keys_.data() + offset(layer, g, pos);
  }
  float* value(std::size_t layer, std::size_t g, std::size_t pos) {
    require(kv_type::f32, "value");
    return values_.data() + offset(layer, g, pos);
  }
  const float* key(std::size_t layer, std::size_t g, std::size_t pos) const {
    require(kv_type::f32, "key");
    return keys_.data() + offset(layer, g, pos);
  }
  const float* value(std::size_t layer, std::size_t g, std::size_t pos) const {
    require(kv_type::f32, "value");
    return values_.data() + offset(layer, g, pos);
  }
  // f32 storage only. [n, E] the first n positions of one kv head of one layer.
  std::span<const float> keys(std::size_t layer, std::size_t g, std::size_t n) const { return {key(layer, g, 0), n * E}; }
  std::span<const float> values(std::size_t layer, std::size_t g, std::size_t n) const {
    return {value(layer, g, 0), n * E};
  }

  // q8 storage only. [E] codes of one position, followed by those of the next
  // positions of the same kv head; and the scale of that position, followed likewise.
  const std::int8_t* key_codes(std::size_t layer, std::size_t g, std::size_t pos) const {
    require(kv_type::q8, "key_codes");
    return key_codes_.data() + offset(layer, g, pos);
  }
  const std::int8_t* value_codes(std::size_t layer, std::size_t g, std::size_t pos) const {
    require(kv_type::q8, "value_codes");
    return value_codes_.data() + offset(layer, g, pos);
  }
  const float* key_scales(std::size_t layer, std::size_t g, std::size_t pos) const {
    require(kv_type::q8, "key_scales");
    return key_scales_.data() + offset(layer, g, pos) / E;
  }
  const float* value_scales(std::size_t layer, std::size_t g, std::size_t pos) const {
    require(kv_type::q8, "value_scales");
    return value_scales_.data() + offset(layer, g, pos) / E;
  }

  // Writes one position's key and value, quantizing them for q8.   k, v: [E]
  void store(std::size_t layer, std::size_t g, std::size_t pos, const float* k, const float* v) {
    const std::size_t at = offset(layer, g, pos);
    if (type_ == kv_type::f32) {
      std::copy_n(k, E, keys_.data() + at);
      std::copy_n(v, E, values_.data() + at);
    } else {
      key_scales_[at / E] = quantize_q8_row(k, E, key_codes_.data() + at);
      value_scales_[at / E] = quantize_q8_row(v, E, value_codes_.data() + at);
    }
  }
  // What attention sees of one position (dequantized for q8).   out: [E]
  void load_key(std::size_t layer, std::size_t g, std::size_t pos, float* out) const {
    const std::size_t at = offset(layer, g, pos);
    if (type_ == kv_type::f32) std::copy_n(keys_.data() + at, E, out);
    else dequantize_q8_row(key_codes_.data() + at, key_scales_[at / E], E, out);
  }
  void load_value(std::size_t layer, std::size_t g, std::size_t pos, float* out) const {
    const std::size_t at = offset(layer, g, pos);
    if (type_ == kv_type::f32) std::copy_n(values_.data() + at, E, out);
    else dequantize_q8_row(value_codes_.data() + at, value_scales_[at / E], E, out);
  }

  // Copies the first n positions of every (layer, kv head) from `from`, of the same
  // type and any capacity that holds them: what a clone needs, and what a cache grown
  // for a longer request keeps of the smaller one (the unwritten tail is never read).
  void copy_positions(const kv_storage& from, std::size_t n) {
    if (from.type_ != type_ || n > capacity_ || n > from.capacity_)
      throw capacity_error("KV cache copy: " + std::to_string(n) + " positions from a cache of " +
                           std::to_string(from.capacity_) + " (" + std::string(to_string(from.type_)) + ") into one of " +
                           std::to_string(capacity_) + " (" + std::string(to_string(type_)) +
                           "); copy between caches of one type, each holding the positions");
    for (std::size_t l = 0; l < C::layers; ++l) {
      for (std::size_t g = 0; g < C::kv_heads; ++g) {
        // Each cache's rows of (l, g) start where its own capacity puts them.
        const std::size_t src = from.offset(l, g, 0), dst = offset(l, g, 0);
        if (type_ == kv_type::f32) {
          std::copy_n(from.keys_.data() + src, n * E, keys_.data() + dst);
          std::copy_n(from.values_.data() + src, n * E, values_.data() + dst);
        } else {
          std::copy_n(from.key_codes_.data() + src, n * E, key_codes_.data() + dst);
          std::copy_n(from.value_codes_.data() + src, n * E, value_codes_.data() + dst);
          std::copy_n(from.key_scales_.data() + src / E, n, key_scales_.data() + dst / E);
          std::copy_n(from.value_scales_.data() + src / E, n, value_scales_.data() + dst / E);
        }
      }
    }
  }

  // Forgets positions keep .. keep+drop-1 of the first `length`: the later ones move
  // down by `drop`, and their keys, which are stored rotated by RoPE for their old
  // position p, are rotated by -drop so that they are what the block would have
  // written at p - drop. Rotations compose exactly, so this differs from recomputing
  // the keys only by float rounding (and, for q8, by requantizing the rotated key:
  // the rotated vector has another absmax, so its codes are recomputed). Values do
  // not depend on the position and move unchanged.
  void shift(std::size_t keep, std::size_t drop, std::size_t length, rope_pairing pairing) {
    if (keep + drop > length || length > capacity_)
      throw capacity_error("KV cache shift: dropping positions " + std::to_string(keep) + " to " +
                           std::to_string(keep + drop) + " of a cache holding " + std::to_string(length) +
                           " of " + std::to_string(capacity_) + " goes past what is written; drop fewer positions");
    if (drop == 0) return;
    const rope_angles<C> back(drop);
    float k[E];  // [E] one key, dequantized for q8
    for (std::size_t l = 0; l < C::layers; ++l) {
      for (std::size_t g = 0; g < C::kv_heads; ++g) {
        for (std::size_t p = keep + drop; p < length; ++p) {
          const std::size_t from = offset(l, g, p), to = offset(l, g, p - drop);
          if (type_ == kv_type::f32) {
            std::copy_n(keys_.data() + from, E, keys_.data() + to);
            std::copy_n(values_.data() + from, E, values_.data() + to);
            detail::rotate_heads<C, float>(keys_.data() + to, E, back, pairing, -1.0f);
          } else {
            dequantize_q8_row(key_codes_.data() + from, key_scales_[from / E], E, k);
            detail::rotate_heads<C, float>(k, E, back, pairing, -1.0f);
            key_scales_[to / E] = quantize_q8_row(k, E, key_codes_.data() + to);
            std::copy_n(value_codes_.data() + from, E, value_codes_.data() + to);
            value_scales_[to / E] = value_scales_[from / E];
          }
        }
      }
    }
  }

  std::size_t key_values() const { return type_ == kv_type::f32 ? keys_.size() : key_codes_.size(); }
  std::size_t value_values() const { return type_ == kv_type::f32 ? values_.size() : value_codes_.size(); }

 private:
  static std::size_t checked(std::size_t capacity) {
    if (capacity == 0 || capacity > C::context) {
      throw capacity_error("KV cache capacity " + std::to_string(capacity) + " is outside 1.." +
                           std::to_string(C::context) + " (the model's context length); choose a capacity in that range");
    }
    return capacity;
  }
  std::size_t offset(std::size_t layer, std::size_t g, std::size_t pos) const {
    return ((layer * C::kv_heads + g) * capacity_ + pos) * E;
  }
  // A float read of an int8 cache (or the reverse) is a bug in the caller, not data
  // to reinterpret.
  void require(kv_type t, const char* what) const {
    if (type_ != t)
      throw error(std::string("KV cache: ") + what + "() reads " + std::string(to_string(t)) +
                  " entries, but this cache stores " + std::string(to_string(type_)) +
                  "; read it through load_key/load_value, or the accessors of its type");
  }

  std::size_t capacity_ = 0;
  kv_type type_ = kv_type::f32;
  detail::f32_buffer keys_;               // [L, G, Cap, E] f32 only
  detail::f32_buffer values_;             // [L, G, Cap, E] f32 only
  std::vector<std::int8_t> key_codes_;    // [L, G, Cap, E] q8 only
  std::vector<std::int8_t> value_codes_;  // [L, G, Cap, E] q8 only
  std::vector<float> key_scales_;         // [L, G, Cap] q8 only
  std::vector<float> value_scales_;       // [L, G, Cap] q8 only
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
  explicit kv_cache(std::size_t capacity, kv_type type = kv_type::f32) : store_(capacity, type) {}

  std::size_t capacity() const { return store_.capacity(); }
  std::size_t length() const { return length_; }
  std::size_t room() const { return capacity() - length_; }
  kv_type type() const { return store_.type(); }
  // The cache's memory: capacity * kv_storage<C>::bytes_per_position(type()).
  std::size_t bytes() const { return store_.bytes(); }

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
  // Forgets positions keep .. keep+drop-1 and moves the later ones down, re-rotating
  // their keys so that they are valid at their new positions (kv_storage::shift): the
  // cache then holds what a fresh run over the kept tokens would have written, up to
  // rounding. `pairing` is the model's (model_options::pairing).
  void shift(std::size_t keep, std::size_t drop, rope_pairing pairing) {
    store_.shift(keep, drop, length_, pairing);
    length_ -= drop;
  }

  // A copy with the same capacity and the same written positions (only those are
  // copied), for a branch such as a beam that continues on its own.
  kv_cache clone() const {
    kv_cache out(capacity(), type());
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
