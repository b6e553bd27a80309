#pragma once
// Run-time CPU feature detection and the kernel level chosen from it.
//
// Why run-time and not -mavx2: a binary built on one machine must run on any
// x86-64. SIMD kernels are compiled per function with target attributes (see
// kernels.hpp), and this header decides once, at first use, which of them may run.
// A CPU without AVX2 gets the portable scalar kernels instead of SIGILL.
//
// Override: the environment variable TLM_KERNELS=scalar|avx2|avx512 (read once, at first
// use) or force_kernel_level() (tests and benchmarks). Asking for a level the CPU
// cannot run is an error, never a silent downgrade.
#include <tlm/error.hpp>

#include <cstdlib>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <string>
#include <string_view>
#include <vector>

namespace tlm {

struct cpu_features {
  bool amd = false;  // vendor AuthenticAMD: Zen 4 runs 512-bit operations as two 256-bit halves
  bool sse42 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512vbmi = false;  // byte permutes (vpermb, vpermt2b): Ice Lake, Zen 4 and later
  bool avx512bf16 = false;
  bool avxvnni = false;  // the VEX-encoded VNNI of Alder Lake / Sapphire Rapids
};

// Detected once; __builtin_cpu_supports also checks that the OS saves the YMM/ZMM
// state (XGETBV), so a feature reported here is usable, not only present.
inline const cpu_features& cpu() {
  static const cpu_features features = [] {
    cpu_features f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    {
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      // Vendor string in EBX, EDX, ECX: "Auth" "enti" "cAMD".
      f.amd = __get_cpuid(0, &eax, &ebx, &ecx, &edx) != 0 && ebx == 0x68747541u && edx == 0x69746e65u &&
              ecx == 0x444d4163u;
    }
    f.sse42 = __builtin_cpu_supports("sse4.2");
    f.avx = __builtin_cpu_supports("avx");
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    {
      // Clang 14 has no "f16c" for __builtin_cpu_supports: read CPUID leaf 1, ECX bit
      // 29. F16C instructions are VEX-encoded, so they also need the OS's AVX support.
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      f.f16c = f.avx && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && ((ecx >> 29) & 1u) != 0;
    }
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512dq = __builtin_cpu_supports("avx512dq");
    f.avx512vnni = __builtin_cpu_supports("avx512vnni");
    f.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
    {
      // CPUID leaf 7 sub-leaf 1: EAX bit 4 AVX-VNNI, bit 5 AVX512_BF16 (neither has a
      // __builtin_cpu_supports name in GCC 12 and Clang 14).
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0) {
        f.avxvnni = f.avx2 && ((eax >> 4) & 1u) != 0;
        f.avx512bf16 = f.avx512f && ((eax >> 5) & 1u) != 0;
      }
    }
#endif
    return f;
  }();
  return features;
}

// The kernel families, in increasing order of what they need from the CPU.
enum class kernel_level { scalar = 0, avx2 = 1, avx512 = 2 };

constexpr std::string_view kernel_level_name(kernel_level l) {
  switch (l) {
    case kernel_level::scalar: return "scalar";
    case kernel_level::avx2: return "avx2";
    case kernel_level::avx512: return "avx512";
  }
  return "?";
}

// The avx2 kernels use AVX2, FMA and F16C instructions.
inline bool kernel_level_supported(kernel_level l) {
  switch (l) {
    case kernel_level::scalar: return true;
    case kernel_level::avx2: {
#if defined(__x86_64__) || defined(__i386__)
      const auto& f = cpu();
      return f.avx2 && f.fma && f.f16c;
#else
      return false;
#endif
    }
    case kernel_level::avx512: {
      // AVX-512 F, BW, VL and DQ, on top of everything the avx2 level needs.
#if defined(__x86_64__) || defined(__i386__)
      const auto& f = cpu();
      return kernel_level_supported(kernel_level::avx2) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
#else
      return false;
#endif
    }
  }
  return false;
}

// Every level this CPU runs, the portable one first: what the kernel tests and
// benchmarks sweep.
inline std::vector<kernel_level> supported_kernel_levels() {
  std::vector<kernel_level> levels{kernel_level::scalar};
  for (kernel_level l : {kernel_level::avx2, kernel_level::avx512})
    if (kernel_level_supported(l)) levels.push_back(l);
  return levels;
}

inline kernel_level best_kernel_level() {
  for (kernel_level l : {kernel_level::avx512, kernel_level::avx2})
    if (kernel_level_supported(l)) return l;
  return kernel_level::scalar;
}

inline kernel_level parse_kernel_level(std::string_view s) {
  if (s == "scalar") return kernel_level::scalar;
  if (s == "avx2") return kernel_level::avx2;
  if (s == "avx512") return kernel_level::avx512;
  throw error("TLM_KERNELS=" + std::string(s) + ": unknown kernel level; use scalar, avx2 or avx512, or unset it");
}

// The level chosen at start-up: TLM_KERNELS if set, else the best the CPU supports.
inline kernel_level startup_kernel_level() {
  const char* env = std::getenv("TLM_KERNELS");
  if (env == nullptr || *env == '\0') return best_kernel_level();
  const kernel_level l = parse_kernel_level(env);
  if (!kernel_level_supported(l)) {
    throw error("TLM_KERNELS=" + std::string(env) +
                ": this CPU lacks the instructions that level needs (avx2: AVX2, FMA and F16C; avx512: also AVX-512 "
                "F/BW/VL/DQ); choose a lower level or unset it");
  }
  return l;
}

// Short description of what was detected, for --timing output and bug reports.
inline std::string cpu_feature_string() {
  const auto& f = cpu();
  std::string s;
  auto add = [&s](bool on, const char* n) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += n;
  };
  add(f.sse42, "sse4.2");
  add(f.avx, "avx");
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vnni, "avx512vnni");
  add(f.avx512vbmi, "avx512vbmi");
  add(f.avx512bf16, "avx512bf16");
  add(f.avxvnni, "avxvnni");
  return s.empty() ? std::string("none") : s;
}

}  // namespace tlm
