// Self-check: fails to compile, but for a typo rather than its named rule, so the
// harness must reject it.
// harness-expect: [wrong-reason]
// law-expect: cache_has_room
#include <tlm/kv.hpp>

#include <utility>

void typo() {
  tlm::kv<tlm::tiny_gqa, 2> k;
#ifdef TLM_LAW_TWIN
  auto n = std::move(k).push();
#else
  auto n = std::move(k).pusj();
#endif
  (void)n;
}
