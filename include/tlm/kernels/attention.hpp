#pragma once
// The attention kernels at the active level (kernels/attention_scalar.hpp says what each
// computes), and the definitions the tests hold every level to.
#include <tlm/kernels/levels.hpp>
#include <tlm/kernels/attention_scalar.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace tlm::kernels {

inline const attention_kernels& attention() { return detail::table().attention; }

// s[j] = scale * q . k_j in double, rounded once.   keys: [n] rows at `stride`  s: [n]
inline void attention_scores_reference(const float* q, const float* keys, std::size_t stride, std::size_t n,
                                       std::size_t E, float scale, float* s) {
  for (std::size_t j = 0; j < n; ++j) {
    double d = 0;
    for (std::size_t e = 0; e < E; ++e) d += static_cast<double>(q[e]) * static_cast<double>(keys[j * stride + e]);
    s[j] = static_cast<float>(d * scale);
  }
}

inline void attention_scores_q8_reference(const float* q, const std::int8_t* codes, const float* key_scales,
                                          std::size_t n, std::size_t E, float scale, float* s) {
  for (std::size_t j = 0; j < n; ++j) {
    double d = 0;
    for (std::size_t e = 0; e < E; ++e) d += static_cast<double>(q[e]) * codes[j * E + e];
    s[j] = static_cast<float>(d * key_scales[j] * scale);
  }
}

// out = c * out + sum_j w_j v_j in double, rounded once per element.
inline void attention_accumulate_reference(float c, const float* p, const float* values, std::size_t stride,
                                           std::size_t n, std::size_t E, float* out) {
  for (std::size_t e = 0; e < E; ++e) {
    double a = static_cast<double>(c) * out[e];
    for (std::size_t j = 0; j < n; ++j) a += static_cast<double>(p[j]) * values[j * stride + e];
    out[e] = static_cast<float>(a);
  }
}

inline void attention_accumulate_q8_reference(float c, const float* p, const std::int8_t* codes,
                                              const float* value_scales, std::size_t n, std::size_t E, float* out) {
  for (std::size_t e = 0; e < E; ++e) {
    double a = static_cast<double>(c) * out[e];
    for (std::size_t j = 0; j < n; ++j) a += static_cast<double>(p[j]) * value_scales[j] * codes[j * E + e];
    out[e] = static_cast<float>(a);
  }
}

}  // namespace tlm::kernels
