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

// The name of a type as the compiler spells it. Compilers differ: for tlm::smollm2_135m
// GCC 12 gives "smollm2_135m" (it leaves out the namespace of the function it is in) and
// Clang 14 "tlm::smollm2_135m". Name a config with config_name below, which is the same
// under both; messages and what files record (general.name, a checkpoint's config key)
// depend on it.
template <class T>
constexpr std::string_view type_name() {
  std::string_view p = __PRETTY_FUNCTION__;
  const auto start = p.find("T = ") + 4;
  const auto end = p.find_first_of(";]", start);
  return p.substr(start, end - start);
}

// The fields every config declares, with the types they must have.
// ---- Traits: what tells one Llama-family model from another. ----
// A config declares a trait only when it differs from plain Llama; the readers
// (rope_scaling_v, attention_bias_v, architecture_v) give plain Llama's value when
// it does not, so older configs need no edit:
// Example (members):
//   static constexpr auto rope_scaling = tlm::rope_llama3(32, 1, 4, 8192);  // default: none
//   static constexpr bool attention_bias = true;                             // default: false
//   static constexpr auto arch = tlm::architecture::qwen2;                   // default: llama

// RoPE frequency scaling. Pair i of a head turns by pos * theta^(-2i/E) / divisor[i]:
//   none    divisor 1 for every pair;
//   linear  divisor `factor` for every pair (position interpolation);
//   llama3  Llama 3.1's per-pair divisors: 1 for short wavelengths, `factor` for
//           long ones, a smooth blend between (rope_divisors in ops/rope.hpp).
enum class rope_scaling_type { none, linear, llama3 };

struct rope_scaling_params {
  rope_scaling_type type = rope_scaling_type::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;      // llama3 only
  double high_freq_factor = 1.0;     // llama3 only
  std::size_t original_context = 0;  // llama3 only: the context the model was pretrained at
};

constexpr rope_scaling_params rope_linear(double factor) { return {rope_scaling_type::linear, factor, 1.0, 1.0, 0}; }
constexpr rope_scaling_params rope_llama3(double factor, double low_freq_factor, double high_freq_factor,
                                   std::size_t original_context) {
  return {rope_scaling_type::llama3, factor, low_freq_factor, high_freq_factor, original_context};
}

// RoPE rotates pairs of elements within a head. Where the pairs are depends on
// where the weights came from:
//   GGUF `llama` files (llama.cpp's converter permutes q/k rows) pair adjacent
//   elements (2i, 2i+1);
//   Hugging Face, and GGUF `qwen2` files (not permuted; llama.cpp's NEOX rope), pair
//   the two halves (i, i + E/2).
// Pair i of either layout rotates by the same angle.
enum class rope_pairing { adjacent, half_split };

// The GGUF architecture (general.architecture). It fixes the prefix of the
// hyperparameter keys and the RoPE pairing of the file's q/k rows.
enum class architecture { llama, qwen2 };

struct architecture_info {
  architecture arch;
  std::string_view name;  // general.architecture, and the prefix of its keys ("qwen2.block_count")
  rope_pairing pairing;   // of the q/k rows in its GGUF files
};

// The one table of architectures.
inline constexpr architecture_info architectures[] = {
    {architecture::llama, "llama", rope_pairing::adjacent},
    {architecture::qwen2, "qwen2", rope_pairing::half_split},
};

constexpr const architecture_info& info_of(architecture a) {
  for (const auto& i : architectures)
    if (i.arch == a) return i;
  return architectures[0];  // unreachable: every enumerator is in the table
}

// Trait readers with plain Llama's defaults.
template <class C>
constexpr rope_scaling_params rope_scaling_of() {
  if constexpr (requires { C::rope_scaling; }) return C::rope_scaling;
  else return {};
}
template <class C>
constexpr bool attention_bias_of() {
  if constexpr (requires { C::attention_bias; }) return C::attention_bias;
  else return false;
}
template <class C>
constexpr architecture architecture_of() {
  if constexpr (requires { C::arch; }) return C::arch;
  else return architecture::llama;
}

// The traits a config may declare, when it does, with the types they must have.
template <class C>
concept config_traits = (!requires { C::rope_scaling; } || std::same_as<std::remove_cv_t<decltype(C::rope_scaling)>, rope_scaling_params>) &&
                        (!requires { C::attention_bias; } || std::same_as<std::remove_cv_t<decltype(C::attention_bias)>, bool>) &&
                        (!requires { C::arch; } || std::same_as<std::remove_cv_t<decltype(C::arch)>, architecture>);

template <class C>
concept config_fields = config_traits<C> && requires {
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
  static_assert(rope_scaling_of<C>().type == rope_scaling_type::none || rope_scaling_of<C>().factor > 0,
                "tlm config rule: a RoPE scaling factor must be positive");
  static_assert(rope_scaling_of<C>().type != rope_scaling_type::llama3 ||
                    (rope_scaling_of<C>().low_freq_factor > 0 &&
                     rope_scaling_of<C>().high_freq_factor > rope_scaling_of<C>().low_freq_factor),
                "tlm config rule: llama3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor");
  static_assert(rope_scaling_of<C>().type != rope_scaling_type::llama3 || rope_scaling_of<C>().original_context >= 1,
                "tlm config rule: llama3 RoPE scaling needs the original (pretraining) context");
  static constexpr bool valid = true;
};

template <class C>
concept LlamaConfig = config_fields<C> && config_rules<C>::valid;

// "smollm2_135m" for tlm::smollm2_135m: the type's name without its namespace, under
// every compiler. It names a config in messages, in checkpoints and on the command line.
template <LlamaConfig C>
constexpr std::string_view config_name() {
  const std::string_view full = type_name<C>();
  const auto colon = full.rfind(':');
  return colon == std::string_view::npos ? full : full.substr(colon + 1);
}

// Derived sizes: computed, never stored in a config.
template <LlamaConfig C> inline constexpr std::size_t heads = C::kv_heads * C::group;
template <LlamaConfig C> inline constexpr std::size_t head_dim = 2 * C::half_head;
template <LlamaConfig C> inline constexpr std::size_t dim = heads<C> * head_dim<C>;
template <LlamaConfig C> inline constexpr std::size_t kv_dim = C::kv_heads * head_dim<C>;

// The traits of a valid config.
template <LlamaConfig C> inline constexpr rope_scaling_params rope_scaling_v = rope_scaling_of<C>();
template <LlamaConfig C> inline constexpr bool attention_bias_v = attention_bias_of<C>();
template <LlamaConfig C> inline constexpr architecture architecture_v = architecture_of<C>();
template <LlamaConfig C> inline constexpr std::string_view architecture_name_v = info_of(architecture_v<C>).name;
// The pairing of the q/k rows in C's GGUF files.
template <LlamaConfig C> inline constexpr rope_pairing file_pairing_v = info_of(architecture_v<C>).pairing;

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

// Llama 3.2 (Meta). Context as the published GGUF files declare it (llama.context_length
// 131072); RoPE scaled as Llama 3.1 onward, which the files carry as rope_freqs.
struct llama32_1b {
  static constexpr std::size_t kv_heads = 8;
  static constexpr std::size_t group = 4;
  static constexpr std::size_t half_head = 32;
  static constexpr std::size_t ffn = 8192;
  static constexpr std::size_t layers = 16;
  static constexpr std::size_t vocab = 128256;
  static constexpr std::size_t context = 131072;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 500000.0f;
  static constexpr bool tied_embeddings = true;
  static constexpr auto rope_scaling = rope_llama3(32.0, 1.0, 4.0, 8192);
};

struct llama32_3b {
  static constexpr std::size_t kv_heads = 8;
  static constexpr std::size_t group = 3;
  static constexpr std::size_t half_head = 64;
  static constexpr std::size_t ffn = 8192;
  static constexpr std::size_t layers = 28;
  static constexpr std::size_t vocab = 128256;
  static constexpr std::size_t context = 131072;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 500000.0f;
  static constexpr bool tied_embeddings = true;
  static constexpr auto rope_scaling = rope_llama3(32.0, 1.0, 4.0, 8192);
};

// Qwen2.5 (Alibaba): the qwen2 architecture, q/k/v biases, context 32768 as its GGUF
// files declare.
struct qwen25_0_5b {
  static constexpr std::size_t kv_heads = 2;
  static constexpr std::size_t group = 7;
  static constexpr std::size_t half_head = 32;
  static constexpr std::size_t ffn = 4864;
  static constexpr std::size_t layers = 24;
  static constexpr std::size_t vocab = 151936;
  static constexpr std::size_t context = 32768;
  static constexpr float rms_eps = 1e-6f;
  static constexpr float rope_theta = 1000000.0f;
  static constexpr bool tied_embeddings = true;
  static constexpr bool attention_bias = true;
  static constexpr auto arch = architecture::qwen2;
};

struct qwen25_1_5b {
  static constexpr std::size_t kv_heads = 2;
  static constexpr std::size_t group = 6;
  static constexpr std::size_t half_head = 64;
  static constexpr std::size_t ffn = 8960;
  static constexpr std::size_t layers = 28;
  static constexpr std::size_t vocab = 151936;
  static constexpr std::size_t context = 32768;
  static constexpr float rms_eps = 1e-6f;
  static constexpr float rope_theta = 1000000.0f;
  static constexpr bool tied_embeddings = true;
  static constexpr bool attention_bias = true;
  static constexpr auto arch = architecture::qwen2;
};

// TinyLlama 1.1B (Llama 2 architecture and SentencePiece vocabulary), context 2048.
struct tinyllama_1_1b {
  static constexpr std::size_t kv_heads = 4;
  static constexpr std::size_t group = 8;
  static constexpr std::size_t half_head = 32;
  static constexpr std::size_t ffn = 5632;
  static constexpr std::size_t layers = 22;
  static constexpr std::size_t vocab = 32000;
  static constexpr std::size_t context = 2048;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 10000.0f;
  static constexpr bool tied_embeddings = false;
};

// Mistral 7B v0.2 and later (theta 1e6, no sliding window), context 32768.
struct mistral_7b {
  static constexpr std::size_t kv_heads = 8;
  static constexpr std::size_t group = 4;
  static constexpr std::size_t half_head = 64;
  static constexpr std::size_t ffn = 14336;
  static constexpr std::size_t layers = 32;
  static constexpr std::size_t vocab = 32000;
  static constexpr std::size_t context = 32768;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 1000000.0f;
  static constexpr bool tied_embeddings = false;
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

// Tiny configs with the traits: Qwen2's architecture and biases, and Llama 3's RoPE
// scaling with an original context that puts the 4 pairs' wavelengths (6.3, 63, 628,
// 6283 positions at theta 1e4) in all three of its regimes (kept, blended, divided).
struct tiny_qwen2 {
  static constexpr std::size_t kv_heads = 2;
  static constexpr std::size_t group = 2;
  static constexpr std::size_t half_head = 4;
  static constexpr std::size_t ffn = 64;
  static constexpr std::size_t layers = 2;
  static constexpr std::size_t vocab = 96;
  static constexpr std::size_t context = 64;
  static constexpr float rms_eps = 1e-6f;
  static constexpr float rope_theta = 10000.0f;
  static constexpr bool tied_embeddings = true;
  static constexpr bool attention_bias = true;
  static constexpr auto arch = architecture::qwen2;
};

struct tiny_llama3 {
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
  static constexpr auto rope_scaling = rope_llama3(8.0, 1.0, 4.0, 1024);
};

// All three traits at once, for the gradient check (no published model is this).
struct tiny_traits {
  static constexpr std::size_t kv_heads = 2;
  static constexpr std::size_t group = 2;
  static constexpr std::size_t half_head = 4;
  static constexpr std::size_t ffn = 64;
  static constexpr std::size_t layers = 2;
  static constexpr std::size_t vocab = 96;
  static constexpr std::size_t context = 64;
  static constexpr float rms_eps = 1e-5f;
  static constexpr float rope_theta = 10000.0f;
  static constexpr bool tied_embeddings = false;
  static constexpr bool attention_bias = true;
  static constexpr auto arch = architecture::qwen2;
  static constexpr auto rope_scaling = rope_llama3(8.0, 1.0, 4.0, 1024);
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
