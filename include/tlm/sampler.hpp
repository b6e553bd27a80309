#pragma once
// Turning logits into the next token.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "error.hpp"

namespace tlm {

// The most likely token; ties go to the lowest id (as numpy's argmax does), so
// greedy runs are comparable with the references.
inline std::int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) throw error("argmax of no logits");
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<std::int32_t>(best);
}

struct sampling {
  float temperature = 0.0f;  // 0: greedy
  std::size_t top_k = 0;     // 0: no limit
  float top_p = 1.0f;        // nucleus mass kept
  std::uint64_t seed = 0;
};

// Temperature / top-k / top-p sampling with its own seeded generator, so a seed
// reproduces a run. With temperature 0 it is greedy.
class sampler {
 public:
  explicit sampler(sampling s = {}) : s_(s), rng_(s.seed) {
    if (!(s.temperature >= 0.0f) || !(s.top_p > 0.0f && s.top_p <= 1.0f)) {
      throw error("sampling: temperature must be >= 0 and top_p in (0, 1]");
    }
  }

  std::int32_t operator()(std::span<const float> logits) {
    if (s_.temperature == 0.0f) return argmax(logits);
    cand_.clear();
    for (std::size_t i = 0; i < logits.size(); ++i) cand_.push_back({logits[i], static_cast<std::int32_t>(i)});
    std::sort(cand_.begin(), cand_.end(), [](const auto& a, const auto& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); });
    if (s_.top_k > 0 && cand_.size() > s_.top_k) cand_.resize(s_.top_k);
    double z = 0.0;
    for (auto& c : cand_) {
      c.p = std::exp((static_cast<double>(c.logit) - cand_.front().logit) / s_.temperature);
      z += c.p;
    }
    double kept = 0.0;
    std::size_t n = 0;
    while (n < cand_.size() && (n == 0 || kept / z < s_.top_p)) kept += cand_[n++].p;
    std::uniform_real_distribution<double> u(0.0, kept);
    double r = u(rng_);
    for (std::size_t i = 0; i < n; ++i) {
      r -= cand_[i].p;
      if (r <= 0.0) return cand_[i].id;
    }
    return cand_[n - 1].id;
  }

 private:
  struct candidate {
    float logit;
    std::int32_t id;
    double p = 0.0;
  };
  sampling s_;
  std::mt19937_64 rng_;
  std::vector<candidate> cand_;
};

}  // namespace tlm
