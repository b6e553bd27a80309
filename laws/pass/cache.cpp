// Law: push on kv<Cap, T> yields length T+1; attention over kv<Cap, T+1> reads
// exactly T+1 positions; a full cache has no push; only written positions can be
// read; each of the key and value arrays holds exactly layers * Cap * kv_dim values.
#include <tlm/kv.hpp>

#include <utility>

using namespace tlm;

template <class K>
concept can_push = requires(K k) { std::move(k).push(); };

template <class K, std::size_t P>
concept can_read = requires(const K k) { k.template key_at<P>(0, 0); };

template <class C, std::size_t Cap, std::size_t T>
constexpr bool cache_law() {
  using K = kv<C, Cap, T>;
  static_assert(K::length == T && K::capacity == Cap);
  static_assert(K::values_per_array == C::layers * Cap * kv_dim<C>);
  if constexpr (T < Cap) {
    using next = decltype(std::declval<K&&>().push());
    static_assert(std::is_same_v<next, kv<C, Cap, T + 1>>);
    static_assert(next::length == T + 1);
    // Attention over the pushed cache reads the T+1 written positions, no more.
    static_assert(decltype(std::declval<const next&>().keys(0, 0))::extent == (T + 1) * head_dim<C>);
    static_assert(decltype(std::declval<const next&>().values(0, 0))::extent == (T + 1) * head_dim<C>);
    static_assert(can_push<K>);
  } else {
    static_assert(!can_push<K>);
  }
  static_assert(!can_read<K, T>);
  if constexpr (T > 0) static_assert(can_read<K, T - 1>);
  return true;
}

template <class C, std::size_t Cap, std::size_t... T>
constexpr bool every_length(std::index_sequence<T...>) {
  return (cache_law<C, Cap, T>() && ...);
}

static_assert(every_length<tiny_gqa, 2>(std::make_index_sequence<3>{}));
static_assert(every_length<tiny_gqa, 7>(std::make_index_sequence<8>{}));
static_assert(every_length<smollm2_135m, 4>(std::make_index_sequence<5>{}));
static_assert(cache_law<smollm2_135m, 8192, 8191>() && cache_law<smollm2_135m, 8192, 8192>());
static_assert(cache_law<smollm2_360m, 16, 16>() && cache_law<smollm2_1_7b, 16, 3>());

static_assert(kv<smollm2_135m, 1024>::values_per_array == 30 * 1024 * 192);
static_assert(kv<smollm2_1_7b, 1024>::values_per_array == 24 * 1024 * 2048);
