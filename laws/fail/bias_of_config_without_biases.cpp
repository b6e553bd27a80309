// Must not compile: reading the query bias of a config without attention biases
// (tiny_gqa); the same read on a config that has them (tiny_qwen2) is the twin. The
// member exists only as `absent`, which the walk skips and which holds no values.
// law-expect: attention_bias<tlm::tiny_gqa, .*tlm::absent.*has no member named .+values
#include <tlm/weights.hpp>

#ifdef TLM_LAW_TWIN
using C = tlm::tiny_qwen2;
#else
using C = tlm::tiny_gqa;
#endif

float first_query_bias(const tlm::layer_weights<C, tlm::owned<float>>& w) { return w.attn_q_bias.values()[0]; }
