#pragma once
// How the D-wide stream is cut into heads, how query heads share kv heads (GQA),
// and how a head is cut into the two halves RoPE rotates together.
#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include <tlm/config.hpp>
#include <tlm/error.hpp>

namespace tlm {

// A query head index names a head only when it is below heads<C>.
template <class C, std::size_t Q>
concept query_head_in_range = LlamaConfig<C> && (Q < heads<C>);

// GQA: query head j*group + i reads kv head j. The compile-time form rejects an
// index out of range by naming the rule; the run-time form throws.
template <LlamaConfig C, std::size_t Q>
  requires query_head_in_range<C, Q>
constexpr std::size_t kv_head_of() {
  return Q / C::group;
}

template <LlamaConfig C>
constexpr std::size_t kv_head_of(std::size_t q) {
  if (q >= heads<C>) {
    throw shape_error("query head " + std::to_string(q) + " does not exist: the model has " +
                      std::to_string(heads<C>) + " query heads");
  }
  return q / C::group;
}

// The query heads that read kv head g: [first_query_of(g), first_query_of(g) + group).
template <LlamaConfig C>
constexpr std::size_t first_query_of(std::size_t g) {
  return g * C::group;
}

// Head split and join: a [D] (or [K]) vector is heads of [E], head h at h*E.
template <LlamaConfig C, class T, std::size_t N>
  requires(N % head_dim<C> == 0)
constexpr std::array<std::span<T, head_dim<C>>, N / head_dim<C>> split_heads(std::span<T, N> x) {
  return [&]<std::size_t... H>(std::index_sequence<H...>) {
    return std::array<std::span<T, head_dim<C>>, N / head_dim<C>>{x.template subspan<H * head_dim<C>, head_dim<C>>()...};
  }(std::make_index_sequence<N / head_dim<C>>{});
}

template <LlamaConfig C, class T, class U, std::size_t H>
constexpr void join_heads(const std::array<std::span<T, head_dim<C>>, H>& parts, std::span<U, H * head_dim<C>> out) {
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t i = 0; i < head_dim<C>; ++i) out[h * head_dim<C> + i] = parts[h][i];
}

// rope_pairing (config.hpp): where the two elements RoPE rotates together sit in a head.
struct pair_slot {
  std::size_t pair;  // i < E/2
  std::size_t side;  // 0: first of the pair, 1: second
};

template <LlamaConfig C>
constexpr pair_slot split_pair(rope_pairing p, std::size_t e) {
  return p == rope_pairing::adjacent ? pair_slot{e / 2, e % 2} : pair_slot{e % C::half_head, e / C::half_head};
}

template <LlamaConfig C>
constexpr std::size_t join_pair(rope_pairing p, pair_slot s) {
  return p == rope_pairing::adjacent ? 2 * s.pair + s.side : s.side * C::half_head + s.pair;
}

// Row permutation between the layouts within one head: GGUF row 2i+j holds HF row j*E/2+i.
template <LlamaConfig C>
constexpr std::size_t hf_row_of_gguf_row(std::size_t e) {
  return join_pair<C>(rope_pairing::half_split, split_pair<C>(rope_pairing::adjacent, e));
}
template <LlamaConfig C>
constexpr std::size_t gguf_row_of_hf_row(std::size_t e) {
  return join_pair<C>(rope_pairing::adjacent, split_pair<C>(rope_pairing::half_split, e));
}

}  // namespace tlm
