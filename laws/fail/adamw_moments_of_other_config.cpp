// Must not compile: an AdamW whose moments belong to tiny_untied stepping tiny_gqa's parameters.
// law-expect: moments_of<W, P>.*\[with (W = tlm::model_weights<tlm::tiny_untied, tlm::owned<float> >; P = tlm::model_weights<tlm::tiny_gqa, tlm::owned<float> >|P = tlm::model_weights<tlm::tiny_gqa, tlm::owned<float> >; W = tlm::model_weights<tlm::tiny_untied, tlm::owned<float> >)
#include <tlm/train/adamw.hpp>

void update(tlm::trainable<tlm::tiny_gqa>& params, const tlm::trainable<tlm::tiny_gqa>& grads,
            tlm::adamw<tlm::trainable<tlm::tiny_gqa>>& right, tlm::adamw<tlm::trainable<tlm::tiny_untied>>& wrong) {
  (void)right;
  (void)wrong;
#ifdef TLM_LAW_TWIN
  right.step(params, grads);
#else
  wrong.step(params, grads);
#endif
}
