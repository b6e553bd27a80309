// Law: splitting the stream into heads, and a head into its RoPE pairs, then
// joining them gives back the original order; head_dim is even by construction;
// the GGUF <-> Hugging Face row permutation inverts itself.
#include <tlm/heads.hpp>

#include <array>
#include <span>

using namespace tlm;

template <class C>
constexpr bool split_join_heads() {
  std::array<int, dim<C>> x{};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int>(i);
  const auto parts = split_heads<C>(std::span<int, dim<C>>(x));
  if (parts.size() != heads<C>) return false;
  for (std::size_t h = 0; h < heads<C>; ++h)
    if (parts[h][0] != static_cast<int>(h * head_dim<C>)) return false;
  std::array<int, dim<C>> y{};
  join_heads<C>(parts, std::span<int, dim<C>>(y));
  return x == y;
}

template <class C>
constexpr bool split_join_pairs() {
  for (auto p : {rope_pairing::adjacent, rope_pairing::half_split}) {
    for (std::size_t e = 0; e < head_dim<C>; ++e) {
      const pair_slot s = split_pair<C>(p, e);
      if (s.pair >= C::half_head || s.side > 1) return false;
      if (join_pair<C>(p, s) != e) return false;
    }
  }
  return true;
}

template <class C>
constexpr bool permutation_inverts() {
  for (std::size_t e = 0; e < head_dim<C>; ++e) {
    if (gguf_row_of_hf_row<C>(hf_row_of_gguf_row<C>(e)) != e) return false;
    if (hf_row_of_gguf_row<C>(gguf_row_of_hf_row<C>(e)) != e) return false;
  }
  // formats.md: within a head, GGUF row 2i + j holds HF row j*E/2 + i.
  for (std::size_t i = 0; i < C::half_head; ++i)
    for (std::size_t j = 0; j < 2; ++j)
      if (hf_row_of_gguf_row<C>(2 * i + j) != j * C::half_head + i) return false;
  return true;
}

template <class C>
constexpr bool head_law() {
  return head_dim<C> % 2 == 0 && split_join_heads<C>() && split_join_pairs<C>() && permutation_inverts<C>();
}

static_assert(head_law<smollm2_135m>());
static_assert(head_law<smollm2_360m>());
static_assert(head_law<smollm2_1_7b>());
static_assert(head_law<tiny_gqa>());
static_assert(head_law<tiny_untied>());
