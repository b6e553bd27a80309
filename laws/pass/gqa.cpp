// Law: grouped-query attention wires query head j*group + i to kv head j, for
// every index of every shipped config (not a sample), every query head belongs to
// exactly one group, and there are exactly kv_heads groups.
#include <tlm/heads.hpp>

#include <array>
#include <utility>

using namespace tlm;

template <class C>
constexpr bool wiring_holds() {
  for (std::size_t j = 0; j < C::kv_heads; ++j)
    for (std::size_t i = 0; i < C::group; ++i)
      if (kv_head_of<C>(j * C::group + i) != j) return false;
  return true;
}

template <class C>
constexpr bool each_query_in_one_group() {
  for (std::size_t q = 0; q < heads<C>; ++q) {
    std::size_t groups_containing_q = 0;
    for (std::size_t g = 0; g < C::kv_heads; ++g)
      if (q >= first_query_of<C>(g) && q < first_query_of<C>(g) + C::group) ++groups_containing_q;
    if (groups_containing_q != 1) return false;
  }
  return true;
}

template <class C>
constexpr std::size_t group_count() {
  std::array<bool, C::kv_heads> used{};
  for (std::size_t q = 0; q < heads<C>; ++q) used[kv_head_of<C>(q)] = true;
  std::size_t n = 0;
  for (bool u : used) n += u;
  return n;
}

// The compile-time form agrees with the run-time form at every index.
template <class C, std::size_t... Q>
constexpr bool static_form_agrees(std::index_sequence<Q...>) {
  return ((kv_head_of<C, Q>() == kv_head_of<C>(Q)) && ...);
}

template <class C>
constexpr bool gqa_law() {
  return wiring_holds<C>() && each_query_in_one_group<C>() && group_count<C>() == C::kv_heads &&
         static_form_agrees<C>(std::make_index_sequence<heads<C>>{});
}

static_assert(gqa_law<smollm2_135m>());
static_assert(gqa_law<smollm2_360m>());
static_assert(gqa_law<smollm2_1_7b>());
static_assert(gqa_law<tiny_gqa>());
static_assert(gqa_law<tiny_untied>());

// Spot values that a wrong formula (q % kv_heads, say) would get wrong.
static_assert(kv_head_of<smollm2_135m, 2>() == 0 && kv_head_of<smollm2_135m, 3>() == 1);
static_assert(kv_head_of<smollm2_360m, 14>() == 4);
