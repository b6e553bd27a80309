// Must not compile: a config that does not say its RoPE base.
// law-expect: config_fields<C>(.|\n)*C::rope_theta
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
#ifdef TLM_LAW_TWIN
  static constexpr float rope_theta = 1e4f;
#else
  // (no rope_theta)
#endif
  static constexpr bool tied_embeddings = true;
};

tlm::layer_weights<broken> layer;
