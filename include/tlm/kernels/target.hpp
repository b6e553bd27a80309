#pragma once
// The compiler target of each SIMD kernel level: the one place its instruction set is
// spelled. Every [[gnu::target]] of a level's kernels names its macro (GCC and Clang
// take only a string literal there, so it is a macro, not a constexpr string), and the
// level's row (kernels/levels.hpp) holds the same string, from which the level's CPU
// test (missing_cpu_features, cpu.hpp) decides whether the CPU runs the level: a
// feature a kernel may use is a feature the CPU was checked for.
//
// The avx512 level needs everything the avx2 level does, so its string extends avx2's,
// and the amx level's extends avx512's.
// Optional extensions inside a level (VNNI, VBMI: kernels/avx512.hpp) append to the
// level's string and are installed only where cpu() reports them.
#define TLM_TARGET_AVX2 "avx2,fma,f16c"
#define TLM_TARGET_AVX512 "avx512f,avx512bw,avx512vl,avx512dq," TLM_TARGET_AVX2
// The amx level: avx512's kernels, and an exact prefill product on the tile registers.
#define TLM_TARGET_AMX "amx-tile,amx-bf16,avx512bf16," TLM_TARGET_AVX512

// A level's kernel, and a helper that must be inlined into one (intrinsics cannot be
// called across functions of different targets).
#define TLM_AVX2_FN [[gnu::target(TLM_TARGET_AVX2)]]
#define TLM_AVX2_INLINE [[gnu::target(TLM_TARGET_AVX2), gnu::always_inline]]
#define TLM_AVX512_FN [[gnu::target(TLM_TARGET_AVX512)]]
#define TLM_AVX512_INLINE [[gnu::target(TLM_TARGET_AVX512), gnu::always_inline]]
#define TLM_AMX_FN [[gnu::target(TLM_TARGET_AMX)]]
#define TLM_AMX_INLINE [[gnu::target(TLM_TARGET_AMX), gnu::always_inline]]
