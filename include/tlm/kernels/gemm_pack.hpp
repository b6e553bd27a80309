#pragma once
// Portable packing of gemm.hpp's operands into micro-panels, shared by every level.
//
// A block of an operand is `count` vectors (rows of op(A) or columns of op(B)) by kc
// steps of p. It is packed as panels of W vectors, each panel p-major [kc, W], so the
// micro-kernel reads one contiguous run of W values per step of p, whatever the
// source layout; the last panel is zero-padded to W, so the kernel runs full tiles.
//   dst [ceil(count / W), kc, W]
#include <cstddef>

namespace tlm::kernels::gemm_detail {

// Source laid out [kc, ...]: element (p, x) at src[p * ld + x] (op(A) transposed, op(B)
// as it is). Each step of p is one contiguous run over x, read front to back.
template <std::size_t W>
inline void pack_contiguous(const float* src, std::size_t ld, std::size_t count, std::size_t kc, float* dst) {
  const std::size_t full = count / W, rest = count % W;
  for (std::size_t p = 0; p < kc; ++p, src += ld) {
    float* d = dst + p * W;
    for (std::size_t panel = 0; panel < full; ++panel, d += kc * W)
      for (std::size_t x = 0; x < W; ++x) d[x] = src[panel * W + x];
    if (rest != 0) {
      for (std::size_t x = 0; x < rest; ++x) d[x] = src[full * W + x];
      for (std::size_t x = rest; x < W; ++x) d[x] = 0.0f;
    }
  }
}

// Source laid out [count, ...]: element (p, x) at src[x * ld + p] (op(A) as it is, op(B)
// transposed). The pack transposes; the SIMD levels have faster versions of this.
template <std::size_t W>
inline void pack_transposed(const float* src, std::size_t ld, std::size_t count, std::size_t kc, float* dst) {
  for (std::size_t panel = 0; panel * W < count; ++panel, dst += kc * W) {
    const std::size_t rows = count - panel * W < W ? count - panel * W : W;
    for (std::size_t x = 0; x < rows; ++x) {
      const float* s = src + (panel * W + x) * ld;
      for (std::size_t p = 0; p < kc; ++p) dst[p * W + x] = s[p];
    }
    for (std::size_t x = rows; x < W; ++x)
      for (std::size_t p = 0; p < kc; ++p) dst[p * W + x] = 0.0f;
  }
}

}  // namespace tlm::kernels::gemm_detail
