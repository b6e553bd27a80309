// model<C>: binding, the cache forms, prefill against token-by-token, and errors.
#include <doctest/doctest.h>

#include <tlm/generation/sampler.hpp>
#include <tlm/model.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "fixture.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_model_api {

using C = tlm::smollm2_135m;

namespace {
double max_rel_diff(std::span<const float> a, std::span<const float> b) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return err / scale;
}

const std::vector<std::int32_t> prompt = {504, 3575, 282, 4649, 314};  // "The capital of France is"
}  // namespace

TEST_CASE("the 135M file binds to smollm2_135m and every tensor is a view into the mapping") {
  auto& m = tlm_test::shared_model<tlm::model<C>>();
  const auto bytes = m.file().bytes();
  std::size_t n = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, const auto& t) {
        ++n;
        CHECK(t.bound());
        CHECK(t.bytes().data() >= bytes.data());
        CHECK(t.bytes().data() + t.bytes().size() <= bytes.data() + bytes.size());
      },
      m.weights());
  CHECK(n == 272);
  CHECK(m.weights().token_embd.enc() == tlm::encoding::q8_0);
  CHECK(m.weights().layers[7].ffn_down.enc() == tlm::encoding::q4_1);
}

TEST_CASE("binding the 135M file to smollm2_360m reports every mismatch at once") {
  try {
    tlm::gguf::file f(TLM_MODEL_PATH);
    (void)tlm::bind<tlm::smollm2_360m>(f);
    FAIL("the 135M file must not bind to smollm2_360m");
  } catch (const tlm::bind_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("does not fit smollm2_360m") != std::string::npos);
    CHECK(msg.find("llama.embedding_length: expected 960, found 576") != std::string::npos);
    const auto& p = e.problems();
    auto has = [&](const std::string& s) {
      return std::any_of(p.begin(), p.end(), [&](const std::string& x) { return x.find(s) != std::string::npos; });
    };
    CHECK(has("llama.block_count: expected 32, found 30"));
    CHECK(has("llama.feed_forward_length: expected 2560, found 1536"));
    CHECK(has("llama.attention.head_count: expected 15, found 9"));
    CHECK(has("llama.attention.head_count_kv: expected 5, found 3"));
    CHECK(has("token_embd.weight: expected dims {960, 49152}, found {576, 49152}"));
    CHECK(has("blk.0.attn_k.weight: expected dims {960, 320}, found {576, 192}"));
    CHECK(has("blk.31.attn_q.weight: missing"));
    // All of them, not the first: 5 hyperparameters, token_embd and output_norm, the 9
    // tensors of each of the 30 layers the file has (all of another width), and the 9
    // tensors of each of the 2 layers it lacks.
    CHECK(p.size() == 5 + 2 + 30 * 9 + 2 * 9);
  }
}

TEST_CASE("prefill in one batch equals feeding the prompt token by token") {
  auto& m = tlm_test::shared_model<tlm::model<C>>();
  tlm::kv_cache<C> a(16), b(16);
  std::vector<float> batched_all;
  const auto batched = m.prefill(prompt, a, &batched_all);
  const std::vector<float> last(batched.begin(), batched.end());
  std::vector<float> one(C::vocab);
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    const auto l = m.forward(prompt[i], b);
    std::copy(l.begin(), l.end(), one.begin());
    CHECK(max_rel_diff(one, std::span<const float>(batched_all.data() + i * C::vocab, C::vocab)) < 1e-5);
  }
  CHECK(max_rel_diff(one, last) < 1e-5);
  CHECK(a.length() == b.length());
  // The caches hold the same keys and values.
  for (std::size_t l : {0u, 29u}) CHECK(max_rel_diff(a.keys(l, 2), b.keys(l, 2)) < 1e-5);
}

// From attention_tile rows a prefill into an f32 cache attends a tile of rows at a time
// (matrix products) where decode attends one row at a time; both are the same softmax.
// Two pieces, the second from position 70 (keys before the tile, and a tile that
// straddles the diagonal blocks), against the same tokens one at a time.
TEST_CASE("a long prefill, tiled, equals feeding the prompt token by token, from position 0 and from 70") {
  auto& m = tlm_test::shared_model<tlm::model<C>>();
  std::vector<std::int32_t> tokens(150);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((i * 7919 + 13) % C::vocab);
  tlm::kv_cache<C> a(tokens.size()), b(tokens.size());
  std::vector<float> batched, more;
  m.prefill(std::span(tokens).first(70), a, &batched);
  m.prefill(std::span(tokens).subspan(70), a, &more);
  batched.insert(batched.end(), more.begin(), more.end());
  REQUIRE(batched.size() == tokens.size() * C::vocab);
  double worst = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto l = m.forward(tokens[i], b);
    worst = std::max(worst, max_rel_diff(std::vector<float>(l.begin(), l.end()),
                                         std::span<const float>(batched.data() + i * C::vocab, C::vocab)));
  }
  MESSAGE("tiled prefill against decode, worst relative difference: " << worst);
  CHECK(worst < 1e-5);
  for (std::size_t l : {0u, 29u}) CHECK(max_rel_diff(a.keys(l, 2), b.keys(l, 2)) < 1e-5);
}

TEST_CASE("the typed cache gives the same logits as the run-time cache") {
  auto& m = tlm_test::shared_model<tlm::model<C>>();
  tlm::kv_cache<C> run(8);
  std::vector<float> want;
  for (auto t : prompt) {
    auto l = m.forward(t, run);
    want.assign(l.begin(), l.end());
  }
  auto [l0, k1] = m.forward(prompt[0], tlm::kv<C, 8>{});
  auto [l1, k2] = m.forward(prompt[1], std::move(k1));
  auto [l2, k3] = m.forward(prompt[2], std::move(k2));
  auto [l3, k4] = m.forward(prompt[3], std::move(k3));
  auto [l4, k5] = m.forward(prompt[4], std::move(k4));
  static_assert(decltype(k5)::length == 5);
  CHECK(max_rel_diff(std::vector<float>(l4.begin(), l4.end()), want) == 0.0);
  CHECK(tlm::argmax(l4) == 7042);  // " Paris"
}

TEST_CASE("bad input to the model is an error that loses nothing") {
  auto& m = tlm_test::shared_model<tlm::model<C>>();
  tlm::kv_cache<C> cache(6);
  m.prefill(prompt, cache);
  CHECK(cache.length() == 5);
  // A prompt that does not fit is refused before anything is written.
  CHECK_THROWS_AS(m.prefill(prompt, cache), tlm::capacity_error);
  CHECK(cache.length() == 5);
  const auto before = std::vector<float>(cache.keys(3, 1).begin(), cache.keys(3, 1).end());
  m.forward(7042, cache);
  CHECK(cache.length() == 6);
  try {
    m.forward(30, cache);
    FAIL("a full cache must refuse another token");
  } catch (const tlm::capacity_error& e) {
    CHECK(std::string(e.what()).find("KV cache full") != std::string::npos);
  }
  CHECK(cache.length() == 6);
  CHECK(std::equal(before.begin(), before.end(), cache.keys(3, 1).begin()));
  tlm::kv_cache<C> fresh(4);
  CHECK_THROWS_AS(m.forward(static_cast<std::int32_t>(C::vocab), fresh), tlm::error);
  CHECK_THROWS_AS(m.forward(-1, fresh), tlm::error);
  CHECK(fresh.length() == 0);
  CHECK_THROWS_AS(m.prefill(std::vector<std::int32_t>{}, fresh), tlm::error);
}

TEST_CASE("missing and non-GGUF files give clear errors") {
  CHECK_THROWS_AS(tlm::model<C>::load("/nonexistent/model.gguf"), tlm::format_error);
  try {
    tlm::model<C>::load(__FILE__);
    FAIL("a C++ source is not a GGUF file");
  } catch (const tlm::format_error& e) {
    CHECK(std::string(e.what()).find(__FILE__) != std::string::npos);
  }
}

}  // namespace test_model_api
