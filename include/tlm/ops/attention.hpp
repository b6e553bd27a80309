#pragma once
// Causal attention of query heads over the positions of their kv head.
//
// Three forms:
//   attend             the plain definition: all T scores, a softmax, the weighted sum.
//                      Kept as the reference the block's forms are tested against.
//   attention_heads    what the block runs for inference: keys in blocks of
//                      `attention_block` with a running maximum and sum (online
//                      softmax), one query row at a time, returning each row's
//                      log-sum-exp. attention_row and attention_row_q8 are its
//                      one-head forms.
//   attention_forward  the same online softmax for training, a tile of rows at a time,
//                      each block two matrix products; attention_backward is its
//                      backward. Memory is O(tile), never O(T): the backward recomputes
//                      the probabilities from the saved log-sum-exp, so training never
//                      holds a T x T matrix.
//
// How keys and values are read is a parameter (detail::float_rows, detail::q8_rows):
// float rows through a stride serve the KV cache (one kv head's positions contiguous:
// stride E) and a training batch (rows of all kv heads: stride K); int8 codes with a
// scale per position serve the int8 KV cache. For float, each block is three kernel
// calls (kernels/attention_scalar.hpp: scores, exp, accumulate).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/kernels.hpp>
#include <tlm/kernels/attention.hpp>

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

namespace detail {

// How the online softmax reads keys and values, a block of positions at a time:
//   scores(q, j0, n, E, scale, s)       s[j] = scale * q . key(j0 + j)       s: [n]
//   accumulate(c, p, j0, n, E, out)     out = c * out + sum_j p[j] value(j0 + j)
// float goes to the attention kernels (kernels/attention_scalar.hpp), one call per
// block; double (gradient checks) runs plain loops.

// s[j] = scale * x . rows[j]   and   out = c * out + sum_j w[j] rows[j], over n rows of
// E values at a stride: the attention kernels for float, plain loops for double.
//   x, out: [E]   rows: [n] at `stride`   s, w: [n]
template <class T>
inline void dot_rows(const T* x, const T* rows, std::size_t stride, std::size_t n, std::size_t E, T scale, T* s) {
  if constexpr (std::same_as<T, float>) {
    kernels::attention().scores(x, rows, stride, n, E, scale, s);
  } else {
    for (std::size_t j = 0; j < n; ++j) s[j] = head_dot(x, rows + j * stride, E) * scale;
  }
}
template <class T>
inline void add_rows(T c, const T* w, const T* rows, std::size_t stride, std::size_t n, std::size_t E, T* out) {
  if constexpr (std::same_as<T, float>) {
    kernels::attention().accumulate(c, w, rows, stride, n, E, out);
  } else {
    for (std::size_t e = 0; e < E; ++e) out[e] *= c;
    for (std::size_t j = 0; j < n; ++j) head_axpy(w[j], rows + j * stride, out, E);
  }
}

// Rows of T at a stride: the f32 KV cache (stride E) and a training batch (stride K).
template <class T>
struct float_rows {
  const T* keys;    // [len] rows at `stride`, E used
  const T* values;  // [len] rows at `stride`, E used
  std::size_t stride;

  void scores(const T* q, std::size_t j0, std::size_t n, std::size_t E, T scale, T* s) const {
    dot_rows(q, keys + j0 * stride, stride, n, E, scale, s);
  }
  void accumulate(T c, const T* p, std::size_t j0, std::size_t n, std::size_t E, T* out) const {
    add_rows(c, p, values + j0 * stride, stride, n, E, out);
  }
};

// The int8 KV cache (kv_type::q8): codes dequantized on the fly, a key's score as
// (q . codes) * key_scale and a value added as (p * value_scale) * codes, so each scale
// costs one multiply per position, not per element, and no float copy is made.
struct q8_rows {
  const std::int8_t* key_codes;    // [len, E]
  const float* key_scales;         // [len]
  const std::int8_t* value_codes;  // [len, E]
  const float* value_scales;       // [len]

  void scores(const float* q, std::size_t j0, std::size_t n, std::size_t E, float scale, float* s) const {
    kernels::attention().scores_q8(q, key_codes + j0 * E, key_scales + j0, n, E, scale, s);
  }
  void accumulate(float c, const float* p, std::size_t j0, std::size_t n, std::size_t E, float* out) const {
    kernels::attention().accumulate_q8(c, p, value_codes + j0 * E, value_scales + j0, n, E, out);
  }
};

// p[j] = exp(scale s[j] - m), returning the sum: the kernel for float, std::exp for double.
template <class T>
inline T exp_block(const T* s, std::size_t n, T scale, T m, T* p) {
  if constexpr (std::same_as<T, float>) {
    return kernels::attention().exp(s, n, scale, m, p);
  } else {
    T sum = 0;
    for (std::size_t j = 0; j < n; ++j) sum += (p[j] = std::exp(scale * s[j] - m));
    return sum;
  }
}

// One row of a tile of raw scores against a block of nj keys, of which the row sees the
// first n (the causal edge): those become exp(scale s - m), the rest 0, so the product
// with the block's values or keys that follows weighs nothing past the edge. Returns the
// sum of the row. The tiled forward and backward share it, so their probabilities agree.
//   row: [nj]
template <class T>
inline T causal_exp_row(T* row, std::size_t n, std::size_t nj, T scale, T m) {
  const T sum = n > 0 ? exp_block(row, n, scale, m, row) : T(0);
  std::fill(row + n, row + nj, T(0));
  return sum;
}

// The largest of s[0..n), n >= 1, in 8 independent chains: std::max_element's one chain
// of compares took a fifth of decode attention's time (4 cycles a score per head). For
// scores without NaN the result is std::max_element's; with a NaN among them the block's
// weights are NaN either way.
template <class T>
inline T block_max(const T* s, std::size_t n) {
  T m[8];
  std::fill(m, m + 8, s[0]);
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (std::size_t i = 0; i < 8; ++i) m[i] = std::max(m[i], s[j + i]);
  for (; j < n; ++j) m[0] = std::max(m[0], s[j]);
  for (std::size_t i = 1; i < 8; ++i) m[0] = std::max(m[0], m[i]);
  return m[0];
}

// Query heads attended together at most, for the per-head running state on the stack.
inline constexpr std::size_t attention_max_heads = 16;

}  // namespace detail

// The online softmax: `nq` query heads against the same `len` positions, a block of
// keys at a time for all heads, so the heads that share a kv head (GQA) read each
// block from near cache (64 positions of f32 keys and values are 32 KB, of int8 codes
// 8 KB) instead of the whole kv head again from memory.
//   q, out: [nq, E]   lse: [nq] log-sum-exp of the scaled scores
//   entropy: null, or [nq] Shannon entropy (nats) of each head's attention weights,
//            lse - sum(p * s), accumulated online like the sum itself.
template <class T, class Rows>
void attention_heads(const Rows& kv, const T* q, std::size_t nq, std::size_t len, std::size_t E, T scale, T* out,
                     T* lse, T* entropy = nullptr) {
  if (nq > detail::attention_max_heads) {
    for (std::size_t h0 = 0; h0 < nq; h0 += detail::attention_max_heads)
      attention_heads(kv, q + h0 * E, std::min(detail::attention_max_heads, nq - h0), len, E, scale, out + h0 * E,
                      lse + h0, entropy ? entropy + h0 : nullptr);
    return;
  }
  T m[detail::attention_max_heads];   // running maximum
  T l[detail::attention_max_heads];   // sum of exp(s - m)
  T ws[detail::attention_max_heads];  // sum of exp(s - m) * s, for the entropy
  std::fill(m, m + nq, -std::numeric_limits<T>::infinity());
  std::fill(l, l + nq, T(0));
  std::fill(ws, ws + nq, T(0));
  std::fill(out, out + nq * E, T(0));
  T s[attention_block];  // [block] scaled scores
  T p[attention_block];  // [block] exp(s - m)
  for (std::size_t j0 = 0; j0 < len; j0 += attention_block) {
    const std::size_t nb = std::min(attention_block, len - j0);
    for (std::size_t h = 0; h < nq; ++h) {
      kv.scores(q + h * E, j0, nb, E, scale, s);
      const T m_new = std::max(m[h], detail::block_max(s, nb));
      const T c = std::exp(m[h] - m_new);  // 0 on the first block, where m = -inf
      l[h] = l[h] * c + detail::exp_block(s, nb, T(1), m_new, p);
      if (entropy != nullptr) {
        T sp = 0;
        if constexpr (std::same_as<T, float>) sp = kernels::dot(p, s, nb);
        else for (std::size_t j = 0; j < nb; ++j) sp += p[j] * s[j];
        ws[h] = ws[h] * c + sp;
      }
      kv.accumulate(c, p, j0, nb, E, out + h * E);
      m[h] = m_new;
    }
  }
  for (std::size_t h = 0; h < nq; ++h) {
    const T inv = T(1) / l[h];
    for (std::size_t e = 0; e < E; ++e) out[h * E + e] *= inv;
    lse[h] = m[h] + std::log(l[h]);
    if (entropy != nullptr) entropy[h] = lse[h] - ws[h] * inv;
  }
}

namespace detail {
// Segments a decode step's row cuts its `visible` positions into: enough for about
// decode_units units of work in the step (rows x kv heads x segments) where the rows
// and kv heads give fewer, none shorter than one block of the online softmax. A
// function of the row's positions and the step's units only, so that a row's result
// never depends on the threads. SmolLM2 (3 kv heads) at 130 positions: 2 segments.
inline constexpr std::size_t decode_units = 16;
inline std::size_t decode_segments(std::size_t visible, std::size_t units) {
  const std::size_t wanted = (decode_units + units - 1) / units;
  return std::max<std::size_t>(1, std::min(wanted, visible / attention_block));
}

// Where segment s of `segs` over `visible` positions begins (s = segs: visible): an
// even share, rounded down to a whole block of the online softmax.
inline std::size_t segment_start(std::size_t visible, std::size_t segs, std::size_t s) {
  if (s == segs) return visible;
  return visible * s / segs / attention_block * attention_block;
}

}  // namespace detail

// The online softmax of the same `nq` query heads over `segs` consecutive segments of
// their positions, each written by attention_heads as [nq, E] o then [nq] lse, `part`
// values apart, joined into out [nq, E] and lse [nq]: each segment's o weighed by
// exp(its lse - the largest), as one pass over all the positions weighs its blocks.
template <class T>
void merge_segments(const T* parts, std::size_t segs, std::size_t part, std::size_t nq, std::size_t E, T* out, T* lse) {
  for (std::size_t h = 0; h < nq; ++h) {
    T top = -std::numeric_limits<T>::infinity();
    for (std::size_t s = 0; s < segs; ++s) top = std::max(top, parts[s * part + nq * E + h]);
    T sum = T(0);
    std::fill(out + h * E, out + (h + 1) * E, T(0));
    for (std::size_t s = 0; s < segs; ++s) {
      const T w = std::exp(parts[s * part + nq * E + h] - top);
      sum += w;
      const T* o = parts + s * part + h * E;
      for (std::size_t e = 0; e < E; ++e) out[h * E + e] += w * o[e];
    }
    for (std::size_t e = 0; e < E; ++e) out[h * E + e] /= sum;
    lse[h] = top + std::log(sum);
  }
}

// One query row against `len` positions.   q: [E]; key/value j at keys + j*stride,
// values + j*stride: [E]; out: [E]. Returns the log-sum-exp of the scaled scores;
// `entropy` as in attention_heads.
template <class T>
T attention_row(const T* q, const T* keys, const T* values, std::size_t stride, std::size_t len, std::size_t E,
                T scale, T* out, T* entropy = nullptr) {
  T lse;
  attention_heads(detail::float_rows<T>{keys, values, stride}, q, 1, len, E, scale, out, &lse, entropy);
  return lse;
}

// attention_row over the int8 KV cache (kv.hpp, kv_type::q8; detail::q8_rows).
//   q: [E]   key_codes, value_codes: [len, E] (stride E)   key_scales, value_scales: [len]   out: [E]
// Returns the log-sum-exp of the scaled scores; `entropy` as in attention_row.
inline float attention_row_q8(const float* q, const std::int8_t* key_codes, const float* key_scales,
                              const std::int8_t* value_codes, const float* value_scales, std::size_t len,
                              std::size_t E, float scale, float* out, float* entropy = nullptr) {
  float lse;
  attention_heads(detail::q8_rows{key_codes, key_scales, value_codes, value_scales}, q, 1, len, E, scale, out, &lse,
                  entropy);
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

// Query rows and key positions per tile of attention_forward and attention_backward.
inline constexpr std::size_t attention_tile = 64;

// attention_heads for ni <= attention_tile rows at positions i0, i0 + 1, .. of one
// sequence, for the `group` query heads of one kv head, with the sequence's keys and
// values in memory: training (kv_in_batch) and prefill into an f32 cache, where every
// row's keys are at hand at once. The row at position i attends to positions 0..i.
//   q, o: the tile's row r, head hh at [r * q_stride + hh * E]   k, v: position j at [j * kv_stride]
//   lse: row r, head hh at [r * lse_stride + hh]
// The same online softmax over blocks of attention_tile keys as attention_heads
// (attention_block keys), but each block is two matrix products of the whole tile of
// rows (S = Q K^T, then O = c O + P V) instead of per-row dot products and axpys, so it
// runs at the GEMM's rate; the upper half of the diagonal block is computed and
// discarded. Memory: one tile of scores on the stack and the GEMM's per-thread buffers.
template <class T>
void attention_forward(std::size_t i0, std::size_t ni, std::size_t E, std::size_t group, T scale, const T* q, T* o,
                       std::size_t q_stride, const T* k, const T* v, std::size_t kv_stride, T* lse,
                       std::size_t lse_stride) {
  using kernels::transpose;
  constexpr std::size_t tile = attention_tile;
  if (ni > tile) {
    throw shape_error("attention_forward: " + std::to_string(ni) + " rows in one call; pass at most " +
                      std::to_string(tile) + " (attention_tile) at a time");
  }
  T p[tile * tile];  // [rows, keys] of the block: S, then P
  T m[tile], l[tile];  // [rows] running maximum, and sum of exp(s - m)
  for (std::size_t hh = 0; hh < group; ++hh) {
    const std::size_t at = hh * E;  // the tile's first row of q and o
    std::fill(m, m + ni, -std::numeric_limits<T>::infinity());
    std::fill(l, l + ni, T(0));
    for (std::size_t j0 = 0; j0 < i0 + ni; j0 += tile) {
      const std::size_t nj = std::min(tile, i0 + ni - j0);
      kernels::gemm_any<T>(transpose::no, transpose::yes, ni, nj, E, q + at, q_stride, k + j0 * kv_stride, kv_stride,
                           p, tile, false);
      for (std::size_t r = 0; r < ni; ++r) {
        const std::size_t i = i0 + r;
        const std::size_t n = i >= j0 ? std::min(nj, i - j0 + 1) : 0;  // keys of the block row i sees
        T* pr = p + r * tile;
        T* orow = o + at + r * q_stride;
        // scale > 0, so the largest raw score gives the largest scaled one.
        const T m_new = n > 0 ? std::max(m[r], scale * detail::block_max(pr, n)) : m[r];
        const T sum = detail::causal_exp_row(pr, n, nj, scale, m_new);
        if (n > 0) {
          const T c = std::exp(m[r] - m_new);  // 0 on the first block, where m = -inf
          l[r] = l[r] * c + sum;
          m[r] = m_new;
          if (j0 > 0)
            for (std::size_t e = 0; e < E; ++e) orow[e] *= c;
        }
      }
      // The first block writes O (every row sees key 0); later ones add to it.
      kernels::gemm_any<T>(transpose::no, transpose::no, ni, E, nj, p, tile, v + j0 * kv_stride, kv_stride, o + at,
                           q_stride, j0 > 0);
    }
    for (std::size_t r = 0; r < ni; ++r) {
      const T inv = T(1) / l[r];
      T* orow = o + at + r * q_stride;
      for (std::size_t e = 0; e < E; ++e) orow[e] *= inv;
      lse[r * lse_stride + hh] = m[r] + std::log(l[r]);
    }
  }
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
//
// A tile of query rows against a tile of keys at a time, every product a matrix
// product of the tile (kernels::gemm, single-threaded: the callers run one call per
// task): S = Q K^T and dP = dO V^T, then P = exp(scale S - L) and dS = scale P (dP - D)
// row by row (0 past the causal edge), then dQ += dS K, dK += dS^T Q, dV += P^T dO.
// Per row and key this was two dot products and three axpys of E values through the
// attention kernels (reductions across lanes for every score); as products of 64 x 64
// tiles it runs at the GEMM's rate, at the price of computing the upper half of each
// diagonal tile and discarding it. The probabilities come from the forward's
// log-sum-exp with the forward's exp kernel. Memory: two tiles on the stack and the
// GEMM's per-thread packing buffers (kernels::reserve_gemm_scratch), never O(len).
template <class T>
void attention_backward(std::size_t len, std::size_t E, std::size_t group, T scale, const T* q, const T* o,
                        const T* d_o, T* dq, std::size_t q_stride, const T* k, const T* v, T* dk, T* dv,
                        std::size_t kv_stride, const T* lse, std::size_t lse_stride) {
  using kernels::transpose;
  constexpr std::size_t tile = attention_tile;
  T p[tile * tile];   // [rows, keys] of the tile: S, then P
  T ds[tile * tile];  // [rows, keys]: dP, then dS
  T L[tile], D[tile];  // [rows] the row's log-sum-exp, and dO_i . O_i (the softmax's correction)
  for (std::size_t hh = 0; hh < group; ++hh) {
    for (std::size_t i0 = 0; i0 < len; i0 += tile) {
      const std::size_t ni = std::min(tile, len - i0);
      const std::size_t at = i0 * q_stride + hh * E;  // the tile's first row of q, o, d_o, dq
      for (std::size_t r = 0; r < ni; ++r) {
        L[r] = lse[(i0 + r) * lse_stride + hh];
        D[r] = detail::head_dot(d_o + at + r * q_stride, o + at + r * q_stride, E);
      }
      // Keys 0 .. i0 + ni - 1: every position a row of the tile sees.
      for (std::size_t j0 = 0; j0 < i0 + ni; j0 += tile) {
        const std::size_t nj = std::min(tile, i0 + ni - j0);
        const T* kt = k + j0 * kv_stride;  // [nj, E] at kv_stride
        const T* vt = v + j0 * kv_stride;
        kernels::gemm_any<T>(transpose::no, transpose::yes, ni, nj, E, q + at, q_stride, kt, kv_stride, p, tile, false);
        kernels::gemm_any<T>(transpose::no, transpose::yes, ni, nj, E, d_o + at, q_stride, vt, kv_stride, ds, tile,
                             false);
        for (std::size_t r = 0; r < ni; ++r) {
          const std::size_t i = i0 + r;
          const std::size_t n = std::min(nj, i - j0 + 1);  // keys of the tile row i sees (i >= i0 >= j0)
          T* pr = p + r * tile;
          T* dsr = ds + r * tile;
          detail::causal_exp_row(pr, n, nj, scale, L[r]);
          for (std::size_t c = 0; c < n; ++c) dsr[c] = pr[c] * (dsr[c] - D[r]) * scale;
          std::fill(dsr + n, dsr + nj, T(0));
        }
        kernels::gemm_any<T>(transpose::no, transpose::no, ni, E, nj, ds, tile, kt, kv_stride, dq + at, q_stride, true);
        kernels::gemm_any<T>(transpose::yes, transpose::no, nj, E, ni, ds, tile, q + at, q_stride, dk + j0 * kv_stride,
                             kv_stride, true);
        kernels::gemm_any<T>(transpose::yes, transpose::no, nj, E, ni, p, tile, d_o + at, q_stride, dv + j0 * kv_stride,
                             kv_stride, true);
      }
    }
  }
}

}  // namespace tlm
