// Must not compile: a config with no kv heads.
// law-expect: tlm config rule: kv_heads must be at least 1
#include <tlm/weights.hpp>

struct broken {
#ifdef TLM_LAW_TWIN
  static constexpr std::size_t kv_heads = 2;
#else
  static constexpr std::size_t kv_heads = 0;
#endif
  static constexpr std::size_t group = 2;
  static constexpr std::size_t half_head = 4;
  static constexpr std::size_t ffn = 16;
  static constexpr std::size_t layers = 1;
  static constexpr std::size_t vocab = 8;
  static constexpr std::size_t context = 8;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 1e4f;
  static constexpr bool tied_embeddings = true;
};

static_assert(tlm::LlamaConfig<broken>);
