#pragma once
// AVX2 + FMA + F16C kernels. Every function here carries a target attribute instead
// of relying on -mavx2, so the rest of the program stays baseline x86-64; they are
// only reached through the table in kernels/table.hpp after the level's CPU test passed.
//
// Numerics (precision::exact): activations stay float32 and every sum is a float32
// FMA chain in independent accumulators. precision::fast (the end of this file)
// quantizes the activations to int8 and sums integer products instead. matmul and the float encodings decode
// weights to float32 bit for bit as dequantize_row does (each product of a half scale
// and a small integer is exact, so an FMA with the min rounds once, as the reference
// does). matvec on Q4_0 / Q4_1 / Q8_0 factors the block scale out of the sum instead
// (see "Fast matvec" below): the same sum in a different order.
#if defined(__x86_64__) || defined(__i386__)
#define TLM_HAVE_AVX2_KERNELS 1

#include <tlm/format/blocks.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/kernels/scalar.hpp>
#include <tlm/kernels/target.hpp>

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>


namespace tlm::kernels::avx2 {

// How far ahead of the current block the kernels prefetch the weight stream. On the
// Intel Xeon VMs measured here the hardware prefetcher alone streamed the Q5 and K-quant
// kernels from DRAM at 2.3-3.9 GB/s (6.1-7.8 with the prefetch), against 7.8-11.5 for
// the AVX-512 Q4_1 kernels, which prefetch too (bench/results/kernels-kquant-xeon-avx512.md,
// "Cold"), and the Q4_0 / Q4_1 / Q8_0 kernels, exact and fast, at 5-9 GB/s against 9-15
// (bench/results/kernels-avx2-prefetch-xeon.md). Those take a `Prefetch` parameter, as
// the fast K-quant matvec does: on AMD Zen 4 a prefetch measured slower in them, so the
// table (kernels/table.hpp) installs them without it on AMD.
inline constexpr std::size_t prefetch_ahead = 1024;

TLM_AVX2_INLINE inline void prefetch(const std::byte* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + prefetch_ahead), _MM_HINT_T0);
}

TLM_AVX2_INLINE inline float hsum(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

TLM_AVX2_INLINE inline float hsum(__m256 v) {
  return hsum(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

TLM_AVX2_INLINE inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// 8 halves or 8 bfloat16 values at an arbitrary byte address.
TLM_AVX2_INLINE inline __m256 load8_f16(const std::byte* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
TLM_AVX2_INLINE inline __m256 load8_bf16(const std::byte* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

// Broadcast of the half-precision scale at p (blocks are not aligned: memcpy load).
TLM_AVX2_INLINE inline __m256 half_scale(const std::byte* p) { return _mm256_set1_ps(_cvtsh_ss(load_u16(p))); }

// The scales at p[0..R) (R <= 4) converted together, lanes R..3 zero.
template <std::size_t R>
TLM_AVX2_INLINE inline __m128 scales4(const std::byte* const (&p)[R]) {
  static_assert(R >= 1 && R <= 4);
  __m128i h = _mm_cvtsi32_si128(load_u16(p[0]));
  if constexpr (R > 1) h = _mm_insert_epi16(h, load_u16(p[1]), 1);
  if constexpr (R > 2) h = _mm_insert_epi16(h, load_u16(p[2]), 2);
  if constexpr (R > 3) h = _mm_insert_epi16(h, load_u16(p[3]), 3);
  return _mm_cvtph_ps(h);
}

// The 32 nibbles of a Q4 block as floats in value order: v[0], v[1] from the low
// nibbles (values 0..15), v[2], v[3] from the high nibbles (values 16..31). With
// Offset = 8 the codes become -8..7 in the integer domain, so (q - 8) * d is one
// exact multiply whose zero carries the sign of d, as in dequantize_row.
template <int Offset>
TLM_AVX2_INLINE inline void nibbles(const std::byte* qs, __m256 (&v)[4]) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  __m128i lo = _mm_and_si128(b, mask);
  __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  if constexpr (Offset != 0) {
    const __m128i off = _mm_set1_epi8(static_cast<char>(Offset));
    lo = _mm_sub_epi8(lo, off);
    hi = _mm_sub_epi8(hi, off);
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo)));
    v[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    v[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi)));
  } else {
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(lo, lo)));
    v[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    v[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(hi, hi)));
  }
}

// Bytes 8k..8k+7 of 32 signed codes widened to int32.
TLM_AVX2_INLINE inline void widen32(__m256i c, __m256i (&out)[4]) {
  const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
  out[0] = _mm256_cvtepi8_epi32(c0);
  out[1] = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(c0, c0));
  out[2] = _mm256_cvtepi8_epi32(c1);
  out[3] = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(c1, c1));
}

// The sum of each N consecutive values of x [cols] -> sums [cols / N], in order, as every
// prepare of x for blocks with a min or a code offset takes them (one rounding for all
// levels' kernels).
template <std::size_t N>
inline void sums_of(const float* x, std::size_t cols, float* sums) {
  for (std::size_t b = 0; b < cols / N; ++b) {
    float t = 0;
    for (std::size_t i = 0; i < N; ++i) t += x[N * b + i];
    sums[b] = t;
  }
}

// The 16 nibble bytes at qs as codes 0..15 in value order: the low nibbles (values 0..15)
// in the low lane, the high nibbles (16..31) in the high lane. One broadcast load and one
// variable shift of the high lane's qwords: an insert of the high half, or a blend of a
// shifted copy, would each cost a second instruction, and the insert takes the one
// shuffle port of Intel cores. The 64-bit form because Haswell's 32-bit variable shift
// is three uops; each byte's low nibble after the shift is its own high nibble either way.
TLM_AVX2_INLINE inline __m256i nibble_halves(const std::byte* qs) {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
}

// The 32 fifth bits of a Q5 block (the little-endian word at qh) as bytes 0 or 0x10,
// in value order: byte j of the result takes byte j/8 of qh and tests bit j%8.
TLM_AVX2_INLINE inline __m256i q5_high_bits(const std::byte* qh) {
  std::uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                                                0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// The 32 codes of a Q5 block in value order as bytes: Q5_1 unsigned 0..31, Q5_0
// signed -16..15. qs: the 16 nibble bytes, qh: the 4 bytes of fifth bits.
template <encoding E>
TLM_AVX2_INLINE inline __m256i q5_codes(const std::byte* qs, const std::byte* qh) {
  __m256i w = _mm256_or_si256(nibble_halves(qs), q5_high_bits(qh));
  if constexpr (E == encoding::q5_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
  return w;
}

// Decodes one 32-value block at p into w (values 0..31 in order), bit for bit equal
// to dequantize_row (see format/quant.hpp for why each step is exact or rounds once).
template <encoding E>
TLM_AVX2_INLINE inline void decode32(const std::byte* p, __m256 (&w)[4]) {
  if constexpr (E == encoding::q8_0) {
    const __m256 d = half_scale(p);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * k));
      w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
  } else if constexpr (E == encoding::q4_0) {
    const __m256 d = half_scale(p);
    nibbles<8>(p + 2, w);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(w[k], d);
  } else if constexpr (E == encoding::q4_1) {
    const __m256 d = half_scale(p);
    const __m256 m = half_scale(p + 2);
    nibbles<0>(p + 4, w);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = _mm256_fmadd_ps(w[k], d, m);
  } else if constexpr (E == encoding::q5_0 || E == encoding::q5_1) {
    // Integer codes (nibble | fifth bit << 4, minus 16 for Q5_0), then one exact
    // multiply (Q5_0) or one FMA rounding once (Q5_1), as dequantize_row.
    constexpr bool has_min = E == encoding::q5_1;
    const std::byte* qh = p + (has_min ? 4 : 2);
    const __m256i codes = q5_codes<E>(qh + 4, qh);  // 32 bytes, values 0..31 in order
    const __m256 d = half_scale(p);
    const __m128i c0 = _mm256_castsi256_si128(codes), c1 = _mm256_extracti128_si256(codes, 1);
    const __m256i wide[4] = {_mm256_cvtepi8_epi32(c0), _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(c0, c0)),
                             _mm256_cvtepi8_epi32(c1), _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(c1, c1))};
    if constexpr (has_min) {
      const __m256 m = half_scale(p + 2);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide[k]), d, m);
    } else {
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(wide[k]), d);
    }
  } else if constexpr (E == encoding::f16) {
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = load8_f16(p + 16 * k);
  } else if constexpr (E == encoding::bf16) {
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = load8_bf16(p + 16 * k);
  } else {
    static_assert(E == encoding::f32);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * k);
  }
}

// Bytes that hold 32 consecutive values.
template <encoding E>
constexpr std::size_t bytes32() {
  return row_bytes(E, 32);
}

TLM_AVX2_FN inline float dot(const float* a, const float* b, std::size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(load8(a + i), load8(b + i), s0);
    s1 = _mm256_fmadd_ps(load8(a + i + 8), load8(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(load8(a + i + 16), load8(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(load8(a + i + 24), load8(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load8(a + i), load8(b + i), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

TLM_AVX2_FN inline void axpy(float a, const float* x, float* y, std::size_t n) {
  const __m256 va = _mm256_set1_ps(a);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load8(x + i), load8(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// Eight int8 codes widened to float (exact); 8 bytes loaded, so no alignment is needed.
TLM_AVX2_INLINE inline __m256 load8_i8(const std::int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

TLM_AVX2_FN inline float dot_i8(const float* a, const std::int8_t* b, std::size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(load8(a + i), load8_i8(b + i), s0);
    s1 = _mm256_fmadd_ps(load8(a + i + 8), load8_i8(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(load8(a + i + 16), load8_i8(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(load8(a + i + 24), load8_i8(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load8(a + i), load8_i8(b + i), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * static_cast<float>(b[i]);
  return s;
}

TLM_AVX2_FN inline void axpy_i8(float a, const std::int8_t* x, float* y, std::size_t n) {
  const __m256 va = _mm256_set1_ps(a);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load8_i8(x + i), load8(y + i)));
  for (; i < n; ++i) y[i] += a * static_cast<float>(x[i]);
}

// Values past the last multiple of 32 in a row of a plain-float encoding (F32, F16,
// BF16 rows may have any length); read with memcpy since rows may be unaligned.
template <encoding E>
inline float tail_dot(const std::byte* row, const float* x, std::size_t from, std::size_t cols) {
  float s = 0;
  for (std::size_t c = from; c < cols; ++c) {
    float w;
    if constexpr (E == encoding::f32) {
      std::memcpy(&w, row + 4 * c, 4);
    } else if constexpr (E == encoding::f16) {
      w = fp16_to_f32(load_u16(row + 2 * c));
    } else {
      w = bf16_to_f32(load_u16(row + 2 * c));
    }
    s += w * x[c];
  }
  return s;
}

// One row of W times x: four accumulators, one per group of 8 values in a block of 32.
template <encoding E>
TLM_AVX2_FN inline float row_dot(const std::byte* row, const float* x, std::size_t cols) {
  constexpr std::size_t bb = bytes32<E>();
  const std::size_t blocks = cols / 32;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    __m256 w[4];
    decode32<E>(row + b * bb, w);
    const float* xb = x + 32 * b;
    a0 = _mm256_fmadd_ps(w[0], load8(xb), a0);
    a1 = _mm256_fmadd_ps(w[1], load8(xb + 8), a1);
    a2 = _mm256_fmadd_ps(w[2], load8(xb + 16), a2);
    a3 = _mm256_fmadd_ps(w[3], load8(xb + 24), a3);
  }
  float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  if constexpr (E == encoding::f32 || E == encoding::f16 || E == encoding::bf16) {
    if (blocks * 32 < cols) s += tail_dot<E>(row, x, blocks * 32, cols);
  }
  return s;
}

template <encoding E>
TLM_AVX2_FN inline void matvec_rows(encoding, const std::byte* w, std::size_t rb, const float* x, float* y,
                                    std::size_t r0, std::size_t r1, std::size_t cols) {
  // One row at a time, in streamed_row's order (4 streams far apart). Two neighbouring
  // rows per pass (sharing x loads) measured up to 2x slower from DRAM for long rows, as
  // two interleaved streams 1-6 KiB apart defeat the hardware prefetcher.
  for (std::size_t i = 0; i < r1 - r0; ++i) {
    const std::size_t r = detail::streamed_row(r0, r1, i);
    y[r] = row_dot<E>(w + r * rb, x, cols);
  }
}

// ---- Fast matvec for Q4_0 / Q4_1 / Q8_0 ------------------------------------------
//
// For matvec (decode) the weights stream from memory once per token and each block
// is used once, so the cost that matters is per block. Instead of decoding every
// weight (q*d + m, one FMA per value) the scale and min are factored out of the block:
//   sum_j (q_j d + m) x_j = d * sum_j q_j x_j + m * sum_j x_j
// with sum_j x_j computed once per block of x for all rows. This is the same sum in
// another order (error within the tolerance stated in tests/test_kernels.cpp).

// Nibbles of a Q4 block as integer codes 0..15 in four registers, in the order
//   e_k = values [4k, 4k+4) in the low lane, [16+4k, 16+4k+4) in the high lane,
// which needs one byte shuffle per register. x is permuted to match (prepare_q4_x).
TLM_AVX2_INLINE inline void q4_codes(const std::byte* qs, __m256 (&e)[4]) {
  const __m256i b = nibble_halves(qs);
  const __m256i s0 = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,  //
                                      0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1);
  const __m256i four = _mm256_set1_epi32(4);
  const __m256i s1 = _mm256_add_epi32(s0, four), s2 = _mm256_add_epi32(s1, four), s3 = _mm256_add_epi32(s2, four);
  e[0] = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(b, s0));
  e[1] = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(b, s1));
  e[2] = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(b, s2));
  e[3] = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(b, s3));
}

// x in q4_codes order, 32 floats per block, followed by one 4-float vector per block
// holding the coefficients of the scale pair: Q4_1 [0, sum x, 0, 0] (pairs with
// [d, m]), Q4_0 [-8 sum x, 0, 0, 0] (pairs with [d, 0]: (q - 8) d = q d - 8 d).
template <encoding E>
inline void prepare_q4_x(const float* x, std::size_t cols, std::vector<float>& prepared) {
  const std::size_t blocks = cols / 32;
  prepared.resize(cols + 4 * blocks);  // [cols] permuted x, then [blocks, 4]
  float* out = prepared.data();
  float* sums = out + cols;  // [blocks, 4]
  for (std::size_t b = 0; b < blocks; ++b) {
    const float* s = x + 32 * b;
    float* d = out + 32 * b;
    for (std::size_t k = 0; k < 4; ++k) {
      for (std::size_t i = 0; i < 4; ++i) {
        d[8 * k + i] = s[4 * k + i];
        d[8 * k + 4 + i] = s[16 + 4 * k + i];
      }
    }
    float t = 0;
    for (std::size_t i = 0; i < 32; ++i) t += s[i];
    float* v = sums + 4 * b;
    v[0] = E == encoding::q4_0 ? -8.0f * t : 0.0f;
    v[1] = E == encoding::q4_0 ? 0.0f : t;
    v[2] = 0.0f;
    v[3] = 0.0f;
  }
}

// [d, m, 0, 0] of a Q4_1 block, [d, 0, 0, 0] of a Q4_0 block (only its 2 bytes read).
template <encoding E>
TLM_AVX2_INLINE inline __m128 q4_scales(const std::byte* p) {
  std::uint32_t bits = 0;
  if constexpr (E == encoding::q4_1) {
    std::memcpy(&bits, p, 4);  // d and m are adjacent little-endian halves
  } else {
    bits = load_u16(p);
  }
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
}

// One block of one row: acc += d * (codes . x), mins += [d, m] * [coefficients].
template <encoding E>
TLM_AVX2_INLINE inline void q4_block(const std::byte* p, const __m256 (&xv)[4], __m128 xs, __m256& acc, __m128& mins) {
  constexpr std::size_t head = E == encoding::q4_1 ? 4 : 2;
  const __m128 dm = q4_scales<E>(p);
  __m256 e[4];
  q4_codes(p + head, e);
  __m256 t = _mm256_mul_ps(e[0], xv[0]);
  t = _mm256_fmadd_ps(e[1], xv[1], t);
  t = _mm256_fmadd_ps(e[2], xv[2], t);
  t = _mm256_fmadd_ps(e[3], xv[3], t);
  acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), t, acc);
  mins = _mm_fmadd_ps(dm, xs, mins);
}

TLM_AVX2_INLINE inline float finish_q4(__m256 acc, __m128 mins) {
  mins = _mm_add_ps(mins, _mm_movehdup_ps(mins));  // lane 0: mins[0] + mins[1]
  return hsum(acc) + _mm_cvtss_f32(mins);
}

// x here is the output of prepare_q4_x, done once per matvec by the caller.
template <encoding E, bool Prefetch>
TLM_AVX2_FN inline void matvec_rows_q4(encoding, const std::byte* w, std::size_t rb, const float* x, float* y,
                                       std::size_t r0, std::size_t r1, std::size_t cols) {
  constexpr std::size_t bb = bytes32<E>();
  const std::size_t blocks = cols / 32;
  const float* xp = x;          // [cols] in q4_codes order (prepare_q4_x)
  const float* xs = x + cols;   // [blocks, 4] coefficients
  // One row at a time, in streamed_row's order (see matvec_rows).
  for (std::size_t i = 0; i < r1 - r0; ++i) {
    const std::size_t r = detail::streamed_row(r0, r1, i);
    const std::byte* row = w + r * rb;
    __m256 acc = _mm256_setzero_ps();
    __m128 mins = _mm_setzero_ps();
    for (std::size_t b = 0; b < blocks; ++b) {
      const float* xb = xp + 32 * b;
      if constexpr (Prefetch) prefetch(row + b * bb);
      const __m256 xv[4] = {load8(xb), load8(xb + 8), load8(xb + 16), load8(xb + 24)};
      q4_block<E>(row + b * bb, xv, _mm_loadu_ps(xs + 4 * b), acc, mins);
    }
    y[r] = finish_q4(acc, mins);
  }
}

// Q8_0: acc += d * (codes . x); the scale multiplies once per block, not per value.
TLM_AVX2_INLINE inline void q8_block(const std::byte* p, const __m256 (&xv)[4], __m256& acc) {
  const __m256 d = half_scale(p);
  __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2)))), xv[0]);
#pragma GCC unroll 4
  for (int k = 1; k < 4; ++k) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * k));
    t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), xv[k], t);
  }
  acc = _mm256_fmadd_ps(d, t, acc);
}

template <bool Prefetch>
TLM_AVX2_FN inline void matvec_rows_q8(encoding, const std::byte* w, std::size_t rb, const float* x, float* y,
                                       std::size_t r0, std::size_t r1, std::size_t cols) {
  constexpr std::size_t bb = bytes32<encoding::q8_0>();
  const std::size_t blocks = cols / 32;
  for (std::size_t i = 0; i < r1 - r0; ++i) {
    const std::size_t r = detail::streamed_row(r0, r1, i);
    const std::byte* row = w + r * rb;
    __m256 acc = _mm256_setzero_ps();
    for (std::size_t b = 0; b < blocks; ++b) {
      const float* xb = x + 32 * b;
      if constexpr (Prefetch) prefetch(row + b * bb);
      const __m256 xv[4] = {load8(xb), load8(xb + 8), load8(xb + 16), load8(xb + 24)};
      q8_block(row + b * bb, xv, acc);
    }
    y[r] = hsum(acc);
  }
}

// The 32 codes of one block in value order: Q4_1 unsigned 0..15, Q4_0 signed -8..7,
// Q5_1 unsigned 0..31, Q5_0 signed -16..15, Q8_0 signed. codes32 and stored_codes32 serve
// the fast kernels (below) and the exact Q5 matvec.
template <encoding E>
TLM_AVX2_INLINE inline __m256i codes32(const std::byte* p) {
  if constexpr (E == encoding::q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
  } else if constexpr (E == encoding::q5_0 || E == encoding::q5_1) {
    const std::byte* qh = p + (E == encoding::q5_1 ? 4 : 2);
    return q5_codes<E>(qh + 4, qh);
  } else {
    constexpr std::size_t head = E == encoding::q4_1 ? 4 : 2;
    __m256i w = nibble_halves(p + head);
    if constexpr (E == encoding::q4_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
    return w;
  }
}

// What a block's code, taken as an unsigned byte, exceeds the value it stands for by: Q4_0's
// and Q5_0's codes as stored (0..15, 0..31), Q8_0's signed bytes with the sign bit flipped;
// 0 for the encodings whose codes are unsigned already. The integer kernels that multiply
// unsigned by signed bytes take the codes so and subtract offset x sum(q).
template <encoding E>
inline constexpr int stored_code_offset = E == encoding::q8_0 ? 128 : E == encoding::q4_0 ? 8 : E == encoding::q5_0 ? 16 : 0;

// The offsets this level's vpmaddubsw kernels use: Q8_0 keeps its signs moved, since its
// codes plus 128 reach 255 and a pair 2 * 255 * 127 would saturate.
template <encoding E>
inline constexpr int code_offset = E == encoding::q8_0 ? 0 : stored_code_offset<E>;

template <encoding E>
TLM_AVX2_INLINE inline __m256i stored_codes32(const std::byte* p) {
  if constexpr (E == encoding::q5_0) {
    return q5_codes<encoding::q5_1>(p + 6, p + 2);  // Q5_1's unpacking leaves the codes as stored
  } else if constexpr (E == encoding::q4_0) {
    return nibble_halves(p + 2);
  } else {
    return codes32<E>(p);
  }
}

// Q5_0 / Q5_1 with the block scale factored out, as for Q4 above: per block
// d * (c . x + o) (+ m * sum(x) for Q5_1), with c the stored codes 0..31, o = -16 sum(x)
// for Q5_0 (whose values are (c - 16) d), 0 for Q5_1.
//
// The codes are widened to int32 within each dword (byte k of every dword: the codes
// 4i + k, i = 0..7), not in value order by sign extensions, so x is laid out per block in
// that order once per matvec (prepare_q5_x). Bytes 0..2 are picked by one AND each and
// left where they are, holding c 2^(8k), converted exactly, with x's groups 1 and 2 stored
// times 2^-8 and 2^-16, so each product is the same float as c x (unless that x times 2^-16
// is subnormal: below 2^-110 it keeps fewer bits); byte 3 is shifted down. On Intel cores
// every byte shuffle runs on one port: the value-order loop took 11 shuffles of a block's
// 31 vector instructions, the shift-and-shuffle widening 3 of 25, this one 1 (the fifth
// bits' spread) of 21, loads aside (perf annotate, forced AVX2). 4 rows a step share the
// loads of x and convert their scales together. bench/results/kernels-avx2-q5-shifts-xeon.md
// and kernels-avx2-q5-masks-xeon.md have the figures.

// x [cols] with each block of 32 as [4 groups][8 lanes] (group k, lane i: value 4i + k of
// the block, times 2^(-8k) for groups 1 and 2, since group 3 is shifted down), then per
// block what its codes' offset or min multiplies: Q5_0 [cols / 32][8], lane i -16 times
// the sum of values 4i..4i+3 (the lanes the sums below keep: the codes' -16 costs no
// instruction); Q5_1 [cols / 32], the sum of the block's x (sums_of, in value order).
template <encoding E>
inline void prepare_q5_x(const float* x, std::size_t cols, std::vector<float>& prepared) {
  const std::size_t blocks = cols / 32;
  constexpr float group_scale[4] = {1.0f, 0x1p-8f, 0x1p-16f, 1.0f};
  prepared.resize(cols + (E == encoding::q5_0 ? 8 : 1) * blocks);
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t k = 0; k < 4; ++k) {
      for (std::size_t i = 0; i < 8; ++i) prepared[32 * b + 8 * k + i] = x[32 * b + 4 * i + k] * group_scale[k];
    }
  }
  if constexpr (E == encoding::q5_0) {
    float* const offsets = prepared.data() + cols;
    for (std::size_t j = 0; j < cols / 4; ++j) {
      const float* v = x + 4 * j;
      offsets[j] = -16.0f * (((v[0] + v[1]) + v[2]) + v[3]);
    }
  } else {
    sums_of<32>(x, cols, prepared.data() + cols);
  }
}

// Byte K of each dword of 32 unsigned byte codes, as int32: c 2^(8K) for K = 0..2, c for K = 3.
template <int K>
TLM_AVX2_INLINE inline __m256i byte_group(__m256i c) {
  if constexpr (K == 3) return _mm256_srli_epi32(c, 24);
  else return _mm256_and_si256(c, _mm256_set1_epi32(0xff << (8 * K)));
}

// What a kernel of R rows a step keeps per row: 8 float lanes of sums and a scalar sum of
// the blocks' mins; out[r] = the row's total.
template <std::size_t R>
struct row_sums {
  __m256 acc[R];
  float mins[R];
  TLM_AVX2_INLINE row_sums() {
    for (std::size_t r = 0; r < R; ++r) {
      acc[r] = _mm256_setzero_ps();
      mins[r] = 0;
    }
  }
  TLM_AVX2_INLINE void finish(float (&out)[R]) const {
    for (std::size_t r = 0; r < R; ++r) out[r] = hsum(acc[r]) + mins[r];
  }
};

// Block b of each of the R rows (bb bytes a block).
template <std::size_t R>
TLM_AVX2_INLINE inline void block_of_rows(const std::byte* const (&rows)[R], std::size_t b, std::size_t bb,
                                          const std::byte* (&p)[R]) {
  for (std::size_t r = 0; r < R; ++r) p[r] = rows[r] + b * bb;
}

// R rows a step: the loads of x and the loop shared, the R rows' scales converted together.
template <encoding E, std::size_t R>
TLM_AVX2_INLINE inline void rows_dot_q5(const std::byte* const (&rows)[R], std::size_t blocks, const float* x,
                                        float (&out)[R]) {
  constexpr bool has_min = E == encoding::q5_1;
  constexpr std::size_t bb = bytes32<E>();
  const float* after = x + 32 * blocks;  // Q5_0: [blocks][8] offsets; Q5_1: [blocks] sums
  row_sums<R> sums;
  __m128 mins = _mm_setzero_ps();  // Q5_1: lane r, row r's m * sum(x) over the blocks
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* p[R];
    block_of_rows(rows, b, bb, p);
    const float* xb = x + 32 * b;
    const __m256 xv[4] = {load8(xb), load8(xb + 8), load8(xb + 16), load8(xb + 24)};
    // Stored and broadcast back by loads (measured faster here than a lane permute per
    // row, which takes the shuffle port; the fast kernel measured the other way).
    alignas(16) float d[4];
    _mm_store_ps(d, scales4(p));
    if constexpr (has_min) {
      const std::byte* m[R];
      for (std::size_t r = 0; r < R; ++r) m[r] = p[r] + 2;
      mins = _mm_fmadd_ps(scales4(m), _mm_set1_ps(after[b]), mins);
    }
#pragma GCC unroll 4
    for (std::size_t r = 0; r < R; ++r) {
      prefetch(p[r]);
      const __m256i c = stored_codes32<E>(p[r]);  // 0..31
      const __m256 g0 = _mm256_cvtepi32_ps(byte_group<0>(c));
      __m256 t = has_min ? _mm256_mul_ps(g0, xv[0]) : _mm256_fmadd_ps(g0, xv[0], load8(after + 8 * b));
      t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(byte_group<1>(c)), xv[1], t);
      t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(byte_group<2>(c)), xv[2], t);
      t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(byte_group<3>(c)), xv[3], t);
      sums.acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(d + r), t, sums.acc[r]);
    }
  }
  alignas(16) float m[4];
  _mm_store_ps(m, mins);
  for (std::size_t r = 0; r < R; ++r) sums.mins[r] = m[r];
  sums.finish(out);
}

template <encoding E>
struct q5_rows {
  std::size_t blocks;
  const float* x;
  template <std::size_t R>
  TLM_AVX2_FN void operator()(const std::byte* const (&rows)[R], float (&out)[R]) const {
    rows_dot_q5<E, R>(rows, blocks, x, out);
  }
};

template <encoding E>
TLM_AVX2_FN inline void matvec_rows_q5(encoding, const std::byte* w, std::size_t rb, const float* x, float* y,
                                       std::size_t r0, std::size_t r1, std::size_t cols) {
  detail::rows_in_steps<4>(r0, r1, w, rb, y, q5_rows<E>{cols / 32, x});
}

// Decodes a whole row to float32 (SIMD where there is a decoder).
template <encoding E>
TLM_AVX2_FN inline void decode_row(encoding, const std::byte* row, float* out, std::size_t cols) {
  constexpr std::size_t bb = bytes32<E>();
  const std::size_t blocks = cols / 32;
  for (std::size_t b = 0; b < blocks; ++b) {
    __m256 w[4];
    decode32<E>(row + b * bb, w);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + 32 * b + 8 * k, w[k]);
  }
  for (std::size_t c = blocks * 32; c < cols; ++c) {
    if constexpr (E == encoding::f32) {
      std::memcpy(out + c, row + 4 * c, 4);
    } else if constexpr (E == encoding::f16) {
      out[c] = fp16_to_f32(load_u16(row + 2 * c));
    } else if constexpr (E == encoding::bf16) {
      out[c] = bf16_to_f32(load_u16(row + 2 * c));
    }
  }
}


// An RT x BT tile of Y over columns [0, len): RT decoded weight rows (w + i*ldw) times
// BT activation rows (x + j*ldx); RT*BT accumulators live in registers, so each weight
// load feeds BT FMAs and each activation load feeds RT. Adds to y when `accumulate`
// (a later slice of the columns), else stores.
// noinline: inlined into matmul_rows at -O3, GCC 12 keeps a memory copy of `acc` and
// stores all 12 accumulators every iteration (measured 2.4x slower).
template <int RT, int BT>
[[gnu::noinline]] TLM_AVX2_FN inline void tile(const float* w, std::size_t ldw, const float* x, std::size_t ldx, std::size_t len,
                             float* y, std::size_t ldy, bool accumulate) {
  __m256 acc[RT][BT];
#pragma GCC unroll 4
  for (int i = 0; i < RT; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < BT; ++j) acc[i][j] = _mm256_setzero_ps();
  std::size_t c = 0;
  for (; c + 8 <= len; c += 8) {
    __m256 xv[BT];
#pragma GCC unroll 4
    for (int j = 0; j < BT; ++j) xv[j] = load8(x + j * ldx + c);
#pragma GCC unroll 4
    for (int i = 0; i < RT; ++i) {
      const __m256 wv = load8(w + i * ldw + c);
#pragma GCC unroll 4
      for (int j = 0; j < BT; ++j) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  // Unrolled, so every acc index is a constant: with a run-time index here GCC keeps
  // `acc` in memory and stores all RT*BT accumulators on every iteration above.
#pragma GCC unroll 4
  for (int i = 0; i < RT; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < BT; ++j) {
      float s = hsum(acc[i][j]);
      for (std::size_t t = c; t < len; ++t) s += w[i * ldw + t] * x[j * ldx + t];
      float& out = y[static_cast<std::size_t>(j) * ldy + static_cast<std::size_t>(i)];
      out = accumulate ? out + s : s;
    }
  }
}

template <int RT>
TLM_AVX2_FN inline void tile_rows(const float* w, std::size_t ldw, const float* x, std::size_t ldx, std::size_t len,
                                  float* y, std::size_t ldy, std::size_t batch, bool accumulate) {
  constexpr std::size_t bt = 3;
  std::size_t b = 0;
  for (; b + bt <= batch; b += bt) tile<RT, bt>(w, ldw, x + b * ldx, ldx, len, y + b * ldy, ldy, accumulate);
  switch (batch - b) {
    case 2: tile<RT, 2>(w, ldw, x + b * ldx, ldx, len, y + b * ldy, ldy, accumulate); break;
    case 1: tile<RT, 1>(w, ldw, x + b * ldx, ldx, len, y + b * ldy, ldy, accumulate); break;
    default: break;
  }
}

// Prefill: decode 4 rows of W once per slice of the batch and reuse them for every
// activation row in the slice. Blocking: a slice of 64 activation rows by 512
// columns (128 KiB) stays in L2 and 4 weight rows by 512 columns (8 KiB) in L1 while
// the tile loop runs over the slice.
template <void (*Decode)(encoding, const std::byte*, float*, std::size_t)>
TLM_AVX2_FN inline void matmul_rows(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                                    std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols,
                                    std::size_t batch) {
  constexpr std::size_t rt = 4;
  constexpr std::size_t slice = 64;
  constexpr std::size_t kc = 512;
  float* const buf = detail::decoded_rows(rt * cols);  // [rt, cols]
  for (std::size_t b0 = 0; b0 < batch; b0 += slice) {
    const std::size_t nb = std::min(slice, batch - b0);
    const float* xs = x + b0 * cols;  // [nb, cols]
    float* ys = y + b0 * rows;        // [nb, rows]
    for (std::size_t r = r0; r < r1; r += rt) {
      const std::size_t nr = std::min(rt, r1 - r);
      for (std::size_t i = 0; i < nr; ++i) Decode(enc, w + (r + i) * rb, buf + i * cols, cols);
      for (std::size_t k0 = 0; k0 < cols; k0 += kc) {
        const std::size_t len = std::min(kc, cols - k0);
        const float* wk = buf + k0;
        const bool acc = k0 != 0;
        switch (nr) {
          case 4: tile_rows<4>(wk, cols, xs + k0, cols, len, ys + r, rows, nb, acc); break;
          case 3: tile_rows<3>(wk, cols, xs + k0, cols, len, ys + r, rows, nb, acc); break;
          case 2: tile_rows<2>(wk, cols, xs + k0, cols, len, ys + r, rows, nb, acc); break;
          default: tile_rows<1>(wk, cols, xs + k0, cols, len, ys + r, rows, nb, acc); break;
        }
      }
    }
  }
}

// ---- Fast mode: int8 activations (maddubs) ---------------------------------------
//
// Plain AVX2 has no VNNI: vpmaddubsw multiplies unsigned by signed bytes into pairs
// of saturating int16 sums, vpmaddwd with ones widens them to int32. No pair can
// saturate: |w| <= 128 (Q8_0, after the sign moves to q) or <= 31 (Q4, Q5), |q| <= 127,
// so a pair is at most 2 * 128 * 127 = 32512 < 32767. The integer sums are exact.

// Bit for bit detail::quantize_scalar (see avx512::quantize for why).
TLM_AVX2_FN inline void quantize(const float* x, std::size_t rows, std::size_t cols, std::size_t group,
                                 q8_activations& out) {
  detail::shape_activations(rows, cols, group, out);
  const std::size_t per = group / 32;  // blocks per group
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lim = _mm256_set1_epi32(127), neg = _mm256_set1_epi32(-127);
  for (std::size_t g = 0; g < rows * cols / group; ++g) {
    float bmax[8], d[8], id[8];
    for (std::size_t b = 0; b < per; ++b) {
      const float* xb = x + group * g + 32 * b;
      __m256 m = _mm256_and_ps(_mm256_loadu_ps(xb), abs_mask);
      for (int k = 1; k < 4; ++k) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xb + 8 * k), abs_mask));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      bmax[b] = _mm_cvtss_f32(h);
    }
    detail::group_scales_at(out, g, bmax, d, id);
    for (std::size_t b = 0; b < per; ++b) {
      const std::size_t i = per * g + b;
      const float* s = x + 32 * i;
      const __m256 vid = _mm256_set1_ps(id[b]);
      __m256i q[4];
      for (int k = 0; k < 4; ++k)
        q[k] = _mm256_max_epi32(neg, _mm256_min_epi32(lim, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(s + 8 * k), vid))));
      const __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
      // packs work per 128-bit lane: the permute restores value order.
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + 32 * i), ordered);
      out.ds[2 * i] = d[b];
      out.ds[2 * i + 1] = d[b] * static_cast<float>(_mm_cvtsi128_si32(t));
    }
  }
  detail::fill_half_sums(out);
}

// 32 products summed into 8 int32 lanes; for signed weights the sign moves to q.
template <encoding E>
TLM_AVX2_INLINE inline __m256i dot32(__m256i w, __m256i q) {
  if constexpr (E != encoding::q4_1 && E != encoding::q5_1) {
    q = _mm256_sign_epi8(q, w);
    w = _mm256_abs_epi8(w);
  }
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), _mm256_set1_epi16(1));
}

// What a block's offset or min multiplies, per weight row: Q4_1 / Q5_1 their min m, Q4_0 /
// Q5_0 -code_offset d (exact: a power of two times d), as m is multiplied by dx sum(q)
// (q8_activations::ds). So the unsigned codes as stored go into vpmaddubsw as they are,
// their offset costs one multiply-add per block (shared by 4 rows in rows_dot_q8) where
// an integer correction per lane took a load and an add a row, and centring the codes
// and moving their signs take two or three instructions. The float rounding this adds is
// the min's, well inside the fast kernels' tolerance (tests/test_kernels.cpp).
template <encoding E>
inline constexpr bool has_block_min = E == encoding::q4_1 || E == encoding::q5_1 || code_offset<E> != 0;

// One weight row against NB quantized activation rows; the weights are unpacked once.
template <encoding E, int NB, bool Prefetch>
TLM_AVX2_INLINE inline void row_dots_q8(const std::byte* row, std::size_t blocks, const std::int8_t* q,
                                        std::size_t qstride, const float* ds, std::size_t dstride, float* out) {
  constexpr std::size_t bb = bytes32<E>();
  __m256 acc[NB];
  float mins[NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    acc[j] = _mm256_setzero_ps();
    mins[j] = 0;
  }
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* p = row + b * bb;
    if constexpr (Prefetch) prefetch(p);
    const __m256i w = stored_codes32<E>(p);
    const float dw = _cvtsh_ss(load_u16(p));
    float m = 0;  // has_block_min
    if constexpr (code_offset<E> != 0) m = static_cast<float>(-code_offset<E>) * dw;
    else if constexpr (has_block_min<E>) m = _cvtsh_ss(load_u16(p + 2));
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const float* dj = ds + static_cast<std::size_t>(j) * dstride + 2 * b;
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + static_cast<std::size_t>(j) * qstride + 32 * b));
      __m256i s;
      if constexpr (code_offset<E> != 0) s = _mm256_madd_epi16(_mm256_maddubs_epi16(w, qv), _mm256_set1_epi16(1));
      else s = dot32<E>(w, qv);
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * dj[0]), acc[j]);
      if constexpr (has_block_min<E>) mins[j] = std::fma(m, dj[1], mins[j]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) out[j] = hsum(acc[j]) + mins[j];
}

// R weight rows against one quantized activation row: row_dots_q8's arithmetic (the
// same result for each row), the loop, the activations' loads and the conversion of the
// R rows' scales and mins shared. On the Intel Xeon, forced to this level, 4 rows a step
// against one: Q4_1 1.14-1.26x, Q5_0 1.13-1.15x, Q5_1 1.11-1.13x, Q8_0 1.03x (bound by
// memory); the exact kernels in this form measured 0.96-1.02x and stay a row at a time
// (bench/results/kernels-avx2-rows-xeon.md). Q4_0 and Q4_1 have since gone two rows to a
// register (rows_dot_q4_pairs, below).
template <encoding E, std::size_t R, bool Prefetch>
TLM_AVX2_INLINE inline void rows_dot_q8(const std::byte* const (&rows)[R], std::size_t blocks, const std::int8_t* q,
                                        const float* ds, float (&out)[R]) {
  constexpr std::size_t bb = bytes32<E>();
  row_sums<R> sums;
  __m128 mins = _mm_setzero_ps();  // lane r: row r's sum of m dx sum(q) (has_block_min)
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* p[R];
    block_of_rows(rows, b, bb, p);
    const __m128 dw = scales4(p);
    if constexpr (code_offset<E> != 0) {
      mins = _mm_fmadd_ps(_mm_mul_ps(dw, _mm_set1_ps(static_cast<float>(-code_offset<E>))), _mm_set1_ps(ds[2 * b + 1]), mins);
    } else if constexpr (has_block_min<E>) {
      const std::byte* m[R];
      for (std::size_t r = 0; r < R; ++r) m[r] = p[r] + 2;
      mins = _mm_fmadd_ps(scales4(m), _mm_set1_ps(ds[2 * b + 1]), mins);
    }
    const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * b));
    // dw * dx for each row, rounded once as row_dots_q8's scalar product is.
    const __m256 scale = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(ds[2 * b])));
#pragma GCC unroll 4
    for (std::size_t r = 0; r < R; ++r) {
      if constexpr (Prefetch) prefetch(p[r]);
      const __m256i w = stored_codes32<E>(p[r]);
      __m256i s;
      if constexpr (code_offset<E> != 0) s = _mm256_madd_epi16(_mm256_maddubs_epi16(w, qv), _mm256_set1_epi16(1));
      else s = dot32<E>(w, qv);
      const __m256 d = _mm256_permutevar8x32_ps(scale, _mm256_set1_epi32(static_cast<int>(r)));
      sums.acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, sums.acc[r]);
    }
  }
  alignas(16) float m[4];
  _mm_store_ps(m, mins);
  for (std::size_t r = 0; r < R; ++r) sums.mins[r] = m[r];
  sums.finish(out);
}

// A Q4_1 block's scale and min of each of R rows (R <= 4), converted together:
// [d0, m0, d1, m1, ...], lanes past 2R zero.
template <std::size_t R>
TLM_AVX2_INLINE inline __m256 scale_min_pairs(const std::byte* const (&p)[R]) {
  static_assert(R >= 1 && R <= 4);
  std::uint32_t dm[R];
  for (std::size_t r = 0; r < R; ++r) std::memcpy(&dm[r], p[r], 4);  // d and m are adjacent halves
  __m128i h = _mm_cvtsi32_si128(static_cast<int>(dm[0]));
  if constexpr (R > 1) h = _mm_insert_epi32(h, static_cast<int>(dm[1]), 1);
  if constexpr (R > 2) h = _mm_insert_epi32(h, static_cast<int>(dm[2]), 2);
  if constexpr (R > 3) h = _mm_insert_epi32(h, static_cast<int>(dm[3]), 3);
  return _mm256_cvtph_ps(h);
}

// Q4_0 / Q4_1 rows two to a register: a pair's 16 code bytes, row a's in the low lane and
// row b's in the high, give both rows' low nibbles (values 0..15) by one AND and their high
// nibbles (16..31) by a shift and an AND, against the activations' halves broadcast to
// both lanes; the two vpmaddubsw results add in 16 bits (|2 * 15 * 127| * 2 < 2^15) and
// one vpmaddwd, conversion and multiply-add serve the pair: 5.5 vector instructions a block
// and row where rows_dot_q8 takes 7, whose unpacking spreads one row's nibbles over a
// register (loads, and the scales' conversion shared by the 4 rows of a step, aside). The
// integer sums are exact, the scale dw dx and the mins as in row_dots_q8; only the float
// lanes' order of addition differs from it (bench/results/kernels-avx2-pairs-xeon.md).
template <encoding E, std::size_t R, bool Prefetch>
TLM_AVX2_INLINE inline void rows_dot_q4_pairs(const std::byte* const (&rows)[R], std::size_t blocks, const std::int8_t* q,
                                              const float* ds, float (&out)[R]) {
  static_assert(E == encoding::q4_0 || E == encoding::q4_1);
  constexpr std::size_t bb = bytes32<E>(), head = E == encoding::q4_1 ? 4 : 2;
  constexpr std::size_t P = (R + 1) / 2;  // pairs; an odd last row pairs with itself
  // Q4_1: row r's scale in lane 2r of the scale vector, its min's sum in lane 2r + 1 of
  // `mins` (the even lanes there sum d dx, unused); Q4_0: lane r of each.
  constexpr int spread = E == encoding::q4_1 ? 2 : 1;
  __m256 acc[P];
  for (std::size_t i = 0; i < P; ++i) acc[i] = _mm256_setzero_ps();
  __m256 mins = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* p[R];
    block_of_rows(rows, b, bb, p);
    __m256 scale;
    if constexpr (E == encoding::q4_1) {
      // [dx, dx sum(q)] in every lane pair: one multiply gives each row's d dx, one
      // multiply-add each row's m dx sum(q), both rounding as row_dots_q8's.
      const __m256 dm = scale_min_pairs(p);
      double pair;
      std::memcpy(&pair, ds + 2 * b, sizeof pair);
      const __m256 xd = _mm256_castpd_ps(_mm256_set1_pd(pair));
      mins = _mm256_fmadd_ps(dm, xd, mins);
      scale = _mm256_mul_ps(dm, xd);
    } else {
      const __m128 dw = scales4(p);
      mins = _mm256_fmadd_ps(_mm256_zextps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(-8.0f))), _mm256_set1_ps(ds[2 * b + 1]), mins);
      scale = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(ds[2 * b])));
    }
    const __m256i q_low = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 32 * b)));
    const __m256i q_high = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 32 * b + 16)));
#pragma GCC unroll 2
    for (std::size_t i = 0; i < P; ++i) {
      const std::size_t a = 2 * i, c = 2 * i + 1 < R ? 2 * i + 1 : 2 * i;
      if constexpr (Prefetch) {
        prefetch(p[a]);
        if (c != a) prefetch(p[c]);
      }
      const __m256i codes = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[a] + head))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[c] + head)), 1);
      const __m256i lo = _mm256_and_si256(codes, low), hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), low);
      const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, q_low), _mm256_maddubs_epi16(hi, q_high));
      const int la = spread * static_cast<int>(a), lc = spread * static_cast<int>(c);
      const __m256 d = _mm256_permutevar8x32_ps(scale, _mm256_setr_epi32(la, la, la, la, lc, lc, lc, lc));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones)), d, acc[i]);
    }
  }
  alignas(32) float m[8];
  _mm256_store_ps(m, mins);
  for (std::size_t i = 0; i < P; ++i) {
    out[2 * i] = hsum(_mm256_castps256_ps128(acc[i])) + m[spread * 2 * i + spread - 1];
    if (2 * i + 1 < R) out[2 * i + 1] = hsum(_mm256_extractf128_ps(acc[i], 1)) + m[spread * (2 * i + 1) + spread - 1];
  }
}

template <encoding E, bool Prefetch>
struct q8_rows {
  std::size_t blocks;
  const std::int8_t* q;
  const float* ds;
  template <std::size_t R>
  TLM_AVX2_FN void operator()(const std::byte* const (&rows)[R], float (&out)[R]) const {
    if constexpr (E == encoding::q4_0 || E == encoding::q4_1) rows_dot_q4_pairs<E, R, Prefetch>(rows, blocks, q, ds, out);
    else rows_dot_q8<E, R, Prefetch>(rows, blocks, q, ds, out);
  }
};

template <encoding E, bool Prefetch>
TLM_AVX2_FN inline void matvec_q8(encoding, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                                  std::size_t r0, std::size_t r1, std::size_t) {
  detail::rows_in_steps<4>(r0, r1, w, rb, y, q8_rows<E, Prefetch>{x.blocks, x.q.data(), x.ds.data()});
}

// Every weight row of [r0, r1) against the batch, four activation rows per call of
// Dots::run<4> (the weights unpacked once for the four), the rest one at a time.
template <class Dots>
TLM_AVX2_INLINE inline void matmul_q8_batch(const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                                            std::size_t r0, std::size_t r1, std::size_t rows) {
  float out[4];
  for (std::size_t i = 0; i < r1 - r0; ++i) {
    const std::size_t r = detail::streamed_row(r0, r1, i);
    const std::byte* row = w + r * rb;
    std::size_t b = 0;
    for (; b + 4 <= x.rows; b += 4) {
      Dots::template run<4>(row, x, b, out);
      for (std::size_t j = 0; j < 4; ++j) y[(b + j) * rows + r] = out[j];
    }
    for (; b < x.rows; ++b) {
      Dots::template run<1>(row, x, b, out);
      y[b * rows + r] = out[0];
    }
  }
}

template <encoding E>
struct q8_dots {
  template <int NB>
  TLM_AVX2_INLINE static void run(const std::byte* row, const q8_activations& x, std::size_t b, float* out) {
    const std::size_t qs = x.blocks * 32, dss = x.blocks * 2;
    // The batch's weight rows prefetched for Q5 only, as measured (matvec_q8 takes a choice).
    constexpr bool prefetch = E == encoding::q5_0 || E == encoding::q5_1;
    row_dots_q8<E, NB, prefetch>(row, x.blocks, x.q.data() + b * qs, qs, x.ds.data() + b * dss, dss, out);
  }
};

template <encoding E>
TLM_AVX2_FN inline void matmul_q8(encoding, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                                  std::size_t r0, std::size_t r1, std::size_t rows, std::size_t) {
  matmul_q8_batch<q8_dots<E>>(w, rb, x, y, r0, r1, rows);
}

}  // namespace tlm::kernels::avx2


#endif
