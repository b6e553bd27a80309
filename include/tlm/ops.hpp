#pragma once
// The operations of a Llama block, each in ops/ next to its backward pass:
//   ops/rmsnorm.hpp        rmsnorm, rmsnorm_backward
//   ops/rope.hpp           rope_angles, rope, rope_backward
//   ops/attention.hpp      attend (reference), attention_heads / attention_row, attention_backward
//   ops/swiglu.hpp         swiglu, swiglu_backward
//   ops/cross_entropy.hpp  cross_entropy, cross_entropy_backward
//   ops/embedding.hpp      embed, embed_backward
//   linalg.hpp             matvec, matmul, matmul_backward
// Each takes spans whose extents come from the config, so a call with the wrong
// widths does not compile; loops run over run-time sizes. Backward functions take
// the forward's inputs, then the output's gradient, then the inputs' gradients,
// into which they accumulate with +=.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include <tlm/ops/attention.hpp>
#include <tlm/ops/cross_entropy.hpp>
#include <tlm/ops/embedding.hpp>
#include <tlm/ops/rmsnorm.hpp>
#include <tlm/ops/rope.hpp>
#include <tlm/ops/swiglu.hpp>

namespace tlm {

// x += d (a residual add; its backward passes the gradient to both sides).   x, d: [N]
template <std::size_t N, class T = float>
void add_to(std::type_identity_t<std::span<T, N>> x, std::type_identity_t<std::span<const T, N>> d) {
  for (std::size_t i = 0; i < N; ++i) x[i] += d[i];
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
