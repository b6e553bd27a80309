// Must not compile: multiplying the query projection (576 inputs) by a kv-sized vector.
// law-expect: inner_dims_match<C, N>.*\[with (C = 576; N = 192|N = 192; C = 576)\]
#include <tlm/linalg.hpp>
#include <tlm/weights.hpp>

tlm::vec<576> project(const tlm::layer_weights<tlm::smollm2_135m>& l, const tlm::vec<192>& k, const tlm::vec<576>& x) {
  (void)k;
  (void)x;
#ifdef TLM_LAW_TWIN
  return tlm::matvec(l.attn_q, x);
#else
  return tlm::matvec(l.attn_q, k);
#endif
}
