// Must not compile: the backward of the key projection (192 outputs) given a gradient of the query width (576).
// law-expect: output_gradient_matches<R, M>.*\[with (R = 192; M = 576|M = 576; R = 192)\]
#include <tlm/linalg.hpp>
#include <tlm/weights.hpp>

void backward(const tlm::layer_weights<tlm::smollm2_135m, tlm::owned<>>& w, const tlm::rows<576>& x,
              const tlm::rows<192>& dk, const tlm::rows<576>& dq, tlm::layer_weights<tlm::smollm2_135m, tlm::owned<>>& g,
              tlm::rows<576>& dx) {
  (void)dk;
  (void)dq;
#ifdef TLM_LAW_TWIN
  tlm::matmul_backward(w.attn_k, x, dk, g.attn_k, dx);
#else
  tlm::matmul_backward(w.attn_k, x, dq, g.attn_k, dx);
#endif
}
