#pragma once
// Portable packing of gemm.hpp's operands into micro-panels, shared by every level.
// A micro-panel is p-major: element (p, r) at p * MR + r, so the micro-kernel reads
// one contiguous run of MR (or NR) values per step of p whatever the source layout.
#include <cstddef>

namespace tlm::kernels::gemm_detail {

// Packs op(A)[i0 .. i0+rows, p0 .. p0+kc) into dst [kc, MR], rows >= `rows` zero.
template <std::size_t MR>
inline void pack_a_plain(const float* a, std::size_t lda, bool ta, std::size_t i0, std::size_t rows, std::size_t p0,
                         std::size_t kc, float* dst) {
  if (ta) {
    // A stored [k, m]: each p is a contiguous run of rows.
    const float* src = a + p0 * lda + i0;
    if (rows == MR) {
      for (std::size_t p = 0; p < kc; ++p, src += lda, dst += MR)
        for (std::size_t r = 0; r < MR; ++r) dst[r] = src[r];
    } else {
      for (std::size_t p = 0; p < kc; ++p, src += lda, dst += MR) {
        for (std::size_t r = 0; r < rows; ++r) dst[r] = src[r];
        for (std::size_t r = rows; r < MR; ++r) dst[r] = 0.0f;
      }
    }
    return;
  }
  // A [m, k]: each row is contiguous in p; the pack transposes.
  for (std::size_t r = 0; r < rows; ++r) {
    const float* src = a + (i0 + r) * lda + p0;
    for (std::size_t p = 0; p < kc; ++p) dst[p * MR + r] = src[p];
  }
  for (std::size_t r = rows; r < MR; ++r)
    for (std::size_t p = 0; p < kc; ++p) dst[p * MR + r] = 0.0f;
}

// Packs op(B)[p0 .. p0+kc, j0 .. j0+cols) into dst [kc, NR], columns >= `cols` zero.
template <std::size_t NR>
inline void pack_b_plain(const float* b, std::size_t ldb, bool tb, std::size_t j0, std::size_t cols, std::size_t p0,
                         std::size_t kc, float* dst) {
  if (!tb) {
    // B [k, n]: each p is a contiguous run of columns.
    const float* src = b + p0 * ldb + j0;
    if (cols == NR) {
      for (std::size_t p = 0; p < kc; ++p, src += ldb, dst += NR)
        for (std::size_t j = 0; j < NR; ++j) dst[j] = src[j];
    } else {
      for (std::size_t p = 0; p < kc; ++p, src += ldb, dst += NR) {
        for (std::size_t j = 0; j < cols; ++j) dst[j] = src[j];
        for (std::size_t j = cols; j < NR; ++j) dst[j] = 0.0f;
      }
    }
    return;
  }
  // B stored [n, k]: each column of op(B) is a contiguous row; the pack transposes.
  for (std::size_t j = 0; j < cols; ++j) {
    const float* src = b + (j0 + j) * ldb + p0;
    for (std::size_t p = 0; p < kc; ++p) dst[p * NR + j] = src[p];
  }
  for (std::size_t j = cols; j < NR; ++j)
    for (std::size_t p = 0; p < kc; ++p) dst[p * NR + j] = 0.0f;
}

}  // namespace tlm::kernels::gemm_detail
