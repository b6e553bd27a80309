#pragma once
// AVX-512 (F, BW, VL, DQ) kernels, with VNNI for the fast mode where the CPU has it.
// As in avx2.hpp every function carries its own target attribute, so the program
// stays baseline x86-64 and a CPU without AVX-512 never reaches these (kernels/table.hpp
// installs them only after the level's CPU test has passed).
//
// Exact mode (float32 activations):
//   matvec: the block scale factored out of the block's sum (as avx2.hpp does), 16
//           lanes = half a block, so a Q4 block is two multiplies with no permutation
//           of x; two accumulators; software prefetch ahead of the weight stream; blocks
//           of 32 four rows a step. Q5_x (a pair of blocks) and the K-quants (128
//           values) assemble 64 code bytes at a time and widen them inside 128-bit
//           lanes, x permuted to match. With VNNI (Intel), Q5_x instead takes x as
//           three signed bytes per value and sums in integers (prepare_q5_digits).
//   matmul: a register-blocked outer-product micro-kernel. Weight rows are decoded
//           once per slice of the batch into a float32 panel [rt, cols]; the slice of
//           activations is transposed once into [cols, 16] columns, so each
//           multiply-add takes one weight (broadcast) and 16 batch rows (a vector):
//           12 rows x 32 batch rows = 24 accumulators in registers.
// Fast mode (int8 activations, VNNI): matvec takes 64 weight bytes (two blocks, or two
// K-quant sub-blocks) per vpdpbusd; with VBMI, four Q4 blocks per step (one byte permute
// gathers their codes). Matmul puts 16 weight rows in the lanes (matmul_q8).
//
// Dispatch (kernels/table.hpp): on AMD the exact Q8_0 / Q4_0 / Q4_1 matvec uses the AVX2
// kernels, which measured faster on Zen 4, whose 512-bit operations run as two 256-bit
// halves, and the byte-permute kernels only run on AMD (slower on an Intel Xeon);
// everything else here is used wherever the CPU has AVX-512.
#if defined(__x86_64__) || defined(__i386__)
#define TLM_HAVE_AVX512_KERNELS 1

#include <tlm/format/blocks.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/kernels/avx2.hpp>
#include <tlm/kernels/avx2_kquant.hpp>
#include <tlm/kernels/scalar.hpp>
#include <tlm/kernels/target.hpp>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

// GCC 12 reports its own intrinsics (_mm512_cvtepu8_epi32 and others start from
// _mm512_undefined_*(), a self-initialized variable) as "used uninitialized" once
// they are inlined here (GCC bug 105593, fixed in GCC 13); the warning is false.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define TLM_VNNI_FN [[gnu::target(TLM_TARGET_AVX512 ",avx512vnni")]]
#define TLM_VNNI_INLINE [[gnu::target(TLM_TARGET_AVX512 ",avx512vnni"), gnu::always_inline]]

namespace tlm::kernels::avx512 {

// How far ahead of the current block the weight stream is prefetched. The hardware
// prefetcher follows one sequential stream well; the software prefetch mainly covers
// the start of each chunk and the page boundaries, where the hardware one restarts.
inline constexpr std::size_t prefetch_ahead = 1024;
// Rows a matvec computes together (detail::rows_in_steps), one of each of streamed_row's
// 4 streams: Q5_0 1536x576, exact (rows_dot_q5_digits), hot, 1 thread, on the Xeon:
// 13.0-13.1 GB/s a row at a time, 13.3-14.4 at 2, 15.1-15.4 at 4, 14.6-15.2 at 8.
inline constexpr std::size_t rows_a_step = 4;

TLM_AVX512_INLINE inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

TLM_AVX512_INLINE inline float half_at(const std::byte* p) { return _cvtsh_ss(load_u16(p)); }

// 32 consecutive values of a float-type row (f32, f16, bf16) as two vectors.
template <encoding E>
TLM_AVX512_INLINE inline void float32_values(const std::byte* p, __m512& a, __m512& b) {
  if constexpr (E == encoding::f32) {
    a = _mm512_loadu_ps(p);
    b = _mm512_loadu_ps(p + 64);
  } else if constexpr (E == encoding::f16) {
    a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
  } else {
    static_assert(E == encoding::bf16);
    a = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
    b = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))), 16));
  }
}

TLM_AVX512_FN inline float dot(const float* a, const float* b, std::size_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  if (i + 16 <= n) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    i += 16;
  }
  if (i < n) {
    // The tail as one masked step: lanes past n load as zero and add nothing.
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return hsum(_mm512_add_ps(s0, s1));
}

TLM_AVX512_FN inline void axpy(float a, const float* x, float* y, std::size_t n) {
  const __m512 va = _mm512_set1_ps(a);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// Sixteen int8 codes widened to float (exact); lanes outside `m` load as zero.
TLM_AVX512_INLINE inline __m512 load16_i8(const std::int8_t* p, __mmask16 m = 0xFFFF) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

TLM_AVX512_FN inline float dot_i8(const float* a, const std::int8_t* b, std::size_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16_i8(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), load16_i8(b + i + 16), s1);
  }
  if (i + 16 <= n) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16_i8(b + i), s0);
    i += 16;
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load16_i8(b + i, m), s1);
  }
  return hsum(_mm512_add_ps(s0, s1));
}

TLM_AVX512_FN inline void axpy_i8(float a, const std::int8_t* x, float* y, std::size_t n) {
  const __m512 va = _mm512_set1_ps(a);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load16_i8(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, load16_i8(x + i, m), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// ---- Codes widened inside 128-bit lanes ---------------------------------------------
//
// Byte codes widened to int32 in value order (vpmovsxbd) cross 128-bit lanes, which
// Zen 4 runs as two dependent 256-bit halves; byte shuffles inside each lane do not.
// They take 64 code bytes to four vectors of 16 dwords, dword j of each 16-byte lane
// from byte 4j + m (m = 0..3), so a vector's values are not consecutive and x is
// permuted once per matvec to meet them: position p = 16m + d of 64 meets byte
// widened_byte(p).

constexpr std::size_t widened_byte(std::size_t p) { return 16 * (p % 16 / 4) + 4 * (p % 4) + p / 16; }

// Dword j of every 16-byte lane of v <- byte 4j + M of the lane, as float32: zero-
// extended (control bytes 0x80 give zero), or (Signed) put at the top of the dword and
// brought down with its sign by an arithmetic shift.
template <int M, bool Signed>
TLM_AVX512_INLINE inline __m512 widen_lane_bytes(__m512i v) {
  const __m512i j4 = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
  if constexpr (Signed) {
    const __m512i pick = _mm512_add_epi32(_mm512_slli_epi32(j4, 24), _mm512_set1_epi32(0x00808080 + (M << 24)));
    return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_shuffle_epi8(v, pick), 24));
  } else {
    const __m512i pick = _mm512_add_epi32(j4, _mm512_set1_epi32(static_cast<int>(0x80808000u) + M));
    return _mm512_cvtepi32_ps(_mm512_shuffle_epi8(v, pick));
  }
}

// sum of codes times x over the 64 codes of one vector of bytes, in 16 lanes (lanes
// 4L..4L+3 from bytes 16L..16L+15), x in widened_byte order.
template <bool Signed = false>
TLM_AVX512_INLINE inline __m512 bytes_times_x(__m512i codes, const float* x) {
  __m512 acc = _mm512_mul_ps(widen_lane_bytes<0, Signed>(codes), _mm512_loadu_ps(x));
  acc = _mm512_fmadd_ps(widen_lane_bytes<1, Signed>(codes), _mm512_loadu_ps(x + 16), acc);
  acc = _mm512_fmadd_ps(widen_lane_bytes<2, Signed>(codes), _mm512_loadu_ps(x + 32), acc);
  return _mm512_fmadd_ps(widen_lane_bytes<3, Signed>(codes), _mm512_loadu_ps(x + 48), acc);
}

// [a, a, b, b]: the 16 bytes at a and the 16 at b, each twice. Two broadcast loads, the
// second merged under a mask: no shuffle-port instruction, where inserting b and
// shuffling the lanes took two.
TLM_AVX512_INLINE inline __m512i twice_each(const std::byte* a, const std::byte* b) {
  const __m512i za = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
  return _mm512_mask_broadcast_i32x4(za, 0xff00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
}

// The 64 codes of two Q5_0 / Q5_1 blocks as unsigned bytes 0..31, each block's in
// value order: the nibbles as for Q4 (the 16 bytes twice, the second copy shifted to
// the high nibbles), plus 16 where a fifth bit is set, the two blocks' 32-bit words of
// fifth bits (bit j for value j) being one 64-bit mask, bit i for byte i.
template <encoding E>
TLM_AVX512_INLINE inline __m512i q5_codes64(const std::byte* p0, const std::byte* p1) {
  constexpr std::size_t qh_at = E == encoding::q5_1 ? 4 : 2;
  std::uint32_t h0, h1;
  std::memcpy(&h0, p0 + qh_at, 4);
  std::memcpy(&h1, p1 + qh_at, 4);
  const __mmask64 fifth = _cvtu64_mask64(h0 | (std::uint64_t{h1} << 32));
  __m512i z = twice_each(p0 + qh_at + 4, p1 + qh_at + 4);
  z = _mm512_and_si512(_mm512_srlv_epi64(z, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0f));
  return _mm512_mask_add_epi8(z, fifth, z, _mm512_set1_epi8(16));
}

// Two Q5 blocks' codes . x in 16 lanes, lanes 0-7 the first block's, 8-15 the second's
// (x permuted per pair of blocks, widened_byte). Q5_0's codes too are taken unsigned
// (0..31, not c - 16): the caller subtracts 16 d sum(x) per block, as Q5_1 adds m sum(x).
template <encoding E>
TLM_AVX512_INLINE inline __m512 q5_pair_dot(const std::byte* p0, const std::byte* p1, const float* x) {
  return bytes_times_x(q5_codes64<E>(p0, p1), x);
}

// ---- Exact matvec -------------------------------------------------------------------
//
// Q4 blocks: the 16 code bytes are broadcast to the four 128-bit lanes, the upper two
// lanes shifted to the high nibbles, and two in-lane byte shuffles widen 4 codes per
// lane to int32: e0 = values [0,4) [4,8) [16,20) [20,24), e1 = [8,12) [12,16) [24,28)
// [28,32). In-lane shuffles instead of vpmovzxbd: on AMD Zen 4 the lane-crossing
// widening of a 512-bit register is the bottleneck of this loop. x is permuted once
// per matvec to match (prepare_q4_x), followed by the pairs [0, sum x_b] per block
// that multiply [d_b, m_b] (only Q4_1 has a min; Q4_0's codes are re-centred).

inline constexpr std::size_t q4_order[32] = {0, 1, 2,  3,  4,  5,  6,  7,  16, 17, 18, 19, 20, 21, 22, 23,
                                             8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};

// Blocks whose decode adds a min: Q4_1 and Q5_1 (d at byte 0, m at byte 2).
template <encoding E>
inline constexpr bool has_min = E == encoding::q4_1 || E == encoding::q5_1;

// vpdpbusd never saturates, so every encoding takes its codes unsigned here.
template <encoding E>
inline constexpr int lane_code_offset = avx2::stored_code_offset<E>;

// x [cols] -> [cols] in the order each block's codes are widened, then [blocks, 2] =
// {0, sum of the block}. Q4_0, Q4_1: q4_order per block. Q5_0, Q5_1: each whole pair of
// blocks in widened_byte order (q5_pair_dot); the last block of an odd count stays in
// value order (block_codes_dot).
template <encoding E>
inline void prepare_q4_x(const float* x, std::size_t cols, std::vector<float>& prepared) {
  constexpr bool pairs = E == encoding::q5_0 || E == encoding::q5_1;
  const std::size_t blocks = cols / 32;
  prepared.resize(cols + 2 * blocks);  // [cols] x (permuted), then [blocks, 2]
  for (std::size_t b = 0; b < blocks; ++b) {
    const bool paired = pairs && (b ^ 1) < blocks;  // b and its partner b ^ 1 form a whole pair
    const std::size_t base = paired ? 32 * (b & ~std::size_t{1}) : 32 * b;
    float t = 0;
    for (std::size_t i = 0; i < 32; ++i) {
      const std::size_t at = 32 * b + i;
      prepared[at] = paired ? x[base + widened_byte(at - base)] : x[base + (pairs ? i : q4_order[i])];
      t += x[at];
    }
    prepared[cols + 2 * b] = 0.0f;
    prepared[cols + 2 * b + 1] = t;
  }
}

template <encoding E>
TLM_AVX512_INLINE inline void q4_codes(const std::byte* qs, __m512& e0, __m512& e1) {
  __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  b = _mm512_and_si512(_mm512_srlv_epi64(b, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)), _mm512_set1_epi8(0x0f));
  if constexpr (E == encoding::q4_0) b = _mm512_sub_epi8(b, _mm512_set1_epi8(8));
  // Lanes 0, 2 widen bytes 0..3 (c0) or 8..11 (c1), lanes 1, 3 bytes 4..7 or 12..15;
  // control bytes 0xff give zero.
  const __m512i c0 = _mm512_setr_epi32(0xffffff00, 0xffffff01, 0xffffff02, 0xffffff03,   //
                                       0xffffff04, 0xffffff05, 0xffffff06, 0xffffff07,   //
                                       0xffffff00, 0xffffff01, 0xffffff02, 0xffffff03,   //
                                       0xffffff04, 0xffffff05, 0xffffff06, 0xffffff07);
  const __m512i c1 = _mm512_add_epi32(c0, _mm512_set1_epi32(8));
  if constexpr (E == encoding::q4_0) {
    // Signed codes: the byte goes to the top of the int32 and an arithmetic shift
    // brings it down with its sign.
    const __m512i top = _mm512_set1_epi32(0x00ffffff);
    const __m512i s0 = _mm512_or_si512(_mm512_slli_epi32(c0, 24), top);
    const __m512i s1 = _mm512_or_si512(_mm512_slli_epi32(c1, 24), top);
    e0 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_shuffle_epi8(b, s0), 24));
    e1 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_shuffle_epi8(b, s1), 24));
  } else {
    e0 = _mm512_cvtepi32_ps(_mm512_shuffle_epi8(b, c0));
    e1 = _mm512_cvtepi32_ps(_mm512_shuffle_epi8(b, c1));
  }
}

// [d0, m0, d1, m1] of two Q4_1 / Q5_1 blocks, [d0, 0, d1, 0] of Q4_0 / Q5_0 / Q8_0 blocks.
template <encoding E>
TLM_AVX512_INLINE inline __m128 scale_pair(const std::byte* p0, const std::byte* p1) {
  std::uint64_t bits;
  if constexpr (has_min<E>) {
    std::uint32_t a, b;
    std::memcpy(&a, p0, 4);
    std::memcpy(&b, p1, 4);
    bits = a | (std::uint64_t{b} << 32);
  } else {
    // [d0, 0, d1, 0] as halves: d1 inserted from memory (vpinsrw) instead of joined in a
    // general register.
    return _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(load_u16(p0)), load_u16(p1), 2));
  }
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(bits)));
}

// d of blocks b and b + 1 (at p and p + bb) of R <= 4 rows, converted together:
// [d0 of row 0, d1 of row 0, d0 of row 1, ...], the rest zero. One conversion for the
// R rows where scale_pair takes one per row. The halves are joined in two general
// registers, not by 8 word inserts, which all take the shuffle port the kernels need:
// Q5_0 1536x576 fast, hot, 1 thread, 1.04x (bench/results/kernels-q5-digits-xeon.md).
template <std::size_t R>
TLM_AVX512_INLINE inline __m256 pair_scales(const std::byte* const (&p)[R], std::size_t bb) {
  static_assert(R >= 1 && R <= 4);
  std::uint64_t half[2] = {0, 0};
  for (std::size_t r = 0; r < R; ++r)
    half[r / 2] |= (std::uint64_t{load_u16(p[r])} | std::uint64_t{load_u16(p[r] + bb)} << 16) << (32 * (r % 2));
  return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<long long>(half[1]), static_cast<long long>(half[0])));
}

// Lanes 0-7 take lane 0 of scale_pair's [d0, m0, d1, m1], lanes 8-15 lane 2.
TLM_AVX512_INLINE inline __m512i scale_pair_pick() {
  return _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
}

template <std::size_t R>
TLM_AVX512_INLINE inline void zero_sums(__m512 (&acc)[R], __m128 (&mins)[R]) {
  for (std::size_t r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    mins[r] = _mm_setzero_ps();
  }
}

// Lanes 0-7 of row r's pair take pair_scales' lane 2r, lanes 8-15 lane 2r + 1.
TLM_AVX512_INLINE inline __m512i pair_pick(std::size_t r) {
  const int first = static_cast<int>(2 * r);
  return _mm512_mask_set1_epi32(_mm512_set1_epi32(first), 0xff00, first + 1);
}

// sum_j c_j x_j of one quantized block (codes . x, before the scale).
template <encoding E>
TLM_AVX512_INLINE inline __m512 block_codes_dot(const std::byte* p, const float* xb) {
  __m512 w0, w1;
  if constexpr (E == encoding::q8_0) {
    w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2))));
    w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18))));
  } else if constexpr (E == encoding::q5_0 || E == encoding::q5_1) {
    // The AVX2 unpacking (32 code bytes in value order), widened 16 at a time.
    const std::byte* qh = p + (has_min<E> ? 4 : 2);
    const __m256i c = avx2::q5_codes<E>(qh + 4, qh);
    w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(c)));
    w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(c, 1)));
  } else {
    q4_codes<E>(p + (E == encoding::q4_1 ? 4 : 2), w0, w1);
  }
  return _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), _mm512_mul_ps(w0, _mm512_loadu_ps(xb)));
}

// R rows of a 32-block matrix (Q8_0, Q4_x, Q5_x): sum_b d_b (codes_b . x_b)
// [+ m_b sum(x_b)], two blocks per step (one conversion of the four scales, two
// accumulators). Each row's sum is computed as one row alone would be; R rows share
// the loop (rows_a_step).
template <encoding E, std::size_t R>
TLM_AVX512_INLINE inline void rows_dot_quant(const std::byte* const (&rows)[R], const float* x, const float* xsum,
                                             std::size_t blocks, float (&out)[R]) {
  constexpr std::size_t bb = row_bytes(E, 32);
  __m512 acc0[R], acc1[R];
  __m128 mins[R];
  zero_sums(acc0, mins);
  for (std::size_t r = 0; r < R; ++r) acc1[r] = _mm512_setzero_ps();
  std::size_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
#pragma GCC unroll 4
    for (std::size_t r = 0; r < R; ++r) {
      const std::byte* p = rows[r] + b * bb;
      _mm_prefetch(reinterpret_cast<const char*>(p + prefetch_ahead), _MM_HINT_T0);
      const __m128 dm = scale_pair<E>(p, p + bb);
      if constexpr (E == encoding::q5_0 || E == encoding::q5_1) {
        const __m512 d = _mm512_permutexvar_ps(scale_pair_pick(), _mm512_castps128_ps512(dm));
        acc0[r] = _mm512_fmadd_ps(d, q5_pair_dot<E>(p, p + bb, x + 32 * b), acc0[r]);
      } else {
        const __m512 t0 = block_codes_dot<E>(p, x + 32 * b);
        const __m512 t1 = block_codes_dot<E>(p + bb, x + 32 * b + 32);
        acc0[r] = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), t0, acc0[r]);
        acc1[r] = _mm512_fmadd_ps(_mm512_broadcastss_ps(_mm_movehl_ps(dm, dm)), t1, acc1[r]);
      }
      if constexpr (has_min<E>) mins[r] = _mm_fmadd_ps(dm, _mm_loadu_ps(xsum + 2 * b), mins[r]);
      // Q5_0: d sum(x) in lanes 1 and 3, times -16 at the end (exact: a power of two).
      if constexpr (E == encoding::q5_0) mins[r] = _mm_fmadd_ps(_mm_moveldup_ps(dm), _mm_loadu_ps(xsum + 2 * b), mins[r]);
    }
  }
  for (std::size_t r = 0; r < R; ++r) {
    if (b < blocks) {
      const std::byte* p = rows[r] + b * bb;
      const __m128 dm = scale_pair<E>(p, p);
      acc0[r] = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), block_codes_dot<E>(p, x + 32 * b), acc0[r]);
      if constexpr (has_min<E>) mins[r] = _mm_fmadd_ps(dm, _mm_setr_ps(0.0f, xsum[2 * b + 1], 0.0f, 0.0f), mins[r]);
    }
    out[r] = hsum(_mm512_add_ps(acc0[r], acc1[r]));
    if constexpr (has_min<E> || E == encoding::q5_0) {
      alignas(16) float m[4];
      _mm_store_ps(m, mins[r]);
      out[r] += (E == encoding::q5_0 ? -16.0f : 1.0f) * (m[1] + m[3]);
    }
  }
}

template <encoding E>
struct quant_rows {
  const float* x;
  const float* xsum;
  std::size_t blocks;
  template <std::size_t R>
  TLM_AVX512_FN void operator()(const std::byte* const (&rows)[R], float (&out)[R]) const {
    rows_dot_quant<E, R>(rows, x, xsum, blocks, out);
  }
};

// One row of a float matrix (f32, f16, bf16), the last cols % 32 as a scalar tail.
template <encoding E>
TLM_AVX512_FN inline float row_dot_float(const std::byte* row, const float* x, std::size_t cols) {
  constexpr std::size_t bb = row_bytes(E, 32);
  const std::size_t blocks = cols / 32;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::byte* p = row + b * bb;
    _mm_prefetch(reinterpret_cast<const char*>(p + prefetch_ahead), _MM_HINT_T0);
    __m512 w0, w1;
    float32_values<E>(p, w0, w1);
    acc0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + 32 * b), acc0);
    acc1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 32 * b + 16), acc1);
  }
  float s = hsum(_mm512_add_ps(acc0, acc1));
  if (blocks * 32 < cols) s += avx2::tail_dot<E>(row, x, blocks * 32, cols);
  return s;
}

// ---- Exact matvec of the K-quants ---------------------------------------------------
//
// The codes of a 64-byte chunk of a super-block (128 values) are assembled as bytes
// where they lie, two vectors of 64 (the low nibbles' codes and the high nibbles',
// with Q5_K's fifth bit or Q6_K's two high bits put on top), then widened to int32 by
// in-lane byte shuffles (vpshufb: dword j of a 16-byte lane takes byte 4j + m) and
// converted; x is permuted once per matvec to meet them (prepare_k_x, k_lane_value).
// Every step stays inside its 128-bit lane: widening in value order (vpmovsxbd, which
// the previous kernel used) crosses lanes, and on Zen 4, which runs a 512-bit
// operation as two 256-bit halves, that bound it. Zen 4, 2048x2048, 1 thread, hot, µs,
// vpmovsxbd / in-lane: Q4_K 249 / 219, Q5_K 287 / 260, Q6_K 332 / 248
// (bench/results/kernels-kquant-exact-zen4.md, with a version decoding 32-bit lanes).
// The lanes of one vector belong to different sub-blocks, so each sub-block's c . x
// gathers in lanes and is scaled once by a vector of the lanes' scales. Q4_K / Q5_K
// mins and Q6_K's code offset of 32 are applied per super-block with sums of x.

// Which value of a super-block lane l of widened vector k of 64-byte chunk c holds
// (p = 128c + 16k + l): byte b = 16(l/4) + 4(l%4) + k%4 of the chunk, from the low
// nibbles' codes (k < 4) or the high nibbles' (k >= 4).
// Q4_K / Q5_K: chunk c is rows 2c and 2c+1 of qs (32 bytes each); row i holds
// sub-block 2i in its low nibbles and 2i+1 in its high.
// Q6_K: chunk c is half c of the super-block, whose two 32-byte rows of low bits hold
// sub-block r of the half in row r's low nibbles and r+2 in its high.
template <encoding E>
constexpr std::size_t k_lane_value(std::size_t p) {
  const std::size_t c = p / 128, k = p / 16 % 8, l = p % 16;
  const std::size_t b = widened_byte(16 * (k % 4) + l), high = k / 4;
  if constexpr (E == encoding::q6_k) return 128 * c + 32 * (b / 32 + 2 * high) + b % 32;
  return 32 * (2 * (2 * c + b / 32) + high) + b % 32;
}

template <encoding E>
inline constexpr auto k_lane_order = [] {
  std::array<std::uint8_t, 256> order{};
  for (std::size_t p = 0; p < 256; ++p) order[p] = static_cast<std::uint8_t>(k_lane_value<E>(p));
  return order;
}();

template <encoding E>
constexpr bool is_permutation_of_256() {
  std::array<bool, 256> seen{};
  for (std::uint8_t v : k_lane_order<E>) {
    if (seen[v]) return false;
    seen[v] = true;
  }
  return true;
}
static_assert(is_permutation_of_256<encoding::q4_k>() && is_permutation_of_256<encoding::q6_k>(),
              "every value of a super-block meets exactly one lane");

// x [cols] -> [cols] in k_lane_order per super-block, then the sums of x that the
// mins (Q4_K, Q5_K) or Q6_K's code offset multiply (avx2::prepare_permuted_x).
template <encoding E>
inline void prepare_k_x(const float* x, std::size_t cols, std::vector<float>& prepared) {
  avx2::prepare_permuted_x<E>(x, cols, prepared, k_lane_order<E>);
}

// Bytes 32-63 of a register shifted down by `by` bits as 16-bit words, bytes 0-31 not.
TLM_AVX512_INLINE inline __m512i shift_upper_down(__m512i v, short by) {
  const __m512i counts = _mm512_mask_blend_epi64(0xf0, _mm512_setzero_si512(), _mm512_set1_epi16(by));
  return _mm512_srlv_epi16(v, counts);
}

// vpternlogd 0xE4: c ? a : b, bitwise.
TLM_AVX512_INLINE inline __m512i select_bits(__m512i mask, __m512i if_set, __m512i if_clear) {
  return _mm512_ternarylogic_epi32(if_set, if_clear, mask, 0xE4);
}

// The codes of chunk c of a super-block as bytes: low[b] of the low nibbles, high[b]
// of the high (k_lane_value). Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 (stored, +32).
// The high bits are masked before any 16-bit shift, so no bit crosses into the next
// byte; bytes 32-63 (the chunk's second row) are shifted apart first where their bits
// lie elsewhere in the shared byte of high bits.
template <encoding E>
TLM_AVX512_INLINE inline void k_chunk_codes(const std::byte* p, int c, __m512i& low, __m512i& high) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  if constexpr (E == encoding::q6_k) {
    // Sub-block t's two bits at bit 2t of qh (32 bytes per half, broadcast): row 0
    // meets t = 0 (low) and 2 (high), row 1 t = 1 and 3; brought to bits 4-5.
    const __m512i ql = _mm512_loadu_si512(p + 64 * c);
    const __m512i qh = shift_upper_down(
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * c))), 2);
    low = select_bits(low4, ql, _mm512_slli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8(0x03)), 4));
    high = select_bits(low4, _mm512_srli_epi16(ql, 4), _mm512_and_si512(qh, _mm512_set1_epi8(0x30)));
  } else {
    constexpr std::size_t qs_at = E == encoding::q5_k ? 48 : 16;
    const __m512i q = _mm512_loadu_si512(p + qs_at + 64 * c);
    if constexpr (E == encoding::q5_k) {
      // Sub-block s's fifth bit at bit s of qh (32 bytes, broadcast): chunk c's row 0
      // meets s = 4c (low) and 4c+1 (high), row 1 s = 4c+2 and 4c+3; brought to bit 4.
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      const __m512i qh = shift_upper_down(
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16))), 2);
      const __m512i ha = c == 0 ? _mm512_slli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8(0x01)), 4)
                                : _mm512_and_si512(qh, bit4);
      const __m512i hb = c == 0 ? _mm512_slli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8(0x02)), 3)
                                : _mm512_srli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8(0x20)), 1);
      low = select_bits(low4, q, ha);
      high = select_bits(low4, _mm512_srli_epi16(q, 4), hb);
    } else {
      low = _mm512_and_si512(q, low4);
      high = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
    }
  }
}

template <encoding E>
TLM_AVX512_INLINE inline void prefetch_superblock(const std::byte* p) {
  for (std::size_t at = 0; at < traits(E).block_bytes; at += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + at + prefetch_ahead), _MM_HINT_T0);
}

template <encoding E>
inline constexpr std::size_t k_sums_per_superblock = 256 / avx2::k_sum_values<E>;

// A super-block's scales in the lanes of one register and, per chunk c and code vector n,
// which of them each of the 16 lane sums takes; corrections += the mins (Q4_K, Q5_K) or
// the scales (Q6_K) times the super-block's sums of x (xsum, k_sums_per_superblock of
// them). Lane l sums code bytes 4l..4l+3, whose scale is Q4_K / Q5_K: sub-block
// 2(2c + l/8) + n; Q6_K: the 16 values 8c + 4n + l/4.
template <encoding E>
TLM_AVX512_INLINE inline void k_superblock_scales(const std::byte* p, const float* xsum, __m512& scales,
                                                  __m512i (&lane_scale)[2][2], __m512& corrections) {
  if constexpr (E == encoding::q6_k) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
    scales = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)), _mm512_set1_ps(_cvtsh_ss(load_u16(p + 208))));
    corrections = _mm512_fmadd_ps(scales, _mm512_loadu_ps(xsum), corrections);
    const __m512i by_16 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int c = 0; c < 2; ++c)
      for (int n = 0; n < 2; ++n) lane_scale[c][n] = _mm512_add_epi32(_mm512_set1_epi32(8 * c + 4 * n), by_16);
  } else {
    __m256 dsc, dmn;
    avx2::k_scales8(p, dsc, dmn);
    corrections = _mm512_fmadd_ps(_mm512_zextps256_ps512(dmn), _mm512_zextps256_ps512(_mm256_loadu_ps(xsum)), corrections);
    scales = _mm512_castps256_ps512(dsc);
    const __m512i by_32 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    for (int c = 0; c < 2; ++c)
      for (int n = 0; n < 2; ++n) lane_scale[c][n] = _mm512_add_epi32(_mm512_set1_epi32(4 * c + n), by_32);
  }
}

template <encoding E>
TLM_AVX512_FN inline float row_dot_k(const std::byte* row, const float* x, std::size_t cols) {
  constexpr std::size_t bb = traits(E).block_bytes;
  __m512 total[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  __m512 corrections = _mm512_setzero_ps();
  const float* xsum = x + cols;  // [cols / avx2::k_sum_values<E>] (prepare_k_x)
  for (std::size_t sb = 0; sb < cols / 256; ++sb) {
    const std::byte* p = row + sb * bb;
    prefetch_superblock<E>(p);
    const float* xs = x + 256 * sb;
    __m512 scales;
    __m512i lane_scale[2][2];
    k_superblock_scales<E>(p, xsum + k_sums_per_superblock<E> * sb, scales, lane_scale, corrections);
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {
      __m512i codes[2];
      k_chunk_codes<E>(p, c, codes[0], codes[1]);
#pragma GCC unroll 2
      for (int n = 0; n < 2; ++n)
        total[n] = _mm512_fmadd_ps(bytes_times_x(codes[n], xs + 128 * c + 64 * n),
                                   _mm512_permutexvar_ps(lane_scale[c][n], scales), total[n]);
    }
  }
  // Less the mins times their sub-block sums (Q4_K, Q5_K) or 32 times the scales times
  // their 16 values' sums (Q6_K: the codes as stored are 32 over the signed ones).
  return hsum(_mm512_add_ps(total[0], total[1])) - (E == encoding::q6_k ? 32.0f : 1.0f) * hsum(corrections);
}

// x: for Q4_x / Q5_x the output of prepare_q4_x, for the K-quants that of
// prepare_k_x; otherwise x itself.
template <encoding E>
TLM_AVX512_FN inline void matvec_rows(encoding, const std::byte* w, std::size_t rb, const float* x, float* y,
                                      std::size_t r0, std::size_t r1, std::size_t cols) {
  if constexpr (traits(E).block_values == 32) {
    detail::rows_in_steps<rows_a_step>(r0, r1, w, rb, y, quant_rows<E>{x, x + cols, cols / 32});
  } else {
    for (std::size_t i = 0; i < r1 - r0; ++i) {
      const std::size_t r = detail::streamed_row(r0, r1, i);
      if constexpr (E == encoding::q4_k || E == encoding::q5_k || E == encoding::q6_k) {
        y[r] = row_dot_k<E>(w + r * rb, x, cols);
      } else {
        y[r] = row_dot_float<E>(w + r * rb, x, cols);
      }
    }
  }
}

// ---- Exact matmul (prefill) --------------------------------------------------------

// Y[b, r] for RT weight rows (panel + i*cols, decoded) and BV*16 batch rows held as
// transposed columns xt [cols, 16] per vector (xt + v*cols*16). Every k is one
// broadcast per row and one load per batch vector: RT*BV multiply-adds from RT+BV loads.
// noinline for the same reason as avx2::tile (GCC keeps `acc` in registers only when
// the micro-kernel is a function of its own).
template <int RT, int BV>
[[gnu::noinline]] TLM_AVX512_FN inline void micro_kernel(const float* panel, const float* xt, std::size_t cols,
                                                           float* y, std::size_t ldy, std::size_t nb) {
  // Each output is one chain of multiply-adds over k; chains of `span` terms are
  // summed into `total` (memory, L1), so a sum of `cols` terms rounds like one of
  // span + cols/span terms: the accuracy of the dot-product kernels, at ~2% of the time.
  constexpr std::size_t span = 64;
  __m512 total[RT][BV];
  __m512 acc[RT][BV];
#pragma GCC unroll 12
  for (int i = 0; i < RT; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < BV; ++v) total[i][v] = _mm512_setzero_ps();
  for (std::size_t k0 = 0; k0 < cols; k0 += span) {
    const std::size_t k1 = std::min(cols, k0 + span);
#pragma GCC unroll 12
    for (int i = 0; i < RT; ++i)
#pragma GCC unroll 2
      for (int v = 0; v < BV; ++v) acc[i][v] = _mm512_setzero_ps();
    for (std::size_t k = k0; k < k1; ++k) {
      __m512 xv[BV];
#pragma GCC unroll 2
      for (int v = 0; v < BV; ++v) xv[v] = _mm512_loadu_ps(xt + static_cast<std::size_t>(v) * cols * 16 + k * 16);
#pragma GCC unroll 12
      for (int i = 0; i < RT; ++i) {
        const __m512 wv = _mm512_set1_ps(panel[static_cast<std::size_t>(i) * cols + k]);
#pragma GCC unroll 2
        for (int v = 0; v < BV; ++v) acc[i][v] = _mm512_fmadd_ps(wv, xv[v], acc[i][v]);
      }
    }
#pragma GCC unroll 12
    for (int i = 0; i < RT; ++i)
#pragma GCC unroll 2
      for (int v = 0; v < BV; ++v) total[i][v] = _mm512_add_ps(total[i][v], acc[i][v]);
  }
  // total[i][v] lane l is Y[v*16 + l, i]: scattered with stride ldy, masked to nb rows.
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(static_cast<int>(ldy)));
#pragma GCC unroll 2
  for (int v = 0; v < BV; ++v) {
    const std::size_t left = nb - std::min<std::size_t>(nb, static_cast<std::size_t>(v) * 16);
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
#pragma GCC unroll 12
    for (int i = 0; i < RT; ++i)
      _mm512_mask_i32scatter_ps(y + static_cast<std::size_t>(v) * 16 * ldy + static_cast<std::size_t>(i), m, idx,
                                total[i][v], 4);
  }
}

template <int RT>
TLM_AVX512_FN inline void micro_rows(const float* panel, const float* xt, std::size_t cols, float* y, std::size_t ldy,
                                     std::size_t nb) {
  std::size_t b = 0;
  for (; b + 16 < nb; b += 32) micro_kernel<RT, 2>(panel, xt + b * cols, cols, y + b * ldy, ldy, nb - b);
  if (b < nb) micro_kernel<RT, 1>(panel, xt + b * cols, cols, y + b * ldy, ldy, nb - b);
}

// Rows [r0, r1) of Y [batch, rows] = X [batch, cols] W^T. The batch goes in slices of
// 64 rows, transposed into xt [ceil(nb/16), cols, 16] (zero-padded, 384 KiB at most for
// cols 1536: it stays in L2); the weights in panels of 12 decoded rows [12, cols].
// A weight row is decoded once per slice, so decoding costs 1/64 of the multiply-adds.
// Scatter addresses are 32-bit: checked by the caller (rows * batch < 2^31).
template <void (*Decode)(encoding, const std::byte*, float*, std::size_t)>
TLM_AVX512_FN inline void matmul_rows(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                                      std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols,
                                      std::size_t batch) {
  constexpr std::size_t slice = 64;
  constexpr std::size_t rt = 12;
  thread_local std::vector<float> xt;     // [slice / 16, cols, 16]
  thread_local std::vector<float> panel;  // [rt, cols]
  xt.resize(slice * cols);
  panel.resize(rt * cols);
  for (std::size_t b0 = 0; b0 < batch; b0 += slice) {
    const std::size_t nb = std::min(slice, batch - b0);
    const std::size_t nv = (nb + 15) / 16;
    for (std::size_t v = 0; v < nv; ++v) {
      float* dst = xt.data() + v * cols * 16;
      for (std::size_t l = 0; l < 16; ++l) {
        const std::size_t b = v * 16 + l;
        if (b < nb) {
          const float* src = x + (b0 + b) * cols;
          for (std::size_t k = 0; k < cols; ++k) dst[k * 16 + l] = src[k];
        } else {
          for (std::size_t k = 0; k < cols; ++k) dst[k * 16 + l] = 0.0f;
        }
      }
    }
    float* ys = y + b0 * rows;
    std::size_t r = r0;
    for (; r + rt <= r1; r += rt) {
      for (std::size_t i = 0; i < rt; ++i) Decode(enc, w + (r + i) * rb, panel.data() + i * cols, cols);
      micro_rows<12>(panel.data(), xt.data(), cols, ys + r, rows, nb);
    }
    for (; r + 4 <= r1; r += 4) {
      for (std::size_t i = 0; i < 4; ++i) Decode(enc, w + (r + i) * rb, panel.data() + i * cols, cols);
      micro_rows<4>(panel.data(), xt.data(), cols, ys + r, rows, nb);
    }
    for (; r < r1; ++r) {
      Decode(enc, w + r * rb, panel.data(), cols);
      micro_rows<1>(panel.data(), xt.data(), cols, ys + r, rows, nb);
    }
  }
}

// ---- Fast mode: int8 activations ---------------------------------------------------

// Same arithmetic as detail::quantize_scalar, 16 lanes at a time: the maxima are exact,
// the scales are the same scalar code (group_scales), and the conversion rounds to
// nearest even (the default MXCSR mode), so the result is bit for bit the scalar one.
TLM_AVX512_FN inline void quantize(const float* x, std::size_t rows, std::size_t cols, std::size_t group,
                                   q8_activations& out) {
  detail::shape_activations(rows, cols, group, out);
  const std::size_t per = group / 32;  // blocks per group
  const __m512i lim = _mm512_set1_epi32(127), neg = _mm512_set1_epi32(-127);
  for (std::size_t g = 0; g < rows * cols / group; ++g) {
    float bmax[8], d[8], id[8];
    for (std::size_t b = 0; b < per; ++b) {
      const float* xb = x + group * g + 32 * b;
      bmax[b] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb)), _mm512_abs_ps(_mm512_loadu_ps(xb + 16))));
    }
    detail::group_scales_at(out, g, bmax, d, id);
    for (std::size_t b = 0; b < per; ++b) {
      const std::size_t i = per * g + b;
      const __m512 vid = _mm512_set1_ps(id[b]);
      const __m512 a = _mm512_loadu_ps(x + 32 * i), c = _mm512_loadu_ps(x + 32 * i + 16);
      const __m512i qa = _mm512_max_epi32(neg, _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_mul_ps(a, vid))));
      const __m512i qc = _mm512_max_epi32(neg, _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_mul_ps(c, vid))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q.data() + 32 * i), _mm512_cvtepi32_epi8(qa));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q.data() + 32 * i + 16), _mm512_cvtepi32_epi8(qc));
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
      out.ds[2 * i] = d[b];
      out.ds[2 * i + 1] = d[b] * static_cast<float>(sum);
    }
  }
  detail::fill_half_sums(out);
}

// The 64 weight codes of blocks p0 and p1 in value order, as unsigned bytes: the
// codes plus lane_code_offset<E> (Q4_1 0..15, Q4_0 0..15 for -8..7, Q5_1 0..31, Q5_0
// 0..31 for -16..15, Q8_0 0..255 for -128..127), which vpdpbusd takes as they are.
template <encoding E>
TLM_VNNI_INLINE inline __m512i biased_codes64(const std::byte* p0, const std::byte* p1) {
  if constexpr (E == encoding::q5_0 || E == encoding::q5_1) {
    return q5_codes64<E>(p0, p1);
  } else if constexpr (E == encoding::q8_0) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0 + 2));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1 + 2));
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1), _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    constexpr std::size_t head = E == encoding::q4_1 ? 4 : 2;
    __m512i z = twice_each(p0 + head, p1 + head);
    // Low nibbles in the first copy of each block, high nibbles in the second.
    z = _mm512_srlv_epi64(z, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
  }
}

// The same codes as signed bytes where the encoding's are signed (Q4_0 -8..7, Q5_0
// -16..15, Q8_0), for dot64.
template <encoding E>
TLM_VNNI_INLINE inline __m512i codes64(const std::byte* p0, const std::byte* p1) {
  const __m512i c = biased_codes64<E>(p0, p1);
  if constexpr (E == encoding::q8_0) return _mm512_xor_si512(c, _mm512_set1_epi8(static_cast<char>(0x80)));
  if constexpr (lane_code_offset<E> != 0) return _mm512_sub_epi8(c, _mm512_set1_epi8(static_cast<char>(lane_code_offset<E>)));
  return c;
}

// Integer sums of 64 products in 16 lanes (four products each; a block's sum is
// spread over 8 lanes). Signed weights: sum w q = sum |w| (sign(w) q), since vpdpbusd
// multiplies unsigned by signed bytes; |q| <= 127, so negating q cannot overflow.
template <encoding E>
TLM_VNNI_INLINE inline __m512i dot64(__m512i w, __m512i q) {
  if constexpr (!has_min<E>) {
    const __mmask64 neg = _mm512_movepi8_mask(w);
    q = _mm512_mask_sub_epi8(q, neg, _mm512_setzero_si512(), q);
    w = _mm512_abs_epi8(w);
  }
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, q);
}

// The last block of an odd count, in 8 lanes.
template <encoding E>
TLM_VNNI_INLINE inline float block_term_vnni(const std::byte* p, const std::int8_t* q, const float* ds) {
  __m256i w;
  if constexpr (E == encoding::q5_0 || E == encoding::q5_1) {
    w = avx2::codes32<E>(p);
  } else if constexpr (E == encoding::q8_0) {
    w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
  } else {
    constexpr std::size_t head = E == encoding::q4_1 ? 4 : 2;
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + head));
    const __m128i mask = _mm_set1_epi8(0x0f);
    w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), mask), _mm_and_si128(b, mask));
    if constexpr (E == encoding::q4_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
  }
  __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  if constexpr (!has_min<E>) {
    qv = _mm256_sign_epi8(qv, w);
    w = _mm256_abs_epi8(w);
  }
  const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, qv);
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
  const float scale = half_at(p) * ds[0];
  float term = scale * static_cast<float>(_mm_cvtsi128_si32(t));
  if constexpr (has_min<E>) term += half_at(p + 2) * ds[1];
  return term;
}

// Per pair of blocks of one activation row, the 16 lane sums of its codes times
// -lane_code_offset<E>: vpdpbusd of the unsigned codes starting from these gives the
// signed codes' integer sums exactly, in one instruction where moving the signs onto the
// activations (dot64) takes four. [pairs, 16] int32.
template <encoding E>
TLM_VNNI_INLINE inline void lane_offsets(const std::int8_t* q, std::size_t pairs, std::int32_t* out) {
  const __m512i off = _mm512_set1_epi8(static_cast<char>(lane_code_offset<E>));
  for (std::size_t i = 0; i < pairs; ++i) {
    const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, _mm512_loadu_si512(q + 64 * i));
    _mm512_storeu_si512(out + 16 * i, _mm512_sub_epi32(_mm512_setzero_si512(), s));
  }
}

// R weight rows against one quantized activation row (q, ds; `offsets` from
// lane_offsets for the encodings with signed codes), sharing the loop and the loads of
// the activations (see rows_dot_q5_digits).
template <encoding E, std::size_t R>
TLM_VNNI_INLINE inline void rows_dot_vnni(const std::byte* const (&rows)[R], std::size_t blocks, const std::int8_t* q,
                                          const float* ds, const std::int32_t* offsets, float (&out)[R]) {
  constexpr std::size_t bb = row_bytes(E, 32);
  const __m512i pick = scale_pair_pick();
  __m512 acc[R];
  __m128 mins[R];
  zero_sums(acc, mins);
  std::size_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const __m512i qv = _mm512_loadu_si512(q + 32 * b);
    __m512i start = _mm512_setzero_si512();
    if constexpr (lane_code_offset<E> != 0) start = _mm512_loadu_si512(offsets + 8 * b);
    const __m128 dx = _mm_loadu_ps(ds + 2 * b);
    const std::byte* p[R];
    for (std::size_t r = 0; r < R; ++r) p[r] = rows[r] + b * bb;
    // Without a min, the R rows' d converted together: [d0 dx0, d1 dx1] per row.
    __m256 prods;
    if constexpr (!has_min<E>)
      prods = _mm256_mul_ps(pair_scales(p, bb), _mm256_permutexvar_ps(_mm256_setr_epi32(0, 2, 0, 2, 0, 2, 0, 2),
                                                                        _mm256_castps128_ps256(dx)));
#pragma GCC unroll 4
    for (std::size_t r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(p[r] + prefetch_ahead), _MM_HINT_T0);
      const __m512i w = biased_codes64<E>(p[r], p[r] + bb);
      const __m512i s = _mm512_dpbusd_epi32(start, w, qv);
      __m512 scale;
      if constexpr (has_min<E>) {
        // [d0 dx0, m0 s0, d1 dx1, m1 s1]: the same two products as the scalar reference.
        const __m128 prod = _mm_mul_ps(scale_pair<E>(p[r], p[r] + bb), dx);
        scale = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(prod));
        mins[r] = _mm_add_ps(mins[r], prod);
      } else {
        scale = _mm512_permutexvar_ps(pair_pick(r), _mm512_castps256_ps512(prods));
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);
    }
  }
  for (std::size_t r = 0; r < R; ++r) {
    out[r] = hsum(acc[r]);
    if constexpr (has_min<E>) {
      alignas(16) float m[4];
      _mm_store_ps(m, mins[r]);
      out[r] += m[1] + m[3];
    }
    if (b < blocks) out[r] += block_term_vnni<E>(rows[r] + b * bb, q + 32 * b, ds + 2 * b);
  }
}

template <encoding E>
struct vnni_rows {
  std::size_t blocks;
  const std::int8_t* q;
  const float* ds;
  const std::int32_t* offsets;
  template <std::size_t R>
  TLM_VNNI_FN void operator()(const std::byte* const (&rows)[R], float (&out)[R]) const {
    rows_dot_vnni<E, R>(rows, blocks, q, ds, offsets, out);
  }
};

// Fast matvec, a pair of blocks per step, signed codes taken as unsigned ones with the
// offsets preloaded: SmolLM2's Q4_0 file decoded 1.20x faster at 1 thread (1.11x at 2),
// its Q4_K_M file (mostly Q5_0) 1.09x / 1.05x, on the Intel Xeon
// (bench/results/kernels-offsets-xeon.md).
template <encoding E>
TLM_VNNI_FN inline void matvec_q8(encoding, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                                  std::size_t r0, std::size_t r1, std::size_t) {
  thread_local std::vector<std::int32_t> offsets;  // [blocks / 2, 16]
  if constexpr (lane_code_offset<E> != 0) {
    offsets.resize(x.blocks / 2 * 16);
    lane_offsets<E>(x.q.data(), x.blocks / 2, offsets.data());
  }
  detail::rows_in_steps<rows_a_step>(r0, r1, w, rb, y, vnni_rows<E>{x.blocks, x.q.data(), x.ds.data(), offsets.data()});
}

// ---- Exact matvec of Q5_0 / Q5_1 with VNNI: x as three bytes -----------------------
//
// rows_dot_quant widens every code to a float before its multiply-add: per pair of
// blocks 4 byte shuffles, 4 conversions and 4 multiply-adds, and on the Xeon that, not
// memory, bounds exact decode of a Q4_K_M file (its Q5_0 matrices about 11 GB/s hot).
// Here x is written once per matvec as integers, each 4 values (a lane of the sums
// below) with their own exponent:
//   X = x 2^s rounded, s chosen so the 4 values' max |X| <= 8355711,
//   X = 65536 hi + 256 mid + lo with hi, mid, lo signed bytes.
// A pair of blocks is then three vpdpbusd (the unsigned codes times each signed digit)
// and two shifts, exact in int32: four products of a lane sum to at most
// 4 * 31 * 8421504 < 2^31 in magnitude. One conversion, and one multiply and one
// multiply-add by 2^-s (per lane) and d, finish the pair.
// Error: rounding X moves each x by at most 1.2e-7 (about 2^-23) of the largest |x| of
// its 4 (max |x| 2^s is more than 4177855; subnormal ones keep fewer bits, as floats
// do); the integer sums add none; the float steps after them round as rows_dot_quant's.
// 4 values with an infinity or a NaN give NaN.

// Per pair of blocks (64 values), in prepared x:
//   [0, 64) hi, [64, 128) mid, [128, 192) lo: signed bytes, value i of the pair at byte i;
//   [192, 256) 2^-s per lane (lane j: values 4j..4j+3 of the pair), float;
//   [256, 320) Q5_0: per lane -16 times its four X (the codes are stored as c + 16),
//              int32; Q5_1: {0, sum x of the first block, 0, sum x of the second}, float.
// An odd count's last block has a partner of zeros.
inline constexpr std::size_t digits_pair_bytes = 320;

// The three digit bytes of 32 consecutive values x32 at hi, mid and lo (each 32 bytes),
// in order, and at scale[0..8) the 2^-s of each 4 values (a lane of the kernels' sums):
// each 4 values take their own exponent, so a value is rounded to 2^-23 of the largest
// of its 4, not of a whole block. 0 for 4 zeros (X = 0), NaN for 4 with an infinity or
// a NaN (X = 0).
TLM_VNNI_INLINE inline void digits_of_32(const float* x32, std::byte* hi, std::byte* mid, std::byte* lo, float* scale) {
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512 largest = _mm512_set1_ps(8355711.0f);  // 65536 * 127 + 256 * 127 + 127
  for (std::size_t h = 0; h < 2; ++h) {
    const __m512 x = _mm512_loadu_ps(x32 + 16 * h);
    // max |x| of each 4 (a 128-bit lane) as bits: non-negative floats order as integers,
    // infinities and NaNs last.
    __m512i top = _mm512_and_si512(_mm512_castps_si512(x), magnitude);
    top = _mm512_max_epu32(top, _mm512_shuffle_epi32(top, _MM_PERM_CDAB));
    top = _mm512_max_epu32(top, _mm512_shuffle_epi32(top, _MM_PERM_BADC));
    // 2^(e-127) <= max |x| < 2^(e-126) for a normal one, so max |x| 2^(149-e) is in
    // [2^22, 2^23); one less where that could round past `largest`. A subnormal (e = 0)
    // is scaled as e = 1.
    const __m512i e = _mm512_max_epi32(_mm512_srli_epi32(top, 23), _mm512_set1_epi32(1));
    __m512 sh = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_set1_epi32(149), e));
    const __mmask16 over = _mm512_cmp_ps_mask(_mm512_scalef_ps(_mm512_castsi512_ps(top), sh), largest, _CMP_GT_OQ);
    sh = _mm512_mask_sub_ps(sh, over, sh, _mm512_set1_ps(1.0f));
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(top, _mm512_setzero_si512());
    const __mmask16 bad = _mm512_cmpge_epu32_mask(top, _mm512_set1_epi32(0x7f800000));
    const __m512i v = _mm512_maskz_cvtps_epi32(static_cast<__mmask16>(~(zero | bad)), _mm512_scalef_ps(x, sh));
    __m512 step = _mm512_maskz_scalef_ps(static_cast<__mmask16>(~zero), _mm512_set1_ps(1.0f), _mm512_sub_ps(_mm512_setzero_ps(), sh));
    step = _mm512_mask_mov_ps(step, bad, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
    // The 4 values' shared step, once per lane of the kernels' sums.
    _mm_storeu_ps(scale + 4 * h, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), step)));
    // Balanced base-256 digits: lo and mid in [-128, 127], and hi too since |X| <= largest.
    const __m512i l = _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24);
    const __m512i rest = _mm512_srai_epi32(_mm512_sub_epi32(v, l), 8);
    const __m512i m = _mm512_srai_epi32(_mm512_slli_epi32(rest, 24), 24);
    const __m512i t = _mm512_srai_epi32(_mm512_sub_epi32(rest, m), 8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + 16 * h), _mm512_cvtepi32_epi8(t));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(mid + 16 * h), _mm512_cvtepi32_epi8(m));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + 16 * h), _mm512_cvtepi32_epi8(l));
  }
}

// Sum of codes times X over 64 code bytes (unsigned) and their digits (hi, mid, lo), in
// 16 lanes of 4 products each; exact while |c X| summed over a lane stays under 2^31
// (codes up to 63: 4 * 63 * 8421504 < 2^31).
TLM_VNNI_INLINE inline __m512i digits_dot(__m512i codes, __m512i hi, __m512i mid, __m512i lo) {
  __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, hi);
  s = _mm512_dpbusd_epi32(_mm512_slli_epi32(s, 8), codes, mid);
  return _mm512_dpbusd_epi32(_mm512_slli_epi32(s, 8), codes, lo);
}

// The same with the digits at xd (hi, mid, lo, 64 bytes each).
TLM_VNNI_INLINE inline __m512i digits_dot(__m512i codes, const std::byte* xd) {
  return digits_dot(codes, _mm512_loadu_si512(xd), _mm512_loadu_si512(xd + 64), _mm512_loadu_si512(xd + 128));
}

template <encoding E>
TLM_VNNI_FN inline void prepare_q5_digits(const float* x, std::size_t cols, std::vector<float>& prepared) {
  static_assert(E == encoding::q5_0 || E == encoding::q5_1);
  const std::size_t blocks = cols / 32, pairs = (blocks + 1) / 2;
  prepared.resize(pairs * digits_pair_bytes / sizeof(float));
  std::byte* const out = reinterpret_cast<std::byte*>(prepared.data());
  if (blocks % 2 == 1) {
    // The odd last block's partner: digits and steps of zero (x = 0).
    std::byte* pair = out + blocks / 2 * digits_pair_bytes;
    for (std::size_t part = 0; part < 3; ++part) std::memset(pair + 64 * part + 32, 0, 32);
    std::memset(pair + 192 + 32, 0, 32);
  }
  for (std::size_t b = 0; b < blocks; ++b) {
    std::byte* pair = out + b / 2 * digits_pair_bytes;
    const std::size_t at = 32 * (b % 2);
    digits_of_32(x + 32 * b, pair + at, pair + 64 + at, pair + 128 + at, reinterpret_cast<float*>(pair + 192) + 8 * (b % 2));
    if constexpr (E == encoding::q5_1) {
      const __m512 sum = _mm512_add_ps(_mm512_loadu_ps(x + 32 * b), _mm512_loadu_ps(x + 32 * b + 16));
      float* slots = reinterpret_cast<float*>(pair + 256) + 2 * (b % 2);
      slots[0] = 0.0f;
      slots[1] = _mm512_reduce_add_ps(sum);
      if (b + 1 == blocks && b % 2 == 0) slots[2] = slots[3] = 0.0f;  // the zero partner
    }
  }
  if constexpr (E == encoding::q5_0) {
    // -16 times each lane's four X: digits_dot with codes of 1.
    const __m512i ones = _mm512_set1_epi8(1);
    for (std::size_t i = 0; i < pairs; ++i) {
      std::byte* pair = out + i * digits_pair_bytes;
      const __m512i t = digits_dot(ones, pair);
      _mm512_storeu_si512(pair + 256, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(t, 4)));
    }
  }
}

template <encoding E, std::size_t R>
TLM_VNNI_INLINE inline void rows_dot_q5_digits(const std::byte* const (&rows)[R], const std::byte* xp, std::size_t blocks,
                                               float (&out)[R]) {
  constexpr std::size_t bb = row_bytes(E, 32);
  const __m512i pick = scale_pair_pick();
  __m512 acc[R];
  __m128 mins[R];
  zero_sums(acc, mins);
  for (std::size_t b = 0; b < blocks; b += 2, xp += digits_pair_bytes) {
    // The last block of an odd count pairs with itself; its partner's x is zero.
    const std::size_t next = b + 1 < blocks ? bb : 0;
    const __m512i hi = _mm512_loadu_si512(xp), mid = _mm512_loadu_si512(xp + 64), lo = _mm512_loadu_si512(xp + 128);
    const __m512 step = _mm512_loadu_ps(reinterpret_cast<const float*>(xp + 192));
    const std::byte* p[R];
    for (std::size_t r = 0; r < R; ++r) p[r] = rows[r] + b * bb;
    __m256 ds;  // Q5_0: the R rows' d converted together
    if constexpr (E == encoding::q5_0) ds = pair_scales(p, next);
#pragma GCC unroll 4
    for (std::size_t r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(p[r] + prefetch_ahead), _MM_HINT_T0);
      const __m512i c = q5_codes64<E>(p[r], p[r] + next);
      __m512i s = digits_dot(c, hi, mid, lo);
      __m512 d;
      if constexpr (E == encoding::q5_0) {
        s = _mm512_add_epi32(s, _mm512_loadu_si512(xp + 256));
        d = _mm512_permutexvar_ps(pair_pick(r), _mm512_castps256_ps512(ds));
      } else {
        const __m128 dm = scale_pair<E>(p[r], p[r] + next);
        d = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(dm));
        mins[r] = _mm_fmadd_ps(dm, _mm_loadu_ps(reinterpret_cast<const float*>(xp + 256)), mins[r]);
      }
      acc[r] = _mm512_fmadd_ps(d, _mm512_mul_ps(_mm512_cvtepi32_ps(s), step), acc[r]);
    }
  }
  for (std::size_t r = 0; r < R; ++r) {
    out[r] = hsum(acc[r]);
    if constexpr (E == encoding::q5_1) {
      alignas(16) float m[4];
      _mm_store_ps(m, mins[r]);
      out[r] += m[1] + m[3];
    }
  }
}

template <encoding E>
struct q5_digits_rows {
  const std::byte* xp;
  std::size_t blocks;
  template <std::size_t R>
  TLM_VNNI_FN void operator()(const std::byte* const (&rows)[R], float (&out)[R]) const {
    rows_dot_q5_digits<E, R>(rows, xp, blocks, out);
  }
};

// x: the output of prepare_q5_digits.
template <encoding E>
TLM_VNNI_FN inline void matvec_rows_q5_digits(encoding, const std::byte* w, std::size_t rb, const float* x, float* y,
                                              std::size_t r0, std::size_t r1, std::size_t cols) {
  detail::rows_in_steps<rows_a_step>(r0, r1, w, rb, y, q5_digits_rows<E>{reinterpret_cast<const std::byte*>(x), cols / 32});
}

// ---- Exact matvec of the K-quants with VNNI: x as three bytes ------------------------
//
// As rows_dot_q5_digits for Q5 blocks: x written once per matvec as 24-bit integers, an
// exponent per 4 values (digits_of_32), and each 64 code bytes of a chunk (k_chunk_codes)
// summed with their digits by digits_dot, where row_dot_k widens, converts and multiplies
// every code. The lane sums keep row_dot_k's lanes (lane l: code bytes 4l..4l+3), so its
// scales and corrections serve unchanged; the corrections take the float sums of x.
// Per super-block, in prepared x (1024 bytes):
//   [192 v, 192 v + 192) the digits (hi, mid, lo, 64 bytes each) of code vector v = 2c + n
//   (chunk c, n = 1 for the high nibbles), byte b holding the value the code byte does;
//   [768 + 64 v, 768 + 64 v + 64) 2^-s per lane (lane l: code bytes 4l..4l+3), float;
// then, after every super-block, the sums of x of prepare_k_x.
inline constexpr std::size_t k_digits_bytes = 1024;

// The first of the 32 consecutive values that bytes 32h..32h+31 of code vector v hold.
template <encoding E>
constexpr std::size_t k_digits_first_value(std::size_t v, std::size_t h) {
  const std::size_t c = v / 2, n = v % 2;
  if constexpr (E == encoding::q6_k) return 128 * c + 32 * (h + 2 * n);
  return 32 * (4 * c + 2 * h + n);
}

template <encoding E>
TLM_VNNI_FN inline void prepare_k_digits(const float* x, std::size_t cols, std::vector<float>& prepared) {
  constexpr std::size_t n = avx2::k_sum_values<E>;
  const std::size_t superblocks = cols / 256, head = superblocks * k_digits_bytes / sizeof(float);
  prepared.resize(head + cols / n);
  std::byte* const out = reinterpret_cast<std::byte*>(prepared.data());
  for (std::size_t sb = 0; sb < superblocks; ++sb) {
    std::byte* at = out + sb * k_digits_bytes;
    for (std::size_t v = 0; v < 4; ++v) {
      for (std::size_t h = 0; h < 2; ++h) {
        std::byte* d = at + 192 * v + 32 * h;
        digits_of_32(x + 256 * sb + k_digits_first_value<E>(v, h), d, d + 64, d + 128,
                     reinterpret_cast<float*>(at + 768 + 64 * v) + 8 * h);
      }
    }
  }
  avx2::sums_of<n>(x, cols, prepared.data() + head);
}

template <encoding E>
TLM_VNNI_FN inline float row_dot_k_digits(const std::byte* row, const std::byte* xp, const float* xsum, std::size_t cols) {
  constexpr std::size_t bb = traits(E).block_bytes;
  __m512 total[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  __m512 corrections = _mm512_setzero_ps();
  for (std::size_t sb = 0; sb < cols / 256; ++sb) {
    const std::byte* p = row + sb * bb;
    prefetch_superblock<E>(p);
    const std::byte* xs = xp + sb * k_digits_bytes;
    __m512 scales;
    __m512i lane_scale[2][2];
    k_superblock_scales<E>(p, xsum + k_sums_per_superblock<E> * sb, scales, lane_scale, corrections);
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {
      __m512i codes[2];
      k_chunk_codes<E>(p, c, codes[0], codes[1]);
#pragma GCC unroll 2
      for (int n = 0; n < 2; ++n) {
        const std::size_t v = static_cast<std::size_t>(2 * c + n);
        const __m512 cx = _mm512_mul_ps(_mm512_cvtepi32_ps(digits_dot(codes[n], xs + 192 * v)),
                                        _mm512_loadu_ps(reinterpret_cast<const float*>(xs + 768 + 64 * v)));
        total[n] = _mm512_fmadd_ps(cx, _mm512_permutexvar_ps(lane_scale[c][n], scales), total[n]);
      }
    }
  }
  return hsum(_mm512_add_ps(total[0], total[1])) - (E == encoding::q6_k ? 32.0f : 1.0f) * hsum(corrections);
}

// x: the output of prepare_k_digits.
template <encoding E>
TLM_VNNI_FN inline void matvec_rows_k_digits(encoding, const std::byte* w, std::size_t rb, const float* x, float* y,
                                             std::size_t r0, std::size_t r1, std::size_t cols) {
  const std::byte* xp = reinterpret_cast<const std::byte*>(x);
  const float* xsum = x + cols / 256 * k_digits_bytes / sizeof(float);
  for (std::size_t i = 0; i < r1 - r0; ++i) {
    const std::size_t r = detail::streamed_row(r0, r1, i);
    y[r] = row_dot_k_digits<E>(w + r * rb, xp, xsum, cols);
  }
}

// ---- Fast matvec with byte permutes (AVX-512 VBMI + VNNI), Q4_0 and Q4_1 ----------
//
// Four Q4 blocks (80 or 72 bytes) are two loads, and one vpermt2b gathers their 64
// code bytes into one register; a mask and a shift give the low nibbles of all four
// blocks in one register and the high nibbles in another, so 128 codes cost about as
// much as 32 do one block at a time. The activations are permuted once per call to
// the same order (per group of 4 blocks: the first halves of the four blocks, then
// the second halves). Q4_0's codes stay exact integers without moving signs: the
// unsigned nibble c times q, plus a correction -8 * sum q per lane that depends only
// on the activations and is computed once per call. (Q8_0 keeps the pairs kernel: its
// blocks need no unpacking, and the permute measured slower there, 29.5 against
// 37 GB/s on Zen 4.) Measured faster on Zen 4 only: on an Intel Xeon the pairs kernel
// decoded SmolLM2 1.2-1.36x faster (table.hpp), so the table installs these on AMD.
// Q5_0 in this form (one more permute for the fifth bits) measured 1.02-1.28x the pairs
// kernel alone there, but 0.88x in the whole decode of the Q4_K_M file, and was dropped.

#define TLM_VBMI_FN [[gnu::target(TLM_TARGET_AVX512 ",avx512vnni,avx512vbmi")]]
#define TLM_VBMI_INLINE [[gnu::target(TLM_TARGET_AVX512 ",avx512vnni,avx512vbmi"), gnu::always_inline]]

// Byte i of the result: byte idx[i] of the 128 bytes (a, b).
TLM_VBMI_INLINE inline __m512i gather_bytes(__m512i a, __m512i b, __m512i idx) {
  return _mm512_permutex2var_epi8(a, idx, b);
}

struct vbmi_prepared {
  std::vector<std::int8_t> q;      // [groups, 128] permuted codes
  std::vector<std::int32_t> corr;  // [groups, 16] lane corrections (Q4_0)
};

// The activations in the order row_dot_vbmi reads them, and the lane corrections
// (lane sums of q, four bytes per int32 lane, times -8).
TLM_VBMI_FN inline void prepare_vbmi(const q8_activations& x, vbmi_prepared& out) {
  const __m512i ones = _mm512_set1_epi8(1);
  const std::size_t groups = x.blocks / 4;
  out.q.resize(groups * 128);
  out.corr.resize(groups * 16);
  // Low halves: bytes 32k + i (block k < 4, i < 16); high halves: 32k + 16 + i.
  alignas(64) std::uint8_t lo_idx[64], hi_idx[64];
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 16; ++i) {
      lo_idx[16 * k + i] = static_cast<std::uint8_t>(32 * k + i);
      hi_idx[16 * k + i] = static_cast<std::uint8_t>(32 * k + 16 + i);
    }
  }
  const __m512i li = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  for (std::size_t g = 0; g < groups; ++g) {
    const __m512i a = _mm512_loadu_si512(x.q.data() + 128 * g);
    const __m512i b = _mm512_loadu_si512(x.q.data() + 128 * g + 64);
    const __m512i ql = gather_bytes(a, b, li), qh = gather_bytes(a, b, hi);
    _mm512_storeu_si512(out.q.data() + 128 * g, ql);
    _mm512_storeu_si512(out.q.data() + 128 * g + 64, qh);
    const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, ql), ones, qh);
    _mm512_storeu_si512(out.corr.data() + 16 * g, _mm512_mullo_epi32(s, _mm512_set1_epi32(-8)));
  }
}

template <encoding E>
TLM_VBMI_INLINE inline float row_dot_vbmi(const std::byte* row, const q8_activations& x, const vbmi_prepared& pre) {
  static_assert(E == encoding::q4_0 || E == encoding::q4_1);
  constexpr std::size_t bb = row_bytes(E, 32);
  constexpr std::size_t head = E == encoding::q4_1 ? 4 : 2;
  const std::size_t nb = x.blocks;
  // Code bytes of the 4 blocks; then [d, m] (Q4_1) or [d, d] (Q4_0) of each block.
  alignas(64) std::uint8_t idx_bytes[64];
  alignas(64) std::uint8_t sidx_bytes[64] = {};
  for (std::size_t k = 0; k < 4; ++k) {
    for (std::size_t i = 0; i < 16; ++i) idx_bytes[16 * k + i] = static_cast<std::uint8_t>(bb * k + head + i);
    const std::size_t m = E == encoding::q4_1 ? 2 : 0;
    sidx_bytes[4 * k + 0] = static_cast<std::uint8_t>(bb * k);
    sidx_bytes[4 * k + 1] = static_cast<std::uint8_t>(bb * k + 1);
    sidx_bytes[4 * k + 2] = static_cast<std::uint8_t>(bb * k + m);
    sidx_bytes[4 * k + 3] = static_cast<std::uint8_t>(bb * k + m + 1);
  }
  const __m512i idx = _mm512_load_si512(idx_bytes), sidx = _mm512_load_si512(sidx_bytes);
  const __m512i nib = _mm512_set1_epi8(0x0f);
  // Bytes 64.. of a group: 16 (Q4_1) or 8 (Q4_0); masked, so nothing past the group is read.
  const __mmask64 tail = E == encoding::q4_1 ? __mmask64{0xffff} : __mmask64{0xff};
  // Lane l of the integer sums belongs to block l / 4, whose scale is product 2 * (l / 4).
  const __m512i pick4 = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
  const __m512i pick2 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m256 mins = _mm256_setzero_ps();
  std::size_t b = 0;
  for (std::size_t g = 0; b + 4 <= nb; b += 4, ++g) {
    const std::byte* p0 = row + b * bb;
    // A group is 80 (Q4_1) or 72 bytes, more than a line: two prefetches, so that no line
    // is left to the hardware prefetcher, which stops at every 4 KiB page of the mapped
    // file; a page ahead, so the next page's first lines are on their way in time.
    // (About 8 % faster at 1 thread on 2048-wide rows in 4 KiB pages, against one
    // prefetch 1 KiB ahead: bench/results/kernels-streams-xeon.md.)
    _mm_prefetch(reinterpret_cast<const char*>(p0 + 4096), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p0 + 4096 + 64), _MM_HINT_T0);
    const __m512i z0 = _mm512_loadu_si512(p0);
    const __m512i z1 = _mm512_maskz_loadu_epi8(tail, p0 + 64);
    const __m512i c = gather_bytes(z0, z1, idx);
    const __m512i lo = _mm512_and_si512(c, nib), hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), nib);
    const std::int8_t* q = pre.q.data() + 128 * g;
    __m512i s = E == encoding::q4_0 ? _mm512_loadu_si512(pre.corr.data() + 16 * g) : _mm512_setzero_si512();
    s = _mm512_dpbusd_epi32(s, lo, _mm512_loadu_si512(q));
    s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(q + 64));
    // [d_k, m_k] or [d_k, d_k] of the 4 blocks times [d_x, s] of each: for Q4_1 the
    // same two products per block as the scalar reference (Q4_0 uses only the first).
    const __m256 dm = _mm256_cvtph_ps(_mm512_castsi512_si128(gather_bytes(z0, z1, sidx)));
    const __m256 prod = _mm256_mul_ps(dm, _mm256_loadu_ps(x.ds.data() + 2 * b));
    const __m512 sc = _mm512_permutexvar_ps(pick4, _mm512_castps256_ps512(prod));
    if (g % 2 == 0) {
      acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc0);
    } else {
      acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc1);
    }
    if constexpr (E == encoding::q4_1) mins = _mm256_add_ps(mins, prod);
  }
  // A last pair of blocks (a row of 576 is 4 groups and a pair), as the pairs kernel
  // (rows_dot_vnni) does it but with the signs moved (dot64): no offsets here.
  __m128 mins2 = _mm_setzero_ps();
  if (b + 2 <= nb) {
    const std::byte* p0 = row + b * bb;
    const __m512i s = dot64<E>(codes64<E>(p0, p0 + bb), _mm512_loadu_si512(x.q.data() + 32 * b));
    const __m128 prod = _mm_mul_ps(scale_pair<E>(p0, p0 + bb), _mm_loadu_ps(x.ds.data() + 2 * b));
    acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(pick2, _mm512_castps128_ps512(prod)), acc1);
    if constexpr (E == encoding::q4_1) mins2 = prod;
    b += 2;
  }
  float sum = hsum(_mm512_add_ps(acc0, acc1));
  if constexpr (E == encoding::q4_1) {
    alignas(32) float m[8];
    _mm256_store_ps(m, mins);
    alignas(16) float m2[4];
    _mm_store_ps(m2, mins2);
    sum += ((m[1] + m[3]) + (m[5] + m[7])) + (m2[1] + m2[3]);
  }
  if (b < nb) sum += block_term_vnni<E>(row + b * bb, x.q.data() + 32 * b, x.ds.data() + 2 * b);
  return sum;
}

template <encoding E>
TLM_VBMI_FN inline void matvec_q8_vbmi(encoding, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                                       std::size_t r0, std::size_t r1, std::size_t) {
  // Per calling thread: the activations in the order the kernel reads them (cols bytes).
  thread_local vbmi_prepared pre;
  prepare_vbmi(x, pre);
  for (std::size_t i = 0; i < r1 - r0; ++i) {
    const std::size_t r = detail::streamed_row(r0, r1, i);
    y[r] = row_dot_vbmi<E>(w + r * rb, x, pre);
  }
}

#undef TLM_VBMI_FN
#undef TLM_VBMI_INLINE

// ---- Fast mode, batched: weight rows in the lanes (VNNI) ---------------------------
//
// Prefill and batched decode in fast mode. The 16 lanes of a register are 16 weight
// rows: dword i of lane r holds the codes of values 4i..4i+3 of one block of row r, so
// one vpdpbusd with 4 activation bytes broadcast adds 64 products into 16 outputs, and a
// block of 16 outputs for one activation row costs 8 of them plus one conversion, one
// multiply and one multiply-add (and one more for a min), where the float32 GEMM spends
// 32 multiply-adds. The kernels it replaced held 64 values of one row per register and
// paid the block scales in float for every (row, activation row) pair, as many
// instructions as the GEMM, so the GEMM beat them above 12 rows (24 for the K-quants);
// this one measured 2.3-3.7x faster than the GEMM from 16 to 512 rows and 2.4-6.7x faster
// than the old kernels (2 threads; bench/results/kernels-fast-lanes-xeon.md). A group of 16 rows is
// unpacked once per call (one gather per dword of a block) into a buffer of [blocks, 8,
// 16] dwords (a K-quant super-block is 8 such blocks, its sub-blocks) and used for every
// activation row, 8 at a time, their sums in registers.
//
// The codes are unsigned bytes: as stored, Q8_0's biased by 128. The offset (Q8_0 128,
// Q4_0 8, Q5_0 16, Q6_K 32) returns as an integer, -offset * sum(q), that starts each
// block's (Q6_K: each half's) sum, so a block's integer sum and its float products are
// the scalar reference's (block_term_scalar); a K-quant's activations come grouped by
// 256, so the sub-block terms are the parts of the scalar super-block sum
// (k_superblock_term_scalar) in float. Only the order of the adds differs.

// Whether a 32-value block's term has a second product, m s: the min of Q4_1 and Q5_1,
// -dmin m of a Q4_K / Q5_K sub-block.
template <encoding E>
inline constexpr bool lane_has_min = has_min<E> || E == encoding::q4_k || E == encoding::q5_k;
// Floats per block in the unpacked scales: d; d and m; Q6_K's d and two int32 scales.
template <encoding E>
inline constexpr std::size_t lane_scale_stride = E == encoding::q6_k ? 48 : lane_has_min<E> ? 32 : 16;

// Where a block's 4-bit (or 8-bit) codes start, and Q5's 32 high bits.
template <encoding E>
inline constexpr std::size_t lane_qs_at = E == encoding::q4_1 ? 4 : E == encoding::q5_0 ? 6 : E == encoding::q5_1 ? 8 : 2;
template <encoding E>
inline constexpr std::size_t lane_qh_at = E == encoding::q5_1 ? 4 : 2;

// The byte offsets of 16 rows `rb` apart, for gather_lanes.
TLM_VNNI_INLINE inline __m512i row_offsets(std::size_t rb) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int>(rb)));
}

// One dword at `p` + offsets[r] for each live lane r (0 elsewhere, read from nowhere).
TLM_VNNI_INLINE inline __m512i gather_lanes(const std::byte* p, __m512i offsets, __mmask16 live) {
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, p, 1);
}

// What gather_lanes gives for n consecutive dwords at once: v[k] lane l = dword k at
// p + l * rb (k < n <= 16; rows outside `live` read nothing and come out 0), as 16
// row loads and a 16 x 16 transpose (64 shuffles) instead of n gathers, which Zen 4
// executes element by element: 8-12% less time for the K-quant prefill products
// (bench/results/kernels-kquant-lanes-transpose-zen4.md).
TLM_VNNI_INLINE inline void transpose_lanes(const std::byte* p, std::size_t rb, __mmask16 live, std::size_t n,
                                            __m512i* v) {
  const auto first = static_cast<__mmask16>((1u << n) - 1);
  __m512i r[16];  // [row]: its n dwords
#pragma GCC unroll 16
  for (std::size_t l = 0; l < 16; ++l)
    r[l] = (live >> l) & 1 ? _mm512_maskz_loadu_epi32(first, p + l * rb) : _mm512_setzero_si512();
  // Within each 128-bit lane j, rows 4m..4m+3 transposed: u[4m + c] lane j holds dword
  // 4j + c of those four rows.
  __m512i u[16];
#pragma GCC unroll 4
  for (std::size_t m = 0; m < 4; ++m) {
    const __m512i t0 = _mm512_unpacklo_epi32(r[4 * m], r[4 * m + 1]), t1 = _mm512_unpackhi_epi32(r[4 * m], r[4 * m + 1]);
    const __m512i t2 = _mm512_unpacklo_epi32(r[4 * m + 2], r[4 * m + 3]), t3 = _mm512_unpackhi_epi32(r[4 * m + 2], r[4 * m + 3]);
    u[4 * m] = _mm512_unpacklo_epi64(t0, t2);
    u[4 * m + 1] = _mm512_unpackhi_epi64(t0, t2);
    u[4 * m + 2] = _mm512_unpacklo_epi64(t1, t3);
    u[4 * m + 3] = _mm512_unpackhi_epi64(t1, t3);
  }
  // Then the 128-bit lanes across the four groups: dword 4j + c of every row is lane j
  // of u[c], u[4 + c], u[8 + c], u[12 + c], in that order.
  __m512i out[16];
#pragma GCC unroll 4
  for (std::size_t c = 0; c < 4; ++c) {
    const __m512i w0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), w1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i w2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), w3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    out[c] = _mm512_shuffle_i32x4(w0, w2, 0x88);
    out[4 + c] = _mm512_shuffle_i32x4(w0, w2, 0xdd);
    out[8 + c] = _mm512_shuffle_i32x4(w1, w3, 0x88);
    out[12 + c] = _mm512_shuffle_i32x4(w1, w3, 0xdd);
  }
  for (std::size_t k = 0; k < n; ++k) v[k] = out[k];
}

// transpose_lanes over N dwords (any N), 16 at a time.
template <std::size_t N>
TLM_VNNI_INLINE inline void rows_as_lanes(const std::byte* p, std::size_t rb, __mmask16 live, __m512i (&v)[N]) {
#pragma GCC unroll 4
  for (std::size_t k = 0; k < N; k += 16) transpose_lanes(p + 4 * k, rb, live, std::min<std::size_t>(16, N - k), v + k);
}

// Block b of 16 rows (p: the block in the group's first row; `offsets` the rows' byte
// offsets from it; lanes outside `live` read nothing and come out 0): 8 vectors of codes
// to `codes` [8, 16] and the 16 block scales d, then (with a min) the 16 m, to `scales`.
template <encoding E>
TLM_VNNI_INLINE inline void unpack_lanes(const std::byte* p, __m512i offsets, __mmask16 live, std::int32_t* codes,
                                         float* scales) {
  if constexpr (E == encoding::q8_0) {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 8
    for (std::size_t i = 0; i < 8; ++i)
      _mm512_storeu_si512(codes + 16 * i, _mm512_xor_si512(gather_lanes(p + 2 + 4 * i, offsets, live), bias));
  } else {
    // Byte j of the codes holds value j (low nibble) and value j + 16 (high nibble), so
    // dword i < 4 gives values 4i..4i+3 and its high nibbles values 16+4i..16+4i+3.
    const __m512i nib = _mm512_set1_epi8(0x0f);
    [[maybe_unused]] __m512i high_bits = _mm512_setzero_si512();
    // Q5: bits 4i..4i+3 of qh spread to bit 4 of bytes 0..3 by a 16-entry table.
    [[maybe_unused]] const __m512i spread = _mm512_setr_epi32(0x00000000, 0x00000010, 0x00001000, 0x00001010, 0x00100000, 0x00100010,
                                             0x00101000, 0x00101010, 0x10000000, 0x10000010, 0x10001000, 0x10001010,
                                             0x10100000, 0x10100010, 0x10101000, 0x10101010);
    constexpr bool five = E == encoding::q5_0 || E == encoding::q5_1;
    if constexpr (five) high_bits = gather_lanes(p + lane_qh_at<E>, offsets, live);
#pragma GCC unroll 4
    for (std::size_t i = 0; i < 4; ++i) {
      const __m512i c = gather_lanes(p + lane_qs_at<E> + 4 * i, offsets, live);
      __m512i lo = _mm512_and_si512(c, nib), hi = _mm512_and_si512(_mm512_srli_epi32(c, 4), nib);
      if constexpr (five) {
        const __m512i n15 = _mm512_set1_epi32(15);
        lo = _mm512_or_si512(lo, _mm512_permutexvar_epi32(
                                     _mm512_and_si512(_mm512_srli_epi32(high_bits, static_cast<unsigned>(4 * i)), n15), spread));
        hi = _mm512_or_si512(hi, _mm512_permutexvar_epi32(
                                     _mm512_and_si512(_mm512_srli_epi32(high_bits, static_cast<unsigned>(16 + 4 * i)), n15), spread));
      }
      _mm512_storeu_si512(codes + 16 * i, lo);
      _mm512_storeu_si512(codes + 16 * (4 + i), hi);
    }
  }
  // The block's first dword: d in its low half, m (Q4_1, Q5_1) in its high half.
  const __m512i head = gather_lanes(p, offsets, live);
  _mm512_storeu_ps(scales, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)));
  if constexpr (has_min<E>) _mm512_storeu_ps(scales + 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))));
}

// Super-block sb of 16 rows of Q4_K / Q5_K as its 8 sub-blocks, each laid out as
// unpack_lanes lays out a block: codes [8, 8, 16], and scales [8, 32] holding d sc and
// -(dmin m) of each sub-block, both exact in float32 (a half times a 6-bit integer).
template <encoding E>
TLM_VNNI_INLINE inline void unpack_lanes_k(const std::byte* p, std::size_t rb, __mmask16 live, std::int32_t* codes,
                                           float* scales) {
  constexpr bool five = E == encoding::q5_k;
  __m512i v[traits(E).block_bytes / 4];  // [dword of the super-block]: lane l from row l
  rows_as_lanes(p, rb, live, v);
  const __m512i head = v[0];  // d, dmin
  const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
  const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
  // The 12 scale bytes: sub-block j < 4 has sc = s0[j] & 63, m = s1[j] & 63; j >= 4 has
  // sc = (s2[j-4] & 15) | (s0[j-4] >> 6) << 4, m = (s2[j-4] >> 4) | (s1[j-4] >> 6) << 4.
  const __m512i s0 = v[1], s1 = v[2], s2 = v[3];
  const __m512i x3f = _mm512_set1_epi32(63), x0f = _mm512_set1_epi32(15), x03 = _mm512_set1_epi32(3);
  const __m512i nib = _mm512_set1_epi8(0x0f), bit0 = _mm512_set1_epi8(1);
  [[maybe_unused]] __m512i high[8];
  if constexpr (five) {
#pragma GCC unroll 8
    for (std::size_t i = 0; i < 8; ++i) high[i] = v[4 + i];
  }
  constexpr std::size_t qs_at = five ? 48 : 16;
#pragma GCC unroll 4
  for (std::size_t pair = 0; pair < 4; ++pair) {
    const unsigned sh = static_cast<unsigned>(8 * pair);
    const __m512i b0 = _mm512_srli_epi32(s0, sh), b1 = _mm512_srli_epi32(s1, sh), b2 = _mm512_srli_epi32(s2, sh);
    // Sub-block `pair` (scales from the first 8 bytes) and `pair + 4` (the last 4 and the top bits).
    const __m512i sc_lo = _mm512_and_si512(b0, x3f), m_lo = _mm512_and_si512(b1, x3f);
    const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(b2, x0f),
                                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b0, 6), x03), 4));
    const __m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b2, 4), x0f),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b1, 6), x03), 4));
    const std::size_t lo = pair, hi = pair + 4;
    _mm512_storeu_ps(scales + 32 * lo, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_lo)));
    _mm512_storeu_ps(scales + 32 * lo + 16, _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m_lo))));
    _mm512_storeu_ps(scales + 32 * hi, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_hi)));
    _mm512_storeu_ps(scales + 32 * hi + 16, _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m_hi))));
    // Codes: 32 bytes per pair of sub-blocks, sub-block 2 pair in the low nibbles and
    // 2 pair + 1 in the high ones; Q5_K's fifth bit of value l of sub-block s is bit s
    // of qh byte l.
    const std::size_t even = 2 * pair, odd = 2 * pair + 1;
#pragma GCC unroll 8
    for (std::size_t i = 0; i < 8; ++i) {
      const __m512i c = v[(qs_at + 32 * pair) / 4 + i];
      __m512i ce = _mm512_and_si512(c, nib), co = _mm512_and_si512(_mm512_srli_epi32(c, 4), nib);
      if constexpr (five) {
        ce = _mm512_or_si512(ce, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(high[i], static_cast<unsigned>(even)), bit0), 4));
        co = _mm512_or_si512(co, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(high[i], static_cast<unsigned>(odd)), bit0), 4));
      }
      _mm512_storeu_si512(codes + 128 * even + 16 * i, ce);
      _mm512_storeu_si512(codes + 128 * odd + 16 * i, co);
    }
  }
}

// Super-block sb of 16 rows of Q6_K as its 8 sub-blocks of 32: codes [8, 8, 16] (6-bit,
// unsigned; the offset 32 returns through `starts`, per half), and per sub-block 48
// values: the 16 d (float), then the int8 scales of its two halves of 16 values (int32).
// The integer sum sc_a isum_a + sc_b isum_b of each sub-block and the product (d d_x)
// follow.
TLM_VNNI_INLINE inline void unpack_lanes_q6(const std::byte* p, std::size_t rb, __mmask16 live, std::int32_t* codes,
                                            float* scales) {
  // d is bytes 208-209, the last two of the block, past the whole dwords that
  // rows_as_lanes reads: one gather of the dword ending there.
  const __m512 d =
      _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(gather_lanes(p + 206, row_offsets(rb), live), 16)));
  __m512i v[52];  // [dword of bytes 0-207]: lane l from row l
  rows_as_lanes(p, rb, live, v);
  const __m512i* sc = v + 48;
  const __m512i x0f = _mm512_set1_epi8(0x0f), x03 = _mm512_set1_epi8(0x03);
#pragma GCC unroll 2
  for (std::size_t h = 0; h < 2; ++h) {
    __m512i high[8];
#pragma GCC unroll 8
    for (std::size_t i = 0; i < 8; ++i) high[i] = v[32 + 8 * h + i];
#pragma GCC unroll 2
    for (std::size_t half = 0; half < 2; ++half) {  // t % 2: which 32 bytes of ql
#pragma GCC unroll 8
      for (std::size_t i = 0; i < 8; ++i) {
        const __m512i low = v[16 * h + 8 * half + i];
#pragma GCC unroll 2
        for (std::size_t upper = 0; upper < 2; ++upper) {  // t / 2: which nibble
          const std::size_t t = 2 * upper + half, s = 4 * h + t;
          const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(low, static_cast<unsigned>(4 * upper)), x0f);
          const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(high[i], static_cast<unsigned>(2 * t)), x03), 4);
          _mm512_storeu_si512(codes + 128 * s + 16 * i, _mm512_or_si512(lo, hi));
        }
      }
    }
  }
#pragma GCC unroll 8
  for (std::size_t s = 0; s < 8; ++s) {
    // Scales 2s and 2s + 1: bytes 2 (s % 2) and 2 (s % 2) + 1 of dword s / 2, sign-extended.
    const __m512i w = sc[s / 2];
    const unsigned up = static_cast<unsigned>(16 - 16 * (s % 2));
    const __m512i a = _mm512_srai_epi32(_mm512_slli_epi32(w, up + 8), 24);
    const __m512i b = _mm512_srai_epi32(_mm512_slli_epi32(w, up), 24);
    _mm512_storeu_ps(scales + 48 * s, d);
    _mm512_storeu_si512(scales + 48 * s + 16, a);
    _mm512_storeu_si512(scales + 48 * s + 32, b);
  }
}

// T activation rows (from t0) against one unpacked group: y[t, 0..15] (masked by live).
template <encoding E, int T>
TLM_VNNI_INLINE inline void lanes_tile(const std::int32_t* codes, const float* scales, const std::int32_t* starts,
                                       const q8_activations& x, std::size_t t0, float* y, std::size_t rows,
                                       __mmask16 live) {
  constexpr std::size_t scale_stride = lane_scale_stride<E>;
  const std::size_t nb = x.blocks;
  __m512 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < nb; ++b) {
    __m512i c[8];
#pragma GCC unroll 8
    for (std::size_t i = 0; i < 8; ++i) c[i] = _mm512_loadu_si512(codes + (8 * b + i) * 16);
    const __m512 d = _mm512_loadu_ps(scales + scale_stride * b);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const std::size_t tb = (t0 + static_cast<std::size_t>(t)) * nb + b;
      const std::int8_t* q = x.q.data() + 32 * tb;
      __m512i s = _mm512_setzero_si512();
      if constexpr (E == encoding::q6_k) {
        // Two halves of 16 values, each with its scale: sc_a isum_a + sc_b isum_b.
        __m512i sa = _mm512_set1_epi32(starts[2 * tb]), sb = _mm512_set1_epi32(starts[2 * tb + 1]);
#pragma GCC unroll 4
        for (std::size_t i = 0; i < 4; ++i) {
          std::int32_t fa, fb;
          std::memcpy(&fa, q + 4 * i, 4);
          std::memcpy(&fb, q + 16 + 4 * i, 4);
          sa = _mm512_dpbusd_epi32(sa, c[i], _mm512_set1_epi32(fa));
          sb = _mm512_dpbusd_epi32(sb, c[4 + i], _mm512_set1_epi32(fb));
        }
        const std::int32_t* sc = reinterpret_cast<const std::int32_t*>(scales + scale_stride * b + 16);
        s = _mm512_add_epi32(_mm512_mullo_epi32(sa, _mm512_loadu_si512(sc)), _mm512_mullo_epi32(sb, _mm512_loadu_si512(sc + 16)));
      } else {
        if constexpr (lane_code_offset<E> != 0) s = _mm512_set1_epi32(starts[tb]);
#pragma GCC unroll 8
        for (std::size_t i = 0; i < 8; ++i) {
          std::int32_t four;
          std::memcpy(&four, q + 4 * i, 4);
          s = _mm512_dpbusd_epi32(s, c[i], _mm512_set1_epi32(four));
        }
      }
      // (d_w d_x) isum (+ m s): the reference's two products.
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(x.ds[2 * tb])), acc[t]);
      if constexpr (lane_has_min<E>)
        acc[t] = _mm512_fmadd_ps(_mm512_loadu_ps(scales + scale_stride * b + 16), _mm512_set1_ps(x.ds[2 * tb + 1]), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + (t0 + static_cast<std::size_t>(t)) * rows, live, acc[t]);
}

template <encoding E>
TLM_VNNI_FN inline void matmul_q8(encoding, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                                        std::size_t r0, std::size_t r1, std::size_t rows, std::size_t) {
  constexpr std::size_t scale_stride = lane_scale_stride<E>;
  constexpr bool k_quant = E == encoding::q4_k || E == encoding::q5_k;
  const std::size_t nb = x.blocks, batch = x.rows;
  // Per calling thread, reused across calls (a decode step allocates nothing).
  thread_local std::vector<std::int32_t> codes;   // [nb, 8, 16]: one group's codes
  thread_local std::vector<float> scales;         // [nb, scale_stride]: its d (and m)
  thread_local std::vector<std::int32_t> starts;  // [batch, nb]: -offset * sum(q) per activation block (Q6_K: [batch, nb, 2], per half)
  codes.resize(nb * 128);
  scales.resize(nb * scale_stride);
  if constexpr (E == encoding::q6_k) {
    starts.resize(batch * nb * 2);
    for (std::size_t i = 0; i < batch * nb * 2; ++i) {
      std::int32_t sum = 0;
      for (std::size_t j = 0; j < 16; ++j) sum += x.q[16 * i + j];
      starts[i] = -32 * sum;
    }
  } else if constexpr (lane_code_offset<E> != 0) {
    starts.resize(batch * nb);
    for (std::size_t i = 0; i < batch * nb; ++i) {
      std::int32_t sum = 0;
      for (std::size_t j = 0; j < 32; ++j) sum += x.q[32 * i + j];
      starts[i] = -lane_code_offset<E> * sum;
    }
  }
  for (std::size_t g = r0; g < r1; g += 16) {
    const std::size_t n = std::min<std::size_t>(16, r1 - g);
    const auto live = static_cast<__mmask16>((1u << n) - 1);
    const std::byte* base = w + g * rb;
    if constexpr (E == encoding::q6_k) {
      for (std::size_t sb = 0; sb < nb / 8; ++sb)
        unpack_lanes_q6(base + sb * traits(E).block_bytes, rb, live, codes.data() + 1024 * sb,
                        scales.data() + 8 * scale_stride * sb);
    } else if constexpr (k_quant) {
      for (std::size_t sb = 0; sb < nb / 8; ++sb)
        unpack_lanes_k<E>(base + sb * traits(E).block_bytes, rb, live, codes.data() + 1024 * sb, scales.data() + 256 * sb);
    } else {
      const __m512i offsets = row_offsets(rb);
      for (std::size_t b = 0; b < nb; ++b)
        unpack_lanes<E>(base + b * row_bytes(E, 32), offsets, live, codes.data() + 128 * b, scales.data() + scale_stride * b);
    }
    float* yg = y + g;
    std::size_t t = 0;
    for (; t + 8 <= batch; t += 8) lanes_tile<E, 8>(codes.data(), scales.data(), starts.data(), x, t, yg, rows, live);
    if (batch - t >= 4) {
      lanes_tile<E, 4>(codes.data(), scales.data(), starts.data(), x, t, yg, rows, live);
      t += 4;
    }
    if (batch - t >= 2) {
      lanes_tile<E, 2>(codes.data(), scales.data(), starts.data(), x, t, yg, rows, live);
      t += 2;
    }
    if (batch - t >= 1) lanes_tile<E, 1>(codes.data(), scales.data(), starts.data(), x, t, yg, rows, live);
  }
}

// ---- Fast mode of the K-quants (VNNI) ----------------------------------------------
//
// The activations come grouped by 256 (kernels/scalar.hpp): block s has d_x = k_s D, so
// a super-block's sum is one integer: each 64-byte vector of codes is multiplied with its
// activations into int16 pairs (vpmaddubsw: unsigned codes <= 63 times |q| <= 127, a
// pair at most 16,002, no saturation) and the pairs by their sub-block's scale times its
// step (sc k <= 2,048) into int32 lanes (vpdpwssd). One conversion and one FMA with d D
// per super-block, where activations scaled per 32 took a conversion, a scale permute
// and an FMA per pair of sub-blocks. The mins (Q4_K, Q5_K) and Q6_K's code offset of 32
// come from the activations' sums of 16 (q8_activations::sums) by one vpmaddwd per
// super-block.
//
// Q4_K / Q5_K keep sub-blocks 4j and 4j+2 in the low nibbles of 64 bytes of qs and 4j+1,
// 4j+3 in the high ones; the kernel copies the activations once per call with each
// super-block's blocks of 32 in the order 0 2 1 3 4 6 5 7, so that one 64-byte load
// of codes and two of activations meet. Q6_K's low bits are in value order already.

// 64 bytes of weights as two 32-byte loads. A super-block of 210 bytes puts most 64-byte
// loads across two cache lines, and from memory on Zen 4 such a load measured far slower
// than two halves: Q6_K 2048x2048 cold, 1 thread, 16 against 25 GB/s (29-31 GB/s hot
// either way). Q4_K's 144 bytes measured the same cold either way and 7% slower hot
// with halves, so it loads whole.
TLM_VNNI_INLINE inline __m512i load_halves(const std::byte* p) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)), 1);
}

// 16-bit shift counts: a in the low 256 bits, b in the high.
TLM_VNNI_INLINE inline __m512i half_counts(short a, short b) {
  return _mm512_inserti64x4(_mm512_set1_epi16(a), _mm256_set1_epi16(b), 1);
}

// int32 lanes holding an int16 scale in both halves, the form vpdpwssd multiplies pairs by.
TLM_VNNI_INLINE inline __m512i scale_pairs(__m512i s32) {
  return _mm512_or_si512(_mm512_and_si512(s32, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(s32, 16));
}

// R rows at once (1 or 2): the rows share the loads of the activations, their sums and
// steps and the steps' widening. Decode of the llama32_1b-shaped Q4_K_M file, fast, on a
// 2-vCPU Intel Xeon: 7-9% less time per token than one row at a time, at 1 and 2 threads
// (bench/results/kernels-kquant-two-rows-xeon.md). More rows per call were not tried.
template <encoding E, std::size_t R>
TLM_VNNI_INLINE inline void row_dots_q8k(const std::byte* const (&rows)[R], const std::int8_t* q,
                                          const q8_activations& x, float (&out)[R]) {
  constexpr std::size_t bb = traits(E).block_bytes;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 acc[R];
  __m256 mins[R];
#pragma GCC unroll 2
  for (std::size_t r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    mins[r] = _mm256_setzero_ps();
  }
  for (std::size_t sb = 0; sb < x.blocks / 8; ++sb) {
#pragma GCC unroll 2
    for (std::size_t r = 0; r < R; ++r)
      for (std::size_t at = 0; at < bb; at += 64)
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + sb * bb + at + prefetch_ahead), _MM_HINT_T0);
    const std::int8_t* qs = q + 256 * sb;
    const __m256i half_sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums.data() + 16 * sb));  // [16]
    const __m128i k8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.steps.data() + 8 * sb));           // [8]
    const float unit = x.units[sb];
    if constexpr (E == encoding::q6_k) {
      const __m512i k32 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(k8, k8));  // [16]: half h takes block h / 2's step
      const __m512i mask = _mm512_set1_epi8(0x30);
      __m512i i0[R], i1[R], sc[R];
      __m256i offset[R];
#pragma GCC unroll 2
      for (std::size_t r = 0; r < R; ++r) {
        const std::byte* p = rows[r] + sb * bb;
        // sc_h k_h of the 16 halves.
        const __m512i sck = _mm512_mullo_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192))), k32);
        sc[r] = scale_pairs(sck);
        // The codes' offset: 32 sum_h sc_h k_h sum_h(q), taken off the sum below.
        offset[r] = _mm256_madd_epi16(_mm512_cvtepi32_epi16(sck), half_sums);
        i0[r] = i1[r] = _mm512_setzero_si512();
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i xa = _mm512_loadu_si512(qs + 128 * h);
        const __m512i xb = _mm512_loadu_si512(qs + 128 * h + 64);
        // Lane l of the 64 values starting at 64v belongs to half 4v + l/4.
        const int v = 2 * h;
        const __m512i ia = _mm512_setr_epi32(4 * v, 4 * v, 4 * v, 4 * v, 4 * v + 1, 4 * v + 1, 4 * v + 1, 4 * v + 1,
                                             4 * v + 2, 4 * v + 2, 4 * v + 2, 4 * v + 2, 4 * v + 3, 4 * v + 3, 4 * v + 3, 4 * v + 3);
        const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(4));
#pragma GCC unroll 2
        for (std::size_t r = 0; r < R; ++r) {
          const std::byte* p = rows[r] + sb * bb;
          const __m512i ql = load_halves(p + 64 * h);
          const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h)));
          // Values 128h + 0..63 (low nibbles; high bits 0-1, 2-3 of qh) and 64..127 (high
          // nibbles; bits 4-5, 6-7), the high bits moved to bits 4-5 of each byte.
          const __m512i ca = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                             _mm512_and_si512(_mm512_sllv_epi16(qh, half_counts(4, 2)), mask));
          const __m512i cb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                             _mm512_and_si512(_mm512_srlv_epi16(qh, half_counts(0, 2)), mask));
          i0[r] = _mm512_dpwssd_epi32(i0[r], _mm512_maddubs_epi16(ca, xa), _mm512_permutexvar_epi32(ia, sc[r]));
          i1[r] = _mm512_dpwssd_epi32(i1[r], _mm512_maddubs_epi16(cb, xb), _mm512_permutexvar_epi32(ib, sc[r]));
        }
      }
#pragma GCC unroll 2
      for (std::size_t r = 0; r < R; ++r) {
        const __m512i i0r = _mm512_sub_epi32(i0[r], _mm512_zextsi256_si512(_mm256_slli_epi32(offset[r], 5)));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0r, i1[r])),
                                 _mm512_set1_ps(half_at(rows[r] + sb * bb + 208) * unit), acc[r]);
      }
    } else {
      constexpr std::size_t qs_at = E == encoding::q5_k ? 48 : 16;
      const __m128i k16 = _mm_cvtepu8_epi16(k8);
      __m512i i0[R], i1[R], sc[R];
      [[maybe_unused]] __m512i qh[R];
#pragma GCC unroll 2
      for (std::size_t r = 0; r < R; ++r) {
        const std::byte* p = rows[r] + sb * bb;
        __m128i sc8, m8;
        avx2::k_scale_bytes(p, sc8, m8);
        sc[r] = scale_pairs(_mm512_cvtepu16_epi32(_mm256_castsi128_si256(_mm_mullo_epi16(_mm_cvtepu8_epi16(sc8), k16))));
        // sum_s m_s k_s qsum_s, each min against the sums of its two halves.
        const __m256i msum = _mm256_madd_epi16(avx2::doubled_words(_mm_mullo_epi16(_mm_cvtepu8_epi16(m8), k16)), half_sums);
        mins[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(half_at(p + 2) * unit), mins[r]);
        if constexpr (E == encoding::q5_k)
          qh[r] = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
        i0[r] = i1[r] = _mm512_setzero_si512();
      }
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const __m512i xa = _mm512_loadu_si512(qs + 128 * j);
        const __m512i xb = _mm512_loadu_si512(qs + 128 * j + 64);
        const int s = 4 * j;
        const __m512i ia = _mm512_setr_epi32(s, s, s, s, s, s, s, s, s + 2, s + 2, s + 2, s + 2, s + 2, s + 2, s + 2, s + 2);
        const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(1));
#pragma GCC unroll 2
        for (std::size_t r = 0; r < R; ++r) {
          const __m512i v = _mm512_loadu_si512(rows[r] + sb * bb + qs_at + 64 * j);
          __m512i lo = _mm512_and_si512(v, low4);                         // sub-blocks 4j, 4j+2
          __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);  // 4j+1, 4j+3
          if constexpr (E == encoding::q5_k) {
            // Bit s of qh is sub-block s's fifth bit: moved to bit 4.
            const __m512i bit4 = _mm512_set1_epi8(0x10);
            const __m512i lo_bits = j == 0 ? _mm512_sllv_epi16(qh[r], half_counts(4, 2))
                                           : _mm512_srlv_epi16(qh[r], half_counts(0, 2));
            const __m512i hi_bits = j == 0 ? _mm512_sllv_epi16(qh[r], half_counts(3, 1))
                                           : _mm512_srlv_epi16(qh[r], half_counts(1, 3));
            lo = _mm512_or_si512(lo, _mm512_and_si512(lo_bits, bit4));
            hi = _mm512_or_si512(hi, _mm512_and_si512(hi_bits, bit4));
          }
          i0[r] = _mm512_dpwssd_epi32(i0[r], _mm512_maddubs_epi16(lo, xa), _mm512_permutexvar_epi32(ia, sc[r]));
          i1[r] = _mm512_dpwssd_epi32(i1[r], _mm512_maddubs_epi16(hi, xb), _mm512_permutexvar_epi32(ib, sc[r]));
        }
      }
#pragma GCC unroll 2
      for (std::size_t r = 0; r < R; ++r)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0[r], i1[r])),
                                 _mm512_set1_ps(half_at(rows[r] + sb * bb) * unit), acc[r]);
    }
  }
#pragma GCC unroll 2
  for (std::size_t r = 0; r < R; ++r) out[r] = hsum(acc[r]) - avx2::hsum(mins[r]);
}

template <encoding E>
TLM_VNNI_FN inline void matvec_q8_k(encoding, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                                    std::size_t r0, std::size_t r1, std::size_t) {
  const std::size_t superblocks = x.blocks / 8;
  const std::int8_t* q = x.q.data();
  if constexpr (E != encoding::q6_k) {
    // Per calling thread, reused: a decode step allocates nothing.
    thread_local std::vector<std::int8_t> order;  // [superblocks, 8, 32], blocks 0 2 1 3 4 6 5 7
    order.resize(256 * superblocks);
    constexpr int from[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (std::size_t sb = 0; sb < superblocks; ++sb)
      for (int k = 0; k < 8; ++k)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(order.data() + 256 * sb + 32 * k),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 256 * sb + 32 * from[k])));
    q = order.data();
  }
  std::size_t i = 0;
  for (; i + 2 <= r1 - r0; i += 2) {
    const std::size_t ra = detail::streamed_row(r0, r1, i), rb2 = detail::streamed_row(r0, r1, i + 1);
    const std::byte* const rows[2] = {w + ra * rb, w + rb2 * rb};
    float out[2];
    row_dots_q8k<E, 2>(rows, q, x, out);
    y[ra] = out[0];
    y[rb2] = out[1];
  }
  if (i < r1 - r0) {
    const std::size_t r = detail::streamed_row(r0, r1, i);
    const std::byte* const rows[1] = {w + r * rb};
    float out[1];
    row_dots_q8k<E, 1>(rows, q, x, out);
    y[r] = out[0];
  }
}

}  // namespace tlm::kernels::avx512

#undef TLM_VNNI_FN
#undef TLM_VNNI_INLINE

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif
