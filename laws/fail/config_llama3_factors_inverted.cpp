// Must not compile: Llama 3 RoPE scaling whose high-frequency factor is not above
// its low-frequency one (the blend between them would divide by zero or turn over).
// law-expect: tlm config rule: llama3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor
#include <tlm/weights.hpp>

struct broken {
  static constexpr std::size_t kv_heads = 2;
  static constexpr std::size_t group = 2;
  static constexpr std::size_t half_head = 4;
  static constexpr std::size_t ffn = 16;
  static constexpr std::size_t layers = 1;
  static constexpr std::size_t vocab = 8;
  static constexpr std::size_t context = 8;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 1e4f;
  static constexpr bool tied_embeddings = true;
#ifdef TLM_LAW_TWIN
  static constexpr auto rope_scaling = tlm::rope_llama3(8.0, 1.0, 4.0, 1024);
#else
  static constexpr auto rope_scaling = tlm::rope_llama3(8.0, 4.0, 1.0, 1024);
#endif
};

static_assert(tlm::LlamaConfig<broken>);
