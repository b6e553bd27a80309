#pragma once
// SwiGLU and its backward pass: h = silu(a) ⊙ b, silu(a) = a σ(a).
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>

namespace tlm {

// out = silu(gate) * up.   gate, up, out: [F]; out may alias gate or up.
template <std::size_t F, class T = float>
void swiglu(std::type_identity_t<std::span<const T, F>> gate, std::type_identity_t<std::span<const T, F>> up,
            std::type_identity_t<std::span<T, F>> out) {
  for (std::size_t i = 0; i < F; ++i) {
    const T g = gate[i];
    out[i] = g / (T(1) + std::exp(-g)) * up[i];
  }
}

// dgate += dh ⊙ b ⊙ silu'(a),  dup += dh ⊙ silu(a),  silu'(a) = σ(a)(1 + a(1 − σ(a))).   all [F]
template <std::size_t F, class T = float>
void swiglu_backward(std::type_identity_t<std::span<const T, F>> gate, std::type_identity_t<std::span<const T, F>> up,
                     std::type_identity_t<std::span<const T, F>> dh, std::type_identity_t<std::span<T, F>> dgate,
                     std::type_identity_t<std::span<T, F>> dup) {
  for (std::size_t i = 0; i < F; ++i) {
    const T a = gate[i];
    const T sig = T(1) / (T(1) + std::exp(-a));
    dgate[i] += dh[i] * up[i] * sig * (T(1) + a * (T(1) - sig));
    dup[i] += dh[i] * a * sig;
  }
}

}  // namespace tlm
