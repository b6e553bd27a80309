#pragma once
// Rotary position embedding and its backward pass (the inverse rotation).
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>

#include "../config.hpp"
#include "../heads.hpp"

namespace tlm {

// The rotation angles of one position: pair i turns by pos * theta^(-2i/E).
// Computed in double once per position and shared by every head of q and k.
template <LlamaConfig C, class T = float>
struct rope_angles {
  std::array<T, C::half_head> cos{};
  std::array<T, C::half_head> sin{};

  rope_angles() = default;
  explicit rope_angles(std::size_t pos, double theta = C::rope_theta) {
    for (std::size_t i = 0; i < C::half_head; ++i) {
      const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim<C>));
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
