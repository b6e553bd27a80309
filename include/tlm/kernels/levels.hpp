#pragma once
// One row per kernel level: everything that differs between levels, in one table.
//
// A level is the set of kernels compiled for one instruction set. Its row holds its
// name (TLM_KERNELS, --timing), its compiler target (kernels/target.hpp), whose
// features are the level's CPU test, its function table for the matrix, vector and
// attention kernels (kernels/table.hpp), the entry points of the GEMM over its
// micro-kernel (kernels/gemm_blocked.hpp) and its AdamW update
// (kernels/adamw_kernels.hpp). Every dispatch reads the active level's row; nothing
// else switches over levels.
//
// A new level: its enumerator and its table builder (kernels/table.hpp), its
// TLM_TARGET_ macro (kernels/target.hpp), its row here (with the include of its GEMM
// micro-kernel) and its four entry points for TLM_PRECOMPILED_KERNELS (declared here,
// defined in tlm/precompiled_kernels.hpp), its kernels, and the list of levels in
// tests/test_kernel_levels.cpp.
//
// Override: the environment variable TLM_KERNELS=<a row's name> (read once, at first
// use) or force_kernel_level() (tests and benchmarks). Asking for a level the CPU
// cannot run is an error, never a silent downgrade.
#include <tlm/cpu.hpp>
#include <tlm/error.hpp>
#include <tlm/kernels/adamw_kernels.hpp>
#include <tlm/kernels/gemm_blocked.hpp>
#include <tlm/kernels/table.hpp>
#include <tlm/kernels/target.hpp>
#include <tlm/thread_pool.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <tlm/kernels/gemm_avx2.hpp>
#include <tlm/kernels/gemm_avx512.hpp>
#endif

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace tlm {

struct kernel_level_row {
  kernel_level level;
  std::string_view name;
  // The compiler target of the level's kernels ("": portable C++). The CPU runs the
  // level when it has every feature named here (missing_cpu_features), so a kernel
  // never uses an instruction its level's CPU test did not check.
  std::string_view target;
  // Null only for a SIMD level on a CPU family that has no kernels for it (not x86).
  const kernels::detail::kernel_table& (*table)();
  void (*gemm)(const kernels::gemm_detail::problem&, thread_pool*);
  void (*reserve_gemm_scratch)();  // this thread's packing buffers for the largest unit
  void (*adamw)(float* p, const float* g, float* m, float* v, std::size_t n, const kernels::adamw_constants& k);
};

// A program of many translation units can compile the kernels once instead of in each
// of them (about 9 s of an -O3 compile each, most of a small program's): define
// TLM_PRECOMPILED_KERNELS for every translation unit of the program, and
// #include <tlm/precompiled_kernels.hpp> in exactly one. The rows below then point to
// the non-inline entry points that header defines, so no other translation unit
// instantiates a kernel. The macro must be the same for the whole program: the rows
// are one inline variable. This project's own programs and tests are built so
// (CMakeLists.txt: tlm_kernels_once); the installed library is header-only either way.
#ifdef TLM_PRECOMPILED_KERNELS
namespace kernels::precompiled {
const detail::kernel_table& scalar_table();
void scalar_gemm(const gemm_detail::problem& p, thread_pool* pool);
void scalar_reserve_gemm_scratch();
void scalar_adamw(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k);
#if defined(__x86_64__) || defined(__i386__)
const detail::kernel_table& avx2_table();
void avx2_gemm(const gemm_detail::problem& p, thread_pool* pool);
void avx2_reserve_gemm_scratch();
void avx2_adamw(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k);
const detail::kernel_table& avx512_table();
void avx512_gemm(const gemm_detail::problem& p, thread_pool* pool);
void avx512_reserve_gemm_scratch();
void avx512_adamw(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k);
#endif
#if defined(__x86_64__)
const detail::kernel_table& amx_table();
void amx_gemm(const gemm_detail::problem& p, thread_pool* pool);
void amx_reserve_gemm_scratch();
void amx_adamw(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k);
#endif
}  // namespace kernels::precompiled
#define TLM_KERNEL_ENTRY(level, what, here) &kernels::precompiled::level##_##what
#else
#define TLM_KERNEL_ENTRY(level, what, here) here
#endif

// Indexed by kernel_level, in increasing order of what the level needs from the CPU.
inline constexpr kernel_level_row kernel_level_rows[] = {
    {kernel_level::scalar, "scalar", "", TLM_KERNEL_ENTRY(scalar, table, &kernels::detail::scalar_table),
     TLM_KERNEL_ENTRY(scalar, gemm, &kernels::gemm_detail::run<kernels::gemm_detail::scalar_kernel>),
     TLM_KERNEL_ENTRY(scalar, reserve_gemm_scratch, &kernels::gemm_detail::reserve_scratch<kernels::gemm_detail::scalar_kernel>),
     TLM_KERNEL_ENTRY(scalar, adamw, &kernels::adamw_update_reference)},
#if defined(__x86_64__) || defined(__i386__)
    {kernel_level::avx2, "avx2", TLM_TARGET_AVX2, TLM_KERNEL_ENTRY(avx2, table, &kernels::detail::avx2_table),
     TLM_KERNEL_ENTRY(avx2, gemm, &kernels::gemm_detail::run<kernels::gemm_avx2::kernel>),
     TLM_KERNEL_ENTRY(avx2, reserve_gemm_scratch, &kernels::gemm_detail::reserve_scratch<kernels::gemm_avx2::kernel>),
     TLM_KERNEL_ENTRY(avx2, adamw, &kernels::adamw_avx2::adamw_update)},
    {kernel_level::avx512, "avx512", TLM_TARGET_AVX512, TLM_KERNEL_ENTRY(avx512, table, &kernels::detail::avx512_table),
     TLM_KERNEL_ENTRY(avx512, gemm, &kernels::gemm_detail::run<kernels::gemm_avx512::kernel>),
     TLM_KERNEL_ENTRY(avx512, reserve_gemm_scratch, &kernels::gemm_detail::reserve_scratch<kernels::gemm_avx512::kernel>),
     TLM_KERNEL_ENTRY(avx512, adamw, &kernels::adamw_avx512::adamw_update)},
#endif
#if defined(__x86_64__)
    // avx512's GEMM of training and AdamW: the tiles serve the exact prefill product only
    // (kernels/amx.hpp).
    {kernel_level::amx, "amx", TLM_TARGET_AMX, TLM_KERNEL_ENTRY(amx, table, &kernels::detail::amx_table),
     TLM_KERNEL_ENTRY(amx, gemm, &kernels::gemm_detail::run<kernels::gemm_avx512::kernel>),
     TLM_KERNEL_ENTRY(amx, reserve_gemm_scratch, &kernels::gemm_detail::reserve_scratch<kernels::gemm_avx512::kernel>),
     TLM_KERNEL_ENTRY(amx, adamw, &kernels::adamw_avx512::adamw_update)},
#endif
#if !defined(__x86_64__) && !defined(__i386__)
    // The CPU test fails (cpu() reports no x86 feature), so these are never selected.
    {kernel_level::avx2, "avx2", TLM_TARGET_AVX2, nullptr, nullptr, nullptr, nullptr},
    {kernel_level::avx512, "avx512", TLM_TARGET_AVX512, nullptr, nullptr, nullptr, nullptr},
#endif
#if !defined(__x86_64__)
    {kernel_level::amx, "amx", TLM_TARGET_AMX, nullptr, nullptr, nullptr, nullptr},
#endif
};

#undef TLM_KERNEL_ENTRY

inline constexpr std::size_t kernel_level_count = std::size(kernel_level_rows);

// Row i is level i, so a level's row is an index.
static_assert([] {
  for (std::size_t i = 0; i < kernel_level_count; ++i)
    if (static_cast<std::size_t>(kernel_level_rows[i].level) != i) return false;
  return true;
}(), "kernel_level_rows: row i must be kernel_level i");

constexpr const kernel_level_row& kernel_level_row_of(kernel_level l) {
  const auto i = static_cast<std::size_t>(l);
  if (i >= kernel_level_count) throw error("kernel level " + std::to_string(i) + " has no row in kernel_level_rows");
  return kernel_level_rows[i];
}

constexpr std::string_view kernel_level_name(kernel_level l) {
  const auto i = static_cast<std::size_t>(l);
  return i < kernel_level_count ? kernel_level_rows[i].name : std::string_view("?");
}

// The CPU test: every feature of the level's target is present and usable.
inline bool kernel_level_supported(kernel_level l) {
  return has_cpu_features(cpu(), kernel_level_row_of(l).target);
}

// Every level this CPU runs, the portable one first: what the kernel tests and
// benchmarks sweep.
inline std::vector<kernel_level> supported_kernel_levels() {
  std::vector<kernel_level> levels;
  for (const auto& r : kernel_level_rows)
    if (kernel_level_supported(r.level)) levels.push_back(r.level);
  return levels;
}

// Without a vector: it runs at the kernels' first use, inside code that must not allocate
// (test_attention counts the heap calls of a backward pass that is the first to dispatch).
inline kernel_level best_kernel_level() {
  kernel_level best = kernel_level_rows[0].level;
  for (const auto& r : kernel_level_rows)
    if (kernel_level_supported(r.level)) best = r.level;
  return best;
}

// "scalar, avx2, avx512 or amx": the names of the rows, for messages.
inline std::string kernel_level_names() {
  std::string s;
  for (std::size_t i = 0; i < kernel_level_count; ++i)
    s += (i == 0 ? "" : i + 1 == kernel_level_count ? " or " : ", ") + std::string(kernel_level_rows[i].name);
  return s;
}

inline kernel_level parse_kernel_level(std::string_view s) {
  for (const auto& r : kernel_level_rows)
    if (r.name == s) return r.level;
  throw error("TLM_KERNELS=" + std::string(s) + ": unknown kernel level; use " + kernel_level_names() +
              ", or unset it");
}

namespace kernels::detail {
// Why `l` cannot run here, for the errors of TLM_KERNELS and force_kernel_level.
inline std::string unsupported_reason(kernel_level l) {
  const auto& r = kernel_level_row_of(l);
  return "this CPU lacks " + missing_cpu_features(cpu(), r.target) + ", which the " + std::string(r.name) +
         " kernels need (compiled for " + std::string(r.target) + "; detected: " + cpu_feature_string() + ")";
}
}  // namespace kernels::detail

// The level chosen at start-up: TLM_KERNELS if set, else the best the CPU supports.
inline kernel_level startup_kernel_level() {
  const char* env = std::getenv("TLM_KERNELS");
  if (env == nullptr || *env == '\0') return best_kernel_level();
  const kernel_level l = parse_kernel_level(env);
  if (!kernel_level_supported(l)) {
    throw error("TLM_KERNELS=" + std::string(env) + ": " + kernels::detail::unsupported_reason(l) +
                "; choose a lower level or unset it");
  }
  return l;
}

namespace kernels {

namespace detail {

inline const kernel_table& table_for(kernel_level l) { return kernel_level_row_of(l).table(); }

// The active table. Initialized once (function-local static, thread-safe); only
// force_kernel_level changes it afterwards.
inline std::atomic<const kernel_table*>& active() {
  static std::atomic<const kernel_table*> t{&table_for(startup_kernel_level())};
  return t;
}

inline const kernel_table& table() { return *active().load(std::memory_order_acquire); }

}  // namespace detail

// The kernel level in use, its row, and its name for --timing output.
inline kernel_level active_kernel_level() { return detail::table().level; }
inline const kernel_level_row& active_kernel_row() { return kernel_level_row_of(active_kernel_level()); }
inline std::string_view kernel_level_name() { return tlm::kernel_level_name(active_kernel_level()); }

// Switches every kernel to level `l` (tests, benchmarks) and returns the previous
// level. Throws if this CPU cannot run `l`. Not meant to race with running kernels:
// a kernel already started finishes on the level it started with.
inline kernel_level force_kernel_level(kernel_level l) {
  if (!kernel_level_supported(l)) {
    throw error("force_kernel_level(" + std::string(tlm::kernel_level_name(l)) + "): " +
                detail::unsupported_reason(l) + "; choose a lower level");
  }
  return detail::active().exchange(&detail::table_for(l), std::memory_order_acq_rel)->level;
}

}  // namespace kernels

}  // namespace tlm
