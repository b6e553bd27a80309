#pragma once
// The attention kernels (attention_scalar.hpp) with AVX2 and FMA. As in avx2.hpp each
// function carries its own target attribute; kernels/table.hpp installs them only on CPUs
// that have the instructions.
//
// Scores: 8 keys at a time, each key's products summed in its own accumulator, then
// one transposing reduction (hadd tree) turns the 8 accumulators into the 8 scores;
// a per-key horizontal sum would cost as much as the key's multiplies. Accumulate:
// the output held in registers (up to 32 floats per pass over the keys), two sets
// of accumulators for even and odd keys, so FMA latency does not serialize the keys.
// Heads whose size is not a multiple of 8 go to the scalar kernels (every Llama head
// is 64 or 128).
#include <tlm/kernels/attention_scalar.hpp>
#include <tlm/kernels/lanes.hpp>
#include <tlm/kernels/target.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tlm::kernels::attention_avx2 {

using lanes = avx2_lanes;

// Lane j of the result is the sum of the 8 lanes of a[j].
TLM_AVX2_INLINE inline __m256 reduce8(const __m256 (&a)[8]) {
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 g0 = _mm256_hadd_ps(h01, h23), g1 = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

// Lanes [0, m) of v to p.
TLM_AVX2_INLINE inline void store_first(float* p, __m256 v, std::size_t m) {
  if (m == 8) {
    _mm256_storeu_ps(p, v);
  } else {
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    std::copy_n(t, m, p);
  }
}

// One group of up to 8 keys: the rows past m repeat the last one (loads stay inside
// the block) and their scores are not stored.
template <class Elem>
TLM_AVX2_INLINE inline __m256 group_dots(const float* q, const Elem* rows, std::size_t stride, std::size_t m,
                                              std::size_t E) {
  // The 8 keys' sums advance together, 8 values at a time, so that their chains of
  // multiply-adds overlap; a loop over keys, each key's chain inside, waited on the key
  // before (with the accumulators kept in registers, decode attention here became
  // 1.1-1.4x faster: bench/results/attention-decode-xeon.md).
  const Elem* r[8];
  for (std::size_t jj = 0; jj < 8; ++jj) r[jj] = rows + std::min(jj, m - 1) * stride;
  __m256 acc[8];
#pragma GCC unroll 8
  for (std::size_t jj = 0; jj < 8; ++jj) acc[jj] = _mm256_setzero_ps();
  for (std::size_t e = 0; e < E; e += 8) {
    const __m256 qv = _mm256_loadu_ps(q + e);
#pragma GCC unroll 8
    for (std::size_t jj = 0; jj < 8; ++jj) acc[jj] = _mm256_fmadd_ps(qv, lanes::load(r[jj] + e), acc[jj]);
  }
  return reduce8(acc);
}

TLM_AVX2_FN inline void scores(const float* q, const float* keys, std::size_t stride, std::size_t n,
                                    std::size_t E, float scale, float* s) {
  if (E % 8 != 0) return detail::attention_scores_scalar(q, keys, stride, n, E, scale, s);
  const __m256 vs = _mm256_set1_ps(scale);
  for (std::size_t j0 = 0; j0 < n; j0 += 8) {
    const std::size_t m = std::min<std::size_t>(8, n - j0);
    const __m256 d = group_dots(q, keys + j0 * stride, stride, m, E);
    store_first(s + j0, _mm256_mul_ps(d, vs), m);
  }
}

TLM_AVX2_FN inline void scores_q8(const float* q, const std::int8_t* codes, const float* key_scales,
                                       std::size_t n, std::size_t E, float scale, float* s) {
  if (E % 8 != 0) return detail::attention_scores_q8_scalar(q, codes, key_scales, n, E, scale, s);
  const __m256 vs = _mm256_set1_ps(scale);
  for (std::size_t j0 = 0; j0 < n; j0 += 8) {
    const std::size_t m = std::min<std::size_t>(8, n - j0);
    const __m256 d = group_dots(q, codes + j0 * E, E, m, E);
    alignas(32) float ks[8] = {};
    std::copy_n(key_scales + j0, m, ks);
    store_first(s + j0, _mm256_mul_ps(d, _mm256_mul_ps(_mm256_load_ps(ks), vs)), m);
  }
}

// exp_poly on 8 lanes: the same operations in the same order.
TLM_AVX2_INLINE inline __m256 exp8(__m256 x) {
  namespace k = exp_constants;
  const __m256 xc = _mm256_min_ps(_mm256_set1_ps(k::highest), _mm256_max_ps(_mm256_set1_ps(k::lowest), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(k::log2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 neg_n = _mm256_sub_ps(_mm256_setzero_ps(), n);
  __m256 r = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(k::ln2_hi), xc);
  r = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(k::ln2_lo), r);
  __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(k::c4), r, _mm256_set1_ps(k::c3));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(k::c2));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(k::c1));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(k::c0));
  const __m256 p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(r, r), q, r), _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(k::lowest), _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(x, _mm256_set1_ps(k::highest), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

TLM_AVX2_FN inline float exp(const float* s, std::size_t n, float scale, float m, float* p) {
  const __m256 vm = _mm256_set1_ps(m);
  const __m256 vscale = _mm256_set1_ps(scale);
  __m256 sum = _mm256_setzero_ps();
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 y = exp8(_mm256_fmsub_ps(vscale, _mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(p + j, y);
    sum = _mm256_add_ps(sum, y);
  }
  float total = 0;
  for (; j < n; ++j) total += (p[j] = exp_poly(std::fma(scale, s[j], -m)));
  alignas(32) float t[8];
  _mm256_store_ps(t, sum);
  for (float x : t) total += x;
  return total;
}

// The weighted sum, as every SIMD level computes it.
#define TLM_LANES_INLINE TLM_AVX2_INLINE
#include <tlm/kernels/attention_accumulate.inc>
#undef TLM_LANES_INLINE

TLM_AVX2_FN inline void accumulate(float c, const float* p, const float* values, std::size_t stride,
                                        std::size_t n, std::size_t E, float* out) {
  if (E % 8 != 0) return detail::attention_accumulate_scalar(c, p, values, stride, n, E, out);
  accumulate_rows(c, p, static_cast<const float*>(nullptr), values, stride, n, E, out);
}

TLM_AVX2_FN inline void accumulate_q8(float c, const float* p, const std::int8_t* codes,
                                           const float* value_scales, std::size_t n, std::size_t E, float* out) {
  if (E % 8 != 0) return detail::attention_accumulate_q8_scalar(c, p, codes, value_scales, n, E, out);
  accumulate_rows(c, p, value_scales, codes, E, n, E, out);
}

// SwiGLU and its backward, as every SIMD level computes them, over exp8.
TLM_AVX2_INLINE inline lanes::reg exp_lanes(lanes::reg x) { return exp8(x); }
#define TLM_LANES_INLINE TLM_AVX2_INLINE
#define TLM_LANES_FN TLM_AVX2_FN
#include <tlm/kernels/swiglu_lanes.inc>
#undef TLM_LANES_FN
#undef TLM_LANES_INLINE

inline constexpr attention_kernels table{&scores, &scores_q8, &exp, &accumulate, &accumulate_q8, &swiglu, &swiglu_backward};

}  // namespace tlm::kernels::attention_avx2
#endif
