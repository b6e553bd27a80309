// Must not compile: putting a layer of smollm2_360m into a model of smollm2_135m.
// law-expect: layers_of_same_config<C, C2>.*\[with C = tlm::smollm2_135m; C2 = tlm::smollm2_360m\]
#include <tlm/weights.hpp>

void graft(tlm::model_weights<tlm::smollm2_135m>& m, const tlm::layer_weights<tlm::smollm2_360m>& other,
           const tlm::layer_weights<tlm::smollm2_135m>& same) {
  (void)other;
  (void)same;
#ifdef TLM_LAW_TWIN
  m.layers[3] = same;
#else
  m.layers[3] = other;
#endif
}
