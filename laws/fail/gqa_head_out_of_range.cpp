// Must not compile: asking which kv head query head 9 reads, in a model of 9 query heads.
// law-expect: query_head_in_range<C, Q>.*\[with C = tlm::smollm2_135m; Q = 9\]
#include <tlm/heads.hpp>

#ifdef TLM_LAW_TWIN
constexpr std::size_t g = tlm::kv_head_of<tlm::smollm2_135m, 8>();
#else
constexpr std::size_t g = tlm::kv_head_of<tlm::smollm2_135m, 9>();
#endif
static_assert(g < tlm::smollm2_135m::kv_heads);
