#pragma once
// Shared by the kernel tests: every kernel level this CPU can run, and a guard that
// puts the start-up level back when a test case ends, even on failure.
#include <tlm/kernels.hpp>

#include <vector>

namespace tlm_test {

inline std::vector<tlm::kernel_level> testable_levels() {
  std::vector<tlm::kernel_level> levels{tlm::kernel_level::scalar};
  for (auto l : {tlm::kernel_level::avx2, tlm::kernel_level::avx512})
    if (tlm::kernel_level_supported(l)) levels.push_back(l);
  return levels;
}

struct level_guard {
  tlm::kernel_level saved = tlm::kernels::active_kernel_level();
  ~level_guard() { tlm::kernels::force_kernel_level(saved); }
};

// Forces the fast matmul's path for one test case and puts the previous one back.
struct prefill_guard {
  tlm::kernels::prefill_path saved;
  explicit prefill_guard(tlm::kernels::prefill_path p) : saved(tlm::kernels::force_prefill_path(p)) {}
  ~prefill_guard() { tlm::kernels::force_prefill_path(saved); }
  prefill_guard(const prefill_guard&) = delete;
  prefill_guard& operator=(const prefill_guard&) = delete;
};

}  // namespace tlm_test
