// Self-check: a well-formed case (a third push into kv<2,2>) plus a second,
// hidden difference between case and twin in an #ifndef block. The twin would then
// differ by more than the one offending line, so the harness must reject the file.
// harness-expect: [malformed]
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

#ifndef TLM_LAW_TWIN
void another_difference() {}
#endif
