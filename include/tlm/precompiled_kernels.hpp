#pragma once
// The kernels' entry points for a program built with TLM_PRECOMPILED_KERNELS
// (kernels/levels.hpp says why): include this header in exactly one translation unit of
// the program, compiled with the same macro as the others. It defines, once, the
// functions that every level's row points to, so only this translation unit
// instantiates the kernels, the GEMM and AdamW of every level.
#include <tlm/kernels.hpp>

#ifndef TLM_PRECOMPILED_KERNELS
#error "tlm/precompiled_kernels.hpp is for programs built with TLM_PRECOMPILED_KERNELS defined in every translation unit"
#endif

namespace tlm::kernels::precompiled {

const detail::kernel_table& scalar_table() { return detail::scalar_table(); }
void scalar_gemm(const gemm_detail::problem& p, thread_pool* pool) {
  gemm_detail::run<gemm_detail::scalar_kernel>(p, pool);
}
void scalar_reserve_gemm_scratch() { gemm_detail::reserve_scratch<gemm_detail::scalar_kernel>(); }
void scalar_adamw(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k) {
  adamw_update_reference(p, g, m, v, n, k);
}

#if defined(__x86_64__) || defined(__i386__)
const detail::kernel_table& avx2_table() { return detail::avx2_table(); }
void avx2_gemm(const gemm_detail::problem& p, thread_pool* pool) { gemm_detail::run<gemm_avx2::kernel>(p, pool); }
void avx2_reserve_gemm_scratch() { gemm_detail::reserve_scratch<gemm_avx2::kernel>(); }
void avx2_adamw(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k) {
  adamw_avx2::adamw_update(p, g, m, v, n, k);
}

const detail::kernel_table& avx512_table() { return detail::avx512_table(); }
void avx512_gemm(const gemm_detail::problem& p, thread_pool* pool) { gemm_detail::run<gemm_avx512::kernel>(p, pool); }
void avx512_reserve_gemm_scratch() { gemm_detail::reserve_scratch<gemm_avx512::kernel>(); }
void avx512_adamw(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k) {
  adamw_avx512::adamw_update(p, g, m, v, n, k);
}
#endif

#if defined(__x86_64__)
const detail::kernel_table& amx_table() { return detail::amx_table(); }
void amx_gemm(const gemm_detail::problem& p, thread_pool* pool) { gemm_detail::run<gemm_avx512::kernel>(p, pool); }
void amx_reserve_gemm_scratch() { gemm_detail::reserve_scratch<gemm_avx512::kernel>(); }
void amx_adamw(float* p, const float* g, float* m, float* v, std::size_t n, const adamw_constants& k) {
  adamw_avx512::adamw_update(p, g, m, v, n, k);
}
#endif

}  // namespace tlm::kernels::precompiled
