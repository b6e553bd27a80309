// Must not compile: the backward pass of tiny_gqa's parameters writing into tiny_untied's gradients.
// law-expect: gradient_of<G, W>.*\[with (G = tlm::model_weights<tlm::tiny_untied, tlm::owned<float> >; W = tlm::model_weights<tlm::tiny_gqa, tlm::owned<float> >|W = tlm::model_weights<tlm::tiny_gqa, tlm::owned<float> >; G = tlm::model_weights<tlm::tiny_untied, tlm::owned<float> >)
#include <tlm/train/step.hpp>

void backward(tlm::training<tlm::tiny_gqa>& run, const tlm::trainable<tlm::tiny_gqa>& params,
              tlm::trainable<tlm::tiny_gqa>& right, tlm::trainable<tlm::tiny_untied>& wrong) {
  (void)right;
  (void)wrong;
#ifdef TLM_LAW_TWIN
  run.backward(params, right);
#else
  run.backward(params, wrong);
#endif
}
