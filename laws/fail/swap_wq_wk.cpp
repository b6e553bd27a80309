// Must not compile: wiring the key projection where the query projection goes.
// In smollm2_135m attn_q is mat<576, 576> and attn_k is mat<192, 576>.
// law-expect: shapes_agree<tlm::mat<R, C, S>, tlm::mat<R2, C2, S2> >.*\[with R = 576; C = 576; S = tlm::mapped; R2 = 192
#include <tlm/weights.hpp>

void wire(tlm::layer_weights<tlm::smollm2_135m>& l) {
#ifdef TLM_LAW_TWIN
  l.attn_q = l.attn_output;
#else
  l.attn_q = l.attn_k;
#endif
}
