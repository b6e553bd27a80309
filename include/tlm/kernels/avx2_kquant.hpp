#pragma once
// AVX2 kernels for the K-quants (Q4_K, Q5_K, Q6_K): 256 values per super-block, in
// sub-blocks of 32 (Q4_K, Q5_K: a 6-bit scale and min each) or 16 (Q6_K: an 8-bit
// signed scale each). Layouts: format/blocks.hpp; the scalar decoder they are tested
// against: format/quant.hpp's dequantize_row; the integer reference: kernels/scalar.hpp.
//
// Exact mode decodes each sub-block to float32 bit for bit as dequantize_row does
// (d*sc and dmin*m are exact products of a half and a 6-bit integer, so one FMA with
// the code rounds once, as the reference's add does) and sums float32 products.
// Fast mode takes the activations quantized by groups of 256 (Q8_K, kernels/scalar.hpp),
// one group per super-block, and sums a super-block's integer products in integers.
#include <tlm/kernels/avx2.hpp>

#ifdef TLM_HAVE_AVX2_KERNELS

#include <tlm/format/blocks.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/kernels/scalar.hpp>
#include <tlm/kernels/target.hpp>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>


namespace tlm::kernels::avx2 {

template <encoding E>
inline constexpr std::size_t k_block_bytes = traits(E).block_bytes;

// Every cache line of the super-block prefetch_ahead bytes on (avx2.hpp, prefetch).
template <encoding E>
TLM_AVX2_INLINE inline void prefetch_superblock(const std::byte* p) {
  for (std::size_t at = 0; at < k_block_bytes<E>; at += 64) prefetch(p + at);
}

// The 32 codes of sub-block s (values 32s..32s+31, in order) as bytes: Q4_K 0..15,
// Q5_K 0..31, Q6_K -32..31.
template <encoding E>
TLM_AVX2_INLINE inline __m256i k_codes32(const std::byte* p, int s) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  if constexpr (E == encoding::q6_k) {
    // Value 128h + 32t + l: low bits from ql[64h + 32(t%2) + l] (nibble t/2), high bits
    // from qh[32h + l] (bits 2t, 2t+1); byte shifts are 16-bit shifts and a mask.
    const int h = s / 4, t = s % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32 * (t % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t / 2))), low4);
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
  } else {
    constexpr std::size_t qs_at = E == encoding::q5_k ? 48 : 16;
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + qs_at + 32 * (s / 2)));
    __m256i c = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(4 * (s % 2))), low4);
    if constexpr (E == encoding::q5_k) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
      const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
      c = _mm256_or_si256(c, _mm256_slli_epi16(bit, 4));
    }
    return c;
  }
}

// Sub-block s of a Q4_K / Q5_K super-block: d*sc and dmin*m (both exact).
TLM_AVX2_INLINE inline void k_scales(const std::byte* p, int s, float& dsc, float& dmn) {
  std::uint8_t sc, m;
  tlm::detail::k_scale_min(reinterpret_cast<const std::uint8_t*>(p) + 4, s, sc, m);
  dsc = _cvtsh_ss(load_u16(p)) * static_cast<float>(sc);
  dmn = _cvtsh_ss(load_u16(p + 2)) * static_cast<float>(m);
}

// Sub-block s (values 32s..32s+31) decoded to float32, bit for bit dequantize_row.
template <encoding E>
TLM_AVX2_INLINE inline void decode_k32(const std::byte* p, int s, __m256 (&w)[4]) {
  __m256i wide[4];
  widen32(k_codes32<E>(p, s), wide);
  if constexpr (E == encoding::q6_k) {
    const auto* scales = reinterpret_cast<const std::int8_t*>(p + 192);
    const float d = _cvtsh_ss(load_u16(p + 208));
    const __m256 da = _mm256_set1_ps(d * static_cast<float>(scales[2 * s]));
    const __m256 db = _mm256_set1_ps(d * static_cast<float>(scales[2 * s + 1]));
    w[0] = _mm256_mul_ps(da, _mm256_cvtepi32_ps(wide[0]));
    w[1] = _mm256_mul_ps(da, _mm256_cvtepi32_ps(wide[1]));
    w[2] = _mm256_mul_ps(db, _mm256_cvtepi32_ps(wide[2]));
    w[3] = _mm256_mul_ps(db, _mm256_cvtepi32_ps(wide[3]));
  } else {
    float dsc, dmn;
    k_scales(p, s, dsc, dmn);
    const __m256 vd = _mm256_set1_ps(dsc), vm = _mm256_set1_ps(-dmn);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide[k]), vd, vm);
  }
}

// ---- Exact matvec (decode) -----------------------------------------------------------
//
// As avx2.hpp's Q4 matvec, the scales are factored out of each sub-block's sum instead
// of decoding every weight: sum_l (dsc c_l - dmn) x_l = dsc (c . x) - dmn sum(x), with
// sum(x) of every block of 32 computed once per matvec (prepare_k_x), and the mins of a
// super-block applied by one 8-lane multiply-add. Q6_K takes its codes as stored
// (c + 32 for the signed c) and subtracts 32 d sc sum(x) per 16 values the same way;
// its two 16-value halves take their own scale. The same sum in another order than
// dequantize_row's (within the tolerance of tests/test_kernels.cpp).

// The 8 6-bit scales and mins of a Q4_K / Q5_K super-block as bytes, unpacked four at a
// time from the three little-endian words of `scales` (layout: detail::k_scale_min);
// k_scales8: as floats, d*sc and dmin*m (exact: a half times a 6-bit integer).
TLM_AVX2_INLINE inline void k_scale_bytes(const std::byte* p, __m128i& sc, __m128i& m) {
  std::uint32_t a, b, c;
  std::memcpy(&a, p + 4, 4);
  std::memcpy(&b, p + 8, 4);
  std::memcpy(&c, p + 12, 4);
  const std::uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
  const std::uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
  sc = _mm_setr_epi32(static_cast<int>(a & 0x3f3f3f3fu), static_cast<int>(sc_hi), 0, 0);
  m = _mm_setr_epi32(static_cast<int>(b & 0x3f3f3f3fu), static_cast<int>(m_hi), 0, 0);
}

TLM_AVX2_INLINE inline void k_scales8(const std::byte* p, __m256& dsc, __m256& dmn) {
  __m128i sc, m;
  k_scale_bytes(p, sc, m);
  dsc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)), _mm256_set1_ps(_cvtsh_ss(load_u16(p))));
  dmn = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m)), _mm256_set1_ps(_cvtsh_ss(load_u16(p + 2))));
}

// The 16 scales d*sc of a Q6_K super-block (exact: a half times an 8-bit integer).
TLM_AVX2_INLINE inline void q6_scales16(const std::byte* p, float (&out)[16]) {
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(p + 208)));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc))), d));
}

// The codes as stored (0..63, the signed code plus 32) of sub-block 4h + t of a Q6_K
// super-block, from the half's two 32-byte rows of low bits (ql0, ql1: nibble t/2 of row
// t%2) and its row of high bits (qh: bits 2t, 2t+1). t is a constant once the callers'
// loops are unrolled.
TLM_AVX2_INLINE inline __m256i q6_stored(__m256i ql0, __m256i ql1, __m256i qh, int t) {
  const __m256i ql = t % 2 ? ql1 : ql0;
  const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t / 2))), _mm256_set1_epi8(0x0f));
  const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
  return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}

// The codes of sub-blocks 2i and 2i+1 of a Q4_K / Q5_K super-block (values in order).
template <encoding E>
TLM_AVX2_INLINE inline void k_code_pair(const std::byte* p, int i, __m256i qh, __m256i& lo, __m256i& hi) {
  constexpr std::size_t qs_at = E == encoding::q5_k ? 48 : 16;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + qs_at + 32 * i));
  lo = _mm256_and_si256(qs, low4);
  hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), low4);
  if constexpr (E == encoding::q5_k) {
    const __m256i one = _mm256_set1_epi8(1);
    const __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * i)), one);
    const __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * i + 1)), one);
    lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
    hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
  }
  (void)qh;
}

// The codes are widened from bytes to int32 by in-lane byte shuffles (vpshufb: dword j
// of a 16-byte lane takes byte 4j + m, m = 0..3), not in value order by vpmovsxbd, which
// crosses lanes; x is permuted once per matvec to meet them (prepare_k_x). One 32-byte
// row of codes is one sub-block (Q6_K: one sub-block of 32, two scales of 16).

// Which value of a sub-block lane d of widened vector m meets (p = 8m + d): byte
// 16(d/4) + 4(d%4) + m of the row.
constexpr std::size_t k_lane_value(std::size_t p) {
  const std::size_t m = p / 8, d = p % 8;
  return 16 * (d / 4) + 4 * (d % 4) + m;
}

inline constexpr auto k_lane_order = [] {
  std::array<std::uint8_t, 256> order{};
  for (std::size_t p = 0; p < 256; ++p) order[p] = static_cast<std::uint8_t>(32 * (p / 32) + k_lane_value(p % 32));
  return order;
}();

// Values per sum of x that a K-quant matvec takes: a sub-block (Q4_K, Q5_K: times its
// min), a scale's 16 values (Q6_K: times 32 d sc, the code offset of the stored codes).
template <encoding E>
inline constexpr std::size_t k_sum_values = E == encoding::q6_k ? 16 : 32;

// x [cols] -> [cols] in `order` per super-block of 256, then the sums of each
// k_sum_values values in value order [cols / k_sum_values] (both levels' K-quant
// matvecs; the order is the level's).
template <encoding E>
inline void prepare_permuted_x(const float* x, std::size_t cols, std::vector<float>& prepared,
                               const std::array<std::uint8_t, 256>& order) {
  constexpr std::size_t n = k_sum_values<E>;
  prepared.resize(cols + cols / n);
  for (std::size_t sb = 0; sb < cols / 256; ++sb)
    for (std::size_t p = 0; p < 256; ++p) prepared[256 * sb + p] = x[256 * sb + order[p]];
  sums_of<n>(x, cols, prepared.data() + cols);
}

template <encoding E>
inline void prepare_k_x(const float* x, std::size_t cols, std::vector<float>& prepared) {
  prepare_permuted_x<E>(x, cols, prepared, k_lane_order);
}

// Dword j of every 16-byte lane of v <- byte 4j + M of the lane (control bytes 0x80
// give zero), as float32.
template <int M>
TLM_AVX2_INLINE inline __m256 widen_lane_bytes(__m256i v) {
  const __m256i pick = _mm256_add_epi32(_mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12),
                                        _mm256_set1_epi32(static_cast<int>(0x80808000u) + M));
  return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(v, pick));
}

// sum of codes times x over a row of 32 codes (x in k_lane_order), in 8 lanes: lanes
// 0-3 hold values 0-15 of the row, 4-7 values 16-31.
TLM_AVX2_INLINE inline __m256 row_times_x(__m256i codes, const float* x) {
  __m256 acc = _mm256_mul_ps(widen_lane_bytes<0>(codes), load8(x));
  acc = _mm256_fmadd_ps(widen_lane_bytes<1>(codes), load8(x + 8), acc);
  acc = _mm256_fmadd_ps(widen_lane_bytes<2>(codes), load8(x + 16), acc);
  return _mm256_fmadd_ps(widen_lane_bytes<3>(codes), load8(x + 24), acc);
}

template <encoding E>
TLM_AVX2_FN inline float row_dot_k(const std::byte* row, const float* x, std::size_t cols) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 corrections = _mm256_setzero_ps();
  const float* xsum = x + cols;  // [cols / k_sum_values<E>] (prepare_k_x)
  for (std::size_t sb = 0; sb < cols / 256; ++sb) {
    const std::byte* p = row + sb * k_block_bytes<E>;
    prefetch_superblock<E>(p);
    const float* xs = x + 256 * sb;
    if constexpr (E == encoding::q6_k) {
      float scales[16];
      q6_scales16(p, scales);
      corrections = _mm256_fmadd_ps(_mm256_loadu_ps(scales), load8(xsum + 16 * sb), corrections);
      corrections = _mm256_fmadd_ps(_mm256_loadu_ps(scales + 8), load8(xsum + 16 * sb + 8), corrections);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const int s = 4 * h + t;
          // Lanes 0-3: the sub-block's first 16 values, scale 2s; 4-7: scale 2s + 1.
          const __m256 lane_scales = _mm256_setr_m128(_mm_set1_ps(scales[2 * s]), _mm_set1_ps(scales[2 * s + 1]));
          acc[t % 2] = _mm256_fmadd_ps(lane_scales, row_times_x(q6_stored(ql0, ql1, qh, t), xs + 32 * s), acc[t % 2]);
        }
      }
    } else {
      __m256 dsc, dmn;
      k_scales8(p, dsc, dmn);
      corrections = _mm256_fmadd_ps(dmn, load8(xsum + 8 * sb), corrections);
      float scales[8];
      _mm256_storeu_ps(scales, dsc);
      const __m256i qh = E == encoding::q5_k ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16))
                                             : _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        __m256i lo, hi;
        k_code_pair<E>(p, i, qh, lo, hi);
        acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(scales[2 * i]), row_times_x(lo, xs + 64 * i), acc[0]);
        acc[1] = _mm256_fmadd_ps(_mm256_set1_ps(scales[2 * i + 1]), row_times_x(hi, xs + 64 * i + 32), acc[1]);
      }
    }
  }
  // Less the mins times their sub-block sums (Q4_K, Q5_K) or 32 times the scales times
  // their 16 values' sums (Q6_K: the stored codes are the signed ones plus 32).
  return hsum(_mm256_add_ps(acc[0], acc[1])) - (E == encoding::q6_k ? 32.0f : 1.0f) * hsum(corrections);
}

// x: prepare_k_x's output.
template <encoding E>
TLM_AVX2_FN inline void matvec_rows_k(encoding, const std::byte* w, std::size_t rb, const float* x, float* y,
                                      std::size_t r0, std::size_t r1, std::size_t cols) {
  for (std::size_t i = 0; i < r1 - r0; ++i) {
    const std::size_t r = detail::streamed_row(r0, r1, i);
    y[r] = row_dot_k<E>(w + r * rb, x, cols);
  }
}

// A whole row to float32, for the prefill GEMM (matmul_rows).
template <encoding E>
TLM_AVX2_FN inline void decode_row_k(encoding, const std::byte* row, float* out, std::size_t cols) {
  for (std::size_t sb = 0; sb < cols / 256; ++sb) {
    const std::byte* p = row + sb * k_block_bytes<E>;
    for (int s = 0; s < 8; ++s) {
      __m256 w[4];
      decode_k32<E>(p, s, w);
      float* o = out + 256 * sb + 32 * static_cast<std::size_t>(s);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) _mm256_storeu_ps(o + 8 * k, w[k]);
    }
  }
}

// ---- Fast mode --------------------------------------------------------------------
//
// The activations come grouped by 256 (kernels/scalar.hpp): block s of a super-block has
// d_x = k_s D, so a super-block's sum is one integer, summed as llama.cpp's AVX2 kernel
// sums its Q8_K products: codes times q into int16 pairs (vpmaddubsw: codes <= 63
// unsigned, |q| <= 127, so a pair is at most 16,002 and cannot saturate), pairs times
// their sub-block's scale sc_s k_s (at most 63 x 16, or 128 x 16 for Q6_K) into int32
// (vpmaddwd), added; one conversion and one FMA with d D per super-block. The mins
// (Q4_K, Q5_K) and Q6_K's code offset of 32 come from the activations' sums of 16
// (q8_activations::sums). One weight row against NB activation rows from row b of x;
// the codes are unpacked once for all of them, the scales formed per row (their steps
// differ). Prefetch: each super-block's lines 1 KiB ahead, as the exact kernels, or
// none (the table's choice on AMD): decoding the 1B-shaped Q4_K_M file (llama32_1b) on
// Zen 4 at this level, 1 thread, measured 42.0-42.3 ms/token without it and 46.1-46.7
// with it; on the Intel Xeon the K-quant kernels streamed from DRAM 2-3x faster with it
// (prefetch_ahead, avx2.hpp).

// Every int16 lane holds word k of each 128-bit half of `words` (k_lo in the low half,
// k_hi in the high): a sub-block's scale spread over its products.
TLM_AVX2_INLINE inline __m256i spread_words(__m256i words, int k_lo, int k_hi) {
  const char a0 = static_cast<char>(2 * k_lo), a1 = static_cast<char>(2 * k_lo + 1);
  const char b0 = static_cast<char>(2 * k_hi), b1 = static_cast<char>(2 * k_hi + 1);
  const __m256i pick = _mm256_setr_epi8(a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1,
                                        b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1);
  return _mm256_shuffle_epi8(words, pick);
}

// The sum of c q over 32 values, each pair of products times its word of `scale`.
TLM_AVX2_INLINE inline __m256i k_products(__m256i c, const std::int8_t* q, __m256i scale) {
  const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(c, qv), scale);
}

// Each word of a [8] twice, in order: [a0 a0 a1 a1 ... a7 a7].
TLM_AVX2_INLINE inline __m256i doubled_words(__m128i a) {
  return _mm256_set_m128i(_mm_unpackhi_epi16(a, a), _mm_unpacklo_epi16(a, a));
}

template <encoding E, int NB, bool Prefetch = true>
TLM_AVX2_INLINE inline void row_dots_k(const std::byte* row, const q8_activations& x, std::size_t b, float* out) {
  const std::size_t nb = x.blocks, stride = nb * 32, pairs = nb * 2;  // per activation row: q, sums
  const std::int8_t* q = x.q.data() + b * stride;
  const std::int16_t* sums = x.sums.data() + b * pairs;
  const std::uint8_t* steps = x.steps.data() + b * nb;
  const float* units = x.units.data() + b * (nb / 8);
  __m256 acc[NB], mins[NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) acc[j] = mins[j] = _mm256_setzero_ps();
  for (std::size_t sb = 0; sb < nb / 8; ++sb) {
    const std::byte* p = row + sb * k_block_bytes<E>;
    if constexpr (Prefetch) prefetch_superblock<E>(p);
    const std::int8_t* qs = q + 256 * sb;
    __m256i isum[NB], scales[NB];  // scales: per row j, the sub-blocks' sc k as int16
    float unit[NB];
    __m128i k8[NB];                // per row j: the 8 blocks' steps
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const std::size_t jj = static_cast<std::size_t>(j);
      unit[j] = units[jj * (nb / 8) + sb];
      k8[j] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(steps + jj * nb + 8 * sb));
    }
    float d;
    if constexpr (E == encoding::q6_k) {
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)));  // [16]
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        // Half h takes the step of block h / 2.
        scales[j] = _mm256_mullo_epi16(sc16, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(k8[j], k8[j])));
        // The codes' offset, 32 sum_h sc_h k_h sum_h(q), taken off first.
        const __m256i hs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + static_cast<std::size_t>(j) * pairs + 16 * sb));
        isum[j] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(scales[j], hs), 5));
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const int s = 4 * h + t;
          const __m256i c = q6_stored(ql0, ql1, qh, t);
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) {
            // Halves 2s, 2s + 1: words 2t, 2t + 1 of the scales' half h.
            const __m256i half = h == 0 ? _mm256_permute2x128_si256(scales[j], scales[j], 0x00)
                                        : _mm256_permute2x128_si256(scales[j], scales[j], 0x11);
            isum[j] = _mm256_add_epi32(isum[j], k_products(c, qs + static_cast<std::size_t>(j) * stride + 32 * s,
                                                           spread_words(half, 2 * t, 2 * t + 1)));
          }
        }
      }
      d = _cvtsh_ss(load_u16(p + 208));
    } else {
      __m128i sc8, m8;
      k_scale_bytes(p, sc8, m8);
      const __m128i sc16 = _mm_cvtepu8_epi16(sc8), m16 = _mm_cvtepu8_epi16(m8);  // [8]
      const float dmin = _cvtsh_ss(load_u16(p + 2));
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const __m128i k16 = _mm_cvtepu8_epi16(k8[j]);
        scales[j] = _mm256_broadcastsi128_si256(_mm_mullo_epi16(sc16, k16));  // [2][8]
        // Each min times its step against the sums of its sub-block's two halves.
        const __m256i hs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + static_cast<std::size_t>(j) * pairs + 16 * sb));
        const __m256i msum = _mm256_madd_epi16(doubled_words(_mm_mullo_epi16(m16, k16)), hs);
        mins[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(dmin * unit[j]), mins[j]);
        isum[j] = _mm256_setzero_si256();
      }
      const __m256i qh = E == encoding::q5_k ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16))
                                             : _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        __m256i lo, hi;
        k_code_pair<E>(p, i, qh, lo, hi);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          const std::int8_t* qj = qs + static_cast<std::size_t>(j) * stride + 64 * i;
          isum[j] = _mm256_add_epi32(isum[j], k_products(lo, qj, spread_words(scales[j], 2 * i, 2 * i)));
          isum[j] = _mm256_add_epi32(isum[j], k_products(hi, qj + 32, spread_words(scales[j], 2 * i + 1, 2 * i + 1)));
        }
      }
      d = _cvtsh_ss(load_u16(p));
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_set1_ps(d * unit[j]), acc[j]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) out[j] = hsum(acc[j]) - hsum(mins[j]);
}

template <encoding E, bool Prefetch = true>
TLM_AVX2_FN inline void matvec_q8_k(encoding, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                                    std::size_t r0, std::size_t r1, std::size_t) {
  for (std::size_t i = 0; i < r1 - r0; ++i) {
    const std::size_t r = detail::streamed_row(r0, r1, i);
    row_dots_k<E, 1, Prefetch>(w + r * rb, x, 0, y + r);
  }
}

template <encoding E>
struct k_dots {
  template <int NB>
  TLM_AVX2_INLINE static void run(const std::byte* row, const q8_activations& x, std::size_t b, float* out) {
    row_dots_k<E, NB>(row, x, b, out);
  }
};

template <encoding E>
TLM_AVX2_FN inline void matmul_q8_k(encoding, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                                    std::size_t r0, std::size_t r1, std::size_t rows, std::size_t) {
  matmul_q8_batch<k_dots<E>>(w, rb, x, y, r0, r1, rows);
}

}  // namespace tlm::kernels::avx2


#endif
