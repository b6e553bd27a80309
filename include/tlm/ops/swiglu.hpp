#pragma once
// SwiGLU and its backward pass: h = silu(a) ⊙ b, silu(a) = a σ(a).
//
// For float both go to the active level's kernels (kernels/attention_scalar.hpp:
// swiglu, swiglu_backward; the SIMD levels' exp_poly instead of libm's expf, which was
// most of their time: 47 million exps a SmolLM2-135M training step). Double (the
// gradient checks) runs the scalar level's definitions, with std::exp.
#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

#include <tlm/kernels/attention.hpp>

namespace tlm {

// out = silu(gate) * up.   gate, up, out: [F]; out may alias gate or up.
template <std::size_t F, class T = float>
void swiglu(std::type_identity_t<std::span<const T, F>> gate, std::type_identity_t<std::span<const T, F>> up,
            std::type_identity_t<std::span<T, F>> out) {
  if constexpr (std::same_as<T, float>) kernels::attention().swiglu(gate.data(), up.data(), out.data(), F);
  else kernels::detail::swiglu_definition(gate.data(), up.data(), out.data(), F);
}

// dgate += dh ⊙ b ⊙ silu'(a),  dup += dh ⊙ silu(a),  silu'(a) = σ(a)(1 + a(1 − σ(a))).   all [F]
template <std::size_t F, class T = float>
void swiglu_backward(std::type_identity_t<std::span<const T, F>> gate, std::type_identity_t<std::span<const T, F>> up,
                     std::type_identity_t<std::span<const T, F>> dh, std::type_identity_t<std::span<T, F>> dgate,
                     std::type_identity_t<std::span<T, F>> dup) {
  if constexpr (std::same_as<T, float>)
    kernels::attention().swiglu_backward(gate.data(), up.data(), dh.data(), dgate.data(), dup.data(), F);
  else kernels::detail::swiglu_backward_definition(gate.data(), up.data(), dh.data(), dgate.data(), dup.data(), F);
}

}  // namespace tlm
