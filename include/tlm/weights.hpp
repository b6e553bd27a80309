#pragma once
// The weights of a Llama model as reflected structs, and the one walk that visits
// them. The walk serves the loader, the parameter count, gradient zeroing, AdamW
// (parameters, gradients, m and v in lockstep) and checkpoint writing, so the
// list of tensors and their file names exist in exactly one place: here.
#include <array>
#include <boost/hana.hpp>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

#include <tlm/config.hpp>
#include <tlm/shape.hpp>

namespace tlm {

// Member of a weight struct that a config does not have (the output matrix of a
// model with tied embeddings). The walk skips it.
struct absent {};

template <LlamaConfig C, Storage S>
using output_matrix = std::conditional_t<C::tied_embeddings, absent, mat<C::vocab, dim<C>, S>>;

// The q/k/v biases of a config with attention_bias (Qwen2), else absent: a config
// without them has no bias members to name, load, count, train or write.   [N]
template <LlamaConfig C, std::size_t N, Storage S>
using attention_bias = std::conditional_t<attention_bias_v<C>, vec<N, S>, absent>;

// Llama 3's per-pair RoPE divisors as llama.cpp's converter stores them (the
// rope_freqs tensor), for a config with llama3 scaling, else absent. A constant, not
// a parameter: the forward uses the divisors computed from the config
// (rope_divisors), which binding checks this tensor against; training leaves it as
// it is (its gradient is zero, and AdamW does not decay vectors).   [E/2]
template <LlamaConfig C, Storage S>
using rope_freqs_vector =
    std::conditional_t<rope_scaling_v<C>.type == rope_scaling_type::llama3, vec<C::half_head, S>, absent>;

// Layers move between models only within one config.
template <class A, class B>
concept layers_of_same_config = std::same_as<A, B>;

// The seven matrices of a layer, as bits: what a low-rank adapter may target
// (train/lora.hpp). Every Llama-family config has all seven; a set of targets is
// one value of this type, usable as a template argument.
enum class lora_target : unsigned {
  none = 0,
  q = 1u << 0,     // attn_q       [D, D]
  k = 1u << 1,     // attn_k       [K, D]
  v = 1u << 2,     // attn_v       [K, D]
  o = 1u << 3,     // attn_output  [D, D]
  gate = 1u << 4,  // ffn_gate     [F, D]
  up = 1u << 5,    // ffn_up       [F, D]
  down = 1u << 6,  // ffn_down     [D, F]
};
constexpr lora_target operator|(lora_target a, lora_target b) {
  return static_cast<lora_target>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
// Whether every target of `set` is in `of` (a single target: whether `of` holds it).
constexpr bool lora_targets_contain(lora_target of, lora_target set) {
  return (static_cast<unsigned>(of) & static_cast<unsigned>(set)) == static_cast<unsigned>(set);
}
inline constexpr lora_target all_layer_matrices = lora_target::q | lora_target::k | lora_target::v | lora_target::o |
                                                 lora_target::gate | lora_target::up | lora_target::down;

// The targets in walk order, each with its name as --lora-targets takes it and its
// matrix's GGUF stem (the member of layer_weights that matrix<T> returns; test_weights
// checks that the two agree). The one table of target names.
struct lora_target_entry {
  lora_target target;
  std::string_view name;    // "q"
  std::string_view tensor;  // "attn_q": blk.N.attn_q.weight
};
inline constexpr std::array<lora_target_entry, 7> lora_targets_table{{{lora_target::q, "q", "attn_q"},
                                                                       {lora_target::k, "k", "attn_k"},
                                                                       {lora_target::v, "v", "attn_v"},
                                                                       {lora_target::o, "o", "attn_output"},
                                                                       {lora_target::gate, "gate", "ffn_gate"},
                                                                       {lora_target::up, "up", "ffn_up"},
                                                                       {lora_target::down, "down", "ffn_down"}}};

// A target's entry in lora_targets_table (the table's size for none or a set of several).
constexpr std::size_t lora_target_index(lora_target t) {
  for (std::size_t i = 0; i < lora_targets_table.size(); ++i)
    if (lora_targets_table[i].target == t) return i;
  return lora_targets_table.size();
}

// Member names are the GGUF tensor names, so a tensor's file name is derived from
// its member and never written down twice.
template <LlamaConfig C, Storage S = mapped>
struct layer_weights {
  using config = C;
  using storage = S;
  BOOST_HANA_DEFINE_STRUCT(layer_weights,
    (vec<dim<C>, S>, attn_norm),               // [D]    RMSNorm gain before attention
    (mat<dim<C>, dim<C>, S>, attn_q),          // [D, D] query projection, H heads of E rows
    (mat<kv_dim<C>, dim<C>, S>, attn_k),       // [K, D] key projection, G heads of E rows
    (mat<kv_dim<C>, dim<C>, S>, attn_v),       // [K, D] value projection
    (attention_bias<C, dim<C>, S>, attn_q_bias),     // [D] query bias, or absent (file name attn_q.bias)
    (attention_bias<C, kv_dim<C>, S>, attn_k_bias),  // [K] key bias, or absent
    (attention_bias<C, kv_dim<C>, S>, attn_v_bias),  // [K] value bias, or absent
    (mat<dim<C>, dim<C>, S>, attn_output),     // [D, D] joins the H heads back into the stream
    (vec<dim<C>, S>, ffn_norm),                // [D]    RMSNorm gain before the MLP
    (mat<C::ffn, dim<C>, S>, ffn_gate),        // [F, D] SwiGLU gate
    (mat<C::ffn, dim<C>, S>, ffn_up),          // [F, D] SwiGLU value
    (mat<dim<C>, C::ffn, S>, ffn_down));       // [D, F] back to the stream

  layer_weights() = default;

  // The matrix a target names: the one place a target maps to a member.
  template <lora_target T, class Self>
  static auto& matrix(Self& w) {
    if constexpr (T == lora_target::q) return w.attn_q;
    else if constexpr (T == lora_target::k) return w.attn_k;
    else if constexpr (T == lora_target::v) return w.attn_v;
    else if constexpr (T == lora_target::o) return w.attn_output;
    else if constexpr (T == lora_target::gate) return w.ffn_gate;
    else if constexpr (T == lora_target::up) return w.ffn_up;
    else {
      static_assert(T == lora_target::down, "tlm lora rule: a target names exactly one of the seven layer matrices");
      return w.ffn_down;
    }
  }

  // A layer of another config is another type, even where the shapes happen to
  // agree. This candidate exists only so that "no match" names the rule.
  template <LlamaConfig C2, Storage S2>
    requires layers_of_same_config<C, C2> && (!std::same_as<S, S2>)
  layer_weights& operator=(const layer_weights<C2, S2>&) = delete;  // mapped <-> owned: copy values explicitly
};

template <LlamaConfig C, Storage S = mapped>
struct model_weights {
  using config = C;
  using storage = S;
  BOOST_HANA_DEFINE_STRUCT(model_weights,
    (mat<C::vocab, dim<C>, S>, token_embd),               // [V, D] embedding rows; also the output when tied
    (std::array<layer_weights<C, S>, C::layers>, layers), // L layers, file names blk.N.*
    (vec<dim<C>, S>, output_norm),                        // [D]    final RMSNorm gain
    (output_matrix<C, S>, output),                        // [V, D] separate output, or absent when tied
    (rope_freqs_vector<C, S>, rope_freqs));               // [E/2]  Llama 3 RoPE divisors, or absent

  model_weights() = default;
};

// The matrix the logits are computed with, [V, D]: the output matrix, or the token
// embedding when the config ties them. The model's head and training's both ask here.
template <class W>
  requires LlamaConfig<typename std::remove_cvref_t<W>::config>
auto& logits_matrix(W& w) {
  if constexpr (std::remove_cvref_t<W>::config::tied_embeddings) return w.token_embd;
  else return w.output;
}

template <class W>
inline constexpr bool is_weight_struct_v = false;
template <LlamaConfig C, Storage S>
inline constexpr bool is_weight_struct_v<layer_weights<C, S>> = true;
template <LlamaConfig C, Storage S>
inline constexpr bool is_weight_struct_v<model_weights<C, S>> = true;

// Training changes weights, so it needs weights it owns: an owned copy made from a
// file's mapped (read-only, possibly quantized) tensors, never the mapping itself.
template <class W>
concept trainable_weights = is_weight_struct_v<std::remove_cvref_t<W>> && is_owned_v<typename std::remove_cvref_t<W>::storage>;

// A gradient has exactly the type of its parameters: the same config, the same
// element type, so every tensor pairs with the parameter of the same name and shape.
template <class G, class W>
concept gradient_of = trainable_weights<W> && std::same_as<std::remove_cvref_t<G>, std::remove_cvref_t<W>>;

// Optimizer moments (AdamW's m and v) likewise belong to one set of parameters.
template <class M, class W>
concept moments_of = trainable_weights<W> && std::same_as<std::remove_cvref_t<M>, std::remove_cvref_t<W>>;

// The name a tensor has in a GGUF file: "blk.<layer>.<member>.weight", or
// "<member>.weight" outside the layers. A member named "<stem>_bias" is the bias of
// <stem>, "<stem>.bias" in the file (blk.0.attn_q.bias): the one place that rule
// lives. Cheap to pass; str() builds the string.
struct tensor_name {
  std::string_view member;
  int layer = -1;

  static constexpr std::string_view bias_suffix = "_bias";
  // A low-rank adapter's factors of <stem> (train/lora.hpp): members "<stem>_lora_a"
  // and "<stem>_lora_b", in the file "<stem>.weight.lora_a" / ".lora_b" as llama.cpp
  // names them (blk.0.attn_q.weight.lora_a).
  static constexpr std::string_view lora_a_suffix = "_lora_a", lora_b_suffix = "_lora_b";

  constexpr bool is_bias() const { return member.ends_with(bias_suffix); }
  constexpr bool is_lora() const { return member.ends_with(lora_a_suffix) || member.ends_with(lora_b_suffix); }

  std::string str() const {
    std::string s;
    if (layer >= 0) s = "blk." + std::to_string(layer) + ".";
    if (is_lora()) {
      s.append(member.substr(0, member.size() - lora_a_suffix.size()));
      s += member.ends_with(lora_a_suffix) ? ".weight.lora_a" : ".weight.lora_b";
    } else if (is_bias()) {
      s.append(member.substr(0, member.size() - bias_suffix.size()));
      s += ".bias";
    } else {
      s.append(member);
      s += ".weight";
    }
    return s;
  }
};

namespace detail {

template <class T>
inline constexpr bool is_std_array_v = false;
template <class T, std::size_t N>
inline constexpr bool is_std_array_v<std::array<T, N>> = true;

template <class T>
inline constexpr std::size_t array_extent_v = 0;
template <class T, std::size_t N>
inline constexpr std::size_t array_extent_v<std::array<T, N>> = N;

template <class F, class T0, class... Ts>
constexpr void walk(F& f, tensor_name name, T0& t0, Ts&... ts) {
  using U = std::remove_cvref_t<T0>;
  if constexpr (std::same_as<U, absent>) {
    static_assert((std::same_as<std::remove_cvref_t<Ts>, absent> && ...),
                  "tlm walk rule: structs walked in lockstep differ: one has a tensor where another has none");
  } else if constexpr (Tensor<U>) {
    static_assert((same_shape<U, Ts> && ...),
                  "tlm walk rule: tensors walked in lockstep must have the same shape (a gradient, moment or copy "
                  "that does not match its parameter)");
    f(name, t0, ts...);
  } else if constexpr (is_std_array_v<U>) {
    static_assert(((array_extent_v<std::remove_cvref_t<Ts>> == array_extent_v<U>) && ...),
                  "tlm walk rule: structs walked in lockstep have different numbers of layers");
    for (std::size_t i = 0; i < array_extent_v<U>; ++i) walk(f, tensor_name{name.member, static_cast<int>(i)}, t0[i], ts[i]...);
  } else {
    static_assert(boost::hana::Struct<U>::value,
                  "tlm walk rule: a weight struct member must be a vec, a mat, an array of layers, a reflected struct, or absent");
    constexpr auto accessors = boost::hana::accessors<U>();
    static_assert(((boost::hana::length(boost::hana::accessors<std::remove_cvref_t<Ts>>()) ==
                    boost::hana::length(accessors)) && ...),
                  "tlm walk rule: structs walked in lockstep have different members");
    boost::hana::for_each(boost::hana::make_range(boost::hana::size_c<0>, boost::hana::length(accessors)), [&](auto i) {
      constexpr auto key = boost::hana::first(accessors[i]);
      static_assert(((boost::hana::first(boost::hana::accessors<std::remove_cvref_t<Ts>>()[i]) == key) && ...),
                    "tlm walk rule: structs walked in lockstep name their members differently");
      walk(f, tensor_name{boost::hana::to<const char*>(key), name.layer}, boost::hana::second(accessors[i])(t0),
           boost::hana::second(boost::hana::accessors<std::remove_cvref_t<Ts>>()[i])(ts)...);
    });
  }
}

}  // namespace detail

// Calls f(tensor_name, t0, ts...) for every tensor of w0, with the tensors of the
// same name in ws... alongside. All structs must have the same members and shapes
// (checked at compile time); their storage may differ.
template <class F, class W0, class... Ws>
constexpr void for_each_tensor(F&& f, W0& w0, Ws&... ws) {
  detail::walk(f, tensor_name{}, w0, ws...);
}

// Number of scalar parameters: a fold over the walk.
template <class W>
constexpr std::size_t parameter_count(const W& w) {
  std::size_t n = 0;
  for_each_tensor([&](const tensor_name&, const auto& t) { n += std::remove_cvref_t<decltype(t)>::rows *
                                                               std::remove_cvref_t<decltype(t)>::cols; },
                  w);
  return n;
}

// The parameter count of a weight type, computed at compile time by walking a
// default (unbound, mapped) instance: no hand-written sum of fields.
template <LlamaConfig C>
inline constexpr std::size_t parameter_count_v = parameter_count(model_weights<C, mapped>{});

// Number of tensors the walk visits (272 for SmolLM2-135M).
template <class W>
constexpr std::size_t tensor_count(const W& w) {
  std::size_t n = 0;
  for_each_tensor([&](const tensor_name&, const auto&) { ++n; }, w);
  return n;
}

}  // namespace tlm
