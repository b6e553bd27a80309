// Must not compile: reading Llama 3's rope_freqs divisors of a config that declares
// no llama3 RoPE scaling (smollm2_135m); llama32_1b, which declares it, is the twin.
// law-expect: rope_freqs_vector<tlm::smollm2_135m, .*tlm::absent.*has no member named .+f32
#include <tlm/weights.hpp>

#ifdef TLM_LAW_TWIN
using C = tlm::llama32_1b;
#else
using C = tlm::smollm2_135m;
#endif

float first_divisor(const tlm::model_weights<C>& w) { return w.rope_freqs.f32()[0]; }
