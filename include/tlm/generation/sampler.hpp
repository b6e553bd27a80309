#pragma once
// Turning logits into the next token.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <tlm/error.hpp>

namespace tlm {

namespace detail {
// The scans over a row of logits below take steps of 16 values as 4 vectors of 4 (GCC
// and Clang vector extensions: SSE2 on every x86-64, NEON on ARM), with no index carried
// from step to step. A scalar loop that carries the best index (`if (l[i] > l[best])
// best = i`) is a serial chain, and GCC does not vectorize 16 independent scalar maxima
// on its own. For SmolLM2's 49,152 logits on the Xeon: argmax 9.0 us against 46.9,
// the finite check (detail::require_finite_logits) 3.4 against 18.0, run on the calling
// thread between decode steps of about 3 ms while the pool waits (bench/sampling.cpp,
// bench/results/sampling-xeon.md).
using f32x4 = float __attribute__((vector_size(16)));
using i32x4 = std::int32_t __attribute__((vector_size(16)));
inline constexpr std::size_t scan_width = 16;

// Values [4k, 4k + 4) of p, k < 4 (unaligned).
inline void load_step(const float* p, f32x4 (&v)[4]) { std::memcpy(v, p, sizeof v); }

inline bool any_set(i32x4 m) { return (m[0] | m[1] | m[2] | m[3]) != 0; }
}  // namespace detail

// The most likely token; ties go to the lowest id (as numpy's argmax does), so
// greedy runs are comparable with the references. NaNs are passed over; all NaN
// gives 0.
inline std::int32_t argmax(std::span<const float> logits) {
  constexpr std::size_t w = detail::scan_width;
  const std::size_t n = logits.size();
  if (n == 0) throw error("argmax of no logits");
  const float* l = logits.data();
  // The largest value: 16 running maxima, then the largest of those.
  constexpr float low = -std::numeric_limits<float>::infinity();
  detail::f32x4 lanes[4] = {{low, low, low, low}, {low, low, low, low}, {low, low, low, low}, {low, low, low, low}};
  const std::size_t steps = n / w;
  for (std::size_t s = 0; s < steps; ++s) {
    detail::f32x4 v[4];
    detail::load_step(l + w * s, v);
    for (std::size_t k = 0; k < 4; ++k) lanes[k] = v[k] > lanes[k] ? v[k] : lanes[k];
  }
  float top = low;
  for (const detail::f32x4& v : lanes)
    for (std::size_t j = 0; j < 4; ++j) top = v[j] > top ? v[j] : top;
  for (std::size_t i = w * steps; i < n; ++i) top = l[i] > top ? l[i] : top;
  // Its first occurrence: whole steps tested at once, then the step that holds it.
  std::size_t s = 0;
  for (; s < steps; ++s) {
    detail::f32x4 v[4];
    detail::load_step(l + w * s, v);
    if (detail::any_set((v[0] == top) | (v[1] == top) | (v[2] == top) | (v[3] == top))) break;
  }
  for (std::size_t i = w * s; i < n; ++i)
    if (l[i] == top) return static_cast<std::int32_t>(i);
  return 0;  // every value NaN
}

// How the next token is chosen. The steps apply in this order, each to what the
// previous one left (the order llama.cpp documents, so settings carry over):
//
//   logit bias -> penalties -> top-k -> top-p -> min-p -> temperature -> draw
//
// top-p and min-p are judged on the distribution at temperature 1, so a temperature
// changes how the survivors are weighted, not which tokens survive. Temperature 0 is
// greedy: the bias and the penalties still apply, then the largest logit wins.
// The first four fields keep their places, so sampling{t, k, p, seed} still reads.
struct sampling {
  float temperature = 0.0f;    // 0: greedy
  std::size_t top_k = 0;       // keep the k most likely; 0: no limit
  float top_p = 1.0f;          // keep the smallest ranked set whose mass reaches top_p; 1: all
  std::uint64_t seed = 0;      // the draw's generator; the same seed gives the same ids
  float min_p = 0.0f;          // drop tokens less likely than min_p times the most likely; 0: none
  float repeat_penalty = 1.0f;  // a repeated token's logit: divided by this if positive, multiplied if not; 1: none
  float frequency_penalty = 0.0f;  // subtracted once per occurrence in the window
  float presence_penalty = 0.0f;   // subtracted once if the token occurs in the window
  std::size_t penalty_window = 64;  // the penalties look at the last N tokens of the context; 0: none
  std::vector<std::pair<std::int32_t, float>> logit_bias{};  // added to a token's logit; -inf bans it
};

// The settings that define no distribution, with what to do about each. Empty when valid.
inline std::string sampling_problem(const sampling& s) {
  if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature))
    return "temperature must be a finite number >= 0 (0 is greedy)";
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) return "top_p must be in (0, 1] (1 keeps every token)";
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) return "min_p must be in [0, 1] (0 keeps every token)";
  if (!(s.repeat_penalty > 0.0f) || !std::isfinite(s.repeat_penalty))
    return "repeat_penalty must be a finite number above 0 (1 is no penalty)";
  if (!std::isfinite(s.frequency_penalty) || !std::isfinite(s.presence_penalty))
    return "frequency_penalty and presence_penalty must be finite numbers (0 is no penalty)";
  for (const auto& [id, b] : s.logit_bias) {
    if (id < 0) return "logit_bias names token id " + std::to_string(id) + "; ids are 0 or more";
    if (std::isnan(b) || b == std::numeric_limits<float>::infinity())
      return "logit_bias for token " + std::to_string(id) + " must be finite, or -inf to ban the token";
  }
  return {};
}

// The sampler, with its own seeded generator, so a seed reproduces a run whatever
// the thread count (the logits do not depend on it, and the draw is serial).
//
// Candidates are ranked by logit (ties: lower id first). Only as much of that ranking
// is built as the draw needs, never a full sort of the vocabulary: top-k is a partial
// sort of k candidates, and without top-k the ranked prefix grows by partial sorts
// (64 candidates, then doubling) until the nucleus (top-p) is complete and the draw
// has landed. A draw usually lands among the first few candidates, so a token costs
// one pass over the logits plus a sort of ~64.
//
// The arithmetic is that of a full sort: the same probabilities, the same nucleus and
// the same walk in rank order, so a seed picks the same ids. The one difference is the
// order in which the normalizer z is added up (rank order for a full sort, index order
// here when there is no top-k), which can move z by an ulp; a draw could only change
// when it falls within that of a boundary between two candidates.
class sampler {
 public:
  explicit sampler(sampling s = {}) : s_(std::move(s)), rng_(s_.seed) {
    if (const std::string p = sampling_problem(s_); !p.empty()) throw error("sampling: " + p);
  }

  const sampling& settings() const { return s_; }

  // `recent` is the context so far (prompt and generated ids, oldest first); the
  // penalties look at its last penalty_window ids.
  std::int32_t operator()(std::span<const float> logits, std::span<const std::int32_t> recent = {}) {
    if (logits.empty()) throw error("sampling from no logits");
    const std::span<const float> l = adjusted(logits, recent);
    if (s_.temperature == 0.0f) {
      const std::int32_t best = argmax(l);
      if (l[static_cast<std::size_t>(best)] == -std::numeric_limits<float>::infinity())
        throw error("sampling: every token is banned by logit_bias; ban fewer tokens");
      return best;
    }
    cand_.clear();
    cand_.reserve(l.size());
    for (std::size_t i = 0; i < l.size(); ++i)
      if (l[i] != -std::numeric_limits<float>::infinity()) cand_.push_back({l[i], static_cast<std::int32_t>(i)});
    if (cand_.empty()) throw error("sampling: every token is banned by logit_bias; ban fewer tokens");
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
    // top-p's mass is that of the top-k survivors at temperature 1.
    const bool nucleus = s_.top_p < 1.0f;
    double z = 0.0;
    if (nucleus)
      for (const auto& c : cand_) z += std::exp(static_cast<double>(c.logit) - top);
    // min-p keeps p >= min_p * p_max, i.e. logit >= top + ln(min_p): a ranked prefix,
    // so dropping the rest before the nucleus walk gives the intersection of the two.
    if (s_.min_p > 0.0f) {
      const double floor = static_cast<double>(top) + std::log(static_cast<double>(s_.min_p));
      std::erase_if(cand_, [&](const candidate& c) { return static_cast<double>(c.logit) < floor; });
      sorted_ = std::min(sorted_, cand_.size());  // erase_if keeps order, so a sorted prefix stays sorted
    }
    // The nucleus: the shortest ranked prefix holding top_p of the mass.
    std::size_t n = cand_.size();
    if (nucleus) {
      double kept = 0.0;
      n = 0;
      while (n < cand_.size() && (n == 0 || kept / z < s_.top_p)) kept += std::exp(static_cast<double>(ranked(n++).logit) - top);
    }
    // Temperature weighs the survivors; the draw walks them in rank order.
    double mass = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      cand_[i].p = std::exp((static_cast<double>(cand_[i].logit) - top) / s_.temperature);
      mass += cand_[i].p;
    }
    std::uniform_real_distribution<double> u(0.0, mass);
    double r = u(rng_);
    for (std::size_t i = 0; i < n; ++i) {
      r -= ranked(i).p;
      if (r <= 0.0) return cand_[i].id;
    }
    return ranked(n - 1).id;
  }

  // The logits after the bias and the penalties, for a caller that wants to see them.
  std::span<const float> adjusted(std::span<const float> logits, std::span<const std::int32_t> recent) {
    const bool penalize = s_.penalty_window > 0 && !recent.empty() &&
                          (s_.repeat_penalty != 1.0f || s_.frequency_penalty != 0.0f || s_.presence_penalty != 0.0f);
    if (!penalize && s_.logit_bias.empty()) return logits;
    work_.assign(logits.begin(), logits.end());
    for (const auto& [id, b] : s_.logit_bias)
      if (static_cast<std::size_t>(id) < work_.size()) work_[static_cast<std::size_t>(id)] += b;
    if (penalize) {
      const auto window = recent.last(std::min(recent.size(), s_.penalty_window));
      counts_.clear();
      for (const std::int32_t id : window)
        if (id >= 0 && static_cast<std::size_t>(id) < work_.size()) counts_.push_back(id);
      std::sort(counts_.begin(), counts_.end());
      for (std::size_t i = 0; i < counts_.size();) {
        std::size_t j = i;
        while (j < counts_.size() && counts_[j] == counts_[i]) ++j;
        float& v = work_[static_cast<std::size_t>(counts_[i])];
        v = v > 0.0f ? v / s_.repeat_penalty : v * s_.repeat_penalty;
        v -= static_cast<float>(j - i) * s_.frequency_penalty + s_.presence_penalty;
        i = j;
      }
    }
    return work_;
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
  std::vector<float> work_;           // [vocab] logits after bias and penalties
  std::vector<std::int32_t> counts_;  // the penalty window, sorted to count repeats
};

}  // namespace tlm
