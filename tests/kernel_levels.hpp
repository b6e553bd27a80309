#pragma once
// Shared by the kernel tests: every kernel level this CPU can run, a guard that
// puts the start-up level back when a test case ends, even on failure, and the
// random, misaligned inputs the kernels are checked on.
#include <tlm/kernels.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace tlm_test {

inline std::vector<tlm::kernel_level> testable_levels() { return tlm::supported_kernel_levels(); }

inline std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float range = 1.0f) {
  std::uniform_real_distribution<float> unit(-range, range);
  std::vector<float> v(n);
  for (auto& f : v) f = unit(rng);
  return v;
}

// int8 codes uniform in [lowest, 127]: -127 is the symmetric range tlm's quantizers
// write, -128 the extreme a foreign writer could store.
inline std::vector<std::int8_t> random_codes(std::size_t n, std::mt19937& rng, int lowest) {
  std::uniform_int_distribution<int> code(lowest, 127);
  std::vector<std::int8_t> v(n);
  for (auto& c : v) c = static_cast<std::int8_t>(code(rng));
  return v;
}

// A copy of src placed `offset` elements into a buffer with guard values around it,
// so a kernel that reads or writes past the end, or assumes alignment, shows.
template <class T>
struct placed {
  std::vector<T> storage;
  T* data;
  placed(const std::vector<T>& src, std::size_t offset, T guard = T{}) : storage(src.size() + offset + 64, guard) {
    data = storage.data() + offset;
    // A loop, not std::copy: GCC 12 sees a size_t wrap-around in the inlined memmove
    // of a copy into `data` and stops a -Werror build (-Wstringop-overflow).
    for (std::size_t i = 0; i < src.size(); ++i) data[i] = src[i];
  }
};

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
