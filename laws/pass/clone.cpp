// Law: a clone of kv<C, Cap, T> is a kv<C, Cap, T>: the same capacity and length T,
// so a branch (a beam) reads exactly the positions its parent had written, and a
// clone of a full cache still has no push.
#include <tlm/kv.hpp>

#include <utility>

using namespace tlm;

template <class K>
concept can_push = requires(K k) { std::move(k).push(); };

template <class C, std::size_t Cap, std::size_t T>
constexpr bool clone_law() {
  using K = kv<C, Cap, T>;
  using copy = decltype(std::declval<const K&>().clone());
  static_assert(std::is_same_v<copy, K>);
  static_assert(copy::length == T && copy::capacity == Cap);
  static_assert(decltype(std::declval<const copy&>().keys(0, 0))::extent == T * head_dim<C>);
  static_assert(can_push<copy> == (T < Cap));
  return true;
}

template <class C, std::size_t Cap, std::size_t... T>
constexpr bool every_length(std::index_sequence<T...>) {
  return (clone_law<C, Cap, T>() && ...);
}

static_assert(every_length<smollm2_135m, 6>(std::make_index_sequence<7>{}));
static_assert(every_length<smollm2_360m, 3>(std::make_index_sequence<4>{}));
static_assert(every_length<smollm2_1_7b, 1>(std::make_index_sequence<2>{}));
