#pragma once
// Model configurations are named types. A config states only the free
// hyperparameters; every size that follows from them is computed here, once.
//
// Glossary of dimension letters used in shape comments across tlm:
//   D   dim        = heads * head_dim     width of the residual stream
//   K   kv_dim     = kv_heads * head_dim  width of keys and values
//   F   ffn                               hidden width of the MLP
//   V   vocab                             tokens in the vocabulary
//   H   heads      = kv_heads * group     query heads
//   G   kv_heads                          key/value heads (GQA groups)
//   Q   group                             query heads per kv head
//   E   head_dim   = 2 * half_head        width of one head (even by construction)
//   L   layers
//   T   positions written to a KV cache;  Cap its capacity
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace tlm {

// The name of a type as the compiler spells it ("tlm::smollm2_135m"), for messages.
// Here rather than in load.hpp so that naming a config needs nothing but its type.
template <class T>
constexpr std::string_view type_name() {
  std::string_view p = __PRETTY_FUNCTION__;
  const auto start = p.find("T = ") + 4;
  const auto end = p.find_first_of(";]", start);
  return p.substr(start, end - start);
}

// The fields every config declares, with the types they must have.
template <class C>
concept config_fields = requires {
  { C::kv_heads } -> std::convertible_to<std::size_t>;
  { C::group } -> std::convertible_to<std::size_t>;
  { C::half_head } -> std::convertible_to<std::size_t>;
  { C::ffn } -> std::convertible_to<std::size_t>;
  { C::layers } -> std::convertible_to<std::size_t>;
  { C::vocab } -> std::convertible_to<std::size_t>;
  { C::context } -> std::convertible_to<std::size_t>;
  { C::rms_eps } -> std::convertible_to<double>;
  { C::rope_theta } -> std::convertible_to<double>;
  { C::tied_embeddings } -> std::convertible_to<bool>;
};

// Each rule is its own static_assert so that a bad config is rejected with the
// message that names the rule it breaks (and the config's name, in the trace).
template <config_fields C>
struct config_rules {
  static_assert(C::kv_heads >= 1, "tlm config rule: kv_heads must be at least 1");
  static_assert(C::group >= 1, "tlm config rule: group (query heads per kv head) must be at least 1");
  static_assert(C::half_head >= 1, "tlm config rule: half_head must be at least 1 (head_dim = 2 * half_head)");
  static_assert(C::ffn >= 1, "tlm config rule: ffn must be at least 1");
  static_assert(C::layers >= 1, "tlm config rule: layers must be at least 1");
  static_assert(C::vocab >= 1, "tlm config rule: vocab must be at least 1");
  static_assert(C::context >= 1, "tlm config rule: context must be at least 1");
  static_assert(C::rms_eps > 0, "tlm config rule: rms_eps must be positive");
  static_assert(C::rope_theta > 0, "tlm config rule: rope_theta must be positive");
  static constexpr bool valid = true;
};

template <class C>
concept LlamaConfig = config_fields<C> && config_rules<C>::valid;

// Derived sizes: computed, never stored in a config.
template <LlamaConfig C> inline constexpr std::size_t heads = C::kv_heads * C::group;
template <LlamaConfig C> inline constexpr std::size_t head_dim = 2 * C::half_head;
template <LlamaConfig C> inline constexpr std::size_t dim = heads<C> * head_dim<C>;
template <LlamaConfig C> inline constexpr std::size_t kv_dim = C::kv_heads * head_dim<C>;

// SmolLM2 family. Context lengths are what the published GGUF files declare in
// llama.context_length; binding a file checks it.
struct smollm2_135m {
  static constexpr std::size_t kv_heads = 3;
  static constexpr std::size_t group = 3;
  static constexpr std::size_t half_head = 32;
  static constexpr std::size_t ffn = 1536;
  static constexpr std::size_t layers = 30;
  static constexpr std::size_t vocab = 49152;
  static constexpr std::size_t context = 8192;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 100000.0f;
  static constexpr bool tied_embeddings = true;
};

struct smollm2_360m {
  static constexpr std::size_t kv_heads = 5;
  static constexpr std::size_t group = 3;
  static constexpr std::size_t half_head = 32;
  static constexpr std::size_t ffn = 2560;
  static constexpr std::size_t layers = 32;
  static constexpr std::size_t vocab = 49152;
  static constexpr std::size_t context = 8192;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 100000.0f;
  static constexpr bool tied_embeddings = true;
};

struct smollm2_1_7b {
  static constexpr std::size_t kv_heads = 32;
  static constexpr std::size_t group = 1;
  static constexpr std::size_t half_head = 32;
  static constexpr std::size_t ffn = 8192;
  static constexpr std::size_t layers = 24;
  static constexpr std::size_t vocab = 49152;
  static constexpr std::size_t context = 8192;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 130000.0f;
  static constexpr bool tied_embeddings = true;
};

// Tiny configs for tests: fast, with group > 1 so GQA is exercised, and one
// with a separate output matrix so the untied path is exercised too.
struct tiny_gqa {
  static constexpr std::size_t kv_heads = 2;
  static constexpr std::size_t group = 2;
  static constexpr std::size_t half_head = 4;
  static constexpr std::size_t ffn = 64;
  static constexpr std::size_t layers = 2;
  static constexpr std::size_t vocab = 96;
  static constexpr std::size_t context = 64;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 10000.0f;
  static constexpr bool tied_embeddings = true;
};

struct tiny_untied {
  static constexpr std::size_t kv_heads = 1;
  static constexpr std::size_t group = 4;
  static constexpr std::size_t half_head = 16;
  static constexpr std::size_t ffn = 96;
  static constexpr std::size_t layers = 2;
  static constexpr std::size_t vocab = 256;
  static constexpr std::size_t context = 128;
  static constexpr float rms_eps = 1e-6f;
  static constexpr float rope_theta = 10000.0f;
  static constexpr bool tied_embeddings = false;
};

// The tiny config of the training benchmarks: dim 64, GQA 4/2, 2 layers, vocab 512
// (bytes and a few more), small enough that a step measures overhead, not FLOPs.
struct tiny_train {
  static constexpr std::size_t kv_heads = 2;
  static constexpr std::size_t group = 2;
  static constexpr std::size_t half_head = 8;
  static constexpr std::size_t ffn = 256;
  static constexpr std::size_t layers = 2;
  static constexpr std::size_t vocab = 512;
  static constexpr std::size_t context = 256;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 10000.0f;
  static constexpr bool tied_embeddings = true;
};

}  // namespace tlm
