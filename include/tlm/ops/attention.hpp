#pragma once
// Causal attention of one query head over the positions of its kv head.
//
// Two forms:
//   attend          the plain definition: all T scores, a softmax, the weighted sum.
//                   Kept as the reference the block's form is tested against.
//   attention_row   what the block runs: keys in blocks of `attention_block` with a
//                   running maximum and sum (online softmax), returning the row's
//                   log-sum-exp. Memory is O(block), never O(T), and the backward
//                   recomputes the probabilities from the saved log-sum-exp, so
//                   training never holds a T x T matrix.
//
// Keys and values are read through a stride, so the same code serves the KV cache
// (one kv head's positions contiguous: stride E) and a training batch (rows of all
// kv heads: stride K). attention_row_q8 is the same row over the int8 KV cache.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "../config.hpp"
#include "../kernels.hpp"

namespace tlm {

// Reference attention.   q: [E]   keys, values: [T, E]   scores: scratch of at least T   out: [E]
// Softmax subtracts the maximum first, so large scores cannot overflow. Leaves the
// probabilities in scores.
template <LlamaConfig C, class T = float>
void attend(std::type_identity_t<std::span<const T, head_dim<C>>> q, std::type_identity_t<std::span<const T>> keys,
            std::type_identity_t<std::span<const T>> values, std::type_identity_t<std::span<T>> scores,
            std::type_identity_t<std::span<T, head_dim<C>>> out) {
  constexpr std::size_t E = head_dim<C>;
  const std::size_t len = keys.size() / E;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(E)));
  T top = -std::numeric_limits<T>::infinity();
  for (std::size_t t = 0; t < len; ++t) {
    const T* k = keys.data() + t * E;
    T s = 0;
    for (std::size_t e = 0; e < E; ++e) s += q[e] * k[e];
    scores[t] = s * scale;
    top = std::max(top, scores[t]);
  }
  double total = 0.0;
  for (std::size_t t = 0; t < len; ++t) {
    scores[t] = std::exp(scores[t] - top);
    total += scores[t];
  }
  const T inv = static_cast<T>(1.0 / total);
  std::fill(out.begin(), out.end(), T(0));
  for (std::size_t t = 0; t < len; ++t) {
    const T p = scores[t] * inv;
    scores[t] = p;
    const T* v = values.data() + t * E;
    for (std::size_t e = 0; e < E; ++e) out[e] += p * v[e];
  }
}

namespace detail {
// Dot products and axpys of one head (E values) in the SIMD kernels for float; a
// plain loop for double (gradient checks), whose sums are exact enough as they are.
template <class T>
inline T head_dot(const T* a, const T* b, std::size_t n) {
  if constexpr (std::same_as<T, float>) {
    return kernels::dot(a, b, n);
  } else {
    T s = 0;
    for (std::size_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
  }
}
template <class T>
inline void head_axpy(T a, const T* x, T* y, std::size_t n) {
  if constexpr (std::same_as<T, float>) {
    kernels::axpy(a, x, y, n);
  } else {
    for (std::size_t i = 0; i < n; ++i) y[i] += a * x[i];
  }
}
}  // namespace detail

// Keys per block of the online softmax: the scores of one block live on the stack.
inline constexpr std::size_t attention_block = 64;

// One query row against `len` positions.   q: [E]; key/value j at keys + j*stride,
// values + j*stride: [E]; out: [E]. Returns the log-sum-exp of the scaled scores.
// With `entropy`, also the Shannon entropy (nats) of the row's attention weights:
// lse - sum(p * s), accumulated online like the sum itself.
template <class T>
T attention_row(const T* q, const T* keys, const T* values, std::size_t stride, std::size_t len, std::size_t E,
                T scale, T* out, T* entropy = nullptr) {
  T m = -std::numeric_limits<T>::infinity();
  T l = 0;   // sum of exp(s - m)
  T ws = 0;  // sum of exp(s - m) * s, for the entropy
  std::fill(out, out + E, T(0));
  T s[attention_block];
  for (std::size_t j0 = 0; j0 < len; j0 += attention_block) {
    const std::size_t nb = std::min(attention_block, len - j0);
    T block_max = -std::numeric_limits<T>::infinity();
    for (std::size_t j = 0; j < nb; ++j) {
      s[j] = detail::head_dot(q, keys + (j0 + j) * stride, E) * scale;
      block_max = std::max(block_max, s[j]);
    }
    const T m_new = std::max(m, block_max);
    const T c = std::exp(m - m_new);  // 0 on the first block, where m = -inf
    l *= c;
    ws *= c;
    for (std::size_t e = 0; e < E; ++e) out[e] *= c;
    for (std::size_t j = 0; j < nb; ++j) {
      const T p = std::exp(s[j] - m_new);
      l += p;
      ws += p * s[j];
      detail::head_axpy(p, values + (j0 + j) * stride, out, E);
    }
    m = m_new;
  }
  const T inv = T(1) / l;
  for (std::size_t e = 0; e < E; ++e) out[e] *= inv;
  const T lse = m + std::log(l);
  if (entropy != nullptr) *entropy = lse - ws * inv;
  return lse;
}

// attention_row over the int8 KV cache (kv.hpp, kv_type::q8), dequantizing on the
// fly: a key's score is (q . codes) * key_scale, a value is added as
// (p * value_scale) * codes, so each scale costs one multiply per position, not per
// element, and no float copy of the cache is made.
//   q: [E]   key_codes, value_codes: [len, E] (stride E)   key_scales, value_scales: [len]   out: [E]
// Returns the log-sum-exp of the scaled scores; `entropy` as in attention_row.
inline float attention_row_q8(const float* q, const std::int8_t* key_codes, const float* key_scales,
                              const std::int8_t* value_codes, const float* value_scales, std::size_t len,
                              std::size_t E, float scale, float* out, float* entropy = nullptr) {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0;   // sum of exp(s - m)
  float ws = 0;  // sum of exp(s - m) * s, for the entropy
  std::fill(out, out + E, 0.0f);
  float s[attention_block];
  for (std::size_t j0 = 0; j0 < len; j0 += attention_block) {
    const std::size_t nb = std::min(attention_block, len - j0);
    float block_max = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < nb; ++j) {
      s[j] = kernels::dot_i8(q, key_codes + (j0 + j) * E, E) * (key_scales[j0 + j] * scale);
      block_max = std::max(block_max, s[j]);
    }
    const float m_new = std::max(m, block_max);
    const float c = std::exp(m - m_new);  // 0 on the first block, where m = -inf
    l *= c;
    ws *= c;
    for (std::size_t e = 0; e < E; ++e) out[e] *= c;
    for (std::size_t j = 0; j < nb; ++j) {
      const float p = std::exp(s[j] - m_new);
      l += p;
      ws += p * s[j];
      kernels::axpy_i8(p * value_scales[j0 + j], value_codes + (j0 + j) * E, out, E);
    }
    m = m_new;
  }
  const float inv = 1.0f / l;
  for (std::size_t e = 0; e < E; ++e) out[e] *= inv;
  const float lse = m + std::log(l);
  if (entropy != nullptr) *entropy = lse - ws * inv;
  return lse;
}

// The definition attention_row_q8 is tested against: every key and value dequantized
// to float first, then the plain softmax of attend, in double. Same arguments.
inline float attention_row_q8_reference(const float* q, const std::int8_t* key_codes, const float* key_scales,
                                        const std::int8_t* value_codes, const float* value_scales, std::size_t len,
                                        std::size_t E, float scale, float* out) {
  std::vector<double> scores(len);  // [len]
  double top = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < len; ++j) {
    double d = 0;
    for (std::size_t e = 0; e < E; ++e)
      d += static_cast<double>(q[e]) * static_cast<double>(static_cast<float>(key_codes[j * E + e]) * key_scales[j]);
    scores[j] = d * static_cast<double>(scale);
    top = std::max(top, scores[j]);
  }
  double total = 0;
  for (auto& x : scores) total += (x = std::exp(x - top));
  std::vector<double> acc(E, 0.0);  // [E]
  for (std::size_t j = 0; j < len; ++j)
    for (std::size_t e = 0; e < E; ++e)
      acc[e] += scores[j] / total * static_cast<double>(static_cast<float>(value_codes[j * E + e]) * value_scales[j]);
  for (std::size_t e = 0; e < E; ++e) out[e] = static_cast<float>(acc[e]);
  return static_cast<float>(top + std::log(total));
}

// The backward of attention_row for every query head of one kv head over one
// sequence of `len` rows (row i attends to positions 0..i). The forward's inputs
// (q, k, v), its outputs (o, lse), the output's gradient d_o, then the inputs'
// gradients, accumulated: dq, dk, dv.
//   q, o, d_o, dq: row i, head hh at [i * q_stride + hh * E], hh < group
//   k, v, dk, dv:  row j at [j * kv_stride]
//   lse: row i, head hh at [i * lse_stride + hh]
// One call owns dk and dv of its kv head, so calls for different kv heads or
// sequences may run in parallel; the `group` query heads that share this kv head
// add into the same dk and dv here, in a fixed order.
template <class T>
void attention_backward(std::size_t len, std::size_t E, std::size_t group, T scale, const T* q, const T* o,
                        const T* d_o, T* dq, std::size_t q_stride, const T* k, const T* v, T* dk, T* dv,
                        std::size_t kv_stride, const T* lse, std::size_t lse_stride) {
  for (std::size_t hh = 0; hh < group; ++hh) {
    for (std::size_t i = 0; i < len; ++i) {
      const T* qi = q + i * q_stride + hh * E;
      const T* oi = o + i * q_stride + hh * E;
      const T* doi = d_o + i * q_stride + hh * E;
      T* dqi = dq + i * q_stride + hh * E;
      const T L = lse[i * lse_stride + hh];
      const T D = detail::head_dot(doi, oi, E);  // dO_i · O_i: the softmax's correction term
      for (std::size_t j = 0; j <= i; ++j) {
        const T* kj = k + j * kv_stride;
        const T* vj = v + j * kv_stride;
        const T p = std::exp(detail::head_dot(qi, kj, E) * scale - L);
        const T ds = p * (detail::head_dot(doi, vj, E) - D) * scale;
        detail::head_axpy(ds, kj, dqi, E);
        detail::head_axpy(ds, qi, dk + j * kv_stride, E);
        detail::head_axpy(p, doi, dv + j * kv_stride, E);
      }
    }
  }
}

}  // namespace tlm
