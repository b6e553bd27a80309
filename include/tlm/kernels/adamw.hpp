#pragma once
// The element-wise AdamW update over one tensor, for f32 training:
//
//   g' = g · scale;  p ← p · decay;  m ← β1 m + (1 − β1) g';  v ← β2 v + (1 − β2) g'²
//   p ← p − step_size · m / (√v / √(1 − β2ᵗ) + ε)
//
// A kernel of its own because the plain loop does not vectorize (std::sqrt may set
// errno, which the compiler must keep scalar) and an optimizer step touches every
// parameter four times: at 135M it took as long as a third of the backward pass.
// Each level updates each element by itself, so results do not depend on how a
// tensor is split over threads; levels differ only in rounding (FMA contraction).
#include <tlm/kernels.hpp>

#include <cmath>
#include <cstddef>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

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
[[gnu::target("avx2,fma")]] inline void adamw_update_avx2(float* p, const float* g, float* m, float* v, std::size_t n,
                                                          const adamw_constants& k) {
  const __m256 scale = _mm256_set1_ps(k.scale), decay = _mm256_set1_ps(k.decay), b1 = _mm256_set1_ps(k.beta1),
               c1 = _mm256_set1_ps(1.0f - k.beta1), b2 = _mm256_set1_ps(k.beta2),
               c2 = _mm256_set1_ps(1.0f - k.beta2), step = _mm256_set1_ps(k.step_size),
               bc2 = _mm256_set1_ps(k.bc2_sqrt), eps = _mm256_set1_ps(k.eps);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), scale);
    const __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(c1, gi));
    const __m256 vi = _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
    const __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_div_ps(_mm256_mul_ps(step, mi), den)));
  }
  adamw_update_reference(p + i, g + i, m + i, v + i, n - i, k);
}

[[gnu::target("avx512f,avx2,fma")]] inline void adamw_update_avx512(float* p, const float* g, float* m, float* v,
                                                                    std::size_t n, const adamw_constants& k) {
  const __m512 scale = _mm512_set1_ps(k.scale), decay = _mm512_set1_ps(k.decay), b1 = _mm512_set1_ps(k.beta1),
               c1 = _mm512_set1_ps(1.0f - k.beta1), b2 = _mm512_set1_ps(k.beta2),
               c2 = _mm512_set1_ps(1.0f - k.beta2), step = _mm512_set1_ps(k.step_size),
               bc2 = _mm512_set1_ps(k.bc2_sqrt), eps = _mm512_set1_ps(k.eps);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), scale);
    const __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
    const __m512 mi = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(c1, gi));
    const __m512 vi = _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
    // The zero-masked form: GCC 12 warns falsely ("may be used uninitialized") about
    // the undefined pass-through vector inside the unmasked _mm512_sqrt_ps.
    const __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_maskz_sqrt_ps(0xffff, vi), bc2), eps);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_div_ps(_mm512_mul_ps(step, mi), den)));
  }
  adamw_update_reference(p + i, g + i, m + i, v + i, n - i, k);
}
#endif

// The update at the active kernel level.
inline void adamw_update(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k) {
#if defined(__x86_64__) || defined(__i386__)
  switch (active_kernel_level()) {
    case kernel_level::avx512: return adamw_update_avx512(p, g, m, v, n, k);
    case kernel_level::avx2: return adamw_update_avx2(p, g, m, v, n, k);
    case kernel_level::scalar: break;
  }
#endif
  adamw_update_reference(p, g, m, v, n, k);
}

}  // namespace tlm::kernels
