#pragma once
// The AVX-512F micro-kernel of gemm.hpp: an MR x 32 tile of C in 2 * MR zmm
// accumulators (MR = 12 by default: 24 accumulators, plus 2 B vectors and a
// broadcast, within the 32 zmm registers). Per step of p: 2 loads of the B panel,
// MR broadcasts of the A panel, 2 * MR FMAs. 24 independent chains cover latency 4
// times two 512-bit FMA pipes (Intel server cores); Zen 4 runs each 512-bit FMA as two
// 256-bit halves, so there the level matches avx2's peak rather than doubling it.
// Packing uses the AVX2 packers (gemm_avx2.hpp): it moves data, and wider shuffles
// would not move it faster.
//
// Only reached after the avx512 level's CPU test (kernels/levels.hpp) has passed.
#include <tlm/kernels/gemm_avx2.hpp>
#include <tlm/kernels/gemm_pack.hpp>
#include <tlm/kernels/target.hpp>

#include <immintrin.h>

#include <cstddef>

namespace tlm::kernels::gemm_avx512 {

// C[rows, cols] (stride ldc) = (overwrite ? 0 : C) + a [kc, MR] . b [kc, 32], top-left corner of the tile.
template <std::size_t MR>
TLM_AVX512_FN void micro(std::size_t kc, const float* a, const float* b, float* c, std::size_t ldc,
                              std::size_t rows, std::size_t cols, bool overwrite) {
  __m512 acc[MR][2];
#pragma GCC unroll 32
  for (std::size_t r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  // The C tile is usually outside L1 (and C is read again for every k block): start
  // fetching it now so the misses overlap the FMAs instead of following them.
  for (std::size_t r = 0; r < rows; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + (cols - 1) / 2), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + cols - 1), _MM_HINT_T0);
  }
  for (std::size_t p = 0; p < kc; ++p, a += MR, b += 32) {
    const __m512 b0 = _mm512_load_ps(b);
    const __m512 b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 32
    for (std::size_t r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r]);
      acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  // Column masks make a partial tile as cheap as a full one; rows past `rows` are
  // never touched. C + acc is the same rounding either way.
  const unsigned lo_bits = cols >= 16 ? 0xffffu : (1u << cols) - 1u;
  const unsigned hi_bits = cols >= 32 ? 0xffffu : cols <= 16 ? 0u : (1u << (cols - 16)) - 1u;
  const __mmask16 m0 = static_cast<__mmask16>(lo_bits), m1 = static_cast<__mmask16>(hi_bits);
#pragma GCC unroll 32
  for (std::size_t r = 0; r < MR; ++r) {
    if (r >= rows) break;
    float* cr = c + r * ldc;
    if (overwrite) {
      _mm512_mask_storeu_ps(cr, m0, acc[r][0]);
      _mm512_mask_storeu_ps(cr + 16, m1, acc[r][1]);
    } else {
      _mm512_mask_storeu_ps(cr, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cr), acc[r][0]));
      _mm512_mask_storeu_ps(cr + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cr + 16), acc[r][1]));
    }
  }
}

template <std::size_t MR = 12, std::size_t KC = 192>
struct kernel_t {
  static constexpr std::size_t mr = MR;
  static constexpr std::size_t nr = 32;
  // The B micro-panel [kc, 32] is kc * 128 bytes: 24 KiB at kc = 192, inside a 32 KiB L1.
  static constexpr std::size_t kc = KC;
  static constexpr std::size_t mc_max = (516 / MR) * MR;  // A block [mc, kc]: 396 KB at kc = 192
  static constexpr std::size_t nc_max = 1024;

  static void micro(std::size_t kc_, const float* a, const float* b, float* c, std::size_t ldc, std::size_t rows,
                    std::size_t cols, bool overwrite) {
    gemm_avx512::micro<MR>(kc_, a, b, c, ldc, rows, cols, overwrite);
  }
  template <std::size_t W>
  static void pack_c(const float* src, std::size_t ld, std::size_t count, std::size_t kc_, float* dst) {
    gemm_avx2::pack_contiguous<W>(src, ld, count, kc_, dst);
  }
  template <std::size_t W>
  static void pack_t(const float* src, std::size_t ld, std::size_t count, std::size_t kc_, float* dst) {
    // The AVX2 transposes: packing moves data, and 256-bit shuffles are as fast here.
    gemm_avx2::pack_transposed<W>(src, ld, count, kc_, dst);
  }
};

using kernel = kernel_t<>;

}  // namespace tlm::kernels::gemm_avx512
