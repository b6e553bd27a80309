// Hot paths allocate nothing in steady state: decoding a token, and a training step
// (forward, backward, zeroing gradients, AdamW) after the first, in full and with a
// low-rank adapter over a mapped quantized base, with the activations saved or
// recomputed; decoding with adapters loaded from files.
#include <doctest/doctest.h>

#include <tlm/generation/sampler.hpp>
#include <tlm/model.hpp>
#include <tlm/train/lora.hpp>

#include <filesystem>
#include <vector>

#include "counting_allocator.hpp"
#include "train_common.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_allocations {

TEST_CASE("a training step allocates nothing after the first") {
  using C = tlm::tiny_gqa;
  auto p = tlm_test::random_params<C, float>(1);
  auto g = std::make_unique<tlm::trainable<C, float>>();
  const auto data = tlm_test::random_batch(3, 8, C::vocab, 2);
  for (std::size_t threads : {1, 2})
  for (bool recompute : {false, true}) {
    tlm::training<C, float> run({.batch = 3, .seq = 8, .threads = threads, .recompute = recompute});
    tlm::adamw<tlm::trainable<C, float>> opt({.lr = 1e-3, .weight_decay = 0.1, .clip = 1.0});
    auto step = [&] {
      run.forward(*p, data.tokens, data.targets);
      tlm::zero(*g);
      run.backward(*p, *g);
      opt.step(*p, *g, &run.pool());
    };
    INFO(threads << " thread(s), recompute " << recompute);  // doctest's context stack allocates on first use: before counting
    step();
    const std::size_t before = tlm_test::allocations.load();
    for (int i = 0; i < 5; ++i) step();
    CHECK(tlm_test::allocations.load() - before == 0);
  }
}

TEST_CASE("a LoRA step over a mapped Q4_1 base allocates nothing after the first") {
  using C = tlm::tiny_untied;
  using A = tlm::lora<C, 4, tlm::all_layer_matrices>;
  auto p = tlm_test::random_params<C, float>(3);
  const tlm_test::mapped_base<C> base(*p, tlm::encoding::q4_1);
  auto ad = std::make_unique<A>(), g = std::make_unique<A>();
  tlm::init_lora(*ad, 4);
  const auto data = tlm_test::random_batch(3, 8, C::vocab, 5);
  for (std::size_t threads : {1, 2})
  for (bool recompute : {false, true}) {
    tlm::training<C, float> run({.batch = 3, .seq = 8, .threads = threads, .recompute = recompute});
    tlm::adamw<A> opt({.lr = 1e-3, .weight_decay = 0.1, .clip = 1.0});
    auto step = [&] {
      run.forward(base.w, *ad, data.tokens, data.targets);
      tlm::zero(*g);
      run.backward(base.w, *ad, *g);
      opt.step(*ad, *g, &run.pool());
    };
    INFO(threads << " thread(s), recompute " << recompute);
    step();  // the adapter's scratch and the per-thread decode tile take their size
    const std::size_t before = tlm_test::allocations.load();
    for (int i = 0; i < 5; ++i) step();
    CHECK(tlm_test::allocations.load() - before == 0);
  }
}

TEST_CASE("decoding a token allocates nothing") {
  REQUIRE_MESSAGE(std::filesystem::exists(TLM_MODEL_PATH), "run scripts/fetch-model first");
  using C = tlm::smollm2_135m;
  for (std::size_t threads : {1, 2}) {
    auto m = tlm::model<C>::load(TLM_MODEL_PATH, {.threads = threads});
    tlm::kv_cache<C> cache(200);
    const std::vector<std::int32_t> prompt{504, 3458, 282, 4649, 314};
    auto logits = m.prefill(prompt, cache);
    logits = m.forward(tlm::argmax(logits), cache);  // first decode: thread-local buffers take their size
    INFO(threads << " thread(s)");
    const std::size_t before = tlm_test::allocations.load();
    for (int i = 0; i < 150; ++i) logits = m.forward(tlm::argmax(logits), cache);
    CHECK(tlm_test::allocations.load() - before == 0);
  }
}

TEST_CASE("decoding a token with two LoRA adapters allocates nothing") {
  REQUIRE_MESSAGE(std::filesystem::exists(TLM_MODEL_PATH), "run scripts/fetch-model first");
  using C = tlm::smollm2_135m;
  const std::string adapter = std::string(TLM_FIXTURES) + "/lora/small.gguf";
  for (std::size_t threads : {1, 2}) {
    auto m = tlm::model<C>::load(TLM_MODEL_PATH, {.threads = threads});
    m.add_lora(adapter, 0.5f);
    m.add_lora(adapter, 2.0f);
    tlm::kv_cache<C> cache(200);
    const std::vector<std::int32_t> prompt{504, 3458, 282, 4649, 314};
    auto logits = m.prefill(prompt, cache);
    logits = m.forward(tlm::argmax(logits), cache);
    INFO(threads << " thread(s)");
    const std::size_t before = tlm_test::allocations.load();
    for (int i = 0; i < 150; ++i) logits = m.forward(tlm::argmax(logits), cache);
    CHECK(tlm_test::allocations.load() - before == 0);
  }
}

}  // namespace test_allocations
