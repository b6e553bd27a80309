// Must not compile: an adapter made for one config (tiny_gqa) trained over the base
// of another (tiny_qwen2), although every shape of the two configs agrees; an adapter
// of the base's own config is the twin.
// law-expect: adapter_of_config<A, C>.*\[with A = tlm::lora<tlm::tiny_gqa
#include <tlm/train/step.hpp>

using C = tlm::tiny_qwen2;
#ifdef TLM_LAW_TWIN
using A = tlm::lora<tlm::tiny_qwen2, 4>;
#else
using A = tlm::lora<tlm::tiny_gqa, 4>;
#endif

double step(tlm::training<C>& run, const tlm::model_weights<C>& base, const A& ad, std::span<const std::int32_t> ids) {
  return run.forward(base, ad, ids, ids);
}
