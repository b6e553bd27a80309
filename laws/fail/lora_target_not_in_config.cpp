// Must not compile: reading the factors of ffn_up from an adapter that does not
// target it (the default q, k, v, o); the same read from an adapter that targets up
// is the twin. An untargeted matrix exists only as `absent`, which the walk skips and
// which holds no values, so it has no count, gradient, moment or file tensor either.
// law-expect: factor<tlm::lora_target::up, .*absent.*has no member named .+values
#include <tlm/train/lora.hpp>

#ifdef TLM_LAW_TWIN
using A = tlm::lora<tlm::tiny_gqa, 4, tlm::lora_default_targets | tlm::lora_target::up>;
#else
using A = tlm::lora<tlm::tiny_gqa, 4>;
#endif

float first_up_factor(const A& ad) { return ad.layers[0].ffn_up_lora_a.values()[0]; }
