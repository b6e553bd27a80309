#pragma once
// The AVX2 + FMA micro-kernel of gemm.hpp: a 6 x 16 tile of C in 12 ymm accumulators.
// Per step of p it loads 2 vectors of the B panel and broadcasts 6 values of the A
// panel into 12 FMAs; 12 independent chains cover the FMA latency (4 cycles) times
// the two FMA pipes of current x86 cores, and leave registers for the operands.
//
// Only reached after cpu.hpp has found AVX2 and FMA (kernel_level::avx2 or above);
// the target attribute keeps the rest of the program baseline x86-64.
#include <tlm/kernels/gemm_pack.hpp>

#include <immintrin.h>

#include <cstddef>

#define TLM_GEMM_AVX2_FN [[gnu::target("avx2,fma")]]

namespace tlm::kernels::gemm_avx2 {

// C[rows, cols] (stride ldc) = (overwrite ? 0 : C) + a [kc, MR] . b [kc, 16], top-left corner of the tile.
template <std::size_t MR>
TLM_GEMM_AVX2_FN void micro(std::size_t kc, const float* a, const float* b, float* c, std::size_t ldc,
                            std::size_t rows, std::size_t cols, bool overwrite) {
  __m256 acc[MR][2];
#pragma GCC unroll 16
  for (std::size_t r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
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

struct kernel {
  static constexpr std::size_t mr = 6;
  static constexpr std::size_t nr = 16;
  // The B micro-panel [kc, 16] is 16 KiB: it stays in a 32 KiB L1 while the A panels stream past it.
  static constexpr std::size_t kc = 256;
  static constexpr std::size_t mc_max = 516;  // A buffer [mc, kc] 516 KiB, read from L2/L3 at ~4 bytes a cycle

  static void micro(std::size_t kc_, const float* a, const float* b, float* c, std::size_t ldc, std::size_t rows,
                    std::size_t cols, bool overwrite) {
    gemm_avx2::micro<mr>(kc_, a, b, c, ldc, rows, cols, overwrite);
  }
  static void pack_a(const float* a, std::size_t lda, bool ta, std::size_t i0, std::size_t rows, std::size_t p0,
                     std::size_t kc_, float* dst) {
    gemm_detail::pack_a_plain<mr>(a, lda, ta, i0, rows, p0, kc_, dst);
  }
  static void pack_b(const float* b, std::size_t ldb, bool tb, std::size_t j0, std::size_t cols, std::size_t p0,
                     std::size_t kc_, float* dst) {
    gemm_detail::pack_b_plain<nr>(b, ldb, tb, j0, cols, p0, kc_, dst);
  }
};

}  // namespace tlm::kernels::gemm_avx2
