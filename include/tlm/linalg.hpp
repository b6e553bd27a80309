#pragma once
// The typed products. matvec(mat<R, C>, vec<C>) -> vec<R> is the only way to
// multiply by a weight, so a product whose shapes disagree does not compile. The
// types guard the call; the loops live in plain kernels with run-time sizes.
#include <cstddef>
#include <span>
#include <string>

#include "kernels.hpp"
#include "shape.hpp"
#include "thread_pool.hpp"

namespace tlm {

// The columns of a matrix (its inputs) must be as many as the vector's values.
template <std::size_t Cols, std::size_t N>
concept inner_dims_match = (Cols == N);

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

// Y = X W^T for a batch of n rows of X: [n, C] -> [n, R]. Prompt prefill uses it so
// each weight block is read once for the whole batch.
template <std::size_t R, std::size_t C, Storage S>
void matmul(const mat<R, C, S>& w, std::span<const float> x, std::span<float> y, std::size_t n,
            thread_pool* pool = nullptr) {
  detail::require_bound(w);
  if (x.size() != n * C || y.size() != n * R) {
    throw shape_error("matmul of a mat<" + std::to_string(R) + ", " + std::to_string(C) + "> over " + std::to_string(n) +
                      " rows needs " + std::to_string(n * C) + " inputs and " + std::to_string(n * R) +
                      " outputs, got " + std::to_string(x.size()) + " and " + std::to_string(y.size()));
  }
  kernels::matmul(w.enc(), w.bytes().data(), x.data(), y.data(), R, C, n, pool);
}

}  // namespace tlm
