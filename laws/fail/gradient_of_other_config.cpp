// Must not compile: a whole-model gradient of another config next to the parameters.
// law-expect: tlm walk rule: (tensors walked in lockstep must have the same shape|structs walked in lockstep have different numbers of layers)
#include <tlm/weights.hpp>

void step(tlm::model_weights<tlm::tiny_gqa, tlm::owned<>>& params, tlm::model_weights<tlm::tiny_untied, tlm::owned<>>& wrong,
          tlm::model_weights<tlm::tiny_gqa, tlm::owned<>>& grads) {
  auto sgd = [](const tlm::tensor_name&, auto& p, const auto& g) {
    for (std::size_t i = 0; i < p.rows * p.cols; ++i) p.data()[i] -= 0.1f * g.data()[i];
  };
  (void)wrong;
  (void)grads;
#ifdef TLM_LAW_TWIN
  tlm::for_each_tensor(sgd, params, grads);
#else
  tlm::for_each_tensor(sgd, params, wrong);
#endif
}
