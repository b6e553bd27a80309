#pragma once
// Rotary position embedding and its backward pass (the inverse rotation).
#include <array>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <span>
#include <type_traits>

#include <tlm/config.hpp>
#include <tlm/heads.hpp>

namespace tlm {

// The unscaled frequency of pair i: theta^(-2i/E) radians per position.
template <LlamaConfig C>
double rope_frequency(std::size_t i, double theta = C::rope_theta) {
  return std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim<C>));
}

// What pair i's frequency is divided by under C's RoPE scaling (config.hpp): 1
// without scaling, `factor` for linear; for llama3 (llama.cpp's and Hugging Face's
// formula) by the pair's wavelength 2π/freq: shorter than original_context /
// high_freq_factor keeps its frequency (divisor 1), longer than original_context /
// low_freq_factor is divided by `factor`, and between the two the inverse divisor
// blends linearly in original_context / wavelength.   [E/2]
//
// For a scaling known at run time (a file's rope_freqs, read by config_match.hpp): the
// same formula, so a config type and a file's description give the same doubles.
inline double rope_divisor(const rope_scaling_params& s, double theta, std::size_t i, std::size_t head_width) {
  if (s.type == rope_scaling_type::none) return 1.0;
  if (s.type == rope_scaling_type::linear) return s.factor;
  const double ctx = static_cast<double>(s.original_context);
  const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_width));
  const double wavelength = 2.0 * std::numbers::pi / freq;
  if (wavelength < ctx / s.high_freq_factor) return 1.0;
  if (wavelength > ctx / s.low_freq_factor) return s.factor;
  const double smooth = (ctx / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return 1.0 / ((1.0 - smooth) / s.factor + smooth);
}

template <LlamaConfig C>
std::array<double, C::half_head> rope_divisors(double theta = C::rope_theta) {
  std::array<double, C::half_head> d{};
  for (std::size_t i = 0; i < C::half_head; ++i) d[i] = rope_divisor(rope_scaling_v<C>, theta, i, head_dim<C>);
  return d;
}

// The rotation angles of one position: pair i turns by pos * theta^(-2i/E) /
// divisor[i] (rope_divisors). Computed in double once per position and shared by
// every head of q and k.
template <LlamaConfig C, class T = float>
struct rope_angles {
  std::array<T, C::half_head> cos{};
  std::array<T, C::half_head> sin{};

  rope_angles() = default;
  explicit rope_angles(std::size_t pos, double theta = C::rope_theta) {
    const std::array<double, C::half_head> divisor = rope_divisors<C>(theta);
    for (std::size_t i = 0; i < C::half_head; ++i) {
      const double freq = rope_frequency<C>(i, theta) / divisor[i];
      const double a = static_cast<double>(pos) * freq;
      cos[i] = static_cast<T>(std::cos(a));
      sin[i] = static_cast<T>(std::sin(a));
    }
  }
};

namespace detail {
// Rotates every head of x in place by +angle (sign = 1) or -angle (sign = -1).
template <LlamaConfig C, class T>
void rotate_heads(T* x, std::size_t n, const rope_angles<C, T>& a, rope_pairing pairing, T sign) {
  for (std::size_t h = 0; h < n / head_dim<C>; ++h) {
    T* head = x + h * head_dim<C>;
    for (std::size_t i = 0; i < C::half_head; ++i) {
      T& u = head[join_pair<C>(pairing, {i, 0})];
      T& v = head[join_pair<C>(pairing, {i, 1})];
      const T u0 = u, v0 = v, s = sign * a.sin[i];
      u = u0 * a.cos[i] - v0 * s;
      v = u0 * s + v0 * a.cos[i];
    }
  }
}
}  // namespace detail

// Rotates every head of x in place.   x: [N] = N / E heads of [E]
template <LlamaConfig C, std::size_t N, class T = float>
  requires(N % head_dim<C> == 0)
void rope(std::type_identity_t<std::span<T, N>> x, const rope_angles<C, T>& a, rope_pairing pairing) {
  detail::rotate_heads<C, T>(x.data(), N, a, pairing, T(1));
}

// RoPE is an in-place rotation, so its backward is in place too: the gradient with
// respect to the rotated x becomes the gradient with respect to x before the
// rotation (rotation by -angle, the transpose of the forward's).   d: [N]
template <LlamaConfig C, std::size_t N, class T = float>
  requires(N % head_dim<C> == 0)
void rope_backward(std::type_identity_t<std::span<T, N>> d, const rope_angles<C, T>& a, rope_pairing pairing) {
  detail::rotate_heads<C, T>(d.data(), N, a, pairing, T(-1));
}

}  // namespace tlm
