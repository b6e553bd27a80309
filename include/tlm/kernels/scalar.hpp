#pragma once
// Portable kernels: the reference definitions, and the fallback used on CPUs without
// AVX2. Both dequantize with format/quant.hpp's dequantize_row, the one scalar decoder of
// every block layout, so the SIMD decoders in avx2.hpp are checked against code
// they share nothing with.
#include <tlm/format/encoding.hpp>
#include <tlm/format/quant.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tlm::kernels {

// How a matrix product treats its activations.
//   exact: float32 activations, float32 sums of the dequantized weights (the
//          fidelity the model's logits are checked at: 2e-6 against float64).
//   fast:  for quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K),
//          each 32-value block of the activations is quantized to int8 with its own
//          scale (as llama.cpp's Q8_0 / Q8_1), and the block dot products are exact
//          integer sums (VNNI where the CPU has it). Float weights compute as `exact`.
enum class precision { exact, fast };

// Activation rows quantized per block of 32 for the fast kernels: value j of block b
// of row i is about q[(i*blocks + b)*32 + j] * d, with d = ds[2*(i*blocks + b)] and
// ds[2*(i*blocks + b) + 1] = d * sum_j q (Q8_1's s, which a Q4_1 block's min m
// multiplies: sum_j (c_j d_w + m) x_j = d_w d sum_j c_j q_j + m s).
struct q8_activations {
  std::size_t rows = 0;
  std::size_t blocks = 0;     // per row
  std::vector<std::int8_t> q; // [rows, blocks, 32]
  std::vector<float> ds;      // [rows, blocks, 2]: d, d * sum(q)
};

}  // namespace tlm::kernels

namespace tlm::kernels::detail {

// Per-thread work on rows [r0, r1) of a matrix W [rows, cols] whose rows are
// `rb` bytes apart; the table in kernels/table.hpp holds one of these per encoding.
//   matvec: x [cols] -> y [rows]
//   matmul: x [batch, cols] -> y [batch, rows]
using matvec_rows_fn = void (*)(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                                std::size_t r0, std::size_t r1, std::size_t cols);
using matmul_rows_fn = void (*)(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                                std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols,
                                std::size_t batch);

// The order a SIMD matvec computes rows [r0, r1) in: i = 0, 1, ... gives row
// streamed_row(r0, r1, i). The range is cut into 4 parts taken a row each in turn, so
// the weights are read as 4 sequential streams far apart instead of one. A core that
// computes while it reads keeps more cache lines in flight that way: on the 2-vCPU
// Intel Xeon, cold matvecs ran 1.24x faster on the median row (0.87-1.73x), SmolLM2's Q8_0
// output matrix in fast mode from 9.2 to 13.5 GB/s at 1 thread and from 18.1 to 26.4
// at 2 (bench/results/kernels-streams-xeon.md). Every row is computed as before, so
// results are unchanged. (Two neighbouring rows read together is a different thing: it
// measured slower, see avx2::matvec_rows.)
inline constexpr std::size_t row_streams = 4;
inline std::size_t streamed_row(std::size_t r0, std::size_t r1, std::size_t i) {
  const std::size_t part = (r1 - r0) / row_streams;
  if (i >= row_streams * part) return r0 + i;  // the remainder, in order
  return r0 + (i % row_streams) * part + i / row_streams;
}

// Optional rewrite of x shared by all rows of one matvec (layout the kernel wants,
// per-block sums); done once per call, before the rows are split among threads.
using prepare_x_fn = void (*)(const float* x, std::size_t cols, std::vector<float>& prepared);

// Fast-mode kernels (precision::fast), same row split as above.
//   quantize: x [rows, cols] -> out (cols a multiple of 32)
//   matvec:   W [rows, cols] times the one quantized row of x -> y [rows]
//   matmul:   W times every row of x -> y [x.rows, rows]
using quantize_fn = void (*)(const float* x, std::size_t rows, std::size_t cols, q8_activations& out);
using matvec_q8_fn = void (*)(encoding enc, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                              std::size_t r0, std::size_t r1, std::size_t cols);
using matmul_q8_fn = void (*)(encoding enc, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                              std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols);

// Values dequantized per step: a multiple of every block size (1, 32, 256) and small
// enough (4 KiB) to stay in L1 next to x.
inline constexpr std::size_t chunk_values = 1024;

// Eight independent sums: shorter dependency chains and a smaller rounding error than
// one running sum; the compiler may vectorize it with baseline SSE2.
inline float dot_scalar(const float* a, const float* b, std::size_t n) {
  float s[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  }
  for (; i < n; ++i) s[i % 8] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

inline void axpy_scalar(float a, const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// The int8 KV cache's halves of attention (ops/attention.hpp): a float query dotted
// with a row of int8 codes, and a weighted int8 row added into a float sum. The row's
// scale is applied by the caller, once per row rather than per element. Every code
// converts to float exactly, so these differ from the float kernels only in that.
inline float dot_i8_scalar(const float* a, const std::int8_t* b, std::size_t n) {
  float s[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t k = 0; k < 8; ++k) s[k] += a[i + k] * static_cast<float>(b[i + k]);
  }
  for (; i < n; ++i) s[i % 8] += a[i] * static_cast<float>(b[i]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

inline void axpy_i8_scalar(float a, const std::int8_t* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += a * static_cast<float>(x[i]);
}

// One row dotted with x, dequantizing `chunk_values` at a time into a stack buffer.
inline float row_dot_generic_scalar(encoding enc, const std::byte* row, const float* x, std::size_t cols) {
  const auto t = traits(enc);
  float buf[chunk_values];  // [chunk_values]
  float sum = 0;
  for (std::size_t c = 0; c < cols; c += chunk_values) {
    const std::size_t n = std::min(chunk_values, cols - c);
    dequantize_row(enc, row + c / t.block_values * t.block_bytes, buf, n);
    sum += dot_scalar(buf, x + c, n);
  }
  return sum;
}

inline void matvec_rows_scalar(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                               std::size_t r0, std::size_t r1, std::size_t cols) {
  for (std::size_t r = r0; r < r1; ++r) y[r] = row_dot_generic_scalar(enc, w + r * rb, x, cols);
}

// Floats a thread's decoded-rows buffer takes at once: 4 rows of 32,768 columns
// (512 KiB), more than any shipped config's widest input (14,336).
inline constexpr std::size_t decoded_rows_reserve = 4 * 32768;

// A thread's buffer for the weight rows the prefill kernels decode (matmul_rows_scalar,
// avx2::matmul_rows): grown, never shrunk, so that a training step or a prefill does not
// allocate per call. reserve_gemm_scratch sizes it on every thread of a pool first, so
// which thread runs which rows never decides whether a later call allocates.
inline float* decoded_rows(std::size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(std::max(n, decoded_rows_reserve));
  return buf.data();
}

// Dequantizes each row once and uses it for the whole batch.
inline void matmul_rows_scalar(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                               std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols,
                               std::size_t batch) {
  float* row = decoded_rows(cols);  // [cols]
  for (std::size_t r = r0; r < r1; ++r) {
    dequantize_row(enc, w + r * rb, row, cols);
    for (std::size_t b = 0; b < batch; ++b) y[b * rows + r] = dot_scalar(row, x + b * cols, cols);
  }
}

// ---- Fast mode: the scalar integer reference ---------------------------------------
//
// Quantizing a block: d = max|x| / 127 and q = round(x / d) to nearest, ties to even,
// computed as x * (1/d), as every SIMD level does too (same IEEE operations in the same
// order, and the SIMD conversions round to nearest even), so every level quantizes
// bit for bit alike and the fast kernels of all levels see the same integers.
// |x - q d| <= d/2 (plus the rounding of x * (1/d), far below it): that is the error
// bound the tests hold the fast mode to.

// Round to nearest, ties to even, for |v| < 2^22, without calling libm (baseline
// x86-64 has no SSE4.1 rounding instruction): adding 1.5 * 2^23 leaves no fraction bits.
inline float round_even(float v) {
  volatile float magic = 12582912.0f;  // volatile: keeps the add-subtract from being folded away
  const float m = magic;
  return (v + m) - m;
}

inline void quantize_block_scalar(const float* x, std::int8_t* q, float* ds) {
  float amax = 0;
  for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int sum = 0;
  for (std::size_t j = 0; j < 32; ++j) {
    const float r = std::clamp(round_even(x[j] * id), -127.0f, 127.0f);
    q[j] = static_cast<std::int8_t>(r);
    sum += q[j];
  }
  ds[0] = d;
  ds[1] = d * static_cast<float>(sum);
}

inline void quantize_scalar(const float* x, std::size_t rows, std::size_t cols, q8_activations& out) {
  const std::size_t blocks = cols / 32;
  out.rows = rows;
  out.blocks = blocks;
  out.q.resize(rows * blocks * 32);
  out.ds.resize(rows * blocks * 2);
  for (std::size_t i = 0; i < rows * blocks; ++i) quantize_block_scalar(x + 32 * i, out.q.data() + 32 * i, out.ds.data() + 2 * i);
}

// The integer dot of one weight block with one quantized activation block, and the
// block's float term: (d_w * d_x) * isum (+ m * s for Q4_1 / Q5_1). Every SIMD level
// forms the same per-block terms (the integer sum is exact, the two products round
// alike) and differs from this only in the order the terms are added.
inline float block_term_scalar(encoding enc, const std::byte* p, const std::int8_t* q, const float* ds) {
  const auto* u = reinterpret_cast<const std::uint8_t*>(p);
  std::int32_t isum = 0;
  float m_term = 0;
  if (enc == encoding::q8_0) {
    for (std::size_t j = 0; j < 32; ++j) isum += static_cast<std::int8_t>(u[2 + j]) * q[j];
  } else if (enc == encoding::q5_0 || enc == encoding::q5_1) {
    const bool has_min = enc == encoding::q5_1;
    const std::uint8_t* qh = u + (has_min ? 4 : 2);
    const int off = has_min ? 0 : 16;
    for (int j = 0; j < 32; ++j) isum += (tlm::detail::q5_code(qh + 4, qh, j) - off) * q[j];
    if (has_min) m_term = fp16_to_f32(load_u16(p + 2)) * ds[1];
  } else {
    const std::size_t head = enc == encoding::q4_1 ? 4 : 2;
    const int off = enc == encoding::q4_1 ? 0 : 8;
    for (std::size_t j = 0; j < 16; ++j) {
      isum += ((u[head + j] & 15) - off) * q[j];
      isum += ((u[head + j] >> 4) - off) * q[j + 16];
    }
    if (enc == encoding::q4_1) m_term = fp16_to_f32(load_u16(p + 2)) * ds[1];
  }
  const float scale = fp16_to_f32(load_u16(p)) * ds[0];
  return scale * static_cast<float>(isum) + m_term;
}

// K-quants against the same per-32 activation blocks (finer than llama.cpp's Q8_K,
// whose one scale covers 256 values): the 256 values of a super-block are 8 activation
// blocks. Per block of 32, the term is
//   Q4_K / Q5_K: (d sc) d_x isum - (dmin m) s_x        (sub-block scale sc, min m)
//   Q6_K:        (d d_x) (sc_a isum_a + sc_b isum_b)   (two 16-value sub-blocks)
// with d sc and dmin m exact in float32 (a half times a 6-bit integer) and the integer
// sums exact; SIMD levels form the same terms and differ only in the order of the adds.
inline void k_block_term_parts(encoding enc, const std::byte* p, int s, const std::int8_t* q, std::int32_t& isum,
                               float& dscale, float& mscale) {
  const auto* u = reinterpret_cast<const std::uint8_t*>(p);
  isum = 0;
  if (enc == encoding::q6_k) {
    block_q6_k blk;
    std::memcpy(&blk, p, sizeof blk);
    const int h = s / 4, t = s % 4;
    std::int32_t part[2] = {0, 0};
    for (int l = 0; l < 32; ++l) {
      const int lo = (blk.ql[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 15;
      const int hi = (blk.qh[32 * h + l] >> (2 * t)) & 3;
      part[l / 16] += ((lo | (hi << 4)) - 32) * q[l];
    }
    isum = blk.scales[2 * s] * part[0] + blk.scales[2 * s + 1] * part[1];
    dscale = fp16_to_f32(blk.d);
    mscale = 0;
    return;
  }
  std::uint8_t sc, m;
  tlm::detail::k_scale_min(u + 4, s, sc, m);
  const bool five = enc == encoding::q5_k;
  const std::uint8_t* qs = u + (five ? 48 : 16);
  for (int l = 0; l < 32; ++l) {
    int c = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
    if (five) c |= ((u[16 + l] >> s) & 1) << 4;
    isum += c * q[l];
  }
  dscale = fp16_to_f32(load_u16(p)) * static_cast<float>(sc);
  mscale = fp16_to_f32(load_u16(p + 2)) * static_cast<float>(m);
}

inline float k_block_term_scalar(encoding enc, const std::byte* p, int s, const std::int8_t* q, const float* ds) {
  std::int32_t isum;
  float dscale, mscale;
  k_block_term_parts(enc, p, s, q, isum, dscale, mscale);
  return (dscale * ds[0]) * static_cast<float>(isum) - mscale * ds[1];
}

constexpr bool is_k_quant(encoding enc) {
  return enc == encoding::q4_k || enc == encoding::q5_k || enc == encoding::q6_k;
}

inline float row_dot_q8_scalar(encoding enc, const std::byte* row, const std::int8_t* q, const float* ds,
                               std::size_t blocks) {
  const std::size_t bb = traits(enc).block_bytes;
  float s = 0;
  if (is_k_quant(enc)) {
    for (std::size_t b = 0; b < blocks; ++b) s += k_block_term_scalar(enc, row + b / 8 * bb, static_cast<int>(b % 8), q + 32 * b, ds + 2 * b);
    return s;
  }
  for (std::size_t b = 0; b < blocks; ++b) s += block_term_scalar(enc, row + b * bb, q + 32 * b, ds + 2 * b);
  return s;
}

inline void matvec_q8_scalar(encoding enc, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                             std::size_t r0, std::size_t r1, std::size_t) {
  for (std::size_t r = r0; r < r1; ++r) y[r] = row_dot_q8_scalar(enc, w + r * rb, x.q.data(), x.ds.data(), x.blocks);
}

inline void matmul_q8_scalar(encoding enc, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                             std::size_t r0, std::size_t r1, std::size_t rows, std::size_t) {
  const std::size_t nb = x.blocks;
  for (std::size_t r = r0; r < r1; ++r) {
    for (std::size_t b = 0; b < x.rows; ++b)
      y[b * rows + r] = row_dot_q8_scalar(enc, w + r * rb, x.q.data() + b * nb * 32, x.ds.data() + b * nb * 2, nb);
  }
}

}  // namespace tlm::kernels::detail
