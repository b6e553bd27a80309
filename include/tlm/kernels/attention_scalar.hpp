#pragma once
// The kernels of decode-time attention (ops/attention.hpp) at the scalar level, the
// polynomial exp they all share, and the other kernel that spends its time in exp:
// SwiGLU (ops/swiglu.hpp) and its backward.
//
// One block of keys (at most ops' attention_block) is handled by three calls instead
// of a dot product and an axpy per key through the dispatch table:
//   scores      s[j] = scale * q . k_j          every key of the block
//   exp         p[j] = exp(scale s[j] - m), sum p   the block's unnormalized weights
//   accumulate  out = c * out + sum_j p[j] v_j   the online softmax's rescale and sum
// Keys and values are f32 rows at a stride (KV cache: E; a training batch: K) or int8
// codes with one scale per position (kv_type::q8, rows of E codes).
//
// exp_poly is the SIMD levels' exp written out for one float: the same operations in
// the same order, so the AVX2 and AVX-512 kernels compute bit for bit its values and
// it is their reference. The scalar level uses std::exp. Error against exp in double,
// over every one of the 2.24e9 floats in [lowest, highest]: at most 1.014 ulp (9
// inputs above 1 ulp, 0.8% not correctly rounded), and the AVX2 and AVX-512 kernels
// equal to exp_poly on every one of them (tests/test_attention_kernels.cpp checks a sample at
// every level). Results that would be subnormal (x < ln FLT_MIN) are flushed to +0,
// so a score far below the maximum weighs exactly 0 and never drags subnormals through
// the sums; x > ln FLT_MAX gives +inf, -inf gives 0 and NaN stays NaN.
#include <tlm/kernels/scalar.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace tlm::kernels {

// The function pointers of one level, a member of kernels/table.hpp's kernel_table.
struct attention_kernels {
  // s[j] = scale * sum_e q[e] * keys[j * stride + e]     q: [E]  keys: [n] rows  s: [n]
  void (*scores)(const float* q, const float* keys, std::size_t stride, std::size_t n, std::size_t E, float scale,
                 float* s);
  // s[j] = scale * key_scales[j] * sum_e q[e] * codes[j * E + e]     codes: [n, E]  key_scales, s: [n]
  void (*scores_q8)(const float* q, const std::int8_t* codes, const float* key_scales, std::size_t n, std::size_t E,
                    float scale, float* s);
  // p[j] = exp(scale * s[j] - m); returns sum_j p[j].   s, p: [n] (p may be s)
  // The SIMD levels round scale * s[j] - m once (an FMA), the scalar level twice; with
  // scale 1 both are exactly exp(s[j] - m). The scale is here, not in a pass of its own,
  // for the training attention's tiles of raw scores (ops/attention.hpp).
  float (*exp)(const float* s, std::size_t n, float scale, float m, float* p);
  // out[e] = c * out[e] + sum_j p[j] * values[j * stride + e]     p: [n]  out: [E]
  void (*accumulate)(float c, const float* p, const float* values, std::size_t stride, std::size_t n, std::size_t E,
                     float* out);
  // out[e] = c * out[e] + sum_j (p[j] * value_scales[j]) * codes[j * E + e]     codes: [n, E]  p, value_scales: [n]
  void (*accumulate_q8)(float c, const float* p, const std::int8_t* codes, const float* value_scales, std::size_t n,
                        std::size_t E, float* out);
  // out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]     gate, up, out: [n] (out may be gate or up)
  void (*swiglu)(const float* gate, const float* up, float* out, std::size_t n);
  // s = 1 / (1 + exp(-gate[i])):  dgate[i] += dh[i] * up[i] * s * (1 + gate[i] * (1 - s)),
  // dup[i] += dh[i] * gate[i] * s     all [n]
  void (*swiglu_backward)(const float* gate, const float* up, const float* dh, float* dgate, float* dup,
                          std::size_t n);
};

namespace exp_constants {
// Beyond these the result is not a normal float: below, exp(x) < FLT_MIN (flushed to
// 0); above, exp(x) > FLT_MAX. Both are the last floats on the finite, normal side.
inline constexpr float lowest = -87.33654022216796875f;
inline constexpr float highest = 88.72283172607421875f;
inline constexpr float log2e = 1.44269502162933349609375f;
// ln 2 in two parts: n * ln2_hi is exact inside an FMA and ln2_lo carries the rest.
inline constexpr float ln2_hi = 0.693147182464599609375f;
inline constexpr float ln2_lo = -1.904654323148236e-09f;
// exp(r) = 1 + r + r^2 (c0 + c1 r + ... + c4 r^4) on |r| <= ln2 / 2: a minimax fit of
// the relative error (Lawson iterations, 3e-9 in exact arithmetic, well under the
// 6e-8 of a float's half ulp), coefficients rounded to float.
inline constexpr float c0 = 0.4999999403953552f;
inline constexpr float c1 = 0.1666652113199234f;
inline constexpr float c2 = 0.04166838899254799f;
inline constexpr float c3 = 0.008368710055947304f;
inline constexpr float c4 = 0.0013814611593261361f;
}  // namespace exp_constants

// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2. 2^n is applied as two
// powers 2^(n >> 1) and 2^(n - (n >> 1)), each a normal float for every n in
// [-126, 128], so the one rounding is the polynomial's. std::fma rounds once, as the
// SIMD levels' FMA instructions do.
inline float exp_poly(float x) {
  namespace k = exp_constants;
  if (x != x) return x;
  if (x < k::lowest) return 0.0f;
  if (x > k::highest) return std::numeric_limits<float>::infinity();
  const float n = std::nearbyint(x * k::log2e);
  float r = std::fma(-n, k::ln2_hi, x);
  r = std::fma(-n, k::ln2_lo, r);
  float q = std::fma(k::c4, r, k::c3);
  q = std::fma(q, r, k::c2);
  q = std::fma(q, r, k::c1);
  q = std::fma(q, r, k::c0);
  const float p = std::fma(r * r, q, r) + 1.0f;
  const std::int32_t ni = static_cast<std::int32_t>(n);
  const std::int32_t half = ni >> 1;
  const float s1 = std::bit_cast<float>(static_cast<std::uint32_t>(half + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<std::uint32_t>(ni - half + 127) << 23);
  return p * s1 * s2;
}

namespace detail {

inline void attention_scores_scalar(const float* q, const float* keys, std::size_t stride, std::size_t n,
                                    std::size_t E, float scale, float* s) {
  for (std::size_t j = 0; j < n; ++j) s[j] = dot_scalar(q, keys + j * stride, E) * scale;
}

inline void attention_scores_q8_scalar(const float* q, const std::int8_t* codes, const float* key_scales,
                                       std::size_t n, std::size_t E, float scale, float* s) {
  for (std::size_t j = 0; j < n; ++j) s[j] = dot_i8_scalar(q, codes + j * E, E) * (key_scales[j] * scale);
}

// std::exp, not exp_poly, and a separate product and difference: without FMA
// instructions std::fma is a library routine, and the polynomial measured twice as slow
// as libm here.
inline float attention_exp_scalar(const float* s, std::size_t n, float scale, float m, float* p) {
  float sum = 0;
  for (std::size_t j = 0; j < n; ++j) sum += (p[j] = std::exp(scale * s[j] - m));
  return sum;
}

inline void attention_accumulate_scalar(float c, const float* p, const float* values, std::size_t stride,
                                        std::size_t n, std::size_t E, float* out) {
  for (std::size_t e = 0; e < E; ++e) out[e] *= c;
  for (std::size_t j = 0; j < n; ++j) axpy_scalar(p[j], values + j * stride, out, E);
}

inline void attention_accumulate_q8_scalar(float c, const float* p, const std::int8_t* codes,
                                           const float* value_scales, std::size_t n, std::size_t E, float* out) {
  for (std::size_t e = 0; e < E; ++e) out[e] *= c;
  for (std::size_t j = 0; j < n; ++j) axpy_i8_scalar(p[j] * value_scales[j], codes + j * E, out, E);
}

// The definitions with std::exp, for float (the scalar level) and double (ops/swiglu.hpp's
// gradient checks); the SIMD levels compute the same operations with exp_poly.
template <class T>
void swiglu_definition(const T* gate, const T* up, T* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const T g = gate[i];
    out[i] = g / (T(1) + std::exp(-g)) * up[i];
  }
}

template <class T>
void swiglu_backward_definition(const T* gate, const T* up, const T* dh, T* dgate, T* dup, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const T a = gate[i];
    const T s = T(1) / (T(1) + std::exp(-a));
    dgate[i] += dh[i] * up[i] * s * (T(1) + a * (T(1) - s));
    dup[i] += dh[i] * a * s;
  }
}

inline constexpr attention_kernels attention_scalar{&attention_scores_scalar, &attention_scores_q8_scalar,
                                                    &attention_exp_scalar,    &attention_accumulate_scalar,
                                                    &attention_accumulate_q8_scalar, &swiglu_definition<float>,
                                                    &swiglu_backward_definition<float>};

}  // namespace detail
}  // namespace tlm::kernels
