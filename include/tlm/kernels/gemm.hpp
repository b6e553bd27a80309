#pragma once
// Dense f32 matrix products for training: C = (accumulate ? C : 0) + op(A) op(B).
//
// Shapes (all row-major, every stride in floats):
//   op(A) [m, k]: A itself [m, k] (lda >= k), or A stored [k, m] and transposed (lda >= m)
//   op(B) [k, n]: B itself [k, n] (ldb >= n), or B stored [n, k] and transposed (ldb >= k)
//   C     [m, n] (ldc >= n); C must not overlap A or B.
//
// Design (the usual packed GEMM): the k dimension is cut into blocks of kc; for each
// block, a block of rows of op(A) is packed into micro-panels of mr rows ([kc, mr],
// p-major) and a block of columns of op(B) into micro-panels of nr columns ([kc, nr]).
// A register-blocked micro-kernel multiplies one A micro-panel by one B micro-panel
// into an mr x nr tile of C held in registers; each B micro-panel stays in L1 while
// all the A micro-panels of the block (in L2) pass by. Packing makes every operand
// layout (transposed or not, any stride, any alignment) look the same to the kernel,
// and zero-pads partial panels so the kernel always runs full tiles.
//
// Threads and determinism: C is cut into rectangular units (a block of rows by a
// block of columns) and the pool runs whole units. Each element of C is computed by
// one thread as: for each k block in order, acc = 0; acc += a*b for p in order;
// C = C + acc (or C = acc for the first block when not accumulating). The k blocking
// (kc) is a constant of the kernel level, never of the thread count, so results are
// bit for bit the same for every pool size and every assignment of units to
// threads; only the unit shapes (which change nothing but speed) follow the pool.
//
// Levels (the active kernel level's row, kernels/levels.hpp): scalar is portable C++
// (no intrinsics, gemm_blocked.hpp); avx2 and avx512 are micro-kernels in
// gemm_avx2.hpp / gemm_avx512.hpp, compiled per function with target attributes.
// Levels differ in tile shape and FMA use, so their results differ in rounding (all
// within the tolerance in tests/test_gemm.cpp), but each level is deterministic.
#include <tlm/error.hpp>
#include <tlm/kernels/gemm_blocked.hpp>
#include <tlm/kernels/levels.hpp>
#include <tlm/kernels/scalar.hpp>
#include <tlm/thread_pool.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

namespace tlm::kernels {

enum class transpose : bool { no = false, yes = true };

namespace gemm_detail {

// A strided operand: rows x cols elements of T, row stride ld, as addresses.
struct region {
  std::uintptr_t base;
  std::size_t rows, cols, ld, size;  // size: sizeof(T)
  std::uintptr_t end() const { return base + ((rows - 1) * ld + cols) * size; }
  // Whether the element-sized object at address p is one of the region's elements
  // (a misaligned p that falls inside the span counts as touching one).
  bool holds(std::uintptr_t p) const {
    if (p < base || p >= end()) return false;
    const std::uintptr_t off = p - base;
    if (off % size != 0) return true;
    return (off / size) % ld < cols;
  }
};

// Whether two operands share an element. Column slices of one buffer (same stride,
// disjoint columns: say the input and the output of a layer side by side in one
// activation matrix) do not overlap, so comparing address spans alone is not enough.
// Same stride: exact up to the first and last rows. Different strides: only the
// first element of each is tested against the other (this catches C == A); a
// subtler overlap goes undetected.
inline bool overlaps(const region& x, const region& y) {
  if (x.end() <= y.base || y.end() <= x.base) return false;
  if (x.ld == y.ld && x.size == y.size) {
    const std::uintptr_t lo = x.base < y.base ? x.base : y.base, hi = x.base < y.base ? y.base : x.base;
    const region& first = x.base < y.base ? x : y;
    const region& second = x.base < y.base ? y : x;
    const std::uintptr_t d = hi - lo;
    if (d % x.size != 0) return true;
    // The second region's columns, seen in the first's row: [s, s + cols) modulo ld.
    const std::size_t s = (d / x.size) % x.ld;
    return s < first.cols || s + second.cols > x.ld;
  }
  return x.holds(y.base) || y.holds(x.base);
}

template <class T>
void check(const char* what, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const T* a,
           std::size_t lda, const T* b, std::size_t ldb, const T* c, std::size_t ldc) {
  const std::string w(what);
  const std::size_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const std::size_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  auto dims = [&] {
    return " (m=" + std::to_string(m) + ", n=" + std::to_string(n) + ", k=" + std::to_string(k) + ")";
  };
  if (lda < a_cols) {
    throw shape_error(w + ": lda " + std::to_string(lda) + " is less than the " + std::to_string(a_cols) +
                      " columns A is stored with" + dims() +
                      (ta ? " (A transposed is stored [k, m])" : " (A is [m, k])") +
                      "; pass the row stride of A in elements");
  }
  if (ldb < b_cols) {
    throw shape_error(w + ": ldb " + std::to_string(ldb) + " is less than the " + std::to_string(b_cols) +
                      " columns B is stored with" + dims() +
                      (tb ? " (B transposed is stored [n, k])" : " (B is [k, n])") +
                      "; pass the row stride of B in elements");
  }
  if (ldc < n) {
    throw shape_error(w + ": ldc " + std::to_string(ldc) + " is less than n = " + std::to_string(n) + dims() +
                      "; pass the row stride of C in elements");
  }
  const bool reads = m != 0 && n != 0 && k != 0;
  if ((reads && (a == nullptr || b == nullptr)) || (m != 0 && n != 0 && c == nullptr)) {
    throw error(w + ": null A, B or C pointer for a product with" + dims() + "; pass the buffers");
  }
  if (reads) {
    auto at = [](const T* p, std::size_t rows, std::size_t cols, std::size_t ld) {
      return region{reinterpret_cast<std::uintptr_t>(p), rows, cols, ld, sizeof(T)};
    };
    const region cr = at(c, m, n, ldc);
    if (overlaps(cr, at(a, a_rows, a_cols, lda)) || overlaps(cr, at(b, b_rows, b_cols, ldb))) {
      throw error(w + ": C overlaps A or B" + dims() + "; write the product to a separate buffer");
    }
  }
}

}  // namespace gemm_detail

// C[m, n] = (accumulate ? C : 0) + op(A)[m, k] . op(B)[k, n]   (shapes: see the top of this file)
//   A [m, k] (lda >= k), or [k, m] if ta == yes (lda >= m)
//   B [k, n] (ldb >= n), or [n, k] if tb == yes (ldb >= k)
//   C [m, n] (ldc >= n), not overlapping A or B.
// Runs on `pool` if given (split over blocks of C, never over k), else on the calling
// thread; results are bitwise the same for every pool size. k == 0 with accumulate
// false writes zeros.
inline void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, const float* a,
                 std::size_t lda, const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate,
                 thread_pool* pool = nullptr) {
  const gemm_detail::problem g{ta == transpose::yes, tb == transpose::yes, m, n, k, a, lda, b, ldb, c, ldc, accumulate};
  gemm_detail::check("gemm", g.ta, g.tb, m, n, k, a, lda, b, ldb, c, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (std::size_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  active_kernel_row().gemm(g, pool);
}

// Gives the calling thread the packing buffers of the active level's largest unit,
// so that its later gemm calls allocate nothing. A hot loop that must not allocate
// (a training step) runs this on every thread of its pool once, up front
// (thread_pool::run_on_each_thread): with chunks claimed dynamically, a thread may
// otherwise run its first unit only in a later step.
inline void reserve_gemm_scratch() {
  detail::decoded_rows(detail::decoded_rows_reserve);  // the narrow-batch prefill kernels' decoded rows
  active_kernel_row().reserve_gemm_scratch();
}

// The definition the fast paths are tested against: plain loops summing in double
// (also the double-precision product of the training gradient checks). Single-threaded.
template <class T>
void gemm_reference(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, const T* a,
                    std::size_t lda, const T* b, std::size_t ldb, T* c, std::size_t ldc, bool accumulate) {
  const bool at = ta == transpose::yes, bt = tb == transpose::yes;
  gemm_detail::check("gemm_reference", at, bt, m, n, k, a, lda, b, ldb, c, ldc);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::size_t p = 0; p < k; ++p) {
        const T av = at ? a[p * lda + i] : a[i * lda + p];
        const T bv = bt ? b[j * ldb + p] : b[p * ldb + j];
        s += static_cast<double>(av) * static_cast<double>(bv);
      }
      T& out = c[i * ldc + j];
      out = static_cast<T>(accumulate ? static_cast<double>(out) + s : s);
    }
  }
}

// The product for an element type chosen by a template: gemm for float, gemm_reference
// for double (the training code's gradient checks run it in double).
template <class T>
void gemm_any(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda,
              const T* b, std::size_t ldb, T* c, std::size_t ldc, bool accumulate, thread_pool* pool = nullptr) {
  if constexpr (std::same_as<T, float>) gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate, pool);
  else gemm_reference<T>(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

}  // namespace tlm::kernels
