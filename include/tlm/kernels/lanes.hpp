#pragma once
// One vector register of float lanes per SIMD level, as a type: the operations the
// kernels written once for every width use (kernels/adamw_lanes.inc,
// kernels/attention_accumulate.inc). Each operation carries its level's target
// (kernels/target.hpp) and is always inlined, so a kernel of that level that uses it
// compiles to the intrinsic itself.
#include <tlm/kernels/target.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace tlm::kernels {

// 8 lanes (AVX2, FMA).
struct avx2_lanes {
  using reg = __m256;
  static constexpr std::size_t width = 8;
  TLM_AVX2_INLINE static reg set1(float x) { return _mm256_set1_ps(x); }
  TLM_AVX2_INLINE static reg zero() { return _mm256_setzero_ps(); }
  TLM_AVX2_INLINE static reg load(const float* p) { return _mm256_loadu_ps(p); }
  // int8 codes convert exactly.
  TLM_AVX2_INLINE static reg load(const std::int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  TLM_AVX2_INLINE static void store(float* p, reg a) { _mm256_storeu_ps(p, a); }
  TLM_AVX2_INLINE static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  TLM_AVX2_INLINE static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  TLM_AVX2_INLINE static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  TLM_AVX2_INLINE static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  TLM_AVX2_INLINE static reg sqrt(reg a) { return _mm256_sqrt_ps(a); }
  // a * b + c, rounded once.
  TLM_AVX2_INLINE static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
};

// GCC 12 reports some of its own AVX-512 intrinsics as "used uninitialized" once
// inlined (GCC bug 105593, fixed in GCC 13), as avx512.hpp notes; the warning is false.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// 16 lanes (AVX-512 F).
struct avx512_lanes {
  using reg = __m512;
  static constexpr std::size_t width = 16;
  TLM_AVX512_INLINE static reg set1(float x) { return _mm512_set1_ps(x); }
  TLM_AVX512_INLINE static reg zero() { return _mm512_setzero_ps(); }
  TLM_AVX512_INLINE static reg load(const float* p) { return _mm512_loadu_ps(p); }
  TLM_AVX512_INLINE static reg load(const std::int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  TLM_AVX512_INLINE static void store(float* p, reg a) { _mm512_storeu_ps(p, a); }
  TLM_AVX512_INLINE static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  TLM_AVX512_INLINE static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  TLM_AVX512_INLINE static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  TLM_AVX512_INLINE static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  // The zero-masked form: GCC 12 warns falsely ("may be used uninitialized") about the
  // undefined pass-through vector inside the unmasked _mm512_sqrt_ps.
  TLM_AVX512_INLINE static reg sqrt(reg a) { return _mm512_maskz_sqrt_ps(0xffff, a); }
  TLM_AVX512_INLINE static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
};

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace tlm::kernels
#endif
