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

}  // namespace

TEST_CASE("prefill and decode give bitwise the same logits at 1, 2, 3 and 4 threads") {
  const auto one = run(1);
  REQUIRE(one.size() == 8 * C::vocab);
  CHECK(tlm::argmax(std::span<const float>(one.data() + 4 * C::vocab, C::vocab)) == 7042);  // " Paris"
  for (const std::size_t t : {2u, 3u, 4u}) {
    CAPTURE(t);
    const auto many = run(t);
    REQUIRE(many.size() == one.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < one.size(); ++i) differ += one[i] != many[i];
    CHECK(differ == 0);
  }
}

}  // namespace test_model_threads
