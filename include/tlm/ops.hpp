#pragma once
// The operations of a Llama block on f32 activations. Each takes spans whose
// extents come from the config, so a call with the wrong widths does not compile;
// loops run over run-time sizes.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "config.hpp"
#include "heads.hpp"

namespace tlm {

// Sum of squares as a pairwise (tree) sum: its rounding error grows with log n
// rather than n, which matters for wide rows with mixed scales.
inline float sum_squares(const float* x, std::size_t n) {
  if (n <= 16) {
    float s = 0.0f;
    for (std::size_t i = 0; i < n; ++i) s += x[i] * x[i];
    return s;
  }
  const std::size_t half = n / 2;
  return sum_squares(x, half) + sum_squares(x + half, n - half);
}

// out = x / sqrt(mean(x^2) + eps) * gain.   x, gain, out: [N]
template <std::size_t N>
void rmsnorm(std::span<const float, N> x, std::span<const float, N> gain, float eps, std::span<float, N> out) {
  const double mean = static_cast<double>(sum_squares(x.data(), N)) / static_cast<double>(N);
  const float scale = static_cast<float>(1.0 / std::sqrt(mean + static_cast<double>(eps)));
  for (std::size_t i = 0; i < N; ++i) out[i] = x[i] * scale * gain[i];
}

// The rotation angles of one position: pair i turns by pos * theta^(-2i/E).
// Computed in double once per position and shared by every head of q and k.
template <LlamaConfig C>
struct rope_angles {
  std::array<float, C::half_head> cos{};
  std::array<float, C::half_head> sin{};

  explicit rope_angles(std::size_t pos, double theta = C::rope_theta) {
    for (std::size_t i = 0; i < C::half_head; ++i) {
      const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim<C>));
      const double a = static_cast<double>(pos) * freq;
      cos[i] = static_cast<float>(std::cos(a));
      sin[i] = static_cast<float>(std::sin(a));
    }
  }
};

// Rotates every head of x in place.   x: [N] = N / E heads of [E]
template <LlamaConfig C, std::size_t N>
  requires(N % head_dim<C> == 0)
void rope(std::span<float, N> x, const rope_angles<C>& a, rope_pairing pairing) {
  for (std::size_t h = 0; h < N / head_dim<C>; ++h) {
    float* head = x.data() + h * head_dim<C>;
    for (std::size_t i = 0; i < C::half_head; ++i) {
      float& u = head[join_pair<C>(pairing, {i, 0})];
      float& v = head[join_pair<C>(pairing, {i, 1})];
      const float u0 = u, v0 = v;
      u = u0 * a.cos[i] - v0 * a.sin[i];
      v = u0 * a.sin[i] + v0 * a.cos[i];
    }
  }
}

// Causal attention of one query head over the T positions of its kv head.
//   q: [E]   keys, values: [T, E]   scores: scratch of at least T   out: [E]
// Softmax subtracts the maximum first, so large scores cannot overflow.
template <LlamaConfig C>
void attend(std::span<const float, head_dim<C>> q, std::span<const float> keys, std::span<const float> values,
            std::span<float> scores, std::span<float, head_dim<C>> out) {
  constexpr std::size_t E = head_dim<C>;
  const std::size_t T = keys.size() / E;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(E)));
  float top = -INFINITY;
  for (std::size_t t = 0; t < T; ++t) {
    const float* k = keys.data() + t * E;
    float s = 0.0f;
    for (std::size_t e = 0; e < E; ++e) s += q[e] * k[e];
    scores[t] = s * scale;
    top = std::max(top, scores[t]);
  }
  double total = 0.0;
  for (std::size_t t = 0; t < T; ++t) {
    scores[t] = std::exp(scores[t] - top);
    total += scores[t];
  }
  const float inv = static_cast<float>(1.0 / total);
  std::fill(out.begin(), out.end(), 0.0f);
  for (std::size_t t = 0; t < T; ++t) {
    const float p = scores[t] * inv;
    scores[t] = p;  // leave the probabilities behind for tracing
    const float* v = values.data() + t * E;
    for (std::size_t e = 0; e < E; ++e) out[e] += p * v[e];
  }
}

// SwiGLU: out = silu(gate) * up.   gate, up, out: [F]
template <std::size_t F>
void swiglu(std::span<const float, F> gate, std::span<const float, F> up, std::span<float, F> out) {
  for (std::size_t i = 0; i < F; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

// x += d.   x, d: [N]
template <std::size_t N>
void add_to(std::span<float, N> x, std::span<const float, N> d) {
  for (std::size_t i = 0; i < N; ++i) x[i] += d[i];
}

// Shannon entropy (nats) of a probability vector; used by the traced forward.
inline double entropy(std::span<const float> p) {
  double h = 0.0;
  for (float v : p)
    if (v > 0.0f) h -= static_cast<double>(v) * std::log(static_cast<double>(v));
  return h;
}

// Entropy (nats) and maximum of the softmax of logits, without storing it.
inline std::pair<double, float> logit_entropy(std::span<const float> logits) {
  const float top = *std::max_element(logits.begin(), logits.end());
  double z = 0.0, weighted = 0.0;
  for (float l : logits) {
    const double d = static_cast<double>(l) - top;
    const double e = std::exp(d);
    z += e;
    weighted += e * d;
  }
  return {std::log(z) - weighted / z, top};
}

}  // namespace tlm
