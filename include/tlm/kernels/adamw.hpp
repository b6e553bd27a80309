#pragma once
// The AdamW update at the active kernel level (its row in kernels/levels.hpp); the
// formula and each level's kernel are in kernels/adamw_kernels.hpp.
#include <tlm/kernels/adamw_kernels.hpp>
#include <tlm/kernels/levels.hpp>

#include <cstddef>

namespace tlm::kernels {

inline void adamw_update(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k) {
  active_kernel_row().adamw(p, g, m, v, n, k);
}

}  // namespace tlm::kernels
