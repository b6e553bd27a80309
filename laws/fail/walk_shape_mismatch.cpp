// Must not compile: walking in lockstep over weights of two configs, as an
// optimizer would over parameters and a gradient that does not match them.
// law-expect: tlm walk rule: tensors walked in lockstep must have the same shape
#include <tlm/weights.hpp>

std::size_t pair_up(tlm::layer_weights<tlm::smollm2_135m>& params, tlm::layer_weights<tlm::smollm2_360m>& other,
                    tlm::layer_weights<tlm::smollm2_135m, tlm::owned<>>& grads) {
  std::size_t n = 0;
  auto count = [&](const tlm::tensor_name&, const auto&, const auto&) { ++n; };
  (void)other;
  (void)grads;
#ifdef TLM_LAW_TWIN
  tlm::for_each_tensor(count, params, grads);
#else
  tlm::for_each_tensor(count, params, other);
#endif
  return n;
}
