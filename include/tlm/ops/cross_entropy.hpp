#pragma once
// Cross-entropy over the vocabulary, averaged over the positions that count.
//
//   loss = (1 / n_counted) Σ_{i counted} (lse(z_i) − z_i[y_i])
//   dz_i = (softmax(z_i) − onehot(y_i)) / n_counted      for counted rows, 0 otherwise
//
// A target of `ignore_target` marks a position that carries no loss (prompt tokens
// in supervised fine-tuning, padding). The log-sum-exp subtracts the row maximum
// first, so no logit overflows.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <tlm/error.hpp>
#include <tlm/kernels.hpp>
#include <tlm/kernels/attention.hpp>
#include <tlm/shape.hpp>
#include <tlm/thread_pool.hpp>

namespace tlm {

inline constexpr std::int32_t ignore_target = -1;

namespace detail {
inline std::size_t counted_targets(std::span<const std::int32_t> targets, std::size_t rows_n, std::size_t vocab) {
  if (targets.size() != rows_n) {
    throw shape_error("cross_entropy: " + std::to_string(targets.size()) + " targets for " + std::to_string(rows_n) +
                      " rows of logits; give one target per row (" + std::to_string(ignore_target) + " to ignore it)");
  }
  std::size_t n = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const std::int32_t t = targets[i];
    if (t == ignore_target) continue;
    if (t < 0 || static_cast<std::size_t>(t) >= vocab) {
      throw error("cross_entropy: target " + std::to_string(t) + " at row " + std::to_string(i) +
                  " is outside the vocabulary of " + std::to_string(vocab) + " (use " + std::to_string(ignore_target) +
                  " for a position without loss)");
    }
    ++n;
  }
  return n;
}

// Calls each(p, j0, len) with p[j] = exp(z[j0 + j] - m) for consecutive pieces of
// z [n]: through the attention exp kernel for float (the SIMD levels' polynomial,
// within 1.014 ulp of exp; kernels/attention_scalar.hpp), std::exp for double. A
// row of logits is 49,152 exps at SmolLM2's vocabulary, and libm's scalar expf was
// 7% of a LoRA step.
template <class T, class Each>
void exp_pieces(const T* z, std::size_t n, T m, Each&& each) {
  constexpr std::size_t piece = 1024;
  T p[piece];  // [piece]
  for (std::size_t j0 = 0; j0 < n; j0 += piece) {
    const std::size_t len = std::min(piece, n - j0);
    if constexpr (std::same_as<T, float>) {
      kernels::attention().exp(z + j0, len, 1.0f, m, p);
    } else {
      for (std::size_t j = 0; j < len; ++j) p[j] = std::exp(z[j0 + j] - m);
    }
    each(static_cast<const T*>(p), j0, len);
  }
}
}  // namespace detail

// Returns the mean loss over counted rows (0 when none counts) and leaves each
// row's log-sum-exp in lse [n] for the backward.   logits: [n, V]
template <std::size_t V, class T>
double cross_entropy(const rows<V, T>& logits, std::span<const std::int32_t> targets, std::span<T> lse,
                     thread_pool* pool = nullptr) {
  const std::size_t n = logits.count();
  const std::size_t counted = detail::counted_targets(targets, n, V);
  if (lse.size() < n) throw shape_error("cross_entropy: the log-sum-exp buffer holds fewer values than there are rows");
  auto body = [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      const T* z = logits.data() + i * V;
      T top = z[0];
      for (std::size_t j = 1; j < V; ++j) top = z[j] > top ? z[j] : top;
      // exp in T (every term is at most 1), the sum in double.
      double sum = 0.0;
      detail::exp_pieces(z, V, top, [&](const T* p, std::size_t, std::size_t len) {
        for (std::size_t j = 0; j < len; ++j) sum += static_cast<double>(p[j]);
      });
      lse[i] = static_cast<T>(static_cast<double>(top) + std::log(sum));
    }
  };
  if (pool) pool->parallel_for(n, 1, body);
  else body(0, n);
  // Summed in row order on one thread: the loss does not depend on the thread count.
  double loss = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    if (targets[i] != ignore_target)
      loss += static_cast<double>(lse[i]) - static_cast<double>(logits.data()[i * V + static_cast<std::size_t>(targets[i])]);
  return counted ? loss / static_cast<double>(counted) : 0.0;
}

// dlogits += dloss · (softmax(z) − onehot(y)) / n_counted on counted rows.
// The forward's inputs (logits, targets) and its saved lse, the loss's gradient
// dloss (1 for the loss itself), then the logits' gradient.   logits, dlogits: [n, V]
template <std::size_t V, class T>
void cross_entropy_backward(const rows<V, T>& logits, std::span<const std::int32_t> targets, std::span<const T> lse,
                            T dloss, rows<V, T>& dlogits, thread_pool* pool = nullptr) {
  const std::size_t n = logits.count();
  const std::size_t counted = detail::counted_targets(targets, n, V);
  if (dlogits.count() != n) throw shape_error("cross_entropy_backward: dlogits has another row count than logits");
  if (counted == 0) return;
  const T scale = dloss / static_cast<T>(counted);
  auto body = [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      if (targets[i] == ignore_target) continue;
      const T* z = logits.data() + i * V;
      T* dz = dlogits.data() + i * V;
      detail::exp_pieces(z, V, lse[i], [&](const T* p, std::size_t j0, std::size_t len) {
        if constexpr (std::same_as<T, float>) {
          kernels::axpy(scale, p, dz + j0, len);
        } else {
          for (std::size_t j = 0; j < len; ++j) dz[j0 + j] += scale * p[j];
        }
      });
      dz[static_cast<std::size_t>(targets[i])] -= scale;
    }
  };
  if (pool) pool->parallel_for(n, 1, body);
  else body(0, n);
}

}  // namespace tlm
