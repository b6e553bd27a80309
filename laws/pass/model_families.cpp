// Law: the configs of the Llama family's published models have the shapes and
// traits of their model cards, checked by the compiler: GQA wiring (24 query heads
// on 8 kv heads for Llama 3.2 3B, 14 on 2 for Qwen2.5 0.5B), the traits and what
// they add to the weights, and parameter counts by the one walk (Hugging Face's
// counts; Llama 3's rope_freqs adds its E/2 constants).
#include <tlm/heads.hpp>
#include <tlm/weights.hpp>

#include <type_traits>

using namespace tlm;

// GQA: heads / kv heads, and the last query head of each group reads its kv head.
static_assert(heads<llama32_3b> == 24 && llama32_3b::kv_heads == 8 && head_dim<llama32_3b> == 128);
static_assert(kv_head_of<llama32_3b, 23>() == 7 && kv_head_of<llama32_3b, 2>() == 0 && kv_head_of<llama32_3b, 3>() == 1);
static_assert(heads<qwen25_0_5b> == 14 && qwen25_0_5b::kv_heads == 2 && head_dim<qwen25_0_5b> == 64);
static_assert(kv_head_of<qwen25_0_5b, 6>() == 0 && kv_head_of<qwen25_0_5b, 7>() == 1 && kv_head_of<qwen25_0_5b, 13>() == 1);
static_assert(dim<llama32_1b> == 2048 && kv_dim<llama32_1b> == 512 && dim<qwen25_0_5b> == 896 && kv_dim<qwen25_0_5b> == 128);
static_assert(dim<qwen25_1_5b> == 1536 && dim<tinyllama_1_1b> == 2048 && dim<mistral_7b> == 4096 && dim<llama32_3b> == 3072);

// Traits: declared ones, and plain Llama's where a config declares none.
static_assert(rope_scaling_v<llama32_1b>.type == rope_scaling_type::llama3 && rope_scaling_v<llama32_1b>.factor == 32.0);
static_assert(rope_scaling_v<smollm2_135m>.type == rope_scaling_type::none);
static_assert(attention_bias_v<qwen25_0_5b> && !attention_bias_v<llama32_1b> && !attention_bias_v<smollm2_135m>);
static_assert(architecture_name_v<qwen25_1_5b> == "qwen2" && architecture_name_v<mistral_7b> == "llama");
static_assert(file_pairing_v<qwen25_0_5b> == rope_pairing::half_split && file_pairing_v<llama32_1b> == rope_pairing::adjacent);

// What the traits add to the weights: biases of the right widths, rope_freqs of E/2.
static_assert(std::is_same_v<decltype(layer_weights<qwen25_0_5b>::attn_k_bias), vec<128, mapped>>);
static_assert(std::is_same_v<decltype(layer_weights<qwen25_0_5b>::attn_q_bias), vec<896, mapped>>);
static_assert(std::is_same_v<decltype(layer_weights<llama32_1b>::attn_q_bias), absent>);
static_assert(std::is_same_v<decltype(model_weights<llama32_1b>::rope_freqs), vec<32, mapped>>);
static_assert(std::is_same_v<decltype(model_weights<qwen25_0_5b>::rope_freqs), absent>);

// Parameter counts, by the walk.
static_assert(parameter_count_v<llama32_1b> == 1'235'814'400 + 32);
static_assert(parameter_count_v<qwen25_0_5b> == 494'032'768);
static_assert(tensor_count(model_weights<qwen25_0_5b>{}) == 24 * 12 + 2);
static_assert(tensor_count(model_weights<llama32_1b>{}) == 16 * 9 + 3);
