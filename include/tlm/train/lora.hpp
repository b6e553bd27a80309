#pragma once
// Low-rank adapters (LoRA) over a frozen base. For each targeted matrix W [out, in]
// of a layer, two trainable factors A [r, in] and B [out, r] change the product to
//
//   y = W x + (alpha / r) · B (A x)
//
// while W stays as it is: mapped, read-only, in its file's encoding. The adapter is a
// reflected struct like the weights, so for_each_tensor walks it, and the parameter
// count, zero(), AdamW (its m and v are adapters too) and checkpoint writing take it
// with no special case. A matrix that is not targeted has no member (absent), as a
// bias has none on a config without biases.
//
// Example, given using C = tlm::smollm2_135m; extern const tlm::model<C>& model; std::uint64_t seed; std::vector<std::int32_t> tokens, targets:
//   #include <tlm/model.hpp>
//   #include <tlm/train/adamw.hpp>
//   #include <tlm/train/step.hpp>
//   tlm::lora<C, 8> ad;                                  // q, k, v, o
//   tlm::init_lora(ad, seed);                            // B = 0: the base's logits
//   tlm::lora<C, 8> grads;
//   tlm::training<C> run({.batch = 4, .seq = 128});
//   double loss = run.forward(model.weights(), ad, tokens, targets);
//   tlm::zero(grads);
//   run.backward(model.weights(), ad, grads);            // grads += d loss / d adapter
//   tlm::adamw<tlm::lora<C, 8>> opt({.lr = 1e-4});  opt.step(ad, grads);
//
// Tensor names and layouts are llama.cpp's (src/llama-adapter.cpp in the llama.cpp
// that llama-cpp-python 0.3.x vendors): "<base tensor>.lora_a" / ".lora_b", e.g.
// blk.0.attn_q.weight.lora_a. llama.cpp checks, for a base tensor of GGUF dims
// ne = [in, out], that lora_a has ne[0] == in and lora_b has ne[1] == out, and that
// a.ne[1] == b.ne[0] (the rank; otherwise "lora_a tensor is not transposed"). GGUF
// dims list the fastest index first, so lora_a is stored row-major as [r][in] and
// lora_b as [out][r]: exactly the mat<r, in> and mat<out, r> here, and PEFT's
// lora_A.weight [r, in] and lora_B.weight [out, r] (convert_lora_to_gguf.py writes
// them unchanged except for token_embd, which is not a target here).
#include <array>
#include <boost/hana.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <tlm/block.hpp>
#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/kernels/gemm.hpp>
#include <tlm/linalg.hpp>
#include <tlm/shape.hpp>
#include <tlm/thread_pool.hpp>
#include <tlm/train/weights.hpp>
#include <tlm/weights.hpp>

namespace tlm {

// PEFT's and torchtune's usual choice.
inline constexpr lora_target lora_default_targets = lora_target::q | lora_target::k | lora_target::v | lora_target::o;

// "q,k,v,o": the names of a set of targets, comma-separated, in walk order.
inline std::string lora_targets_text(lora_target set) {
  std::string s;
  for (const auto& e : lora_targets_table)
    if (lora_targets_contain(set, e.target)) s += (s.empty() ? "" : ",") + std::string(e.name);
  return s.empty() ? "none" : s;
}

// Parses a comma-separated list of target names (any order); an unknown, repeated or
// empty name is an error that lists the names.
inline lora_target parse_lora_targets(std::string_view text) {
  unsigned set = 0;
  std::string_view rest = text;
  const auto known = [] {
    std::string k;
    for (const auto& e : lora_targets_table) k += (k.empty() ? "" : ", ") + std::string(e.name);
    return k;
  };
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    unsigned bit = 0;
    for (const auto& e : lora_targets_table)
      if (e.name == part) bit = static_cast<unsigned>(e.target);
    if (bit == 0)
      throw error("--lora-targets " + std::string(text) + ": '" + std::string(part) + "' is not a layer matrix; the names are " + known());
    if (set & bit) throw error("--lora-targets " + std::string(text) + ": '" + std::string(part) + "' is named twice");
    set |= bit;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return static_cast<lora_target>(set);
}

// A set of targets names at least one of the seven layer matrices and nothing else.
template <lora_target Targets>
concept lora_targets_known = Targets != lora_target::none && lora_targets_contain(all_layer_matrices, Targets);

template <std::size_t Rank>
concept lora_rank_positive = Rank >= 1;

// A's rows and B's columns are the same rank: the product B (A x) passes through r values.
template <std::size_t RankA, std::size_t RankB>
concept lora_ranks_match = RankA == RankB;

// A factor of a targeted matrix, or absent when the adapter does not target it.
template <lora_target Targets, lora_target Of, class M>
using lora_factor = std::conditional_t<lora_targets_contain(Targets, Of), M, absent>;

// One layer's factors. Member names give the file names (weights.hpp, tensor_name):
// attn_q_lora_a is blk.N.attn_q.weight.lora_a.
template <LlamaConfig C, std::size_t Rank, lora_target Targets, Element T>
  requires lora_rank_positive<Rank> && lora_targets_known<Targets>
struct lora_layer {
  using config = C;
  using storage = owned<T>;
  static constexpr std::size_t D = dim<C>, K = kv_dim<C>, F = C::ffn, R = Rank;
  template <lora_target t, std::size_t Rows, std::size_t Cols>
  using factor = lora_factor<Targets, t, mat<Rows, Cols, owned<T>>>;
  BOOST_HANA_DEFINE_STRUCT(lora_layer,
    (factor<lora_target::q, R, D>, attn_q_lora_a),          // [r, D] of attn_q [D, D]
    (factor<lora_target::q, D, R>, attn_q_lora_b),          // [D, r]
    (factor<lora_target::k, R, D>, attn_k_lora_a),          // [r, D] of attn_k [K, D]
    (factor<lora_target::k, K, R>, attn_k_lora_b),          // [K, r]
    (factor<lora_target::v, R, D>, attn_v_lora_a),          // [r, D] of attn_v [K, D]
    (factor<lora_target::v, K, R>, attn_v_lora_b),          // [K, r]
    (factor<lora_target::o, R, D>, attn_output_lora_a),     // [r, D] of attn_output [D, D]
    (factor<lora_target::o, D, R>, attn_output_lora_b),     // [D, r]
    (factor<lora_target::gate, R, D>, ffn_gate_lora_a),     // [r, D] of ffn_gate [F, D]
    (factor<lora_target::gate, F, R>, ffn_gate_lora_b),     // [F, r]
    (factor<lora_target::up, R, D>, ffn_up_lora_a),         // [r, D] of ffn_up [F, D]
    (factor<lora_target::up, F, R>, ffn_up_lora_b),         // [F, r]
    (factor<lora_target::down, R, F>, ffn_down_lora_a),     // [r, F] of ffn_down [D, F]
    (factor<lora_target::down, D, R>, ffn_down_lora_b));    // [D, r]

  template <lora_target t>
  static constexpr bool targets = lora_targets_contain(Targets, t);

  // The factors of target t: members 2i and 2i + 1 for entry i of lora_targets_table,
  // the order the struct above declares them in (test_train_lora checks each against
  // the walk's name).
  template <lora_target t, class Self>
    requires targets<t>
  static auto& a_of(Self& l) {
    return boost::hana::second(boost::hana::at_c<2 * lora_target_index(t)>(boost::hana::accessors<lora_layer>()))(l);
  }
  template <lora_target t, class Self>
    requires targets<t>
  static auto& b_of(Self& l) {
    return boost::hana::second(boost::hana::at_c<2 * lora_target_index(t) + 1>(boost::hana::accessors<lora_layer>()))(l);
  }
};

// An adapter for config C: one lora_layer per layer (file names blk.N.*). Its
// gradient and AdamW's moments are the same type.
template <LlamaConfig C, std::size_t Rank, lora_target Targets = lora_default_targets, Element T = float>
  requires lora_rank_positive<Rank> && lora_targets_known<Targets>
struct lora {
  using config = C;
  using storage = owned<T>;
  using layer_type = lora_layer<C, Rank, Targets, T>;
  static constexpr std::size_t rank = Rank;
  static constexpr lora_target targets = Targets;
  BOOST_HANA_DEFINE_STRUCT(lora,
    (std::array<layer_type, C::layers>, layers));  // L layers of factors

  // The low-rank path is scaled by alpha / r (llama.cpp's adapter.lora.alpha). A
  // constant of the adapter, not a parameter: the walk does not see it.
  double alpha = static_cast<double>(Rank);
  double scale() const { return alpha / static_cast<double>(Rank); }
};

template <class A>
inline constexpr bool is_lora_v = false;
template <LlamaConfig C, std::size_t R, lora_target Tg, Element T>
inline constexpr bool is_lora_v<lora<C, R, Tg, T>> = true;

template <LlamaConfig C, std::size_t R, lora_target Tg, Element T>
inline constexpr bool is_weight_struct_v<lora<C, R, Tg, T>> = true;
template <LlamaConfig C, std::size_t R, lora_target Tg, Element T>
inline constexpr bool is_weight_struct_v<lora_layer<C, R, Tg, T>> = true;

// An adapter belongs to one config: its shapes are that config's, and one of
// another config is another type even where the shapes happen to agree.
template <class A, class C>
concept adapter_of_config = is_lora_v<std::remove_cvref_t<A>> && std::same_as<typename std::remove_cvref_t<A>::config, C>;

// PEFT's initialisation: B = 0, so the adapted model starts as the base; A as
// torch's kaiming_uniform_(a = sqrt(5)) on [r, in], i.e. uniform(-1/sqrt(in),
// 1/sqrt(in)) (gain sqrt(2 / (1 + 5)), bound gain · sqrt(3 / in)). The seed fixes
// every value (normal_rng is splitmix64, the same with any standard library).
template <class A>
  requires is_lora_v<A>
void init_lora(A& ad, std::uint64_t seed) {
  normal_rng rng(seed);
  for_each_tensor(
      [&](const tensor_name& name, auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        if (name.member.ends_with(tensor_name::lora_b_suffix)) {
          std::fill(t.values().begin(), t.values().end(), 0);
          return;
        }
        const double bound = 1.0 / std::sqrt(static_cast<double>(U::cols));
        for (auto& v : t.values()) v = static_cast<typename U::value_type>(bound * (2.0 * rng.uniform() - 1.0));
      },
      ad);
}

namespace detail {
template <class T>
void check_lora_scratch(std::span<T> s, std::size_t need, const char* who) {
  if (s.size() < need) {
    throw shape_error(std::string(who) + ": scratch of " + std::to_string(s.size()) + " values for " +
                      std::to_string(need) + " (rows x rank); give at least that many");
  }
}
}  // namespace detail

// The low-rank path of one product, added to the base's output:
//   u = scale · X Aᵀ     [n, r]   (into `u`, scratch of at least n·r values)
//   Y += u Bᵀ            [n, out]
// a [r, in]  b [out, r]  x [n, in]  y [n, out]
template <std::size_t RA, std::size_t In, std::size_t Out, std::size_t RB, class T, std::size_t N, std::size_t M>
  requires lora_ranks_match<RA, RB> && inner_dims_match<In, N> && output_gradient_matches<Out, M>
void lora_forward(const mat<RA, In, owned<T>>& a, const mat<Out, RB, owned<T>>& b, T scale, const rows<N, T>& x,
                  rows<M, T>& y, std::span<T> u, thread_pool* pool = nullptr) {
  using kernels::transpose;
  const std::size_t n = x.count();
  detail::check_lora_scratch(u, n * RA, "lora_forward");
  if (y.count() != n) throw shape_error("lora_forward: the output has another row count than the input");
  if (n == 0) return;
  kernels::gemm_any<T>(transpose::no, transpose::yes, n, RA, In, x.data(), In, a.data(), In, u.data(), RA, false, pool);
  for (std::size_t i = 0; i < n * RA; ++i) u[i] *= scale;
  kernels::gemm_any<T>(transpose::no, transpose::yes, n, Out, RA, u.data(), RA, b.data(), RA, y.data(), Out, true, pool);
}

// Its backward: the forward's inputs (a, b, scale, x), the output's gradient dy,
// then the gradients, accumulated. With u = scale · X Aᵀ recomputed (r values per
// row: cheaper than saving it per layer and target):
//   dB += dYᵀ u               [out, r]
//   du  = scale · dY B        [n, r]   (scratch)
//   dA += duᵀ X               [r, in]
//   dX += du A                [n, in]
template <std::size_t RA, std::size_t In, std::size_t Out, std::size_t RB, class T, std::size_t N, std::size_t M>
  requires lora_ranks_match<RA, RB> && inner_dims_match<In, N> && output_gradient_matches<Out, M>
void lora_backward(const mat<RA, In, owned<T>>& a, const mat<Out, RB, owned<T>>& b, T scale, const rows<N, T>& x,
                   const rows<M, T>& dy, mat<RA, In, owned<T>>& da, mat<Out, RB, owned<T>>& db, rows<N, T>& dx,
                   std::span<T> u, std::span<T> du, thread_pool* pool = nullptr) {
  using kernels::transpose;
  const std::size_t n = x.count();
  detail::check_lora_scratch(u, n * RA, "lora_backward");
  detail::check_lora_scratch(du, n * RA, "lora_backward");
  if (dy.count() != n || dx.count() != n) {
    throw shape_error("lora_backward: input, output-gradient and input-gradient rows differ; all must be the batch's");
  }
  if (n == 0) return;
  kernels::gemm_any<T>(transpose::no, transpose::yes, n, RA, In, x.data(), In, a.data(), In, u.data(), RA, false, pool);
  for (std::size_t i = 0; i < n * RA; ++i) u[i] *= scale;
  kernels::gemm_any<T>(transpose::yes, transpose::no, Out, RA, n, dy.data(), Out, u.data(), RA, db.data(), RA, true, pool);
  kernels::gemm_any<T>(transpose::no, transpose::no, n, RA, Out, dy.data(), Out, b.data(), RA, du.data(), RA, false, pool);
  for (std::size_t i = 0; i < n * RA; ++i) du[i] *= scale;
  kernels::gemm_any<T>(transpose::yes, transpose::no, RA, In, n, du.data(), RA, x.data(), In, da.data(), In, true, pool);
  kernels::gemm_any<T>(transpose::no, transpose::no, n, In, RA, du.data(), RA, a.data(), In, dx.data(), In, true, pool);
}

// Merges an adapter into owned weights: W += (alpha / r) · B A for each targeted
// matrix, so that the merged model alone computes what the base with the adapter
// computes (up to the rounding of its encoding when written).
template <LlamaConfig C, std::size_t R, lora_target Tg, Element T>
void merge_lora(model_weights<C, owned<T>>& w, const lora<C, R, Tg, T>& ad) {
  using L = lora_layer<C, R, Tg, T>;
  using W = std::remove_cvref_t<decltype(w.layers[0])>;
  std::vector<T> scaled;  // [out, r] scale · B
  for (std::size_t l = 0; l < C::layers; ++l) {
    const auto one = [&]<lora_target t>() {
      if constexpr (L::template targets<t>) {
        const auto& a = L::template a_of<t>(ad.layers[l]);
        const auto& b = L::template b_of<t>(ad.layers[l]);
        auto& m = W::template matrix<t>(w.layers[l]);
        using M = std::remove_cvref_t<decltype(m)>;
        scaled.assign(b.values().begin(), b.values().end());
        for (auto& x : scaled) x = static_cast<T>(x * ad.scale());
        kernels::gemm_any<T>(kernels::transpose::no, kernels::transpose::no, M::rows, M::cols, R, scaled.data(), R, a.data(), M::cols,
                            m.data(), M::cols, true, nullptr);
      }
    };
    one.template operator()<lora_target::q>();
    one.template operator()<lora_target::k>();
    one.template operator()<lora_target::v>();
    one.template operator()<lora_target::o>();
    one.template operator()<lora_target::gate>();
    one.template operator()<lora_target::up>();
    one.template operator()<lora_target::down>();
  }
}

// The block's forward hook for one layer's adapter (block.hpp, block_forward): adds
// the low-rank path of every targeted product.
template <class Layer, class T>
struct lora_block_forward {
  const Layer& ad;
  T scale;
  std::span<T> u;  // [n, r] scratch
  thread_pool* pool;

  template <lora_target t, std::size_t N, std::size_t M>
  void add(const rows<N, T>& x, rows<M, T>& y) const {
    if constexpr (Layer::template targets<t>)
      lora_forward(Layer::template a_of<t>(ad), Layer::template b_of<t>(ad), scale, x, y, u, pool);
  }
};

// The block's backward sink for a frozen base under an adapter (block.hpp,
// block_backward): dX flows through each frozen W (mapped or owned) and through the
// low-rank path; only the adapter's factors get gradients. Norm gains and biases
// are part of the frozen base: no gradient.
template <class Layer, class T>
struct lora_block_backward {
  const Layer& ad;
  Layer& grad;
  T scale;
  std::span<T> u, du;  // [n, r] scratch each
  thread_pool* pool;

  template <lora_target t, class W, std::size_t N, std::size_t M>
  void product(const W& w, const rows<N, T>& x, const rows<M, T>& dy, rows<N, T>& dx) const {
    matmul_backward_input(W::template matrix<t>(w), dy, dx, pool);
    if constexpr (Layer::template targets<t>)
      lora_backward(Layer::template a_of<t>(ad), Layer::template b_of<t>(ad), scale, x, dy,
                    Layer::template a_of<t>(grad), Layer::template b_of<t>(grad), dx, u, du, pool);
  }
  T* attn_norm_gradient() const { return nullptr; }
  T* ffn_norm_gradient() const { return nullptr; }
  template <class R1, class R2, class R3>
  void biases(const R1&, const R2&, const R3&) const {}
};

}  // namespace tlm
