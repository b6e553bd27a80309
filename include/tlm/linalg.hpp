#pragma once
// The typed products. matvec(mat<R, C>, vec<C>) -> vec<R> and
// matmul(mat<R, C>, rows<C>) -> rows<R> are the only ways to multiply by a weight,
// so a product whose shapes disagree does not compile. The types guard the call;
// the loops live in plain kernels with run-time sizes.
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#include "kernels.hpp"
#include "shape.hpp"
#include "thread_pool.hpp"

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

// Plain loops over owned values, split over rows of the output; each output value
// is summed by one thread in a fixed order, so results do not depend on the pool.
//   y[i, r] = Σ_c x[i, c] w[r, c]          x [n, C], w [R, C], y [n, R]
template <class T>
void product_nt(const T* w, const T* x, T* y, std::size_t R, std::size_t C, std::size_t n, thread_pool* pool) {
  auto body = [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i)
      for (std::size_t r = 0; r < R; ++r) {
        T s = 0;
        for (std::size_t c = 0; c < C; ++c) s += x[i * C + c] * w[r * C + c];
        y[i * R + r] = s;
      }
  };
  if (pool) pool->parallel_for(n, 1, body);
  else body(0, n);
}
//   dx[i, c] += Σ_r dy[i, r] w[r, c]       dy [n, R], w [R, C], dx [n, C]
template <class T>
void product_nn_add(const T* dy, const T* w, T* dx, std::size_t R, std::size_t C, std::size_t n, thread_pool* pool) {
  auto body = [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i)
      for (std::size_t r = 0; r < R; ++r) {
        const T g = dy[i * R + r];
        for (std::size_t c = 0; c < C; ++c) dx[i * C + c] += g * w[r * C + c];
      }
  };
  if (pool) pool->parallel_for(n, 1, body);
  else body(0, n);
}
//   dw[r, c] += Σ_i dy[i, r] x[i, c]       dy [n, R], x [n, C], dw [R, C]
template <class T>
void product_tn_add(const T* dy, const T* x, T* dw, std::size_t R, std::size_t C, std::size_t n, thread_pool* pool) {
  auto body = [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r)
      for (std::size_t i = 0; i < n; ++i) {
        const T g = dy[i * R + r];
        for (std::size_t c = 0; c < C; ++c) dw[r * C + c] += g * x[i * C + c];
      }
  };
  if (pool) pool->parallel_for(R, 1, body);
  else body(0, R);
}
}  // namespace detail

// y = W x, into caller-owned storage: the form the forward pass uses (no allocation).
template <std::size_t R, std::size_t C, Storage S>
void matvec(const mat<R, C, S>& w, std::span<const float, C> x, std::span<float, R> y, thread_pool* pool = nullptr) {
  detail::require_bound(w);
  kernels::matvec(w.enc(), w.bytes().data(), x.data(), y.data(), R, C, pool);
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
void matmul(const mat<R, C, S>& w, const rows<N, T>& x, rows<R, T>& y, thread_pool* pool = nullptr) {
  detail::require_bound(w);
  y.resize(x.count());
  if (x.count() == 0) return;
  if constexpr (std::same_as<T, float>) {
    kernels::matmul(w.enc(), w.bytes().data(), x.data(), y.data(), R, C, x.count(), pool);
  } else {
    detail::product_nt(w.data(), x.data(), y.data(), R, C, x.count(), pool);
  }
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
  detail::product_nn_add(dy.data(), w.data(), dx.data(), R, C, n, pool);
  detail::product_tn_add(dy.data(), x.data(), dw.data(), R, C, n, pool);
}

}  // namespace tlm
