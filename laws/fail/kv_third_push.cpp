// Must not compile: a third push into a cache of capacity 2.
// law-expect: cache_has_room<Cap, T>.*\[with Cap = 2; T = 2\]
#include <tlm/kv.hpp>

#include <utility>

void fill() {
  tlm::kv<tlm::tiny_gqa, 2> empty;
  auto one = std::move(empty).push();
  auto two = std::move(one).push();
#ifdef TLM_LAW_TWIN
  auto three = std::move(two);
#else
  auto three = std::move(two).push();
#endif
  (void)three;
}
