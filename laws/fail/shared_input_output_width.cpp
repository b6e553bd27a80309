// Must not compile: the key projection (192 outputs) written into query-wide rows (576)
// in a grouped product of one input.
// law-expect: deduced conflicting values for non-type parameter [^ ]*R[^ ]* \([^ ]*192[^ ]* and [^ ]*576
#include <tlm/linalg.hpp>
#include <tlm/weights.hpp>

void project(const tlm::layer_weights<tlm::smollm2_135m>& l, const tlm::rows<576>& x, tlm::rows<576>& q,
             tlm::rows<192>& k) {
  (void)k;
#ifdef TLM_LAW_TWIN
  tlm::matmul_shared(x, nullptr, tlm::kernels::precision::exact, tlm::into(l.attn_q, q), tlm::into(l.attn_k, k));
#else
  tlm::matmul_shared(x, nullptr, tlm::kernels::precision::exact, tlm::into(l.attn_q, q), tlm::into(l.attn_k, q));
#endif
}
