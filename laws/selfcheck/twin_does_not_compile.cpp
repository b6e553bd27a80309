// Self-check: the case fails for its named reason, but its twin does not compile
// either, so the case proves nothing; the harness must reject it.
// harness-expect: [twin-broken]
// law-expect: cache_has_room<Cap, T>
#include <tlm/kv.hpp>

#include <utility>

void both_broken() {
  auto full = std::move(std::move(tlm::kv<tlm::tiny_gqa, 2>{}).push()).push();
#ifdef TLM_LAW_TWIN
  auto n = std::move(full).pusj();
#else
  auto n = std::move(full).push();
#endif
  (void)n;
}
