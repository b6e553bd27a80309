// Self-check: fails to compile for a typo, and the failing line carries the rule's
// name in a comment. The compiler echoes that source line under its error, so a
// harness that matched the whole output would find 'cache_has_room' there; it must
// look only at the compiler's own error:/note:/required-from lines, and reject this.
// harness-expect: [wrong-reason]
// law-expect: cache_has_room
#include <tlm/kv.hpp>

#include <utility>

void typo() {
  tlm::kv<tlm::tiny_gqa, 2> k;
#ifdef TLM_LAW_TWIN
  auto n = std::move(k).push();
#else
  auto n = std::move(k).pusj();  // cache_has_room
#endif
  (void)n;
}
