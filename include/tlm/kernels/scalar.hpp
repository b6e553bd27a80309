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
//          the activations are quantized to int8 and the dot products are exact
//          integer sums (VNNI where the CPU has it), as llama.cpp does: one scale per
//          32 values for the 32-value encodings (its Q8_0 / Q8_1); for the K-quants a
//          unit per 256-value super-block times a small integer step per 32
//          (q8_activations), so that a super-block's whole sum is one integer and takes
//          one float multiply, as with its Q8_K. Float weights compute as `exact`.
enum class precision { exact, fast };

// Activation rows quantized for the fast kernels: value j of block b of row i is
// about q[(i*blocks + b)*32 + j] * d, with d = ds[2*(i*blocks + b)] and
// ds[2*(i*blocks + b) + 1] = d * sum_j q (Q8_1's s, which a Q4_1 block's min m
// multiplies: sum_j (c_j d_w + m) x_j = d_w d sum_j c_j q_j + m s).
// `group` is 32 (each block of 32 its own d, as llama.cpp's Q8_0 / Q8_1), or 256 for
// the K-quants (activation_group): then a super-block's 8 blocks share one unit
// D = max|x| / (127 * 16) of its 256 values, and block b's d is D times a small integer
// step k_b (1..16, the least that covers the block's largest value). A K-quant kernel
// folds k_b into its sub-block's integer scale, so the super-block's whole sum stays one
// integer, as with llama.cpp's Q8_K (one d per 256), while a block of small values keeps
// a fine step: on SmolLM2-135M's Q4_K_M file the fast logits' worst error is 0.067 of
// the largest logit, as with a d per 32 (0.065), where Q8_K's measured 0.150
// (bench/results/kernels-kquant-steps-zen4.md; tests/reference/check_kquant.py holds
// it to 0.1). `sums` holds the integer sums
// of q over each 16 values (Q8_K's bsums), which a Q4_K sub-block's min and a Q6_K
// half's code offset multiply. A kernel for 32-value blocks reads d per block, so it
// takes either grouping.
inline constexpr int max_step = 16;

struct q8_activations {
  std::size_t rows = 0;
  std::size_t blocks = 0;            // per row
  std::size_t group = 32;            // 32 or 256
  std::vector<std::int8_t> q;        // [rows, blocks, 32]
  std::vector<float> ds;             // [rows, blocks, 2]: d, d * sum(q)
  std::vector<float> units;          // [rows, blocks / 8]: D (group 256)
  std::vector<std::uint8_t> steps;   // [rows, blocks]: k, d = k D (group 256)
  std::vector<std::int16_t> sums;    // [rows, blocks, 2]: sum of q over each 16 values (group 256)
};

constexpr bool is_k_quant(encoding enc) {
  return enc == encoding::q4_k || enc == encoding::q5_k || enc == encoding::q6_k;
}

// The activations' grouping a fast product of weights in `enc` takes (q8_activations).
constexpr std::size_t activation_group(encoding enc) { return is_k_quant(enc) ? 256 : 32; }

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

// y[r] for every row of [r0, r1) in streamed_row's order, R rows a step and the rest
// one at a time: dot(rows, out) takes arrays of R (or 1) row pointers and outputs. A
// SIMD kernel gives its dot a target attribute; this loop needs none.
template <std::size_t R, class Dot>
inline void rows_in_steps(std::size_t r0, std::size_t r1, const std::byte* w, std::size_t rb, float* y, const Dot& dot) {
  std::size_t i = 0;
  for (; i + R <= r1 - r0; i += R) {
    std::size_t at[R];
    const std::byte* rows[R];
    float out[R];
    for (std::size_t j = 0; j < R; ++j) {
      at[j] = streamed_row(r0, r1, i + j);
      rows[j] = w + at[j] * rb;
    }
    dot(rows, out);
    for (std::size_t j = 0; j < R; ++j) y[at[j]] = out[j];
  }
  for (; i < r1 - r0; ++i) {
    const std::size_t r = streamed_row(r0, r1, i);
    const std::byte* rows[1] = {w + r * rb};
    float out[1];
    dot(rows, out);
    y[r] = out[0];
  }
}

// Optional rewrite of x shared by all rows of one matvec (layout the kernel wants,
// per-block sums); done once per call, before the rows are split among threads.
using prepare_x_fn = void (*)(const float* x, std::size_t cols, std::vector<float>& prepared);

// Fast-mode kernels (precision::fast), same row split as above.
//   quantize: x [rows, cols] -> out, one d per `group` values (32 or 256; cols a
//             multiple of it)
//   matvec:   W [rows, cols] times the one quantized row of x -> y [rows]
//   matmul:   W times every row of x -> y [x.rows, rows]
using quantize_fn = void (*)(const float* x, std::size_t rows, std::size_t cols, std::size_t group,
                             q8_activations& out);
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
// Quantizing a block of 32 with its d: q = round(x / d) to nearest, ties to even,
// computed as x * (1/d), as every SIMD level does too (same IEEE operations in the same
// order, and the SIMD conversions round to nearest even), so every level quantizes bit
// for bit alike and the fast kernels of all levels see the same integers. d comes from
// the blocks' largest magnitudes through group_scales, scalar code every level calls.
// |x - q d| <= d/2 (plus the rounding of x * (1/d), far below it): that is the error
// bound the tests hold the fast mode to.

// Round to nearest, ties to even, for |v| < 2^22, without calling libm (baseline
// x86-64 has no SSE4.1 rounding instruction): adding 1.5 * 2^23 leaves no fraction bits.
inline float round_even(float v) {
  volatile float magic = 12582912.0f;  // volatile: keeps the add-subtract from being folded away
  const float m = magic;
  return (v + m) - m;
}

// The larger of m and v, or NaN if either is (m's NaN if both): a running maximum that
// a NaN reaches and stays in, where std::max(m, NaN) would keep m.
inline float max_keeping_nan(float m, float v) { return std::isnan(m) ? m : (v > m || std::isnan(v)) ? v : m; }

// The scales of one group from its blocks' largest magnitudes bmax [per] (per = group /
// 32): d [per] and 1/d [per]; for a group of 256 also its unit D and steps k [per].
//   group 32:  d = max / 127
//   group 256: D = max / 127 / 16, k = the least integer >= 16 bmax / max (at least 1),
//              d = k D
// A NaN maximum makes d NaN, so that NaN activations give NaN outputs, never finite
// ones: the generator's check for non-finite logits depends on it.
inline void group_scales(const float* bmax, std::size_t per, float* d, float* id, float* unit, std::uint8_t* steps) {
  float amax = bmax[0];
  for (std::size_t b = 1; b < per; ++b) amax = max_keeping_nan(amax, bmax[b]);
  const float dmax = amax / 127.0f;
  if (per == 1) {
    d[0] = dmax;
    id[0] = dmax != 0.0f ? 1.0f / dmax : 0.0f;
    return;
  }
  const float u = dmax * (1.0f / static_cast<float>(max_step));  // exact (a power of two) but for subnormals
  *unit = u;
  for (std::size_t b = 0; b < per; ++b) {
    // NaN or infinite activations leave t unordered: the step stays 16 (and q is as
    // undefined as for a block of 32), without casting a NaN to int.
    int k = max_step;
    if (amax != 0.0f) {
      const float t = bmax[b] / amax * static_cast<float>(max_step);  // <= 16
      if (t <= 1.0f) {
        k = 1;
      } else if (t < static_cast<float>(max_step)) {
        k = static_cast<int>(t);
        if (static_cast<float>(k) < t) ++k;
      }
    }
    steps[b] = static_cast<std::uint8_t>(k);
    d[b] = u * static_cast<float>(k);
    id[b] = d[b] != 0.0f ? 1.0f / d[b] : 0.0f;
  }
}

// One block of 32 with the group's d and 1/d.
inline void quantize_block_scalar(const float* x, float d, float id, std::int8_t* q, float* ds) {
  int sum = 0;
  for (std::size_t j = 0; j < 32; ++j) {
    const float r = std::clamp(round_even(x[j] * id), -127.0f, 127.0f);
    // NaN (a NaN x or d) converts to -127, as the SIMD conversions' clamped INT_MIN does,
    // instead of casting a NaN to int.
    q[j] = r == r ? static_cast<std::int8_t>(r) : std::int8_t{-127};
    sum += q[j];
  }
  ds[0] = d;
  ds[1] = d * static_cast<float>(sum);
}

// q8_activations::sums of a quantized buffer (group 256); plain integer adds, so every
// level calls this one.
inline void fill_half_sums(q8_activations& out) {
  if (out.group != 256) {
    out.sums.clear();
    return;
  }
  out.sums.resize(out.q.size() / 16);
  for (std::size_t h = 0; h < out.sums.size(); ++h) {
    int s = 0;
    for (std::size_t j = 0; j < 16; ++j) s += out.q[16 * h + j];
    out.sums[h] = static_cast<std::int16_t>(s);  // |s| <= 16 * 127
  }
}

// Sizes `out` for x [rows, cols] quantized by groups of `group`; the levels share it.
inline void shape_activations(std::size_t rows, std::size_t cols, std::size_t group, q8_activations& out) {
  out.rows = rows;
  out.blocks = cols / 32;
  out.group = group;
  out.q.resize(rows * out.blocks * 32);
  out.ds.resize(rows * out.blocks * 2);
  out.units.resize(group == 256 ? rows * out.blocks / 8 : 0);
  out.steps.resize(group == 256 ? rows * out.blocks : 0);
}

// Group g's scales from its blocks' maxima, for block b0 = g * per onwards.
inline void group_scales_at(q8_activations& out, std::size_t g, const float* bmax, float* d, float* id) {
  const std::size_t per = out.group / 32;
  group_scales(bmax, per, d, id, per == 1 ? nullptr : out.units.data() + g,
               per == 1 ? nullptr : out.steps.data() + g * per);
}

inline void quantize_scalar(const float* x, std::size_t rows, std::size_t cols, std::size_t group, q8_activations& out) {
  shape_activations(rows, cols, group, out);
  const std::size_t per = group / 32;  // blocks per group
  for (std::size_t g = 0; g < rows * cols / group; ++g) {
    float bmax[8] = {}, d[8], id[8];
    for (std::size_t b = 0; b < per; ++b) {
      for (std::size_t j = 0; j < 32; ++j) {
        const float a = std::fabs(x[group * g + 32 * b + j]);
        bmax[b] = max_keeping_nan(bmax[b], a);
      }
    }
    group_scales_at(out, g, bmax, d, id);
    for (std::size_t b = 0; b < per; ++b) {
      const std::size_t i = per * g + b;
      quantize_block_scalar(x + 32 * i, d[b], id[b], out.q.data() + 32 * i, out.ds.data() + 2 * i);
    }
  }
  fill_half_sums(out);
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

// K-quants against activations grouped by 256: block s of the super-block has
// d_x = k_s D, so with each sub-block's integer scale times its step the whole sum is an
// integer:
//   Q4_K / Q5_K: (d D) sum_s sc_s k_s isum_s - (dmin D) sum_s m_s k_s qsum_s
//                (sub-block s of 32: scale sc, min m, isum = sum c q, qsum = sum q)
//   Q6_K:        (d D) sum_h sc_h k_h isum_h  (16-value halves h, codes c - 32, k_h the
//                step of the block of 32 holding h)
// Both integers are exact here (64-bit); SIMD levels sum them in 32-bit lanes (at most
// 8 x 2 x 16,002 x 2,048 per lane, far from overflow), convert the lanes and add them in
// another order.
inline float k_superblock_term_scalar(encoding enc, const std::byte* p, const std::int8_t* q, const std::uint8_t* k,
                                      float unit) {
  const auto* u = reinterpret_cast<const std::uint8_t*>(p);
  std::int64_t isum = 0, msum = 0;
  if (enc == encoding::q6_k) {
    block_q6_k blk;
    std::memcpy(&blk, p, sizeof blk);
    for (int v = 0; v < 256; ++v) {
      const int h = v / 128, t = (v % 128) / 32, l = v % 32;
      const int lo = (blk.ql[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 15;
      const int hi = (blk.qh[32 * h + l] >> (2 * t)) & 3;
      isum += blk.scales[v / 16] * k[v / 32] * ((lo | (hi << 4)) - 32) * q[v];
    }
    return (fp16_to_f32(blk.d) * unit) * static_cast<float>(isum);
  }
  const bool five = enc == encoding::q5_k;
  const std::uint8_t* qs = u + (five ? 48 : 16);
  for (int s = 0; s < 8; ++s) {
    std::uint8_t sc, m;
    tlm::detail::k_scale_min(u + 4, s, sc, m);
    for (int l = 0; l < 32; ++l) {
      int c = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
      if (five) c |= ((u[16 + l] >> s) & 1) << 4;
      isum += sc * k[s] * c * q[32 * s + l];
      msum += m * k[s] * q[32 * s + l];
    }
  }
  return (fp16_to_f32(load_u16(p)) * unit) * static_cast<float>(isum) -
         (fp16_to_f32(load_u16(p + 2)) * unit) * static_cast<float>(msum);
}

// One weight row against activation row b of x.
inline float row_dot_q8_scalar(encoding enc, const std::byte* row, const q8_activations& x, std::size_t b) {
  const std::size_t bb = traits(enc).block_bytes, nb = x.blocks;
  const std::int8_t* q = x.q.data() + b * nb * 32;
  float s = 0;
  if (is_k_quant(enc)) {
    for (std::size_t sb = 0; sb < nb / 8; ++sb)
      s += k_superblock_term_scalar(enc, row + sb * bb, q + 256 * sb, x.steps.data() + b * nb + 8 * sb, x.units[b * nb / 8 + sb]);
    return s;
  }
  const float* ds = x.ds.data() + b * nb * 2;
  for (std::size_t i = 0; i < nb; ++i) s += block_term_scalar(enc, row + i * bb, q + 32 * i, ds + 2 * i);
  return s;
}

inline void matvec_q8_scalar(encoding enc, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                             std::size_t r0, std::size_t r1, std::size_t) {
  for (std::size_t r = r0; r < r1; ++r) y[r] = row_dot_q8_scalar(enc, w + r * rb, x, 0);
}

inline void matmul_q8_scalar(encoding enc, const std::byte* w, std::size_t rb, const q8_activations& x, float* y,
                             std::size_t r0, std::size_t r1, std::size_t rows, std::size_t) {
  for (std::size_t r = r0; r < r1; ++r) {
    for (std::size_t b = 0; b < x.rows; ++b) y[b * rows + r] = row_dot_q8_scalar(enc, w + r * rb, x, b);
  }
}

}  // namespace tlm::kernels::detail
