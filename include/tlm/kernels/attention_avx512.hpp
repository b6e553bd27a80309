#pragma once
// The attention kernels (attention_scalar.hpp) with AVX-512 F/DQ, laid out as the
// AVX2 ones (attention_avx2.hpp): 16 keys per reduction, 64 output floats per pass
// over the values. Heads whose size is not a multiple of 16 go to the AVX2 kernels.
#include <tlm/kernels/attention_avx2.hpp>
#include <tlm/kernels/lanes.hpp>
#include <tlm/kernels/target.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

// GCC 12 reports some of its own AVX-512 intrinsics as "used uninitialized" once
// inlined (GCC bug 105593, fixed in GCC 13), as avx512.hpp notes; the warning is false.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tlm::kernels::attention_avx512 {

using lanes = avx512_lanes;

TLM_AVX512_INLINE inline __mmask16 first(std::size_t m) { return static_cast<__mmask16>((1u << m) - 1u); }

// Lane j of the result is the sum of the 16 lanes of a[j]. Each step adds pairs of
// registers with their halves crossed, halving the lanes per key and the registers:
// 256-bit halves, then 128-bit quarters, then pairs, then single lanes. Lane 4L + i
// then holds key 4i + L, which one permute puts in order.
TLM_AVX512_INLINE inline __m512 reduce16(const __m512 (&a)[16]) {
  __m512 h[8], g[4], f[2];
  for (int i = 0; i < 8; ++i)
    h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    g[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)
    f[i] = _mm512_add_ps(_mm512_shuffle_ps(g[2 * i], g[2 * i + 1], 0x44), _mm512_shuffle_ps(g[2 * i], g[2 * i + 1], 0xEE));
  const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], 0x88), _mm512_shuffle_ps(f[0], f[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), v);
}

// One group of up to 16 keys; rows past m repeat the last one and are not stored.
template <class Elem>
TLM_AVX512_INLINE inline __m512 group_dots(const float* q, const Elem* rows, std::size_t stride, std::size_t m,
                                                std::size_t E) {
  __m512 acc[16];
  for (std::size_t jj = 0; jj < 16; ++jj) {
    const Elem* r = rows + std::min(jj, m - 1) * stride;
    __m512 a = _mm512_setzero_ps();
    for (std::size_t e = 0; e < E; e += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + e), lanes::load(r + e), a);
    acc[jj] = a;
  }
  return reduce16(acc);
}

// group_dots for heads of EV x 16 values (64 and 128, every configuration's), the query
// held in registers and the 16 keys' products written out, so that their chains of
// multiply-adds overlap: as a loop over keys, each chain waited on the key before (this
// and the accumulators kept in registers made decode attention 1.4-1.5x faster:
// bench/results/attention-decode-xeon.md). The same operations in the same order: the
// results are group_dots' bit for bit (tests/test_attention_kernels.cpp checks).
template <std::size_t EV, class Elem>
TLM_AVX512_INLINE inline __m512 group_dots_fixed(const __m512 (&qv)[EV], const Elem* rows, std::size_t stride,
                                                 std::size_t m) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (std::size_t jj = 0; jj < 16; ++jj) {
    const Elem* r = rows + std::min(jj, m - 1) * stride;
    __m512 a = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (std::size_t e = 0; e < EV; ++e) a = _mm512_fmadd_ps(qv[e], lanes::load(r + 16 * e), a);
    acc[jj] = a;
  }
  return reduce16(acc);
}

// Scores of n keys, 16 at a time: rows are the keys (float, `stride` apart) or their
// int8 codes (stride E, each key's dot times key_scales[j]; null for float). EV: the
// head's size in vectors of 16 for group_dots_fixed, 0 for any size (group_dots).
template <std::size_t EV, class Elem>
TLM_AVX512_INLINE inline void scores_rows(const float* q, const Elem* rows, std::size_t stride, std::size_t n,
                                          std::size_t E, float scale, const float* key_scales, float* s) {
  __m512 qv[EV == 0 ? 1 : EV];
  for (std::size_t e = 0; e < EV; ++e) qv[e] = _mm512_loadu_ps(q + 16 * e);
  const __m512 vs = _mm512_set1_ps(scale);
  for (std::size_t j0 = 0; j0 < n; j0 += 16) {
    const std::size_t m = std::min<std::size_t>(16, n - j0);
    __m512 d;
    if constexpr (EV == 0) d = group_dots(q, rows + j0 * stride, stride, m, E);
    else d = group_dots_fixed<EV>(qv, rows + j0 * stride, stride, m);
    const __m512 f = key_scales == nullptr ? vs : _mm512_mul_ps(_mm512_maskz_loadu_ps(first(m), key_scales + j0), vs);
    _mm512_mask_storeu_ps(s + j0, first(m), _mm512_mul_ps(d, f));
  }
}

template <class Elem>
TLM_AVX512_INLINE inline void scores_any(const float* q, const Elem* rows, std::size_t stride, std::size_t n,
                                         std::size_t E, float scale, const float* key_scales, float* s) {
  if (E == 64) return scores_rows<4>(q, rows, stride, n, E, scale, key_scales, s);
  if (E == 128) return scores_rows<8>(q, rows, stride, n, E, scale, key_scales, s);
  scores_rows<0>(q, rows, stride, n, E, scale, key_scales, s);
}

TLM_AVX512_FN inline void scores(const float* q, const float* keys, std::size_t stride, std::size_t n,
                                      std::size_t E, float scale, float* s) {
  if (E % 16 != 0) return attention_avx2::scores(q, keys, stride, n, E, scale, s);
  scores_any(q, keys, stride, n, E, scale, nullptr, s);
}

TLM_AVX512_FN inline void scores_q8(const float* q, const std::int8_t* codes, const float* key_scales,
                                         std::size_t n, std::size_t E, float scale, float* s) {
  if (E % 16 != 0) return attention_avx2::scores_q8(q, codes, key_scales, n, E, scale, s);
  scores_any(q, codes, E, n, E, scale, key_scales, s);
}

// exp_poly on 16 lanes: the same operations in the same order.
TLM_AVX512_INLINE inline __m512 exp16(__m512 x) {
  namespace k = exp_constants;
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(k::highest), _mm512_max_ps(_mm512_set1_ps(k::lowest), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(k::log2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 neg_n = _mm512_sub_ps(_mm512_setzero_ps(), n);
  __m512 r = _mm512_fmadd_ps(neg_n, _mm512_set1_ps(k::ln2_hi), xc);
  r = _mm512_fmadd_ps(neg_n, _mm512_set1_ps(k::ln2_lo), r);
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(k::c4), r, _mm512_set1_ps(k::c3));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(k::c2));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(k::c1));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(k::c0));
  const __m512 p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(r, r), q, r), _mm512_set1_ps(1.0f));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i half = _mm512_srai_epi32(ni, 1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, half), bias), 23));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(k::lowest), _CMP_LT_OQ), _mm512_setzero_ps());
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(k::highest), _CMP_GT_OQ),
                         _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

TLM_AVX512_FN inline float exp(const float* s, std::size_t n, float scale, float m, float* p) {
  const __m512 vm = _mm512_set1_ps(m);
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 sum = _mm512_setzero_ps();
  for (std::size_t j = 0; j < n; j += 16) {
    const __mmask16 k = first(std::min<std::size_t>(16, n - j));
    const __m512 y = exp16(_mm512_fmsub_ps(vscale, _mm512_maskz_loadu_ps(k, s + j), vm));
    _mm512_mask_storeu_ps(p + j, k, y);
    sum = _mm512_mask_add_ps(sum, k, sum, y);
  }
  return _mm512_reduce_add_ps(sum);
}

// The weighted sum, as every SIMD level computes it.
#define TLM_LANES_INLINE TLM_AVX512_INLINE
#include <tlm/kernels/attention_accumulate.inc>
#undef TLM_LANES_INLINE

TLM_AVX512_FN inline void accumulate(float c, const float* p, const float* values, std::size_t stride,
                                          std::size_t n, std::size_t E, float* out) {
  if (E % 16 != 0) return attention_avx2::accumulate(c, p, values, stride, n, E, out);
  accumulate_rows(c, p, static_cast<const float*>(nullptr), values, stride, n, E, out);
}

TLM_AVX512_FN inline void accumulate_q8(float c, const float* p, const std::int8_t* codes,
                                             const float* value_scales, std::size_t n, std::size_t E, float* out) {
  if (E % 16 != 0) return attention_avx2::accumulate_q8(c, p, codes, value_scales, n, E, out);
  accumulate_rows(c, p, value_scales, codes, E, n, E, out);
}

// SwiGLU and its backward, as every SIMD level computes them, over exp16.
TLM_AVX512_INLINE inline lanes::reg exp_lanes(lanes::reg x) { return exp16(x); }
#define TLM_LANES_INLINE TLM_AVX512_INLINE
#define TLM_LANES_FN TLM_AVX512_FN
#include <tlm/kernels/swiglu_lanes.inc>
#undef TLM_LANES_FN
#undef TLM_LANES_INLINE

inline constexpr attention_kernels table{&scores, &scores_q8, &exp, &accumulate, &accumulate_q8, &swiglu, &swiglu_backward};

}  // namespace tlm::kernels::attention_avx512

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
