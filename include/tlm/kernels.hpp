#pragma once
// The kernels, in one include:
//   kernels/target.hpp        each SIMD level's compiler target, spelled once
//   kernels/table.hpp         each level's function table (matrix, vector, attention kernels)
//   kernels/levels.hpp        one row per kernel level (name, CPU test, target, table, GEMM,
//                             AdamW) and the active level (TLM_KERNELS, force_kernel_level)
//   kernels/matrix.hpp        matvec, matmul, dot, axpy and their references
//   kernels/attention.hpp     the attention kernels at the active level
//   kernels/gemm.hpp          the f32 GEMM of training
//   kernels/adamw.hpp         the AdamW update
#include <tlm/cpu.hpp>
#include <tlm/kernels/adamw.hpp>
#include <tlm/kernels/attention.hpp>
#include <tlm/kernels/gemm.hpp>
#include <tlm/kernels/levels.hpp>
#include <tlm/kernels/matrix.hpp>
#include <tlm/kernels/table.hpp>
#include <tlm/kernels/target.hpp>
