// Law: the parameter counts of the shipped configs, folded over the weight walk
// (no hand-written sum of fields), equal the published figures.
#include <tlm/weights.hpp>

using namespace tlm;

static_assert(parameter_count_v<smollm2_135m> == 134'515'008);
static_assert(parameter_count_v<smollm2_360m> == 361'821'120);
static_assert(parameter_count_v<smollm2_1_7b> == 1'711'376'384);

// The walk visits every tensor of the file format: 1 embedding, 9 per layer,
// 1 final norm, and an output matrix only when embeddings are not tied.
static_assert(tensor_count(model_weights<smollm2_135m>{}) == 272);
static_assert(tensor_count(model_weights<smollm2_360m>{}) == 2 + 9 * 32);
static_assert(tensor_count(model_weights<tiny_untied>{}) == 3 + 9 * 2);

// The derived sizes of the SmolLM2 family (formats.md's table).
static_assert(heads<smollm2_135m> == 9 && dim<smollm2_135m> == 576 && kv_dim<smollm2_135m> == 192);
static_assert(heads<smollm2_360m> == 15 && dim<smollm2_360m> == 960 && kv_dim<smollm2_360m> == 320);
static_assert(heads<smollm2_1_7b> == 32 && dim<smollm2_1_7b> == 2048 && kv_dim<smollm2_1_7b> == 2048);
static_assert(head_dim<smollm2_135m> == 64 && head_dim<smollm2_360m> == 64 && head_dim<smollm2_1_7b> == 64);

// Every member's shape, as the GGUF file stores it ({ne0 = cols, ne1 = rows}).
using l135 = layer_weights<smollm2_135m>;
static_assert(std::is_same_v<decltype(l135::attn_q), mat<576, 576>>);
static_assert(std::is_same_v<decltype(l135::attn_k), mat<192, 576>>);
static_assert(std::is_same_v<decltype(l135::attn_v), mat<192, 576>>);
static_assert(std::is_same_v<decltype(l135::attn_output), mat<576, 576>>);
static_assert(std::is_same_v<decltype(l135::ffn_gate), mat<1536, 576>>);
static_assert(std::is_same_v<decltype(l135::ffn_up), mat<1536, 576>>);
static_assert(std::is_same_v<decltype(l135::ffn_down), mat<576, 1536>>);
static_assert(std::is_same_v<decltype(l135::attn_norm), vec<576, mapped>>);
static_assert(std::is_same_v<decltype(model_weights<smollm2_135m>::output), absent>);
static_assert(std::is_same_v<decltype(model_weights<tiny_untied>::output), mat<256, 128>>);

// Cross-check of the walk against the architecture's formula (the walk stays the
// source of truth; this only proves it visits what the formula says).
template <class C>
constexpr std::size_t formula() {
  const std::size_t per_layer = 2 * dim<C> + 2 * dim<C> * dim<C> + 2 * kv_dim<C> * dim<C> + 3 * C::ffn * dim<C>;
  return C::vocab * dim<C> * (C::tied_embeddings ? 1 : 2) + C::layers * per_layer + dim<C>;
}
static_assert(parameter_count_v<smollm2_135m> == formula<smollm2_135m>());
static_assert(parameter_count_v<smollm2_1_7b> == formula<smollm2_1_7b>());
static_assert(parameter_count_v<tiny_gqa> == formula<tiny_gqa>());
static_assert(parameter_count_v<tiny_untied> == formula<tiny_untied>());
