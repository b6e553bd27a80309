// The real model at 1 to 4 threads: every row of a product is computed by one thread
// in the same order whatever the split, so the logits must be bitwise the same at every
// thread count. scripts/test also runs this binary under ThreadSanitizer (with the
// thread pool's own tests), where a data race is reported even when it changes nothing.
#include <doctest/doctest.h>

#include <tlm/generation/sampler.hpp>
#include <tlm/model.hpp>

#include <filesystem>
#include <vector>

#include "fixture.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_model_threads {

using C = tlm::smollm2_135m;

namespace {

// Prefill of "The capital of France is" and 3 greedy steps: every logit produced.
std::vector<float> run(std::size_t threads) {
  if (!std::filesystem::exists(TLM_MODEL_PATH)) throw std::runtime_error("model missing at " TLM_MODEL_PATH "; run scripts/fetch-model");
  auto m = tlm::model<C>::load(TLM_MODEL_PATH, {.threads = threads});
  REQUIRE(m.threads() == threads);
  const std::vector<std::int32_t> prompt = {504, 3575, 282, 4649, 314};
  tlm::kv_cache<C> cache(prompt.size() + 3);
  std::vector<float> all;
  auto logits = m.prefill(prompt, cache, &all);
  for (int i = 0; i < 3; ++i) {
    logits = m.forward(tlm::argmax(logits), cache);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// A prompt long enough for the tiled prefill attention (kv_from_cache::attend_tiles, from
// attention_tile rows), in two pieces so the second starts at position 70, then 2 greedy
// steps: every logit produced.
std::vector<float> run_long(std::size_t threads) {
  auto m = tlm::model<C>::load(TLM_MODEL_PATH, {.threads = threads});
  std::vector<std::int32_t> prompt(150);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>((i * 7919 + 13) % C::vocab);
  tlm::kv_cache<C> cache(prompt.size() + 2);
  std::vector<float> all, more;
  m.prefill(std::span(prompt).first(70), cache, &all);
  auto logits = m.prefill(std::span(prompt).subspan(70), cache, &more);
  all.insert(all.end(), more.begin(), more.end());
  for (int i = 0; i < 2; ++i) {
    logits = m.forward(tlm::argmax(logits), cache);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// How many logits of run(t) differ from `one` (run(1)), for t = 2, 3 and 4.
template <class Run>
void check_same_as_one_thread(const std::vector<float>& one, Run run) {
  for (const std::size_t t : {2u, 3u, 4u}) {
    CAPTURE(t);
    const auto many = run(t);
    REQUIRE(many.size() == one.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < one.size(); ++i) differ += one[i] != many[i];
    CHECK(differ == 0);
  }
}

}  // namespace

TEST_CASE("a long prefill in two pieces gives bitwise the same logits at 1, 2, 3 and 4 threads") {
  const auto one = run_long(1);
  REQUIRE(one.size() == 152 * C::vocab);
  check_same_as_one_thread(one, run_long);
}

TEST_CASE("prefill and decode give bitwise the same logits at 1, 2, 3 and 4 threads") {
  const auto one = run(1);
  REQUIRE(one.size() == 8 * C::vocab);
  CHECK(tlm::argmax(std::span<const float>(one.data() + 4 * C::vocab, C::vocab)) == 7042);  // " Paris"
  check_same_as_one_thread(one, run);
}

}  // namespace test_model_threads
