// Must not compile: the low-rank product with an A of rank 4 and a B of rank 8 (the
// path B (A x) passes through r values, so both factors must have the same r); a B
// of rank 4 is the twin.
// law-expect: lora_ranks_match<RA, RB>.* \[with RA = 4; RB = 8\]
#include <tlm/train/lora.hpp>

#ifdef TLM_LAW_TWIN
using B = tlm::mat<16, 4, tlm::owned<float>>;
#else
using B = tlm::mat<16, 8, tlm::owned<float>>;
#endif

void low_rank(const tlm::mat<4, 32, tlm::owned<float>>& a, const B& b, const tlm::rows<32, float>& x,
              tlm::rows<16, float>& y, std::span<float> u) {
  tlm::lora_forward(a, b, 1.0f, x, y, u);
}
