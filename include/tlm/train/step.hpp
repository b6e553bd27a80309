#pragma once
// The training forward and backward passes of a whole model over a batch of B
// sequences of T tokens, on the same block the inference path runs.
//
// Example, given using C = tlm::tiny_train; std::vector<std::int32_t> tokens, targets:
//   tlm::trainable<C> params;                       // or to_trainable(model.weights())
//   tlm::trainable<C> grads;
//   tlm::training<C> run({.batch = 4, .seq = 128, .threads = 2});
//   double loss = run.forward(params, tokens, targets);   // tokens, targets: [B * T]
//   tlm::zero(grads);
//   run.backward(params, grads);                          // grads += d loss / d params
//
// With a low-rank adapter (lora.hpp) over a frozen base, mapped from its file in its
// encodings (or owned), the same calls take the base and the adapter.
// Example, given using C = tlm::smollm2_135m; extern const tlm::model<C>& model; extern tlm::training<C>& run; extern tlm::lora<C, 8>& adapter, &adapter_grads; std::vector<std::int32_t> tokens, targets:
//   #include <tlm/model.hpp>
//   double loss = run.forward(model.weights(), adapter, tokens, targets);
//   run.backward(model.weights(), adapter, adapter_grads);   // only the adapter's
//
// Memory: every layer's block_activations for B*T rows (about 8.5 K floats per row
// and layer at 135M), the logits [B*T, V] and their gradient. Attention keeps one
// log-sum-exp per row and head, never a T x T matrix. Buffers are sized once, in
// the constructor: a step allocates nothing.
//
// With training_options::recompute the forward keeps only each block's input (D
// floats per row and layer) and one block's full activations; the backward reruns a
// block's forward from its saved input just before that block's backward. The rerun
// is the same computation on the same inputs and threads, so the gradients are the
// same bit for bit, for about a third more arithmetic (one more forward of the blocks).
//
// Packed examples: forward(..., starts) takes, for every token of the batch, the
// position in its sequence where its example starts ([B * T]; a sequence holds one
// example after another). Each token then attends to its own example only and is
// rotated by its position in the example, so a packed sequence computes for each
// example what that example computes alone in a sequence of its own; backward follows
// the same segments. Without starts every sequence is one example, today's path.
// Example, given using C = tlm::tiny_train; extern tlm::training<C>& run; extern const tlm::trainable<C>& params; std::vector<std::int32_t> tokens, targets:
//   std::vector<std::uint32_t> starts = {0, 0, 0, 3, 3, 3, 3, 7};   // T = 8: examples at 0, 3, 7
//   double loss = run.forward(params, tokens, targets, starts);
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <tlm/block.hpp>
#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/kernels/gemm.hpp>
#include <tlm/ops.hpp>
#include <tlm/shape.hpp>
#include <tlm/thread_pool.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/weights.hpp>
#include <tlm/weights.hpp>

namespace tlm {

struct training_options {
  std::size_t batch = 1;    // B sequences per step
  std::size_t seq = 1;      // T tokens per sequence
  std::size_t threads = 0;  // 0: every core
  rope_pairing pairing = rope_pairing::adjacent;
  bool recompute = false;   // keep only each block's input; rerun the block in the backward
};

// Parameters that train for config C in element type T.
template <class W, class C, class T>
concept weights_for = trainable_weights<W> && std::same_as<std::remove_cvref_t<W>, trainable<C, T>>;

// A base that stays frozen under an adapter: model weights of config C that
// multiply T activations (mapped in their file encodings for float, or owned).
template <class W, class C, class T>
concept frozen_base_for = is_weight_struct_v<std::remove_cvref_t<W>> &&
                          std::same_as<std::remove_cvref_t<W>, model_weights<C, typename std::remove_cvref_t<W>::storage>> &&
                          multiplies<typename std::remove_cvref_t<W>::storage, T>;

// An adapter that trains with config C in element type T.
template <class A, class C, class T>
concept adapter_for = adapter_of_config<A, C> && std::same_as<storage_value_t<typename std::remove_cvref_t<A>::storage>, T>;

template <LlamaConfig C, Element T = float>
class training {
  static constexpr std::size_t D = dim<C>, V = C::vocab;

 public:
  using config = C;
  using value_type = T;

  explicit training(training_options opt) : opt_(checked(opt)), n_(opt.batch * opt.seq) {
    pool_ = std::make_unique<thread_pool>(threads_or_every_core(opt.threads),
                                          /*flush_denormals=*/true);
    // With recompute, every layer keeps its input rows; the one full set (work_) takes
    // each layer's input in turn by a swap, so its own x needs no storage.
    if (opt_.recompute) {
      for (auto& a : acts_) a.x.reserve(n_);
      for (auto* r : {&work_.xn1, &work_.q, &work_.o, &work_.x_mid, &work_.xn2}) r->reserve(n_);
      work_.k.reserve(n_);
      work_.v.reserve(n_);
      work_.lse.reserve(n_);
      for (auto* r : {&work_.gate, &work_.up, &work_.h}) r->reserve(n_);
    } else {
      for (auto& a : acts_) a.reserve(n_);
    }
    x_out_.reserve(n_);
    xf_.reserve(n_);
    logits_.reserve(n_);
    dlogits_.reserve(n_);
    dx_.reserve(n_);
    dxf_.reserve(n_);
    scratch_.reserve(n_);
    lse_.resize(n_);
    tokens_.resize(n_);
    targets_.resize(n_);
    starts_.resize(n_);
    angles_.reserve(opt_.seq);
    for (std::size_t t = 0; t < opt_.seq; ++t) angles_.emplace_back(t);
    // Every thread's GEMM packing buffers now, so that no step allocates, whichever
    // thread happens to claim which block of a product.
    if constexpr (std::is_same_v<T, float>) pool_->run_on_each_thread([] { kernels::reserve_gemm_scratch(); });
  }

  const training_options& options() const { return opt_; }
  std::size_t batch_rows() const { return n_; }
  std::size_t threads() const { return pool_->size(); }
  thread_pool& pool() { return *pool_; }

  // The bytes the forward keeps for the backward in the blocks' activations (every
  // layer's set, or with recompute the layers' inputs and one full set): what
  // recompute saves, counted from the buffers' sizes, not measured.
  std::size_t activation_bytes() const {
    std::size_t rows_total = 0;
    const auto add = [&](const block_activations<C, T>& a) {
      rows_total += a.x.capacity() * D + a.xn1.capacity() * D + a.q.capacity() * D + a.k.capacity() * kv_dim<C> +
                    a.v.capacity() * kv_dim<C> + a.o.capacity() * D + a.lse.capacity() * heads<C> + a.x_mid.capacity() * D +
                    a.xn2.capacity() * D + (a.gate.capacity() + a.up.capacity() + a.h.capacity()) * C::ffn;
    };
    for (const auto& a : acts_) add(a);
    add(work_);
    return rows_total * sizeof(T);
  }

  // The same count for `rows` rows (batch * seq) before any buffer exists: a layer's
  // full set is 6 D + 2 K + H + 3 F values per row; with recompute each layer keeps D
  // (its input) and one set without its x is shared.
  static constexpr std::size_t kept_activation_bytes(std::size_t rows, bool recompute) {
    constexpr std::size_t full = 6 * D + 2 * kv_dim<C> + heads<C> + 3 * C::ffn;
    return rows * (recompute ? C::layers * D + (full - D) : C::layers * full) * sizeof(T);
  }

  // Runs the batch forward and returns the mean cross-entropy over the targets that
  // count (targets equal to ignore_target carry no loss).   tokens, targets: [B * T]
  // The activations stay for backward(). Throws numeric_error on a non-finite loss.
  // starts: empty, or [B * T] where each token's example starts in its sequence (packed).
  template <class W>
    requires weights_for<W, C, T>
  double forward(const W& p, std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                 std::span<const std::uint32_t> starts = {}) {
    return run_forward(p, tokens, targets, starts, [](std::size_t) { return no_adapter{}; });
  }

  // The same over a frozen base with a low-rank adapter: y = W x + (alpha/r) B (A x)
  // for the adapter's targets.
  template <class W, class A>
    requires frozen_base_for<W, C, T> && adapter_for<A, C, T>
  double forward(const W& base, const A& ad, std::span<const std::int32_t> tokens,
                 std::span<const std::int32_t> targets, std::span<const std::uint32_t> starts = {}) {
    reserve_lora(A::rank);
    const std::span<T> u(lora_u_.data(), n_ * A::rank);
    const T scale = static_cast<T>(ad.scale());
    thread_pool* pool = pool_.get();
    return run_forward(base, tokens, targets, starts, [&](std::size_t l) {
      return lora_block_forward<typename A::layer_type, T>{ad.layers[l], scale, u, pool};
    });
  }

  // Adds dloss · d(loss)/d(params) of the last forward() into grads (zero them first
  // for one batch's gradient). dloss weighs a micro-batch in an accumulated step: its
  // share of the step's counted targets.
  template <class W, class G>
    requires weights_for<W, C, T> && gradient_of<G, W>
  void backward(const W& p, G& grads, T dloss = T(1)) {
    flush_denormals_guard ftz;
    thread_pool* pool = pool_.get();
    logits_backward(dloss);
    matmul_backward(logits_matrix(p), xf_, dlogits_, logits_matrix(grads), dxf_, pool);
    dx_.resize(n_);
    detail::zero_rows(dx_, pool);
    detail::rmsnorm_backward_rows<D, T, T>(x_out_, p.output_norm.values(), C::rms_eps, dxf_, dx_,
                                           grads.output_norm.data(), scratch_.rms, pool);
    const block_context<C, T> ctx = context();
    for (std::size_t l = C::layers; l-- > 0;) {
      block_activations<C, T>& a = saved(p, l, ctx, [](std::size_t) { return no_adapter{}; });
      block_backward(p.layers[l], a, ctx, dx_, grads.layers[l], scratch_, pool);
      unsave(l);
    }
    for (std::size_t i = 0; i < n_; ++i) embed_backward<V, D, T>(tokens_[i], dx_.row(i), grads.token_embd);
  }

  // Adds d(loss)/d(adapter) of the last forward(base, ad, ...) into grads. The base
  // gets no gradient: the stream's gradient flows through its frozen matrices
  // (matmul_backward_input) down to the first layer's adapter, and stops there (the
  // embeddings are frozen).
  template <class W, class A, class G>
    requires frozen_base_for<W, C, T> && adapter_for<A, C, T> && gradient_of<G, A>
  void backward(const W& base, const A& ad, G& grads, T dloss = T(1)) {
    flush_denormals_guard ftz;
    thread_pool* pool = pool_.get();
    if (lora_u_.size() < n_ * A::rank) throw error("training::backward: call forward(base, adapter, ...) first");
    logits_backward(dloss);
    matmul_backward_input(logits_matrix(base), dlogits_, dxf_, pool);
    dx_.resize(n_);
    detail::zero_rows(dx_, pool);
    const auto gf = detail::gain_values(base.output_norm);
    detail::rmsnorm_backward_rows<D, T, typename decltype(gf)::value_type>(x_out_, gf, C::rms_eps, dxf_, dx_, nullptr,
                                                                         scratch_.rms, pool);
    const block_context<C, T> ctx = context();
    const std::span<T> u(lora_u_.data(), n_ * A::rank), du(lora_du_.data(), n_ * A::rank);
    const T scale = static_cast<T>(ad.scale());
    for (std::size_t l = C::layers; l-- > 0;) {
      block_activations<C, T>& a = saved(base, l, ctx, [&](std::size_t m) {
        return lora_block_forward<typename A::layer_type, T>{ad.layers[m], scale, u, pool};
      });
      const lora_block_backward<typename A::layer_type, T> sink{ad.layers[l], grads.layers[l], scale, u, du, pool};
      block_backward(base.layers[l], a, ctx, dx_, scratch_, pool, sink);
      unsave(l);
    }
  }

  // The logits of the last forward: [B * T, V].
  const rows<V, T>& logits() const { return logits_; }

 private:
  static training_options checked(training_options o) {
    if (o.batch == 0 || o.seq == 0) {
      throw error("training: batch " + std::to_string(o.batch) + " x seq " + std::to_string(o.seq) +
                  " holds no tokens; both must be at least 1");
    }
    if (o.seq > C::context) {
      throw capacity_error("training: sequences of " + std::to_string(o.seq) + " tokens exceed the model's context of " +
                           std::to_string(C::context) + "; use a shorter --seq");
    }
    // As in model_options: a qwen2 config's weights keep Hugging Face's q/k row order.
    if constexpr (file_pairing_v<C> != rope_pairing::adjacent) o.pairing = file_pairing_v<C>;
    return o;
  }

  // The forward of both uses: `adapter_of(l)` gives layer l's hook (no_adapter in
  // full training).
  template <class W, class AdapterOf>
  double run_forward(const W& p, std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                     std::span<const std::uint32_t> starts, AdapterOf adapter_of) {
    flush_denormals_guard ftz;
    if (tokens.size() != n_ || targets.size() != n_) {
      throw shape_error("training::forward: " + std::to_string(tokens.size()) + " tokens and " +
                        std::to_string(targets.size()) + " targets for a batch of " + std::to_string(opt_.batch) +
                        " x " + std::to_string(opt_.seq) + " = " + std::to_string(n_) + "; give exactly that many");
    }
    check_starts(starts);
    std::copy(tokens.begin(), tokens.end(), tokens_.begin());
    std::copy(targets.begin(), targets.end(), targets_.begin());
    packed_ = !starts.empty();
    if (packed_) std::copy(starts.begin(), starts.end(), starts_.begin());
    thread_pool* pool = pool_.get();
    auto& x0 = acts_[0].x;
    x0.resize(n_);
    for (std::size_t i = 0; i < n_; ++i) embed(p.token_embd, tokens_[i], x0.row(i));
    const block_context<C, T> ctx = context();
    const kv_in_batch<C, T> kv{opt_.seq};
    for (std::size_t l = 0; l < C::layers; ++l) {
      auto& out = l + 1 < C::layers ? acts_[l + 1].x : x_out_;
      if (opt_.recompute) {
        // The work set takes the layer's input for the forward and gives it back: only
        // the input stays with the layer; the last layer's set stays in work_ (saved()).
        std::swap(work_.x, acts_[l].x);
        block_forward(p.layers[l], work_, out, ctx, kv, pool, adapter_of(l));
        std::swap(work_.x, acts_[l].x);
        work_layer_ = l;
      } else {
        block_forward(p.layers[l], acts_[l], out, ctx, kv, pool, adapter_of(l));
      }
    }
    xf_.resize(n_);
    const auto gf = detail::gain_values(p.output_norm);
    detail::for_rows(pool, n_, [&](std::size_t i) {
      rmsnorm<D, T, typename decltype(gf)::value_type>(x_out_.row(i), gf, C::rms_eps, xf_.row(i));
    });
    matmul(logits_matrix(p), xf_, logits_, pool);
    const double loss = cross_entropy(logits_, std::span<const std::int32_t>(targets_), std::span<T>(lse_), pool);
    if (!std::isfinite(loss)) {
      throw numeric_error("training: the loss is " + std::to_string(loss) +
                          "; the parameters were not changed. Lower the learning rate, enable gradient clipping, or "
                          "check the data and the initial weights");
    }
    forwarded_ = true;
    return loss;
  }

  // Packed starts must describe examples one after another in each sequence: a token's
  // example starts at the token itself or where the token before it's does.
  void check_starts(std::span<const std::uint32_t> starts) const {
    if (starts.empty()) return;
    if (starts.size() != n_) {
      throw shape_error("training::forward: " + std::to_string(starts.size()) + " segment starts for a batch of " +
                        std::to_string(n_) + " tokens; give one per token, or none for unpacked sequences");
    }
    const std::size_t len = opt_.seq;
    for (std::size_t i = 0; i < n_; ++i) {
      const std::size_t t = i % len, s = starts[i];
      if (s != t && (t == 0 || s != starts[i - 1])) {
        throw shape_error("training::forward: token " + std::to_string(t) + " of sequence " + std::to_string(i / len) +
                          " starts its example at " + std::to_string(s) + "; a token's example starts at the token itself or "
                          "where the token before it's does (" + (t ? std::to_string(starts[i - 1]) : std::string("none before")) + ")");
      }
    }
  }

  // Layer l's activations for its backward: its own set, or with recompute the work
  // set holding the layer's input again (taken back by unsave) and the block's forward
  // rerun from it, unless the set is that layer's already (the forward leaves the last
  // layer's there). The rerun's output is not needed: it goes to the scratch's dxn,
  // which block_backward zeroes before its first use.
  template <class W, class AdapterOf>
  block_activations<C, T>& saved(const W& p, std::size_t l, const block_context<C, T>& ctx, AdapterOf adapter_of) {
    if (!opt_.recompute) return acts_[l];
    std::swap(work_.x, acts_[l].x);
    if (work_layer_ != l) {
      block_forward(p.layers[l], work_, scratch_.dxn, ctx, kv_in_batch<C, T>{opt_.seq}, pool_.get(), adapter_of(l));
      work_layer_ = l;
    }
    return work_;
  }
  void unsave(std::size_t l) {
    if (opt_.recompute) std::swap(work_.x, acts_[l].x);
  }

  // dloss · d(loss)/d(logits) into dlogits_, and dxf_ zeroed for the output product's backward.
  void logits_backward(T dloss) {
    if (!forwarded_) throw error("training::backward: call forward() first; backward uses its saved activations");
    thread_pool* pool = pool_.get();
    dlogits_.resize(n_);
    detail::zero_rows(dlogits_, pool);
    cross_entropy_backward(logits_, std::span<const std::int32_t>(targets_), std::span<const T>(lse_), dloss, dlogits_,
                           pool);
    dxf_.resize(n_);
    detail::zero_rows(dxf_, pool);
  }

  // The adapter's [n, r] scratch, grown on the first adapter step (its rank is the
  // adapter's, not the config's), then reused.
  void reserve_lora(std::size_t rank) {
    if (lora_u_.size() < n_ * rank) {
      lora_u_.resize(n_ * rank);
      lora_du_.resize(n_ * rank);
    }
  }

  block_context<C, T> context() const {
    block_context<C, T> ctx{{opt_.batch, opt_.seq, 0}, angles_.data(), opt_.pairing, nullptr};
    if (packed_) ctx.segment_start = starts_.data();
    return ctx;
  }

  training_options opt_;
  std::size_t n_;
  std::unique_ptr<thread_pool> pool_;
  std::array<block_activations<C, T>, C::layers> acts_;  // per layer: its input and what its backward needs (recompute: its input)
  block_activations<C, T> work_;  // recompute: one layer's set at a time (its x is a layer's, swapped in)
  std::size_t work_layer_ = C::layers;  // the layer whose set work_ holds (C::layers: none)
  rows<D, T> x_out_;      // [n, D] output of the last block
  rows<D, T> xf_;         // [n, D] output_norm(x_out)
  rows<V, T> logits_;     // [n, V]
  rows<V, T> dlogits_;    // [n, V]
  rows<D, T> dx_, dxf_;   // [n, D] gradients flowing back through the stream
  block_scratch<C, T> scratch_;
  std::vector<T> lse_;                       // [n] log-sum-exp of each row's logits
  std::vector<std::int32_t> tokens_, targets_;  // [n] the batch of the last forward
  std::vector<std::uint32_t> starts_;        // [n] its segment starts, when packed_
  bool packed_ = false;                      // the last forward packed examples (starts_ holds them)
  std::vector<rope_angles<C, T>> angles_;    // [T] angles of positions 0..T-1
  std::vector<T> lora_u_, lora_du_;          // [n, r] an adapter's low-rank activations and their gradient
  bool forwarded_ = false;
};

}  // namespace tlm
