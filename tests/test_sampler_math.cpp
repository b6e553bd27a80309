// The sampler's distribution against hand-computed ones: temperature, top-k, top-p
// and both together, by drawing many tokens and comparing frequencies; seeded
// reproducibility; what must never be drawn is never drawn.
#include <doctest/doctest.h>

#include <tlm/generation/sampler.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_sampler_math {

namespace {

// Logits whose softmax at temperature 1 is exactly {0.1, 0.2, 0.3, 0.4}.
const std::vector<float> four = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};

constexpr int draws = 200000;

// Frequencies of each id over `draws` draws.
std::vector<double> frequencies(tlm::sampling s, const std::vector<float>& logits) {
  tlm::sampler pick(s);
  std::vector<double> f(logits.size(), 0.0);
  int outside = 0;
  for (int i = 0; i < draws; ++i) {
    const auto id = pick(logits);
    if (id < 0 || static_cast<std::size_t>(id) >= logits.size()) ++outside;
    else f[static_cast<std::size_t>(id)] += 1.0;
  }
  CHECK(outside == 0);
  for (auto& v : f) v /= draws;
  return f;
}

// Each frequency within 0.005 of the expected probability (the standard error of
// 200,000 draws is at most 0.0011, so this is over 4 standard errors), and a token
// of probability 0 is never drawn at all.
void check_distribution(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("id ", i, ": drawn with frequency ", got[i], ", expected probability ", want[i]);
    if (want[i] == 0.0) CHECK(got[i] == 0.0);
    else CHECK(std::fabs(got[i] - want[i]) < 0.005);
  }
}

}  // namespace

TEST_CASE("temperature 1 draws from the softmax of the logits") {
  check_distribution(frequencies({.temperature = 1.0f, .seed = 1}, four), {0.1, 0.2, 0.3, 0.4});
}

TEST_CASE("temperature divides the logits before the softmax") {
  // T = 2: p ~ sqrt(p1) = {0.316228, 0.447214, 0.547723, 0.632456} / 1.943621.
  check_distribution(frequencies({.temperature = 2.0f, .seed = 2}, four), {0.162701, 0.230092, 0.281804, 0.325403});
  // T = 0.5: p ~ p1^2 = {0.01, 0.04, 0.09, 0.16} / 0.30.
  check_distribution(frequencies({.temperature = 0.5f, .seed = 3}, four), {0.033333, 0.133333, 0.3, 0.533333});
}

TEST_CASE("top-k keeps the k most likely tokens, renormalized") {
  // {0.3, 0.4} / 0.7.
  check_distribution(frequencies({.temperature = 1.0f, .top_k = 2, .seed = 4}, four), {0.0, 0.0, 0.428571, 0.571429});
  check_distribution(frequencies({.temperature = 1.0f, .top_k = 1, .seed = 5}, four), {0.0, 0.0, 0.0, 1.0});
  // k at least the vocabulary is no limit.
  check_distribution(frequencies({.temperature = 1.0f, .top_k = 9, .seed = 6}, four), {0.1, 0.2, 0.3, 0.4});
}

TEST_CASE("top-p keeps the most likely tokens until their mass reaches p") {
  // Sorted: 0.4, 0.3 (0.7 >= 0.65): {0.3, 0.4} / 0.7.
  check_distribution(frequencies({.temperature = 1.0f, .top_p = 0.65f, .seed = 7}, four), {0.0, 0.0, 0.428571, 0.571429});
  // 0.4 alone falls short of 0.45, so 0.3 joins; p = 0.35 keeps 0.4 alone.
  check_distribution(frequencies({.temperature = 1.0f, .top_p = 0.45f, .seed = 8}, four), {0.0, 0.0, 0.428571, 0.571429});
  check_distribution(frequencies({.temperature = 1.0f, .top_p = 0.35f, .seed = 9}, four), {0.0, 0.0, 0.0, 1.0});
  // 0.4 + 0.3 + 0.2 = 0.9 >= 0.85: {0.2, 0.3, 0.4} / 0.9.
  check_distribution(frequencies({.temperature = 1.0f, .top_p = 0.85f, .seed = 10}, four), {0.0, 0.222222, 0.333333, 0.444444});
}

TEST_CASE("top-p is judged at temperature 1; the temperature then weighs the survivors") {
  // At T = 1, 0.4 + 0.3 = 0.7 < 0.8, so 0.2 joins (0.9): {0.2, 0.3, 0.4} survive. T = 0.5
  // squares them: {0.04, 0.09, 0.16} / 0.29. (The order penalties -> top-k -> top-p ->
  // min-p -> temperature is llama.cpp's; judged at T = 0.5 the nucleus would be {0.3, 0.4}.)
  check_distribution(frequencies({.temperature = 0.5f, .top_p = 0.8f, .seed = 11}, four), {0.0, 0.137931, 0.310345, 0.551724});
}

TEST_CASE("top-k comes first, then top-p over the renormalized survivors") {
  // top-k 3 keeps {0.2, 0.3, 0.4} -> {0.2222, 0.3333, 0.4444}; 0.4444 + 0.3333 = 0.7778 >= 0.75
  // stops there. (top-p over the whole distribution would need 0.4 + 0.3 + 0.2 to reach 0.75.)
  check_distribution(frequencies({.temperature = 1.0f, .top_k = 3, .top_p = 0.75f, .seed = 12}, four),
                     {0.0, 0.0, 0.428571, 0.571429});
}

TEST_CASE("top-k on a large vocabulary draws only the k largest logits, in softmax proportion") {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(1000);
  for (auto& v : logits) v = dist(rng);
  std::vector<std::size_t> order(logits.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](auto a, auto b) { return logits[a] > logits[b]; });
  std::vector<double> want(logits.size(), 0.0);
  double z = 0.0;
  for (int i = 0; i < 5; ++i) z += std::exp(static_cast<double>(logits[order[i]]) - logits[order[0]]);
  for (int i = 0; i < 5; ++i) want[order[i]] = std::exp(static_cast<double>(logits[order[i]]) - logits[order[0]]) / z;
  tlm::sampler pick({.temperature = 1.0f, .top_k = 5, .seed = 13});
  std::vector<double> got(logits.size(), 0.0);
  const int n = 10000;
  for (int i = 0; i < n; ++i) got[static_cast<std::size_t>(pick(logits))] += 1.0 / n;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (want[i] == 0.0) {
      if (got[i] != 0.0) FAIL_CHECK("id ", i, " is outside the top 5 but was drawn");
    } else {
      CHECK(std::fabs(got[i] - want[i]) < 0.02);  // 10,000 draws: standard error <= 0.005
    }
  }
}

TEST_CASE("a seed reproduces a run, and another seed gives another run") {
  const auto run = [](std::uint64_t seed) {
    tlm::sampler pick({.temperature = 1.0f, .seed = seed});
    std::vector<std::int32_t> ids;
    for (int i = 0; i < 1000; ++i) ids.push_back(pick(four));
    return ids;
  };
  CHECK(run(17) == run(17));
  CHECK(run(17) != run(18));
  // A copy continues from the same state.
  tlm::sampler a({.temperature = 1.0f, .seed = 5});
  for (int i = 0; i < 10; ++i) (void)a(four);
  tlm::sampler b = a;
  for (int i = 0; i < 100; ++i) CHECK(a(four) == b(four));
}

TEST_CASE("temperature 0 is greedy whatever the seed or limits; ties go to the lowest id") {
  for (std::uint64_t seed : {0u, 1u, 99u}) {
    tlm::sampler pick({.temperature = 0.0f, .top_k = 2, .top_p = 0.5f, .seed = seed});
    CHECK(pick(four) == 3);
    CHECK(pick(std::vector<float>{1.0f, 5.0f, 5.0f, 2.0f}) == 1);
  }
}

TEST_CASE("settings that define no distribution are refused") {
  CHECK_THROWS_AS(tlm::sampler({.temperature = -1.0f}), tlm::error);
  CHECK_THROWS_AS(tlm::sampler({.temperature = std::nanf("")}), tlm::error);
  CHECK_THROWS_AS(tlm::sampler({.temperature = 1.0f, .top_p = 0.0f}), tlm::error);
  CHECK_THROWS_AS(tlm::sampler({.temperature = 1.0f, .top_p = 1.5f}), tlm::error);
  CHECK_NOTHROW(tlm::sampler({.temperature = 1.0f, .top_p = 1.0f}));
}

namespace {
std::vector<double> frequencies_after(tlm::sampling s, const std::vector<float>& logits, const std::vector<std::int32_t>& recent) {
  tlm::sampler pick(std::move(s));
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) f[static_cast<std::size_t>(pick(logits, recent))] += 1.0 / draws;
  return f;
}
}  // namespace

TEST_CASE("min-p keeps the tokens at least min_p times as likely as the most likely") {
  // 0.6 * 0.4 = 0.24: {0.3, 0.4} / 0.7.
  check_distribution(frequencies({.temperature = 1.0f, .seed = 21, .min_p = 0.6f}, four), {0.0, 0.0, 0.428571, 0.571429});
  // 0.45 * 0.4 = 0.18: {0.2, 0.3, 0.4} / 0.9.
  check_distribution(frequencies({.temperature = 1.0f, .seed = 22, .min_p = 0.45f}, four), {0.0, 0.222222, 0.333333, 0.444444});
  // After top-p 0.85 keeps {0.2, 0.3, 0.4}, min-p 0.6 leaves {0.3, 0.4}.
  check_distribution(frequencies({.temperature = 1.0f, .top_p = 0.85f, .seed = 23, .min_p = 0.6f}, four),
                     {0.0, 0.0, 0.428571, 0.571429});
  // min-p is judged at temperature 1: T = 0.5 then squares {0.3, 0.4}: {0.09, 0.16} / 0.25.
  check_distribution(frequencies({.temperature = 0.5f, .seed = 24, .min_p = 0.6f}, four), {0.0, 0.0, 0.36, 0.64});
}

TEST_CASE("top-p breaks ties by the lower id, so the kept set is the same every time") {
  // Four equal tokens, p = 0.4: rank order is 0, 1, 2, 3; 0.25 < 0.4, then 0.5 reaches it.
  const std::vector<float> flat(4, 1.0f);
  check_distribution(frequencies({.temperature = 1.0f, .top_p = 0.4f, .seed = 25}, flat), {0.5, 0.5, 0.0, 0.0});
  check_distribution(frequencies({.temperature = 1.0f, .top_k = 3, .seed = 26}, flat), {1.0 / 3, 1.0 / 3, 1.0 / 3, 0.0});
}

TEST_CASE("presence and frequency penalties subtract from the logits of tokens in the window") {
  // id 3 loses 1 nat: weights {0.1, 0.2, 0.3, 0.4/e = 0.147152} / 0.747152.
  const std::vector<double> want = {0.133842, 0.267684, 0.401527, 0.196947};
  check_distribution(frequencies_after({.temperature = 1.0f, .seed = 27, .presence_penalty = 1.0f}, four, {3}), want);
  check_distribution(frequencies_after({.temperature = 1.0f, .seed = 28, .presence_penalty = 1.0f}, four, {3, 3, 3}), want);
  check_distribution(frequencies_after({.temperature = 1.0f, .seed = 29, .frequency_penalty = 0.5f}, four, {3, 3}), want);
  // A window of 1 sees only the newest id (0): {0.1/e = 0.036788, 0.2, 0.3, 0.4} / 0.936788.
  check_distribution(
      frequencies_after({.temperature = 1.0f, .seed = 30, .presence_penalty = 1.0f, .penalty_window = 1}, four, {3, 0}),
      {0.039271, 0.213495, 0.320243, 0.426991});
  // A window of 0 is no penalty.
  check_distribution(
      frequencies_after({.temperature = 1.0f, .seed = 31, .presence_penalty = 1.0f, .penalty_window = 0}, four, {3}),
      {0.1, 0.2, 0.3, 0.4});
}

TEST_CASE("the repetition penalty divides a positive logit and multiplies a negative one") {
  // log 0.4 = -0.916291, times 2: exp = 0.16; {0.1, 0.2, 0.3, 0.16} / 0.76.
  check_distribution(frequencies_after({.temperature = 1.0f, .seed = 32, .repeat_penalty = 2.0f}, four, {3}),
                     {0.131579, 0.263158, 0.394737, 0.210526});
  // Logits {0, 2}: id 1 becomes 1; softmax {1, e} / (1 + e).
  check_distribution(frequencies_after({.temperature = 1.0f, .seed = 33, .repeat_penalty = 2.0f}, {0.0f, 2.0f}, {1}),
                     {0.268941, 0.731059});
}

TEST_CASE("the repetition penalty applies once per token, however often it repeats in the window") {
  // Logits {0.5, -1, 2, 3}: with penalty 2 a repeated id 3 becomes 1.5 and id 1 becomes -2,
  // whether they occur once or three times; a per-occurrence penalty would give 0.75 and -8.
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 3.0f};
  tlm::sampler once({.repeat_penalty = 2.0f});
  tlm::sampler twice({.repeat_penalty = 2.0f});
  const auto a = once.adjusted(logits, std::vector<std::int32_t>{3});
  const std::vector<float> got_once(a.begin(), a.end());
  const auto b = twice.adjusted(logits, std::vector<std::int32_t>{3, 3});
  const std::vector<float> got_twice(b.begin(), b.end());
  CHECK(got_once == std::vector<float>{0.5f, -1.0f, 2.0f, 1.5f});
  CHECK(got_twice == got_once);
  CHECK(got_twice[3] == 1.5f);  // the same, printable when it fails
  tlm::sampler mixed({.repeat_penalty = 2.0f});
  const auto c = mixed.adjusted(logits, std::vector<std::int32_t>{1, 3, 1, 3, 1});
  const std::vector<float> got_mixed(c.begin(), c.end());
  CHECK(got_mixed == std::vector<float>{0.5f, -2.0f, 2.0f, 1.5f});
  // Greedy sees the same: {0.8, 2} with id 1 twice in the window is {0.8, 1}, so id 1
  // stays the choice (penalised per occurrence it would be 0.5 and lose to id 0).
  CHECK(tlm::sampler({.repeat_penalty = 2.0f})(std::vector<float>{0.8f, 2.0f}, std::vector<std::int32_t>{1, 1}) == 1);
  // The frequency penalty, unlike it, counts occurrences: 3 - 3 * 0.25 = 2.25.
  tlm::sampler freq({.frequency_penalty = 0.25f});
  const auto d = freq.adjusted(logits, std::vector<std::int32_t>{3, 3, 3});
  CHECK(d[3] == 2.25f);
}

TEST_CASE("logit bias adds to a token's logit, and -inf bans it") {
  const float ban = -std::numeric_limits<float>::infinity();
  check_distribution(frequencies({.temperature = 1.0f, .seed = 34, .logit_bias = {{3, ban}}}, four), {0.166667, 0.333333, 0.5, 0.0});
  // +ln 2 doubles id 0: {0.2, 0.2, 0.3, 0.4} / 1.1.
  check_distribution(frequencies({.temperature = 1.0f, .seed = 35, .logit_bias = {{0, std::log(2.0f)}}}, four),
                     {0.181818, 0.181818, 0.272727, 0.363636});
  // Greedy sees the bias and the penalties too.
  CHECK(tlm::sampler({.logit_bias = {{3, ban}}})(four) == 2);
  CHECK(tlm::sampler({.presence_penalty = 10.0f})(four, std::vector<std::int32_t>{3}) == 2);
  // Nothing left to draw is an error, not a hang or an out-of-range id.
  tlm::sampler all_banned({.temperature = 1.0f, .logit_bias = {{0, ban}, {1, ban}, {2, ban}, {3, ban}}});
  CHECK_THROWS_AS(all_banned(four), tlm::error);
  CHECK_THROWS_AS(tlm::sampler({.logit_bias = {{0, ban}, {1, ban}, {2, ban}, {3, ban}}})(four), tlm::error);
}

TEST_CASE("new settings that define no distribution are refused") {
  CHECK_THROWS_AS(tlm::sampler({.min_p = 1.5f}), tlm::error);
  CHECK_THROWS_AS(tlm::sampler({.min_p = -0.1f}), tlm::error);
  CHECK_THROWS_AS(tlm::sampler({.repeat_penalty = 0.0f}), tlm::error);
  CHECK_THROWS_AS(tlm::sampler({.frequency_penalty = std::nanf("")}), tlm::error);
  CHECK_THROWS_AS(tlm::sampler({.logit_bias = {{-1, 1.0f}}}), tlm::error);
  CHECK_THROWS_AS(tlm::sampler({.logit_bias = {{1, std::numeric_limits<float>::infinity()}}}), tlm::error);
}

}  // namespace test_sampler_math
