// Must not compile: the query projection (576 inputs) over a batch of kv-wide rows (192).
// law-expect: inner_dims_match<C, N>.*\[with (C = 576; N = 192|N = 192; C = 576)\]
#include <tlm/linalg.hpp>
#include <tlm/weights.hpp>

void project(const tlm::layer_weights<tlm::smollm2_135m>& l, const tlm::rows<192>& k, const tlm::rows<576>& x,
             tlm::rows<576>& q) {
  (void)k;
  (void)x;
#ifdef TLM_LAW_TWIN
  tlm::matmul(l.attn_q, x, q);
#else
  tlm::matmul(l.attn_q, k, q);
#endif
}
