// The sampler against the full-sort definition it replaced: for the same seed, the
// same ids, over temperatures, top-k, top-p, vocabulary sizes and tied logits.
#include <doctest/doctest.h>

#include <tlm/generation/sampler.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_sampler {

namespace {

// The definition: rank every logit with a full sort, keep top_k, then the nucleus.
class full_sort_sampler {
 public:
  explicit full_sort_sampler(tlm::sampling s) : s_(s), rng_(s.seed) {}

  std::int32_t operator()(std::span<const float> logits) {
    if (s_.temperature == 0.0f) return tlm::argmax(logits);
    struct cand {
      float logit;
      std::int32_t id;
      double p = 0.0;
    };
    std::vector<cand> c;
    for (std::size_t i = 0; i < logits.size(); ++i) c.push_back({logits[i], static_cast<std::int32_t>(i)});
    std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); });
    if (s_.top_k > 0 && c.size() > s_.top_k) c.resize(s_.top_k);
    // The nucleus is judged at temperature 1; the temperature weighs its members.
    double z = 0.0;
    for (auto& x : c) z += std::exp(static_cast<double>(x.logit) - c.front().logit);
    double mass1 = 0.0;
    std::size_t n = 0;
    if (s_.top_p < 1.0f) {
      while (n < c.size() && (n == 0 || mass1 / z < s_.top_p)) mass1 += std::exp(static_cast<double>(c[n++].logit) - c.front().logit);
    } else {
      n = c.size();
    }
    double kept = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      c[i].p = std::exp((static_cast<double>(c[i].logit) - c.front().logit) / s_.temperature);
      kept += c[i].p;
    }
    std::uniform_real_distribution<double> u(0.0, kept);
    double r = u(rng_);
    for (std::size_t i = 0; i < n; ++i) {
      r -= c[i].p;
      if (r <= 0.0) return c[i].id;
    }
    return c[n - 1].id;
  }

 private:
  tlm::sampling s_;
  std::mt19937_64 rng_;
};

std::vector<float> logits_like_a_model(std::size_t n, std::mt19937& rng, bool ties) {
  // A few strong candidates over a long tail, as a language model's logits look.
  std::normal_distribution<float> tail(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = tail(rng);
  std::uniform_int_distribution<std::size_t> pick(0, n - 1);
  for (int i = 0; i < 5; ++i) v[pick(rng)] = 6.0f + static_cast<float>(i);
  if (ties) {
    for (auto& x : v) x = std::round(x * 2.0f) / 2.0f;  // many exact ties
  }
  return v;
}

}  // namespace

TEST_CASE("sampler: partial selection picks the ids of the full-sort definition") {
  std::mt19937 rng(77);
  int draws = 0, same = 0;
  for (std::size_t vocab : {1, 2, 7, 100, 49152}) {
    for (bool ties : {false, true}) {
      const auto logits = logits_like_a_model(vocab, rng, ties);
      for (float t : {0.0f, 0.3f, 0.8f, 1.0f, 2.5f}) {
        for (std::size_t k : {0, 1, 5, 40, 1000}) {
          for (float p : {1.0f, 0.95f, 0.9f, 0.5f, 0.05f}) {
            tlm::sampling s{t, k, p, 1234 + vocab + k};
            tlm::sampler fast(s);
            full_sort_sampler ref(s);
            for (int i = 0; i < (vocab > 1000 ? 4 : 12); ++i) {
              const auto a = fast(logits), b = ref(logits);
              ++draws;
              same += a == b;
              INFO("vocab " << vocab << " ties " << ties << " T " << t << " k " << k << " p " << p << " draw " << i);
              CHECK(a == b);
            }
          }
        }
      }
    }
  }
  MESSAGE("sampler: " << same << " of " << draws << " draws identical to the full sort");
}

TEST_CASE("sampler: a flat distribution ranks the whole vocabulary without error") {
  // Equal logits: the nucleus of 0.99 holds nearly every candidate, so the ranked
  // prefix must grow to (nearly) the whole vocabulary; ties rank by id.
  std::vector<float> flat(49152, 0.0f);
  tlm::sampling s{1.0f, 0, 0.99f, 5};
  tlm::sampler fast(s);
  full_sort_sampler ref(s);
  for (int i = 0; i < 20; ++i) CHECK(fast(flat) == ref(flat));
}

TEST_CASE("sampler: bad settings and empty logits are errors") {
  CHECK_THROWS_AS(tlm::sampler(tlm::sampling{-1.0f, 0, 1.0f, 0}), tlm::error);
  CHECK_THROWS_AS(tlm::sampler(tlm::sampling{1.0f, 0, 0.0f, 0}), tlm::error);
  tlm::sampler s(tlm::sampling{1.0f, 0, 1.0f, 0});
  std::vector<float> none;
  CHECK_THROWS_AS(s(none), tlm::error);
}

// The definition argmax replaced: the first index of the largest value, NaNs never
// winning (all NaN: 0).
std::int32_t argmax_reference(std::span<const float> l) {
  std::size_t best = 0;
  bool found = false;
  for (std::size_t i = 0; i < l.size(); ++i) {
    if (std::isnan(l[i])) continue;
    if (!found || l[i] > l[best]) best = i;
    found = true;
  }
  return static_cast<std::int32_t>(best);
}

TEST_CASE("argmax: the first largest value at every position, in every length, from any alignment") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  std::vector<float> store(200);
  for (std::size_t offset = 0; offset < 3; ++offset) {
    for (std::size_t n = 1; n <= 70; ++n) {
      const std::span<float> l(store.data() + offset, n);
      for (std::size_t at = 0; at < n; ++at) {
        for (float& v : l) v = u(rng);
        l[at] = 31.0f;
        CHECK(tlm::argmax(l) == static_cast<std::int32_t>(at));
        // A tie after it: the lower id still wins.
        if (at + 1 < n) {
          l[n - 1] = 31.0f;
          CHECK(tlm::argmax(l) == static_cast<std::int32_t>(at));
        }
      }
    }
  }
  // A whole vocabulary, the largest in the last step and in the tail past the steps.
  std::vector<float> big(49152 + 7);
  for (float& v : big) v = u(rng);
  for (const std::size_t at : {std::size_t{0}, std::size_t{49151}, std::size_t{49152}, big.size() - 1}) {
    std::vector<float> l = big;
    l[at] = 100.0f;
    CHECK(tlm::argmax(l) == static_cast<std::int32_t>(at));
    CHECK(tlm::argmax(l) == argmax_reference(l));
  }
}

TEST_CASE("argmax: NaNs are passed over, infinities count, all NaN gives 0") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{16}, std::size_t{17}, std::size_t{40}}) {
    std::vector<float> l(n, nan);
    CHECK(tlm::argmax(l) == 0);
    l.back() = -inf;  // every token banned but one NaN: the banned one
    CHECK(tlm::argmax(l) == argmax_reference(l));
    CHECK(tlm::argmax(l) == static_cast<std::int32_t>(n - 1));
    std::fill(l.begin(), l.end(), -inf);
    CHECK(tlm::argmax(l) == 0);
    l[n / 2] = inf;
    l[0] = nan;
    CHECK(tlm::argmax(l) == static_cast<std::int32_t>(n / 2));
  }
}

}  // namespace test_sampler
