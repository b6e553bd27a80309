#pragma once
// The AVX2 + FMA micro-kernel of gemm.hpp: a 6 x 16 tile of C in 12 ymm accumulators.
// Per step of p it loads 2 vectors of the B panel and broadcasts 6 values of the A
// panel into 12 FMAs; 12 independent chains cover the FMA latency (4 cycles) times
// the two FMA pipes of current x86 cores, and leave registers for the operands.
//
// Only reached after the avx2 level's CPU test (kernels/levels.hpp) has passed;
// the target attribute keeps the rest of the program baseline x86-64.
#include <tlm/kernels/gemm_pack.hpp>
#include <tlm/kernels/target.hpp>

#include <immintrin.h>

#include <cstddef>

namespace tlm::kernels::gemm_avx2 {

// C[rows, cols] (stride ldc) = (overwrite ? 0 : C) + a [kc, MR] . b [kc, 16], top-left corner of the tile.
template <std::size_t MR>
TLM_AVX2_FN void micro(std::size_t kc, const float* a, const float* b, float* c, std::size_t ldc,
                            std::size_t rows, std::size_t cols, bool overwrite) {
  __m256 acc[MR][2];
#pragma GCC unroll 16
  for (std::size_t r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  // The C tile is usually outside L1 (and C is read again for every k block): start
  // fetching it now so the misses overlap the FMAs instead of following them.
  for (std::size_t r = 0; r < rows; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + cols - 1), _MM_HINT_T0);
  }
  for (std::size_t p = 0; p < kc; ++p, a += MR, b += 16) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  if (rows == MR && cols == 16) {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r) {
      float* cr = c + r * ldc;
      if (overwrite) {
        _mm256_storeu_ps(cr, acc[r][0]);
        _mm256_storeu_ps(cr + 8, acc[r][1]);
      } else {
        _mm256_storeu_ps(cr, _mm256_add_ps(_mm256_loadu_ps(cr), acc[r][0]));
        _mm256_storeu_ps(cr + 8, _mm256_add_ps(_mm256_loadu_ps(cr + 8), acc[r][1]));
      }
    }
    return;
  }
  // A partial tile: the same sums, written element by element (C + acc rounds as the
  // vector add does).
  alignas(32) float tile[MR][16];
#pragma GCC unroll 16
  for (std::size_t r = 0; r < MR; ++r) {
    _mm256_store_ps(tile[r], acc[r][0]);
    _mm256_store_ps(tile[r] + 8, acc[r][1]);
  }
  for (std::size_t r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    for (std::size_t j = 0; j < cols; ++j) cr[j] = overwrite ? tile[r][j] : cr[j] + tile[r][j];
  }
}

// r[q] = column q of the 8 x 8 block whose rows are r[0..7] (AVX only).
TLM_AVX2_FN inline void transpose8(__m256 (&r)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// gemm_detail::pack_transposed with 8 x 8 register transposes: source [count, ...]
// (element (p, x) at src[x * ld + p]) into panels dst [ceil(count / W), kc, W]. Groups
// of 8 vectors; a group short of 8 (W = 6, or the last panel) loads zeros for the
// missing vectors and stores only the lanes that belong to the panel.
template <std::size_t W>
TLM_AVX2_FN void pack_transposed(const float* src, std::size_t ld, std::size_t count, std::size_t kc,
                                      float* dst) {
  const std::size_t kc8 = kc / 8 * 8;
  for (std::size_t panel = 0; panel * W < count; ++panel, dst += kc * W) {
    const std::size_t x_panel = panel * W;
    const std::size_t rows = count - x_panel < W ? count - x_panel : W;
    for (std::size_t g = 0; g < W; g += 8) {
      const std::size_t lanes = W - g < 8 ? W - g : 8;                      // lanes of the panel in this group
      const std::size_t valid = rows > g ? (rows - g < lanes ? rows - g : lanes) : 0;  // of which have data
      float* d = dst + g;
      if (valid == 0) {
        for (std::size_t p = 0; p < kc; ++p)
          for (std::size_t x = 0; x < lanes; ++x) d[p * W + x] = 0.0f;
        continue;
      }
      const float* s = src + (x_panel + g) * ld;
      for (std::size_t p = 0; p < kc8; p += 8) {
        __m256 r[8];
        for (std::size_t x = 0; x < 8; ++x) r[x] = x < valid ? _mm256_loadu_ps(s + x * ld + p) : _mm256_setzero_ps();
        transpose8(r);
        if (lanes == 8) {
          for (std::size_t q = 0; q < 8; ++q) _mm256_storeu_ps(d + (p + q) * W, r[q]);
        } else if (lanes == 4) {
          for (std::size_t q = 0; q < 8; ++q) _mm_storeu_ps(d + (p + q) * W, _mm256_castps256_ps128(r[q]));
        } else if (lanes == 6) {
          for (std::size_t q = 0; q < 8; ++q) {
            _mm_storeu_ps(d + (p + q) * W, _mm256_castps256_ps128(r[q]));
            _mm_storel_pi(reinterpret_cast<__m64*>(d + (p + q) * W + 4), _mm256_extractf128_ps(r[q], 1));
          }
        } else {
          alignas(32) float t[8];
          for (std::size_t q = 0; q < 8; ++q) {
            _mm256_store_ps(t, r[q]);
            for (std::size_t x = 0; x < lanes; ++x) d[(p + q) * W + x] = t[x];
          }
        }
      }
      for (std::size_t p = kc8; p < kc; ++p)
        for (std::size_t x = 0; x < lanes; ++x) d[p * W + x] = x < valid ? s[x * ld + p] : 0.0f;
    }
  }
}

// W floats from s to d with vector moves chosen at compile time (8, 4, then 2 wide).
// Not vmaskmovps: its store form is microcoded and slow on AMD cores.
template <std::size_t W>
TLM_AVX2_FN inline void copy_run(const float* s, float* d) {
  static_assert(W % 2 == 0, "panel widths are even");
  std::size_t x = 0;
  for (; x + 8 <= W; x += 8) _mm256_storeu_ps(d + x, _mm256_loadu_ps(s + x));
  if constexpr (W % 8 >= 4) {
    _mm_storeu_ps(d + x, _mm_loadu_ps(s + x));
    x += 4;
  }
  if constexpr (W % 4 == 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(d + x), _mm_loadl_pi(_mm_setzero_ps(), reinterpret_cast<const __m64*>(s + x)));
  }
}

// gemm_detail::pack_contiguous with vector copies: source [kc, ...] (element (p, x) at
// src[p * ld + x]) into panels dst [ceil(count / W), kc, W]. Compiled for the baseline,
// a 6- or 12-wide copy becomes scalar moves.
template <std::size_t W>
TLM_AVX2_FN void pack_contiguous(const float* src, std::size_t ld, std::size_t count, std::size_t kc,
                                      float* dst) {
  const std::size_t full = count / W, rest = count % W;
  for (std::size_t p = 0; p < kc; ++p, src += ld) {
    float* d = dst + p * W;
    const float* s = src;
    for (std::size_t panel = 0; panel < full; ++panel, d += kc * W, s += W) copy_run<W>(s, d);
    if (rest != 0) {
      for (std::size_t x = 0; x < rest; ++x) d[x] = s[x];
      for (std::size_t x = rest; x < W; ++x) d[x] = 0.0f;
    }
  }
}

struct kernel {
  static constexpr std::size_t mr = 6;
  static constexpr std::size_t nr = 16;
  // The B micro-panel [kc, 16] is 16 KiB: it stays in a 32 KiB L1 while the A panels stream past it.
  static constexpr std::size_t kc = 256;
  // The A block [mc, kc] (528 KB) is read once per B micro-panel, about 4 bytes a cycle:
  // L2 serves that easily and L3 still does, so the block may outgrow a 512 KiB L2. The B
  // block [nc, kc] is read once, straight after it is packed.
  static constexpr std::size_t mc_max = 516;
  static constexpr std::size_t nc_max = 1024;

  static void micro(std::size_t kc_, const float* a, const float* b, float* c, std::size_t ldc, std::size_t rows,
                    std::size_t cols, bool overwrite) {
    gemm_avx2::micro<mr>(kc_, a, b, c, ldc, rows, cols, overwrite);
  }
  template <std::size_t W>
  static void pack_c(const float* src, std::size_t ld, std::size_t count, std::size_t kc_, float* dst) {
    gemm_avx2::pack_contiguous<W>(src, ld, count, kc_, dst);
  }
  template <std::size_t W>
  static void pack_t(const float* src, std::size_t ld, std::size_t count, std::size_t kc_, float* dst) {
    gemm_avx2::pack_transposed<W>(src, ld, count, kc_, dst);
  }
};

}  // namespace tlm::kernels::gemm_avx2
