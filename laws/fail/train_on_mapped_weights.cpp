// Must not compile: a training step on the file-backed (mapped, read-only) weights of a loaded model.
// law-expect: trainable_weights<W>.*\[with W = tlm::model_weights<tlm::smollm2_135m(, tlm::mapped)?>
#include <tlm/train/adamw.hpp>

void update(tlm::model_weights<tlm::smollm2_135m>& loaded, tlm::trainable<tlm::smollm2_135m>& owned_copy,
            const tlm::trainable<tlm::smollm2_135m>& grads, tlm::adamw<tlm::trainable<tlm::smollm2_135m>>& opt) {
  (void)loaded;
  (void)owned_copy;
#ifdef TLM_LAW_TWIN
  opt.step(owned_copy, grads);
#else
  opt.step(loaded, grads);
#endif
}
