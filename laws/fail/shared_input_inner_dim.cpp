// Must not compile: a grouped product whose input (the FFN's 1536-wide rows) is not the
// width the gate and up projections take (576).
// law-expect: takes_input<P, N, T>\) \[with P = .*N = 1536; T = float\][^ ]* evaluated to [^ ]*false
#include <tlm/linalg.hpp>
#include <tlm/weights.hpp>

void project(const tlm::layer_weights<tlm::smollm2_135m>& l, const tlm::rows<576>& xn, const tlm::rows<1536>& h,
             tlm::rows<1536>& gate, tlm::rows<1536>& up) {
  (void)xn;
  (void)h;
#ifdef TLM_LAW_TWIN
  tlm::matmul_shared(xn, nullptr, tlm::kernels::precision::exact, tlm::into(l.ffn_gate, gate), tlm::into(l.ffn_up, up));
#else
  tlm::matmul_shared(h, nullptr, tlm::kernels::precision::exact, tlm::into(l.ffn_gate, gate), tlm::into(l.ffn_up, up));
#endif
}
