#pragma once
// RMSNorm and its backward pass.
//
//   y = g ⊙ x · r,  r = 1 / sqrt(mean(x²) + eps)              x, g, y: [N]
//
// The backward recomputes r from x with the same tree sum as the forward, so the
// two agree to the bit and nothing but x has to be saved.
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>

namespace tlm {

// Sum of squares as a pairwise (tree) sum: its rounding error grows with log n
// rather than n, which matters for wide rows with mixed scales.
template <class T>
T sum_squares(const T* x, std::size_t n) {
  if (n <= 16) {
    T s = 0;
    for (std::size_t i = 0; i < n; ++i) s += x[i] * x[i];
    return s;
  }
  const std::size_t half = n / 2;
  return sum_squares(x, half) + sum_squares(x + half, n - half);
}

// r = 1 / sqrt(mean(x²) + eps), with the mean and the root taken in double.
template <class T>
T rms_scale(const T* x, std::size_t n, double eps) {
  const double mean = static_cast<double>(sum_squares(x, n)) / static_cast<double>(n);
  return static_cast<T>(1.0 / std::sqrt(mean + eps));
}

// out = x · r · gain.   x, gain, out: [N]. Returns r.
// T (the activations) and G (the gain: f32 from a file, or a trainable T) default to
// float and are not deduced, so a call with vec or array arguments picks float.
template <std::size_t N, class T = float, class G = float>
T rmsnorm(std::type_identity_t<std::span<const T, N>> x, std::type_identity_t<std::span<const G, N>> gain, float eps,
          std::type_identity_t<std::span<T, N>> out) {
  const T scale = rms_scale(x.data(), N, static_cast<double>(eps));
  for (std::size_t i = 0; i < N; ++i) out[i] = x[i] * scale * static_cast<T>(gain[i]);
  return scale;
}

// The forward's inputs (x, gain, eps), the output's gradient dy, then the inputs'
// gradients, accumulated:  dgain += dy ⊙ x · r;  with u = dy ⊙ g:
//   dx += r · u − x · r³ · (u · x) / N.                     all [N]
// Returns r, for a caller that sums dgain over many rows itself.
template <std::size_t N, class T = float, class G = float>
T rmsnorm_backward(std::type_identity_t<std::span<const T, N>> x, std::type_identity_t<std::span<const G, N>> gain,
                      float eps, std::type_identity_t<std::span<const T, N>> dy, std::type_identity_t<std::span<T, N>> dx,
                      T* dgain) {
  const T r = rms_scale(x.data(), N, static_cast<double>(eps));
  // u·x accumulates in double: it is a sum of N products of mixed sign.
  double ux = 0.0;
  for (std::size_t i = 0; i < N; ++i) ux += static_cast<double>(dy[i] * static_cast<T>(gain[i])) * static_cast<double>(x[i]);
  const T c = static_cast<T>(static_cast<double>(r) * static_cast<double>(r) * static_cast<double>(r) * ux /
                             static_cast<double>(N));
  for (std::size_t i = 0; i < N; ++i) {
    const T u = dy[i] * static_cast<T>(gain[i]);
    dx[i] += r * u - x[i] * c;
  }
  if (dgain != nullptr)
    for (std::size_t i = 0; i < N; ++i) dgain[i] += dy[i] * x[i] * r;
  return r;
}

}  // namespace tlm
