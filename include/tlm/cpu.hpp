#pragma once
// Run-time CPU feature detection, for the kernel levels (kernels/levels.hpp).
//
// Why run-time and not -mavx2: a binary built on one machine must run on any
// x86-64. SIMD kernels are compiled per function with target attributes (see
// kernels/target.hpp), and this header detects once, at first use, what the CPU has.
// A CPU without AVX2 gets the portable scalar kernels instead of SIGILL.
//
// The levels, their CPU tests and the override (TLM_KERNELS, force_kernel_level) are
// in kernels/levels.hpp; this header detects the features they test.
#include <tlm/error.hpp>

#include <cstdlib>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <string>
#include <string_view>
#include <vector>

namespace tlm {

struct cpu_features {
  bool amd = false;  // vendor AuthenticAMD: Zen 4 runs 512-bit operations as two 256-bit halves
  unsigned family = 0;  // CPUID's display family: 25 (0x19) is AMD Zen 3 and Zen 4, 26 Zen 5
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
  // Intel AMX (Sapphire Rapids and later): the tile registers and their bf16 products.
  // Set only when the OS saves the tile state (XCR0 bits 17-18) and, on Linux, has granted
  // this process its use (amx_permission): before the grant a tile instruction is SIGILL.
  bool amx_tile = false;
  bool amx_bf16 = false;
};

#if defined(__x86_64__)
// Linux hands out the AMX tile state (8 KiB a thread) on request only, once per process,
// for every thread: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). Asked at
// detection, so that a level the CPU test passes can run. False elsewhere (no AMX then).
inline bool amx_permission() {
#if defined(__linux__)
  constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
  return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
  return false;
#endif
}

// XCR0: the register states the OS saves. XGETBV is valid only when CPUID says OSXSAVE.
inline unsigned long long xcr0() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || ((ecx >> 27) & 1u) == 0) return 0;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
#endif

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
      const bool leaf1 = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0;
      f.f16c = f.avx && leaf1 && ((ecx >> 29) & 1u) != 0;
      // The base family, plus the extended family when the base is 15.
      const unsigned base = (eax >> 8) & 0xfu;
      f.family = !leaf1 ? 0 : base == 0xfu ? base + ((eax >> 20) & 0xffu) : base;
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
#if defined(__x86_64__)
    {
      // CPUID leaf 7 sub-leaf 0: EDX bit 24 AMX-TILE, bit 22 AMX-BF16.
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      const bool tile = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && ((edx >> 24) & 1u) != 0;
      const bool bf16 = tile && ((edx >> 22) & 1u) != 0;
      const bool os_saves = (xcr0() & (3ull << 17)) == (3ull << 17);
      if (tile && os_saves && amx_permission()) {
        f.amx_tile = true;
        f.amx_bf16 = bf16;
      }
    }
#endif
#endif
    return f;
  }();
  return features;
}

// The GCC / Clang target-feature name of each flag: the names a kernel level's
// compiler target is written in (kernels/target.hpp), so that the level's CPU test
// reads the same string its kernels are compiled for.
struct cpu_feature_name {
  std::string_view name;
  bool cpu_features::*flag;
};
inline constexpr cpu_feature_name cpu_feature_names[] = {
    {"sse4.2", &cpu_features::sse42},       {"avx", &cpu_features::avx},
    {"avx2", &cpu_features::avx2},          {"fma", &cpu_features::fma},
    {"f16c", &cpu_features::f16c},          {"avx512f", &cpu_features::avx512f},
    {"avx512bw", &cpu_features::avx512bw},  {"avx512vl", &cpu_features::avx512vl},
    {"avx512dq", &cpu_features::avx512dq},  {"avx512vnni", &cpu_features::avx512vnni},
    {"avx512vbmi", &cpu_features::avx512vbmi}, {"avx512bf16", &cpu_features::avx512bf16},
    {"avxvnni", &cpu_features::avxvnni},   {"amx-tile", &cpu_features::amx_tile},
    {"amx-bf16", &cpu_features::amx_bf16}};

// Whether `name` is one of cpu_feature_names.
constexpr bool known_cpu_feature(std::string_view name) {
  for (const auto& f : cpu_feature_names)
    if (f.name == name) return true;
  return false;
}

// Whether `f` has every feature of a comma-separated target string ("avx2,fma,f16c"); a
// name cpu_feature_names does not know counts as lacking. Allocates nothing: the kernels'
// first dispatch asks it, inside code that must not allocate.
inline bool has_cpu_features(const cpu_features& f, std::string_view target) {
  while (!target.empty()) {
    const std::size_t comma = target.find(',');
    const std::string_view name = target.substr(0, comma);
    target = comma == std::string_view::npos ? std::string_view{} : target.substr(comma + 1);
    bool has = false;
    for (const auto& n : cpu_feature_names)
      if (n.name == name) has = f.*n.flag;
    if (!has) return false;
  }
  return true;
}

// The features of a comma-separated target string ("avx2,fma,f16c") that `f` lacks,
// comma-separated; a name cpu_feature_names does not know counts as lacking (a CPU
// test cannot vouch for it). Empty: `f` runs code compiled for that target.
inline std::string missing_cpu_features(const cpu_features& f, std::string_view target) {
  std::string missing;
  while (!target.empty()) {
    const std::size_t comma = target.find(',');
    const std::string_view name = target.substr(0, comma);
    target = comma == std::string_view::npos ? std::string_view{} : target.substr(comma + 1);
    bool has = false;
    for (const auto& n : cpu_feature_names)
      if (n.name == name) has = f.*n.flag;
    if (!has) missing += (missing.empty() ? "" : ",") + std::string(name);
  }
  return missing;
}

// Short description of what was detected, for --timing output and bug reports.
inline std::string cpu_feature_string() {
  const auto& f = cpu();
  std::string s;
  auto add = [&s](bool on, std::string_view n) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += n;
  };
  for (const auto& n : cpu_feature_names) add(f.*n.flag, n.name);
  return s.empty() ? std::string("none") : s;
}

}  // namespace tlm
