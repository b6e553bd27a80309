#pragma once
// Portable kernels: the reference definitions, and the fallback used on CPUs without
// AVX2. Both dequantize with quant.hpp's dequantize_row, the one scalar decoder of
// every block layout, so the SIMD decoders in avx2.hpp are checked against code
// they share nothing with.
#include <tlm/encoding.hpp>
#include <tlm/quant.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tlm::kernels::detail {

// Per-thread work on rows [r0, r1) of a matrix W [rows, cols] whose rows are
// `rb` bytes apart; the table in kernels.hpp holds one of these per encoding.
//   matvec: x [cols] -> y [rows]
//   matmul: x [batch, cols] -> y [batch, rows]
using matvec_rows_fn = void (*)(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                                std::size_t r0, std::size_t r1, std::size_t cols);
using matmul_rows_fn = void (*)(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                                std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols,
                                std::size_t batch);

// Optional rewrite of x shared by all rows of one matvec (layout the kernel wants,
// per-block sums); done once per call, before the rows are split among threads.
using prepare_x_fn = void (*)(const float* x, std::size_t cols, std::vector<float>& prepared);

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

// Dequantizes each row once and uses it for the whole batch.
inline void matmul_rows_scalar(encoding enc, const std::byte* w, std::size_t rb, const float* x, float* y,
                               std::size_t r0, std::size_t r1, std::size_t rows, std::size_t cols,
                               std::size_t batch) {
  std::vector<float> row(cols);  // [cols]
  for (std::size_t r = r0; r < r1; ++r) {
    dequantize_row(enc, w + r * rb, row.data(), cols);
    for (std::size_t b = 0; b < batch; ++b) y[b * rows + r] = dot_scalar(row.data(), x + b * cols, cols);
  }
}

}  // namespace tlm::kernels::detail
