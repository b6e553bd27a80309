// Must not compile: push on any kv<Cap, T> with T == Cap, here after filling a
// cache of the real model's shape generically.
// law-expect: cache_has_room<Cap, T>.*\[with Cap = 5; T = 5\]
#include <tlm/kv.hpp>

#include <utility>

template <class C, std::size_t Cap, std::size_t T>
auto fill(tlm::kv<C, Cap, T>&& k) {
  if constexpr (T == Cap) return std::move(k);
  else return fill(std::move(k).push());
}

void overflow() {
  auto full = fill(tlm::kv<tlm::smollm2_135m, 5>{});
#ifdef TLM_LAW_TWIN
  auto next = std::move(full);
#else
  auto next = std::move(full).push();
#endif
  (void)next;
}
