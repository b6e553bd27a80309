#pragma once
// The typed products. matvec(mat<R, C>, vec<C>) -> vec<R> and
// matmul(mat<R, C>, rows<C>) -> rows<R> are the only ways to multiply by a weight,
// so a product whose shapes disagree does not compile. The types guard the call;
// the loops live in plain kernels with run-time sizes.
#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <tlm/format/quant.hpp>
#include <tlm/kernels.hpp>
#include <tlm/kernels/gemm.hpp>
#include <tlm/shape.hpp>
#include <tlm/thread_pool.hpp>

namespace tlm {

// The columns of a matrix (its inputs) must be as many as the vector's values.
template <std::size_t Cols, std::size_t N>
concept inner_dims_match = (Cols == N);

// A gradient flowing back into a product has the width of the product's output.
template <std::size_t Rows, std::size_t N>
concept output_gradient_matches = (Rows == N);

// Weights multiply activations of their own element type (double weights for
// gradient checks take double activations); mapped weights take float.
template <class S, class T>
concept multiplies = std::same_as<storage_value_t<S>, T>;

namespace detail {
template <std::size_t R, std::size_t C, Storage S>
void require_bound(const mat<R, C, S>& w) {
  if (!w.bound()) {
    throw shape_error("product with an unbound mat<" + std::to_string(R) + ", " + std::to_string(C) +
                      ">: bind its weights (load a model) before using it");
  }
}

}  // namespace detail

// y = W x, into caller-owned storage: the form the forward pass uses (no allocation).
// `precision` applies to quantized weights (kernels.hpp): exact multiplies f32
// activations, fast quantizes them to int8 per block first.
template <std::size_t R, std::size_t C, Storage S>
void matvec(const mat<R, C, S>& w, std::span<const float, C> x, std::span<float, R> y, thread_pool* pool = nullptr,
            kernels::precision precision = kernels::default_precision()) {
  detail::require_bound(w);
  kernels::matvec(w.enc(), w.bytes().data(), x.data(), y.data(), R, C, pool, precision);
}

// y = W x, returning a new vector.
template <std::size_t R, std::size_t C, Storage S, std::size_t N>
  requires inner_dims_match<C, N>
vec<R> matvec(const mat<R, C, S>& w, const vec<N>& x, thread_pool* pool = nullptr) {
  vec<R> y;
  matvec(w, std::span<const float, C>(x), std::span<float, R>(y), pool);
  return y;
}

// Y = X Wᵀ over a batch: x [n, C] -> y [n, R] (y takes x's count). Each weight is
// read once for the whole batch; a batch of one row runs the decode-speed matvec.
template <std::size_t R, std::size_t C, Storage S, std::size_t N, class T>
  requires inner_dims_match<C, N> && multiplies<S, T>
void matmul(const mat<R, C, S>& w, const rows<N, T>& x, rows<R, T>& y, thread_pool* pool = nullptr,
            kernels::precision precision = kernels::default_precision()) {
  detail::require_bound(w);
  y.resize(x.count());
  if (x.count() == 0) return;
  using kernels::transpose;
  if constexpr (!is_owned_v<S>) {
    kernels::matmul(w.enc(), w.bytes().data(), x.data(), y.data(), R, C, x.count(), pool, precision);
  } else if constexpr (std::same_as<T, float>) {
    kernels::gemm(transpose::no, transpose::yes, x.count(), R, C, x.data(), C, w.data(), C, y.data(), R, false, pool);
  } else {
    // Double weights exist for gradient checks on tiny configs: the plain loops do.
    kernels::gemm_reference<T>(transpose::no, transpose::yes, x.count(), R, C, x.data(), C, w.data(), C, y.data(), R,
                               false);
  }
}

// One product of matmul_shared: W [R, C] into y [n, R]. `into` deduces R from both
// sides, so a weight whose rows are not y's width does not compile.
template <std::size_t R, std::size_t C, Storage S, class T>
struct product_into {
  static constexpr bool mapped = !is_owned_v<S>;
  const mat<R, C, S>& w;
  rows<R, T>& y;
};
template <std::size_t R, std::size_t C, Storage S, class T>
product_into<R, C, S, T> into(const mat<R, C, S>& w, rows<R, T>& y) {
  return {w, y};
}

// P is a product whose weight takes inputs of width N and element T.
template <class P, std::size_t N, class T>
inline constexpr bool takes_input_v = false;
template <std::size_t R, std::size_t C, Storage S, class T, std::size_t N>
inline constexpr bool takes_input_v<product_into<R, C, S, T>, N, T> = inner_dims_match<C, N> && multiplies<S, T>;
template <class P, std::size_t N, class T>
concept takes_input = takes_input_v<P, N, T>;

namespace detail {
template <std::size_t R, std::size_t C, Storage S, class T>
kernels::shared_input_product kernel_product(const product_into<R, C, S, T>& p) {
  require_bound(p.w);
  p.y.resize(1);
  return {p.w.enc(), p.w.bytes().data(), p.y.data(), R};
}
}  // namespace detail

// Several products of one input, y_i = X W_iᵀ (q, k and v of a block; gate and up):
// the same values as a matmul each. A single row of mapped weights runs them as one
// kernels::matvec_group (one parallel region, x prepared once); anything else, a
// matmul each.
template <std::size_t N, class T, takes_input<N, T>... P>
void matmul_shared(const rows<N, T>& x, thread_pool* pool, kernels::precision precision, const P&... products) {
  if constexpr ((P::mapped && ...) && std::same_as<T, float>) {
    if (x.count() == 1) {
      const std::array<kernels::shared_input_product, sizeof...(P)> group{detail::kernel_product(products)...};
      kernels::matvec_group(group, x.data(), N, pool, precision);
      return;
    }
  }
  (matmul(products.w, x, products.y, pool, precision), ...);
}

// The backward of matmul: the forward's inputs (w, x), the output's gradient dy,
// then the inputs' gradients, accumulated:
//   dW += dYᵀ X     dw [R, C]
//   dX += dY W      dx [n, C]
// Only owned weights have a gradient: training works on an owned copy.
template <std::size_t R, std::size_t C, class T, std::size_t N, std::size_t M>
  requires inner_dims_match<C, N> && output_gradient_matches<R, M>
void matmul_backward(const mat<R, C, owned<T>>& w, const rows<N, T>& x, const rows<M, T>& dy,
                     mat<R, C, owned<T>>& dw, rows<N, T>& dx, thread_pool* pool = nullptr) {
  const std::size_t n = x.count();
  if (dy.count() != n || dx.count() != n) {
    throw shape_error("matmul_backward: " + std::to_string(n) + " input rows, " + std::to_string(dy.count()) +
                      " output-gradient rows and " + std::to_string(dx.count()) +
                      " input-gradient rows; all three must be the forward's batch");
  }
  if (n == 0) return;
  using kernels::transpose;
  if constexpr (std::same_as<T, float>) {
    kernels::gemm(transpose::no, transpose::no, n, C, R, dy.data(), R, w.data(), C, dx.data(), C, true, pool);
    kernels::gemm(transpose::yes, transpose::no, R, C, n, dy.data(), R, x.data(), C, dw.data(), C, true, pool);
  } else {
    kernels::gemm_reference<T>(transpose::no, transpose::no, n, C, R, dy.data(), R, w.data(), C, dx.data(), C, true);
    kernels::gemm_reference<T>(transpose::yes, transpose::no, R, C, n, dy.data(), R, x.data(), C, dw.data(), C, true);
  }
}

// The input half of matmul's backward, for a frozen weight that has no gradient (the
// base under a low-rank adapter): the forward's weight, the output's gradient, then
// the input's gradient, accumulated:
//   dX += dY W      w [R, C]  dy [n, R]  dx [n, C]
// A mapped weight stays in its file encoding: it is decoded tile by tile (a few rows
// at a time, with dequantize_row, the reference every kernel is tested against) into
// a per-thread buffer, and each tile adds its rows' part, dX += dY[:, tile] W[tile],
// so a quantized base never exists whole as floats (a 1.7B base would not fit).
template <std::size_t R, std::size_t C, Storage S, class T, std::size_t N, std::size_t M>
  requires inner_dims_match<C, N> && output_gradient_matches<R, M> && multiplies<S, T>
void matmul_backward_input(const mat<R, C, S>& w, const rows<M, T>& dy, rows<N, T>& dx, thread_pool* pool = nullptr) {
  detail::require_bound(w);
  const std::size_t n = dy.count();
  if (dx.count() != n) {
    throw shape_error("matmul_backward_input: " + std::to_string(n) + " output-gradient rows and " +
                      std::to_string(dx.count()) + " input-gradient rows; both must be the forward's batch");
  }
  if (n == 0) return;
  using kernels::transpose;
  if constexpr (is_owned_v<S>) {
    if constexpr (std::same_as<T, float>)
      kernels::gemm(transpose::no, transpose::no, n, C, R, dy.data(), R, w.data(), C, dx.data(), C, true, pool);
    else
      kernels::gemm_reference<T>(transpose::no, transpose::no, n, C, R, dy.data(), R, w.data(), C, dx.data(), C, true);
  } else {
    // 64 rows per tile: enough depth for the GEMM's blocking, small enough to stay in
    // cache (64 x 1536 floats is 384 KB at 135M's widest). Grows once per thread.
    constexpr std::size_t tile = R < 64 ? R : 64;
    thread_local std::vector<float> buf;
    if (buf.size() < tile * C) buf.resize(tile * C);
    const std::size_t rb = row_bytes(w.enc(), C);
    const std::byte* base = w.bytes().data();
    for (std::size_t r0 = 0; r0 < R; r0 += tile) {
      const std::size_t t = std::min(tile, R - r0);
      for (std::size_t r = 0; r < t; ++r) dequantize_row(w.enc(), base + (r0 + r) * rb, buf.data() + r * C, C);
      kernels::gemm(transpose::no, transpose::no, n, C, t, dy.data() + r0, R, buf.data(), C, dx.data(), C, true, pool);
    }
  }
}

}  // namespace tlm
