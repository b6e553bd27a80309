#pragma once
// The element-wise AdamW update over one tensor at each kernel level, for f32 training:
//
//   g' = g · scale;  p ← p · decay;  m ← β1 m + (1 − β1) g';  v ← β2 v + (1 − β2) g'²
//   p ← p − step_size · m / (√v / √(1 − β2ᵗ) + ε)
//
// A kernel of its own because the plain loop does not vectorize (std::sqrt may set
// errno, which the compiler must keep scalar) and an optimizer step touches every
// parameter four times: at 135M it took as long as a third of the backward pass.
// Each level updates each element by itself, so results do not depend on how a
// tensor is split over threads; levels differ only in rounding (FMA contraction).
#include <tlm/kernels/lanes.hpp>
#include <tlm/kernels/target.hpp>

#include <cmath>
#include <cstddef>

namespace tlm::kernels {

struct adamw_constants {
  float scale;      // clip factor applied to the gradient
  float decay;      // 1 − lr · weight_decay (1 for tensors without decay)
  float beta1, beta2;
  float step_size;  // lr / (1 − β1ᵗ)
  float bc2_sqrt;   // √(1 − β2ᵗ)
  float eps;
};

// The definition: the same arithmetic, one element at a time.
inline void adamw_update_reference(float* p, const float* g, float* m, float* v, std::size_t n,
                                   const adamw_constants& k) {
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * k.scale;
    p[i] *= k.decay;
    m[i] = k.beta1 * m[i] + (1.0f - k.beta1) * gi;
    v[i] = k.beta2 * v[i] + (1.0f - k.beta2) * gi * gi;
    p[i] -= k.step_size * m[i] / (std::sqrt(v[i]) / k.bc2_sqrt + k.eps);
  }
}

#if defined(__x86_64__) || defined(__i386__)
// The levels' kernels: the one formula of adamw_lanes.inc at each vector width.
namespace adamw_avx2 {
using lanes = avx2_lanes;
#define TLM_LANES_FN TLM_AVX2_FN
#include <tlm/kernels/adamw_lanes.inc>
#undef TLM_LANES_FN
}  // namespace adamw_avx2

namespace adamw_avx512 {
using lanes = avx512_lanes;
#define TLM_LANES_FN TLM_AVX512_FN
#include <tlm/kernels/adamw_lanes.inc>
#undef TLM_LANES_FN
}  // namespace adamw_avx512
#endif

}  // namespace tlm::kernels
