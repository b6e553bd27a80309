#pragma once
// AdamW as torch.optim.AdamW computes it, with a warm-up + cosine learning-rate
// schedule and clipping by the global gradient norm. One step is one walk over
// parameters, gradients and the two moments in lockstep.
//
// For step t = 1, 2, ... with learning rate η_t:
//   g ← g · min(1, clip / ‖g‖₂)                    (clip > 0; ‖g‖ over every tensor)
//   p ← p (1 − η_t λ)                              (decoupled decay; matrices only)
//   m ← β1 m + (1 − β1) g;   v ← β2 v + (1 − β2) g²
//   p ← p − (η_t / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + ε)
//
// Weight decay is not applied to the norm gains (the 1-D tensors): decaying a gain
// towards 0 would shrink the normalized activations, not regularize. Embeddings and
// the output matrix are decayed like every other matrix.
//
// A NaN or infinity in any gradient is an error naming the tensor and the step,
// raised before anything changes: parameters, moments and the step count stay as
// they were.
#include <cmath>
#include <cstddef>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include <tlm/error.hpp>
#include <tlm/kernels/adamw.hpp>
#include <tlm/thread_pool.hpp>
#include <tlm/train/weights.hpp>
#include <tlm/weights.hpp>

namespace tlm {

struct adamw_options {
  double lr = 1e-3;            // peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;   // decoupled (AdamW); torch's default is 0.01
  double clip = 0.0;           // global gradient-norm clip; 0 turns it off
  std::size_t warmup = 0;      // steps of linear warm-up from 0 to lr
  std::size_t total_steps = 0; // cosine decay from lr to min_lr ends here; 0: constant after warm-up
  double min_lr = 0.0;
};

// The learning rate of step t (1-based): lr·t/warmup during warm-up, then a cosine from
// lr towards min_lr over the remaining steps. Step t after warm-up uses progress
// (t − warmup − 1) / (total_steps − warmup): the first step after warm-up (step 1 with
// no warm-up) runs at the peak, and the last step, total_steps, still runs above min_lr
// (the cosine would reach min_lr one step later, which is never taken); a step at
// min_lr or at a fraction of the peak wastes the step. Beyond total_steps: min_lr.
inline double learning_rate(const adamw_options& o, std::size_t t) {
  if (o.warmup > 0 && t <= o.warmup) return o.lr * static_cast<double>(t) / static_cast<double>(o.warmup);
  if (o.total_steps == 0 || o.total_steps <= o.warmup) return o.lr;
  if (t > o.total_steps) return o.min_lr;
  const double progress = static_cast<double>(t - o.warmup - 1) / static_cast<double>(o.total_steps - o.warmup);
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

// What a step did, for logs.
struct adamw_report {
  std::size_t step = 0;
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  double clip_scale = 1.0; // the factor gradients were multiplied by
};

namespace detail {
inline std::string option_problem(const adamw_options& o) {
  auto bad = [](double x) { return !std::isfinite(x); };
  if (bad(o.lr) || o.lr < 0) return "lr must be a finite number >= 0";
  if (bad(o.beta1) || o.beta1 < 0 || o.beta1 >= 1) return "beta1 must be in [0, 1)";
  if (bad(o.beta2) || o.beta2 < 0 || o.beta2 >= 1) return "beta2 must be in [0, 1)";
  if (bad(o.eps) || o.eps <= 0) return "eps must be a finite number > 0";
  if (bad(o.weight_decay) || o.weight_decay < 0) return "weight_decay must be a finite number >= 0";
  if (bad(o.clip) || o.clip < 0) return "clip must be a finite number >= 0 (0 turns clipping off)";
  if (bad(o.min_lr) || o.min_lr < 0 || o.min_lr > o.lr) return "min_lr must be in [0, lr]";
  return {};
}
}  // namespace detail

// AdamW's state for parameters of type W: the moments m and v (of W's type, so of
// its config and shapes) and the number of steps taken.
template <class W>
  requires trainable_weights<W>
class adamw {
 public:
  using weights_type = W;

  explicit adamw(adamw_options o) : opt_(o), m_(std::make_unique<W>()), v_(std::make_unique<W>()) {
    if (auto p = detail::option_problem(o); !p.empty()) throw error("adamw: " + p);
  }

  const adamw_options& options() const { return opt_; }
  std::size_t steps() const { return t_; }
  W& m() { return *m_; }
  W& v() { return *v_; }
  const W& m() const { return *m_; }
  const W& v() const { return *v_; }
  // For resuming from a checkpoint that stored the moments and the step count.
  void set_steps(std::size_t t) { t_ = t; }

  // One update of params from grads (grads are not changed), split over `pool`'s
  // threads when one is given. Results do not depend on the pool: every element is
  // updated by itself, and the gradient norm sums fixed chunks in a fixed order.
  template <class P, class G>
    requires moments_of<W, P> && gradient_of<G, P>
  adamw_report step(P& params, const G& grads, thread_pool* pool = nullptr) {
    using T = storage_value_t<typename W::storage>;
    // v holds squared gradients: tiny ones turn denormal, and x86 is slow on those.
    flush_denormals_guard ftz;
    const std::size_t t = t_ + 1;
    // Checked before anything changes, so a bad step leaves everything as it was.
    double sum_sq = 0.0;
    for_each_tensor(
        [&](const tensor_name& name, const auto& g) {
          const auto vals = g.values();
          const std::size_t chunks = (vals.size() + norm_chunk - 1) / norm_chunk;
          if (partial_.size() < chunks) partial_.resize(chunks);  // once, on the first step
          auto body = [&](std::size_t c0, std::size_t c1) {
            for (std::size_t c = c0; c < c1; ++c) {
              const std::size_t b = c * norm_chunk, e = std::min(vals.size(), b + norm_chunk);
              // Four accumulators: independent additions pipeline; a non-finite value
              // poisons the sum, which is how it is found without a test per element.
              double a[4] = {0, 0, 0, 0};
              std::size_t i = b;
              for (; i + 4 <= e; i += 4)
                for (std::size_t k = 0; k < 4; ++k) a[k] += static_cast<double>(vals[i + k]) * vals[i + k];
              for (; i < e; ++i) a[0] += static_cast<double>(vals[i]) * vals[i];
              partial_[c] = (a[0] + a[1]) + (a[2] + a[3]);
            }
          };
          if (pool) pool->parallel_for(chunks, 1, body);
          else body(0, chunks);
          for (std::size_t c = 0; c < chunks; ++c) {
            if (!std::isfinite(partial_[c])) {
              std::size_t i = c * norm_chunk;
              while (i < vals.size() && std::isfinite(static_cast<double>(vals[i]))) ++i;
              const double x = i < vals.size() ? static_cast<double>(vals[i]) : partial_[c];
              throw numeric_error("adamw step " + std::to_string(t) + ": the gradient of " + name.str() + " holds " +
                                  (std::isnan(x) ? std::string("a NaN") : std::string("an infinity")) +
                                  (i < vals.size() ? " at index " + std::to_string(i) : std::string(" (overflow)")) +
                                  "; no parameter was changed. Lower the learning rate, enable clipping, or check "
                                  "the data");
            }
            sum_sq += partial_[c];
          }
        },
        grads);
    adamw_report r;
    r.step = t;
    r.lr = learning_rate(opt_, t);
    r.grad_norm = std::sqrt(sum_sq);
    if (opt_.clip > 0 && r.grad_norm > opt_.clip) r.clip_scale = opt_.clip / (r.grad_norm + 1e-6);
    const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(t));
    const T step_size = static_cast<T>(r.lr / bc1);
    const T bc2_sqrt = static_cast<T>(std::sqrt(bc2));
    const T b1 = static_cast<T>(opt_.beta1), b2 = static_cast<T>(opt_.beta2), eps = static_cast<T>(opt_.eps);
    const T scale = static_cast<T>(r.clip_scale);
    const T decay = static_cast<T>(1.0 - r.lr * opt_.weight_decay);
    for_each_tensor(
        [&](const tensor_name&, auto& p, const auto& g, auto& m, auto& v) {
          using U = std::remove_cvref_t<decltype(p)>;
          const bool decayed = U::rank == 2 && opt_.weight_decay != 0.0;
          T* pp = p.data();
          const T* gg = g.data();
          T* mm = m.data();
          T* vv = v.data();
          auto body = [&](std::size_t b, std::size_t e) {
            if constexpr (std::same_as<T, float>) {
              const kernels::adamw_constants k{scale, decayed ? decay : 1.0f, b1, b2, step_size, bc2_sqrt, eps};
              kernels::adamw_update(pp + b, gg + b, mm + b, vv + b, e - b, k);
            } else {
              for (std::size_t i = b; i < e; ++i) {
                const T gi = gg[i] * scale;
                if (decayed) pp[i] *= decay;
                mm[i] = b1 * mm[i] + (T(1) - b1) * gi;
                vv[i] = b2 * vv[i] + (T(1) - b2) * gi * gi;
                pp[i] -= step_size * mm[i] / (std::sqrt(vv[i]) / bc2_sqrt + eps);
              }
            }
          };
          const std::size_t n = U::rows * U::cols;
          if (pool) pool->parallel_for(n, 16384, body);
          else body(0, n);
        },
        params, grads, *m_, *v_);
    t_ = t;
    return r;
  }

 private:
  static constexpr std::size_t norm_chunk = 1 << 16;

  adamw_options opt_;
  std::unique_ptr<W> m_, v_;
  std::size_t t_ = 0;
  std::vector<double> partial_;  // [chunks of the largest tensor] partial sums of squares
};

}  // namespace tlm
