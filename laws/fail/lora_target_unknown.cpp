// Must not compile: an adapter whose targets name something other than the seven
// layer matrices (a bit past ffn_down, as a cast from a number would make); naming
// ffn_down is the twin.
// law-expect: lora_targets_known<Targets>.* \[with Targets = \(tlm::lora_target\)128\]
#include <tlm/train/lora.hpp>

#ifdef TLM_LAW_TWIN
constexpr auto targets = tlm::lora_target::down;
#else
constexpr auto targets = static_cast<tlm::lora_target>(1u << 7);
#endif

std::size_t factors(const tlm::lora<tlm::tiny_gqa, 4, targets>& ad) { return tlm::tensor_count(ad); }
