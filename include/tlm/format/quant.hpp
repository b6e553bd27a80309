#pragma once
// Scalar conversion between float32 and the block encodings found in GGUF files.
//
// dequantize_row is the reference every SIMD kernel is tested against, and it is
// itself checked bit for bit against gguf-py's `gguf.quants.dequantize`
// (tests/reference/check_gguf.py). quantize_row follows ggml's reference quantizers
// as llama.cpp's x86-64 build runs them (the ones its quantizer uses without an
// importance matrix), so a file we write holds the bytes llama.cpp would write
// (tests/reference/check_quantize.py); gguf-py's `gguf.quants.quantize` agrees except
// for the rare Q4_0 / Q5_0 rounding noted at centred_codes.
//
// Why the float arithmetic is safe to reorder here: every scale is a half (11
// significant bits) times a small integer (at most 8 bits), and a quant has at most
// 6 bits, so each product below is exact in float32. Only the final add or subtract
// of a min rounds, once, which makes the result independent of FMA contraction and
// of the order of the multiplications.
#include <tlm/error.hpp>
#include <tlm/format/blocks.hpp>
#include <tlm/format/encoding.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace tlm {

namespace detail {

template <class Block>
inline Block load_block(const std::byte* src, std::size_t index) {
  Block b;
  std::memcpy(&b, src + index * sizeof(Block), sizeof(Block));
  return b;
}

template <class Block>
inline void store_block(std::byte* dst, std::size_t index, const Block& b) {
  std::memcpy(dst + index * sizeof(Block), &b, sizeof(Block));
}

inline void check_row_length(encoding enc, std::size_t n, const char* what) {
  const auto t = traits(enc);
  if (t.block_values == 0) {
    throw shape_error(std::string(what) + ": unsupported encoding id " +
                      std::to_string(static_cast<std::uint32_t>(enc)) + "; use one of the encodings in encoding.hpp");
  }
  if (n % t.block_values != 0) {
    throw shape_error(std::string(what) + ": row of " + std::to_string(n) + " values is not a multiple of the " +
                      std::string(t.name) + " block size " + std::to_string(t.block_values) +
                      "; pad the row or choose an encoding with a smaller block");
  }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block.
inline void k_scale_min(const std::uint8_t* q, int j, std::uint8_t& sc, std::uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The 5-bit code of value j (0..31) of a Q5_0 / Q5_1 block.
inline int q5_code(const std::uint8_t* qs, const std::uint8_t* qh, int j) {
  const int lo = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
  const int hi = (qh[j / 8] >> (j % 8)) & 1;
  return lo | (hi << 4);
}

// Packs 32 five-bit codes into a block's qs and qh (the inverse of q5_code).
inline void q5_pack(const std::uint8_t* q, std::uint8_t* qs, std::uint8_t* qh) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<std::uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
  for (int i = 0; i < 4; ++i) {
    std::uint8_t h = 0;
    for (int k = 0; k < 8; ++k) h = static_cast<std::uint8_t>(h | (((q[8 * i + k] >> 4) & 1) << k));
    qh[i] = h;
  }
}

// Packs 32 four-bit codes: value j in the low nibble of byte j, value j + 16 in its high.
inline void q4_pack(const std::uint8_t* q, std::uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<std::uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
}

// a + b rounded once to float32, computed in double: the double sum rounded to float
// equals the float sum (53 >= 2*24 + 2), and the conversion keeps a compiler from
// fusing a preceding float multiply into an FMA, which would change the result.
inline float add_rounded(float a, float b) {
  return static_cast<float>(static_cast<double>(a) + static_cast<double>(b));
}

// a * b rounded to float32, never fused with a following add into an FMA: llama.cpp's
// ggml-base is built for baseline x86-64, which has no FMA, so its products are
// rounded, and a quantizer that means to write its bytes must round them too.
inline float mul(float a, float b) { return static_cast<float>(static_cast<double>(a) * static_cast<double>(b)); }

// ggml's nearest_int: add 1.5 * 2^23 and read the mantissa, i.e. round half to even
// for |v| < 2^22 (beyond, where ggml only asserts, the same wrapped value as ggml's).
inline int nearest_int(float v) {
  const float biased = add_rounded(v, 12582912.0f);
  std::int32_t i;
  std::memcpy(&i, &biased, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

inline void check_finite(const float* src, std::size_t n, encoding enc) {
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(src[i])) {
      throw numeric_error("quantize_row: value " + std::to_string(i) + " is not finite; " +
                          std::string(traits(enc).name) + " blocks cannot hold NaN or infinity; store the tensor as F32 or F16");
    }
  }
}

// Q4_0 / Q5_0 codes of a block of 32 (half = 8 or 16): the signed value of largest
// magnitude (the first one on ties) maps to code 0, d = max / -half, and
// q = trunc(x * (1/d) + half + 0.5) clamped to the 2 half codes. The product is rounded
// to float before the add, as llama.cpp's x86-64 build computes it (its ggml-base has no
// FMA); gguf-py instead evaluates product and sum in float64 (what an FMA would give,
// its comment calls this rounding "cursed"). The two differ in about 3 of 10,000 blocks
// of weights dequantized from Q4_1 (and in none of check_gguf.py's random data); we
// follow llama.cpp, whose files users download (tests/reference/check_quantize.py).
// Returns d.
inline float centred_codes(const float* x, int half, std::uint8_t* q) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -static_cast<float>(half);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const float top = static_cast<float>(2 * half - 1);
  for (int j = 0; j < 32; ++j) {
    const float v = add_rounded(mul(x[j], id), static_cast<float>(half) + 0.5f);
    q[j] = static_cast<std::uint8_t>(std::clamp(std::trunc(v), 0.0f, top));
  }
  return d;
}

// Q4_1 / Q5_1 codes of a block of 32 (steps = 15 or 31): the block's range [min, max]
// in `steps` equal steps, q = trunc((x - min) / d + 0.5) clamped. Returns d; sets mn.
inline float offset_codes(const float* x, int steps, std::uint8_t* q, float& mn) {
  mn = x[0];
  float mx = x[0];
  for (int j = 1; j < 32; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  const float d = (mx - mn) / static_cast<float>(steps);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float v = add_rounded((x[j] - mn) * id, 0.5f);
    q[j] = static_cast<std::uint8_t>(std::clamp(std::trunc(v), 0.0f, static_cast<float>(steps)));
  }
  return d;
}

// ---- K-quant quantizers: llama.cpp's reference algorithms (quantize_row_q4_K_ref,
// q5_K_ref, q6_K_ref, which its quantizer uses when no importance matrix is given),
// written so that our bytes equal its bytes: the same float operations in the same
// order, every product that feeds a sum through `mul`, rounding through `nearest_int`.

// Scale and min of one sub-block of 32 (llama.cpp's make_qkx2_quants): start from the
// range [min(x, 0), max], then try nstep + 1 other step counts nmax + rmin + rdelta*is,
// each followed by a weighted least-squares fit of scale and min to the codes it gives,
// and keep the fit with the smallest weighted squared error. Returns the scale;
// `neg_min` receives -min (>= 0), codes go to L.
inline float fit_scale_min(const float* x, const float* w, int nmax, float rmin, float rdelta, int nstep,
                           std::uint8_t* L, float& neg_min) {
  constexpr int n = 32;
  float mn = x[0], mx = x[0];
  float sum_w = w[0];
  float sum_x = mul(sum_w, x[0]);
  for (int i = 1; i < n; ++i) {
    if (x[i] < mn) mn = x[i];
    if (x[i] > mx) mx = x[i];
    sum_w += w[i];
    sum_x += mul(w[i], x[i]);
  }
  if (mn > 0) mn = 0;
  if (mx == mn) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    neg_min = -mn;
    return 0.0f;
  }
  const float fmax = static_cast<float>(nmax);
  float iscale = fmax / (mx - mn);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(mul(iscale, x[i] - mn));
    L[i] = static_cast<std::uint8_t>(std::max(0, std::min(nmax, l)));
    const float diff = mul(scale, static_cast<float>(L[i])) + mn - x[i];
    best_error += mul(w[i], mul(diff, diff));
  }
  std::uint8_t aux[n];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + mul(rdelta, static_cast<float>(is)) + fmax) / (mx - mn);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(mul(iscale, x[i] - mn))));
      aux[i] = static_cast<std::uint8_t>(l);
      const float wl = mul(w[i], static_cast<float>(l));
      sum_l += wl;
      sum_l2 += mul(wl, static_cast<float>(l));
      sum_xl += mul(wl, x[i]);
    }
    const float D = mul(sum_w, sum_l2) - mul(sum_l, sum_l);
    if (D > 0) {
      float this_scale = (mul(sum_w, sum_xl) - mul(sum_x, sum_l)) / D;
      float this_min = (mul(sum_l2, sum_x) - mul(sum_l, sum_xl)) / D;
      if (this_min > 0) {  // a positive offset cannot be stored: fit the scale alone
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = mul(this_scale, static_cast<float>(aux[i])) + this_min - x[i];
        cur_error += mul(w[i], mul(diff, diff));
      }
      if (cur_error < best_error) {
        std::memcpy(L, aux, n);
        best_error = cur_error;
        scale = this_scale;
        mn = this_min;
      }
    }
  }
  neg_min = -mn;
  return scale;
}

// One Q4_K (nmax 15) or Q5_K (nmax 31) super-block of 256 values: each sub-block's
// scale and min fitted with weights |x| + rms(x) (so large values count more), then both
// sets quantized to 6 bits against the largest of each, and the codes recomputed with
// the stored (rounded) scales. Fills d, dmin, scales; codes (0..nmax) go to L.
inline void k_super_block(const float* x, int nmax, float rmin, float rdelta, int nstep, std::uint16_t& d_out,
                          std::uint16_t& dmin_out, std::uint8_t* packed, std::uint8_t* L) {
  float scales[8], mins[8], w[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += mul(xs[l], xs[l]);
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_min(xs, w, nmax, rmin, rdelta, nstep, L + 32 * j, mins[j]);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(packed, 0, 12);
  for (int j = 0; j < 8; ++j) {
    // Wrapped to 8 bits before the clamp, as llama.cpp stores them (a negative fit
    // becomes 63, not 0).
    const auto ls = static_cast<std::uint8_t>(std::min<unsigned>(63, static_cast<std::uint8_t>(nearest_int(mul(inv_scale, scales[j])))));
    const auto lm = static_cast<std::uint8_t>(std::min<unsigned>(63, static_cast<std::uint8_t>(nearest_int(mul(inv_min, mins[j])))));
    // The inverse of k_scale_min: sub-blocks 0..3 in the low 6 bits of bytes 0..7,
    // 4..7 as nibbles in bytes 8..11 with their top 2 bits above those of 0..3.
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = static_cast<std::uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      packed[j - 4] = static_cast<std::uint8_t>(packed[j - 4] | ((ls >> 4) << 6));
      packed[j] = static_cast<std::uint8_t>(packed[j] | ((lm >> 4) << 6));
    }
  }
  d_out = f32_to_fp16(max_scale / 63.0f);
  dmin_out = f32_to_fp16(max_min / 63.0f);
  const float d = fp16_to_f32(d_out), dmin = fp16_to_f32(dmin_out);
  for (int j = 0; j < 8; ++j) {
    std::uint8_t sc, m;
    k_scale_min(packed, j, sc, m);
    const float ds = d * static_cast<float>(sc);
    if (ds == 0.0f) continue;  // keeps the fit's codes, as llama.cpp does
    const float dm = mul(dmin, static_cast<float>(m));
    for (int i = 0; i < 32; ++i) {
      const int l = nearest_int((x[32 * j + i] + dm) / ds);
      L[32 * j + i] = static_cast<std::uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

// Codes of 16 values for Q6_K (llama.cpp's make_qx_quants with nmax 32 and weights
// x^2): the value of largest magnitude maps to -32, then 18 nearby step counts
// -(32 + 0.1 * is) / max are tried and the least-squares scale of the best kept.
// Codes are stored offset by 32 (0..63). Returns the scale.
inline float fit_symmetric(const float* x, std::uint8_t* L) {
  constexpr int n = 16, nmax = 32;
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const auto code = [](float iscale, float v) { return std::max(-nmax, std::min(nmax - 1, nearest_int(mul(iscale, v)))); };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = code(iscale, x[i]);
    L[i] = static_cast<std::uint8_t>(l + nmax);
    const float w = mul(x[i], x[i]);
    sumlx += mul(mul(w, x[i]), static_cast<float>(l));
    suml2 += mul(mul(w, static_cast<float>(l)), static_cast<float>(l));
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + mul(0.1f, static_cast<float>(is))) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = code(iscale, x[i]);
      const float w = mul(x[i], x[i]);
      sumlx += mul(mul(w, x[i]), static_cast<float>(l));
      suml2 += mul(mul(w, static_cast<float>(l)), static_cast<float>(l));
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<std::uint8_t>(code(iscale, x[i]) + nmax);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

inline void quantize_q4_k(const float* x, std::byte* dst, std::size_t blocks) {
  for (std::size_t b = 0; b < blocks; ++b, x += 256) {
    block_q4_k blk{};
    std::uint8_t L[256];
    k_super_block(x, 15, -1.0f, 0.1f, 20, blk.d, blk.dmin, blk.scales, L);
    // Chunk c of 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high.
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) blk.qs[32 * c + l] = static_cast<std::uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    store_block(dst, b, blk);
  }
}

inline void quantize_q5_k(const float* x, std::byte* dst, std::size_t blocks) {
  for (std::size_t b = 0; b < blocks; ++b, x += 256) {
    block_q5_k blk{};
    std::uint8_t L[256];
    k_super_block(x, 31, -0.5f, 0.1f, 15, blk.d, blk.dmin, blk.scales, L);
    // Low 4 bits as in Q4_K; the fifth bit of sub-block s is bit s of qh[l].
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        blk.qs[32 * c + l] = static_cast<std::uint8_t>((lo & 15) | ((hi & 15) << 4));
        blk.qh[l] = static_cast<std::uint8_t>(blk.qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
    store_block(dst, b, blk);
  }
}

inline void quantize_q6_k(const float* x, std::byte* dst, std::size_t blocks) {
  for (std::size_t b = 0; b < blocks; ++b, x += 256) {
    block_q6_k blk{};
    std::uint8_t L[256];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int s = 0; s < 16; ++s) {
      scales[s] = fit_symmetric(x + 16 * s, L + 16 * s);
      if (std::fabs(scales[s]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[s]);
        max_scale = scales[s];
      }
    }
    if (max_abs_scale < 1e-15f) {  // an all-zero block: all zero bytes
      store_block(dst, b, blk);
      continue;
    }
    // The sub-block scale of largest magnitude becomes -128 (so 127 is never exceeded
    // by more than rounding); the others are 8-bit multiples of d.
    const float iscale = -128.0f / max_scale;
    blk.d = f32_to_fp16(1 / iscale);
    for (int s = 0; s < 16; ++s) blk.scales[s] = static_cast<std::int8_t>(std::min(127, nearest_int(mul(iscale, scales[s]))));
    const float d = fp16_to_f32(blk.d);
    for (int s = 0; s < 16; ++s) {
      const float ds = d * static_cast<float>(blk.scales[s]);
      if (ds == 0.0f) continue;  // keeps the fit's codes, as llama.cpp does
      for (int i = 0; i < 16; ++i) {
        const int l = std::max(-32, std::min(31, nearest_int(x[16 * s + i] / ds)));
        L[16 * s + i] = static_cast<std::uint8_t>(l + 32);
      }
    }
    // The inverse of the Q6_K dequantizer's layout (see dequantize_row).
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* q = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        blk.ql[64 * h + l] = static_cast<std::uint8_t>((q[l] & 15) | ((q[l + 64] & 15) << 4));
        blk.ql[64 * h + 32 + l] = static_cast<std::uint8_t>((q[l + 32] & 15) | ((q[l + 96] & 15) << 4));
        blk.qh[32 * h + l] = static_cast<std::uint8_t>((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) | ((q[l + 96] >> 4) << 6));
      }
    }
    store_block(dst, b, blk);
  }
}

}  // namespace detail

// src holds row_bytes(enc, n) bytes; dst receives n floats.
inline void dequantize_row(encoding enc, const std::byte* src, float* dst, std::size_t n) {
  detail::check_row_length(enc, n, "dequantize_row");
  switch (enc) {
    case encoding::f32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case encoding::f16:
      for (std::size_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(load_u16(src + 2 * i));
      return;
    case encoding::bf16:
      for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case encoding::q8_0:
      for (std::size_t b = 0; b < n / 32; ++b) {
        const auto blk = detail::load_block<block_q8_0>(src, b);
        const float d = fp16_to_f32(blk.d);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = static_cast<float>(blk.qs[j]) * d;
      }
      return;
    case encoding::q4_0:
      for (std::size_t b = 0; b < n / 32; ++b) {
        const auto blk = detail::load_block<block_q4_0>(src, b);
        const float d = fp16_to_f32(blk.d);
        float* y = dst + b * 32;
        for (int j = 0; j < 16; ++j) {
          y[j] = d * static_cast<float>((blk.qs[j] & 15) - 8);
          y[j + 16] = d * static_cast<float>((blk.qs[j] >> 4) - 8);
        }
      }
      return;
    case encoding::q4_1:
      for (std::size_t b = 0; b < n / 32; ++b) {
        const auto blk = detail::load_block<block_q4_1>(src, b);
        const float d = fp16_to_f32(blk.d);
        const float m = fp16_to_f32(blk.m);
        float* y = dst + b * 32;
        for (int j = 0; j < 16; ++j) {
          y[j] = detail::add_rounded(d * static_cast<float>(blk.qs[j] & 15), m);
          y[j + 16] = detail::add_rounded(d * static_cast<float>(blk.qs[j] >> 4), m);
        }
      }
      return;
    case encoding::q5_0:
      for (std::size_t b = 0; b < n / 32; ++b) {
        const auto blk = detail::load_block<block_q5_0>(src, b);
        const float d = fp16_to_f32(blk.d);
        float* y = dst + b * 32;
        for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(detail::q5_code(blk.qs, blk.qh, j) - 16);
      }
      return;
    case encoding::q5_1:
      for (std::size_t b = 0; b < n / 32; ++b) {
        const auto blk = detail::load_block<block_q5_1>(src, b);
        const float d = fp16_to_f32(blk.d);
        const float m = fp16_to_f32(blk.m);
        float* y = dst + b * 32;
        for (int j = 0; j < 32; ++j) y[j] = detail::add_rounded(d * static_cast<float>(detail::q5_code(blk.qs, blk.qh, j)), m);
      }
      return;
    case encoding::q4_k:
      for (std::size_t b = 0; b < n / 256; ++b) {
        const auto blk = detail::load_block<block_q4_k>(src, b);
        const float d = fp16_to_f32(blk.d);
        const float dmin = fp16_to_f32(blk.dmin);
        float* y = dst + b * 256;
        // 4 chunks of 32 bytes; low nibbles are sub-block 2c, high nibbles 2c+1.
        for (int c = 0; c < 4; ++c) {
          std::uint8_t sc0, m0, sc1, m1;
          detail::k_scale_min(blk.scales, 2 * c, sc0, m0);
          detail::k_scale_min(blk.scales, 2 * c + 1, sc1, m1);
          const float d0 = d * sc0, dm0 = dmin * m0, d1 = d * sc1, dm1 = dmin * m1;
          for (int l = 0; l < 32; ++l) {
            const std::uint8_t q = blk.qs[32 * c + l];
            y[64 * c + l] = detail::add_rounded(d0 * static_cast<float>(q & 15), -dm0);
            y[64 * c + 32 + l] = detail::add_rounded(d1 * static_cast<float>(q >> 4), -dm1);
          }
        }
      }
      return;
    case encoding::q5_k:
      for (std::size_t b = 0; b < n / 256; ++b) {
        const auto blk = detail::load_block<block_q5_k>(src, b);
        const float d = fp16_to_f32(blk.d);
        const float dmin = fp16_to_f32(blk.dmin);
        float* y = dst + b * 256;
        // Sub-block s: low 4 bits as in Q4_K, the fifth bit is bit s of qh[l].
        for (int s = 0; s < 8; ++s) {
          std::uint8_t sc, m;
          detail::k_scale_min(blk.scales, s, sc, m);
          const float ds = d * sc, dm = dmin * m;
          for (int l = 0; l < 32; ++l) {
            const int lo = (blk.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15;
            const int hi = (blk.qh[l] >> s) & 1;
            y[32 * s + l] = detail::add_rounded(ds * static_cast<float>(lo | (hi << 4)), -dm);
          }
        }
      }
      return;
    case encoding::q6_k:
      for (std::size_t b = 0; b < n / 256; ++b) {
        const auto blk = detail::load_block<block_q6_k>(src, b);
        const float d = fp16_to_f32(blk.d);
        float* y = dst + b * 256;
        // Two halves of 128 values; in half h, value h*128 + 32*t + l takes its low
        // bits from ql[h*64 + l (+32 if t odd)] (nibble t/2) and its high bits from
        // qh[h*32 + l] (bits 2t, 2t+1).
        for (int h = 0; h < 2; ++h) {
          for (int t = 0; t < 4; ++t) {
            for (int l = 0; l < 32; ++l) {
              const int p = 128 * h + 32 * t + l;
              const int lo = (blk.ql[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 15;
              const int hi = (blk.qh[32 * h + l] >> (2 * t)) & 3;
              const float ds = d * static_cast<float>(blk.scales[p / 16]);
              y[p] = ds * static_cast<float>((lo | (hi << 4)) - 32);
            }
          }
        }
      }
      return;
    default:
      throw shape_error("dequantize_row: no dequantizer for " + std::string(traits(enc).name) +
                        " (it is used for activations only); convert the tensor to a weight encoding");
  }
}

// src holds n floats; dst receives row_bytes(enc, n) bytes. Quantized encodings
// reject non-finite input with numeric_error.
inline void quantize_row(encoding enc, const float* src, std::byte* dst, std::size_t n) {
  detail::check_row_length(enc, n, "quantize_row");
  switch (enc) {
    case encoding::f32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case encoding::f16:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t h = f32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case encoding::bf16:
      // Round to nearest even on the upper 16 bits; NaN stays a quiet NaN (as ggml does).
      for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t u = std::bit_cast<std::uint32_t>(src[i]);
        std::uint16_t h;
        if ((u & 0x7fffffffu) > 0x7f800000u) {
          h = static_cast<std::uint16_t>((u >> 16) | 64u);
        } else {
          h = static_cast<std::uint16_t>((static_cast<std::uint64_t>(u) + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case encoding::q8_0:
      detail::check_finite(src, n, enc);
      for (std::size_t b = 0; b < n / 32; ++b) {
        const float* x = src + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q8_0 blk{};
        blk.d = f32_to_fp16(d);
        for (int j = 0; j < 32; ++j) blk.qs[j] = static_cast<std::int8_t>(std::round(x[j] * id));  // half away from zero
        detail::store_block(dst, b, blk);
      }
      return;
    case encoding::q4_0:
    case encoding::q5_0:
      detail::check_finite(src, n, enc);
      for (std::size_t b = 0; b < n / 32; ++b) {
        std::uint8_t q[32];
        const bool five = enc == encoding::q5_0;
        const float d = detail::centred_codes(src + b * 32, five ? 16 : 8, q);
        if (five) {
          block_q5_0 blk{};
          blk.d = f32_to_fp16(d);
          detail::q5_pack(q, blk.qs, blk.qh);
          detail::store_block(dst, b, blk);
        } else {
          block_q4_0 blk{};
          blk.d = f32_to_fp16(d);
          detail::q4_pack(q, blk.qs);
          detail::store_block(dst, b, blk);
        }
      }
      return;
    case encoding::q4_1:
    case encoding::q5_1:
      detail::check_finite(src, n, enc);
      for (std::size_t b = 0; b < n / 32; ++b) {
        std::uint8_t q[32];
        float mn;
        const bool five = enc == encoding::q5_1;
        const float d = detail::offset_codes(src + b * 32, five ? 31 : 15, q, mn);
        if (five) {
          block_q5_1 blk{};
          blk.d = f32_to_fp16(d);
          blk.m = f32_to_fp16(mn);
          detail::q5_pack(q, blk.qs, blk.qh);
          detail::store_block(dst, b, blk);
        } else {
          block_q4_1 blk{};
          blk.d = f32_to_fp16(d);
          blk.m = f32_to_fp16(mn);
          detail::q4_pack(q, blk.qs);
          detail::store_block(dst, b, blk);
        }
      }
      return;
    case encoding::q4_k:
      detail::check_finite(src, n, enc);
      detail::quantize_q4_k(src, dst, n / 256);
      return;
    case encoding::q5_k:
      detail::check_finite(src, n, enc);
      detail::quantize_q5_k(src, dst, n / 256);
      return;
    case encoding::q6_k:
      detail::check_finite(src, n, enc);
      detail::quantize_q6_k(src, dst, n / 256);
      return;
    default:
      throw shape_error("quantize_row: no quantizer for " + std::string(traits(enc).name) +
                        " (it is used for activations only); write the tensor as one of " + writable_encodings_list());
  }
}

}  // namespace tlm
