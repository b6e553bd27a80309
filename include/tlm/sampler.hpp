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
//
// Candidates are ranked by logit (ties: lower id first). Only as much of that ranking
// is built as the draw needs, never a full sort of the vocabulary: top-k is a partial
// sort of k candidates, and without top-k the ranked prefix grows by partial sorts
// (64 candidates, then doubling) until the nucleus (top-p) is complete and the draw
// has landed. A draw usually lands among the first few
// candidates, so a token costs one pass over the logits plus a sort of ~64.
//
// The arithmetic is that of a full sort: the same probabilities, the same nucleus and
// the same walk in rank order, so a seed picks the same ids. The one difference is the
// order in which the normalizer sum z is added up (rank order before, index order now
// when there is no top-k), which can move z by an ulp; a draw could only change when
// it falls within that of a boundary between two candidates.
class sampler {
 public:
  explicit sampler(sampling s = {}) : s_(s), rng_(s.seed) {
    if (!(s.temperature >= 0.0f) || !(s.top_p > 0.0f && s.top_p <= 1.0f)) {
      throw error("sampling: temperature must be >= 0 and top_p in (0, 1]");
    }
  }

  std::int32_t operator()(std::span<const float> logits) {
    if (s_.temperature == 0.0f) return argmax(logits);
    if (logits.empty()) throw error("sampling from no logits");
    cand_.clear();
    cand_.reserve(logits.size());
    for (std::size_t i = 0; i < logits.size(); ++i) cand_.push_back({logits[i], static_cast<std::int32_t>(i)});
    sorted_ = 0;
    float top = 0;
    if (s_.top_k > 0 && cand_.size() > s_.top_k) {
      // A heap of the k best, then sorted: most candidates cost one comparison with
      // the heap's worst (measured 70x faster than a full sort, and 8x faster than
      // nth_element and a sort, for k = 40 of 49152).
      std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(s_.top_k), cand_.end(), ranks_before);
      cand_.resize(s_.top_k);
      sorted_ = cand_.size();
      top = cand_.front().logit;
    } else {
      top = std::max_element(cand_.begin(), cand_.end(), [](const auto& a, const auto& b) { return ranks_before(b, a); })->logit;
    }
    double z = 0.0;
    for (auto& c : cand_) {
      c.p = std::exp((static_cast<double>(c.logit) - top) / s_.temperature);
      z += c.p;
    }
    // The nucleus: the shortest ranked prefix holding top_p of the mass. With top_p = 1
    // it is every candidate, whose mass is z (up to rounding), so nothing is ranked for it.
    double kept = 0.0;
    std::size_t n = 0;
    if (s_.top_p >= 1.0f) {
      kept = z;
      n = cand_.size();
    } else {
      while (n < cand_.size() && (n == 0 || kept / z < s_.top_p)) kept += ranked(n++).p;
    }
    std::uniform_real_distribution<double> u(0.0, kept);
    double r = u(rng_);
    for (std::size_t i = 0; i < n; ++i) {
      r -= ranked(i).p;
      if (r <= 0.0) return cand_[i].id;
    }
    return ranked(n - 1).id;
  }

 private:
  struct candidate {
    float logit;
    std::int32_t id;
    double p = 0.0;
  };

  static bool ranks_before(const candidate& a, const candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }

  // The candidate of rank i, extending the ranked prefix [0, sorted_) when needed:
  // a partial sort of the rest (every one of which ranks after the prefix) doubles it.
  const candidate& ranked(std::size_t i) {
    if (i >= sorted_) {
      const std::size_t end = std::min(cand_.size(), std::max<std::size_t>({i + 1, 2 * sorted_, 64}));
      const auto first = cand_.begin() + static_cast<std::ptrdiff_t>(sorted_);
      const auto last = cand_.begin() + static_cast<std::ptrdiff_t>(end);
      std::partial_sort(first, last, cand_.end(), ranks_before);
      sorted_ = end;
    }
    return cand_[i];
  }

  sampling s_;
  std::mt19937_64 rng_;
  std::vector<candidate> cand_;  // [vocab] (or [top_k]); [0, sorted_) in rank order
  std::size_t sorted_ = 0;
};

}  // namespace tlm
