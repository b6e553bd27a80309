// Self-check: this "must not compile" case compiles, so the harness must reject it
// (its ctest passes only if the harness rejects it with the verdict named below).
// harness-expect: [case-compiles]
// law-expect: this text never appears
#include <tlm/kv.hpp>

#include <utility>

void fine() {
  tlm::kv<tlm::tiny_gqa, 2> k;
#ifdef TLM_LAW_TWIN
  auto n = std::move(k);
#else
  auto n = std::move(k).push();
#endif
  (void)n;
}
