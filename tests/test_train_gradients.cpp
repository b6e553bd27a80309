// Exact gradients: the backward pass against central finite differences in double,
// and the float build against the double build.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "train_common.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_gradients {

namespace {

using tlm_test::random_batch;
using tlm_test::random_params;

template <tlm::LlamaConfig C>
void check_finite_differences() {
  constexpr std::size_t B = 2, T = 5;
  auto p = random_params<C, double>(11);
  const auto data = random_batch(B, T, C::vocab, 12);
  tlm::training<C, double> run({.batch = B, .seq = T, .threads = 1});
  auto grads = std::make_unique<tlm::trainable<C, double>>();
  run.forward(*p, data.tokens, data.targets);
  run.backward(*p, *grads);

  std::mt19937_64 rng(13);
  std::size_t tensors = 0, entries = 0;
  double worst = 0.0;
  std::string worst_name;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, auto& w, const auto& g) {
        if (name.member == "rope_freqs") {
          // A constant (weights.hpp): the forward does not read it, so no gradient.
          CHECK(std::all_of(g.values().begin(), g.values().end(), [](double v) { return v == 0.0; }));
          ++tensors;
          return;
        }
        // Every entry of a small tensor; 24 sampled entries of a large one, plus the
        // entry of largest gradient.
        const auto idx = tlm_test::entries_to_check(g, 64, 24, true, rng);
        const auto fd = tlm_test::central_differences(w, g, idx, [&] { return run.forward(*p, data.tokens, data.targets); });
        const double rel = fd.relative_error;
        entries += fd.entries;
        INFO(name.str() << ": max |fd - grad| / max |grad| = " << rel);
        CHECK(fd.max_gradient > 0);  // every tensor takes part in the loss
        CHECK(rel <= 1e-6);
        if (rel > worst) {
          worst = rel;
          worst_name = name.str();
        }
        ++tensors;
      },
      *p, *grads);
  MESSAGE(tensors << " tensors, " << entries << " entries; worst relative error " << worst << " (" << worst_name
                  << ")");
  CHECK(tensors == tlm::tensor_count(*p));
}

template <tlm::LlamaConfig C>
void check_float_against_double(std::size_t threads) {
  constexpr std::size_t B = 3, T = 7;
  auto pd = random_params<C, double>(21);
  auto pf = tlm::convert<float>(*pd);
  const auto data = random_batch(B, T, C::vocab, 22);
  tlm::training<C, double> rd({.batch = B, .seq = T, .threads = 1});
  tlm::training<C, float> rf({.batch = B, .seq = T, .threads = threads});
  auto gd = std::make_unique<tlm::trainable<C, double>>();
  auto gf = std::make_unique<tlm::trainable<C, float>>();
  const double ld = rd.forward(*pd, data.tokens, data.targets);
  const double lf = rf.forward(*pf, data.tokens, data.targets);
  CHECK(std::abs(lf - ld) / std::abs(ld) <= 1e-5);
  rd.backward(*pd, *gd);
  rf.backward(*pf, *gf);
  double worst = 0.0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& a, const auto& b) {
        double max_ref = 0.0, max_err = 0.0;
        for (std::size_t i = 0; i < a.values().size(); ++i) {
          max_ref = std::max(max_ref, std::abs(a.data()[i]));
          max_err = std::max(max_err, std::abs(a.data()[i] - static_cast<double>(b.data()[i])));
        }
        INFO(name.str());
        if (max_ref == 0.0) {  // a constant (Llama 3's rope_freqs): no gradient in either build
          CHECK(max_err == 0.0);
          return;
        }
        CHECK(max_err / max_ref <= 1e-4);
        worst = std::max(worst, max_err / max_ref);
      },
      *gd, *gf);
  MESSAGE("float against double, " << threads << " thread(s): worst gradient error " << worst);
}

}  // namespace

TEST_CASE("backward equals central finite differences in double: tiny_gqa (tied, group 2)") {
  check_finite_differences<tlm::tiny_gqa>();
}

TEST_CASE("backward equals central finite differences in double: tiny_untied (separate output, group 4)") {
  check_finite_differences<tlm::tiny_untied>();
}

TEST_CASE("backward equals central finite differences in double: tiny_qwen2 (q/k/v biases, half-split pairing)") {
  check_finite_differences<tlm::tiny_qwen2>();
}

TEST_CASE("backward equals central finite differences in double: tiny_llama3 (Llama 3 RoPE scaling)") {
  check_finite_differences<tlm::tiny_llama3>();
}

TEST_CASE("backward equals central finite differences in double: tiny_traits (biases, llama3 scaling, qwen2 pairing, untied)") {
  check_finite_differences<tlm::tiny_traits>();
}

TEST_CASE("the traits change the computation: biases and scaling each move the loss") {
  // Guards the gradient checks above against a trait that is silently ignored (the
  // backward of a no-op would pass them).
  constexpr std::size_t B = 1, T = 6;
  const auto data = random_batch(B, T, 96, 61);
  // tiny_llama3 has tiny_gqa's sizes; its walk only adds rope_freqs at the end, so the
  // same seed gives the same parameters, and only the scaling differs.
  auto pg = random_params<tlm::tiny_gqa, double>(62);
  auto pl = random_params<tlm::tiny_llama3, double>(62);
  tlm::training<tlm::tiny_gqa, double> rg({.batch = B, .seq = T, .threads = 1});
  tlm::training<tlm::tiny_llama3, double> rl({.batch = B, .seq = T, .threads = 1});
  CHECK(rl.forward(*pl, data.tokens, data.targets) != rg.forward(*pg, data.tokens, data.targets));
  // Zeroing tiny_qwen2's biases changes its loss.
  auto pq = random_params<tlm::tiny_qwen2, double>(63);
  tlm::training<tlm::tiny_qwen2, double> rq({.batch = B, .seq = T, .threads = 1});
  const double with_bias = rq.forward(*pq, data.tokens, data.targets);
  for (auto& l : pq->layers)
    for (auto* b : {l.attn_q_bias.values().data(), l.attn_k_bias.values().data(), l.attn_v_bias.values().data()}) b[0] = 0.0;
  CHECK(rq.forward(*pq, data.tokens, data.targets) != with_bias);
  // Llama 3's divisors for tiny_llama3: kept, kept, blended, divided by the factor.
  const auto d = tlm::rope_divisors<tlm::tiny_llama3>();
  CHECK(d[0] == 1.0);
  CHECK(d[1] == 1.0);
  CHECK(d[2] > 1.0);
  CHECK(d[2] < 8.0);
  CHECK(d[3] == 8.0);
}

TEST_CASE("the float build agrees with the double build") {
  check_float_against_double<tlm::tiny_gqa>(1);
  check_float_against_double<tlm::tiny_untied>(1);
  check_float_against_double<tlm::tiny_gqa>(2);
  check_float_against_double<tlm::tiny_traits>(2);
}

TEST_CASE("gradients do not depend on the thread count") {
  constexpr std::size_t B = 4, T = 9;
  using C = tlm::tiny_gqa;
  auto p = tlm::convert<float>(*random_params<C, double>(31));
  const auto data = random_batch(B, T, C::vocab, 32);
  std::map<std::size_t, std::unique_ptr<tlm::trainable<C, float>>> grads;
  std::map<std::size_t, double> losses;
  for (std::size_t threads : {1, 2, 3}) {
    tlm::training<C, float> run({.batch = B, .seq = T, .threads = threads});
    grads[threads] = std::make_unique<tlm::trainable<C, float>>();
    losses[threads] = run.forward(*p, data.tokens, data.targets);
    run.backward(*p, *grads[threads]);
  }
  for (std::size_t threads : {2, 3}) {
    CHECK(losses[threads] == losses[1]);
    tlm::for_each_tensor(
        [&](const tlm::tensor_name& name, const auto& a, const auto& b) {
          INFO(name.str() << " at " << threads << " threads");
          CHECK(std::equal(a.values().begin(), a.values().end(), b.values().begin()));
        },
        *grads[1], *grads[threads]);
  }
}

TEST_CASE("ignored targets carry no loss and no gradient") {
  using C = tlm::tiny_gqa;
  constexpr std::size_t B = 1, T = 4;
  auto p = random_params<C, double>(41);
  tlm::training<C, double> run({.batch = B, .seq = T, .threads = 1});
  const std::vector<std::int32_t> tokens{1, 2, 3, 4};
  const std::vector<std::int32_t> all_ignored(T, tlm::ignore_target);
  CHECK(run.forward(*p, tokens, all_ignored) == 0.0);
  auto g = std::make_unique<tlm::trainable<C, double>>();
  run.backward(*p, *g);
  tlm::for_each_tensor(
      [](const tlm::tensor_name& name, const auto& t) {
        INFO(name.str());
        CHECK(std::all_of(t.values().begin(), t.values().end(), [](double v) { return v == 0.0; }));
      },
      *g);
  // The last position's loss does not depend on what the earlier targets say.
  const std::vector<std::int32_t> last_only{tlm::ignore_target, tlm::ignore_target, tlm::ignore_target, 7};
  const std::vector<std::int32_t> last_only2{tlm::ignore_target, tlm::ignore_target, tlm::ignore_target, 7};
  CHECK(run.forward(*p, tokens, last_only) == run.forward(*p, tokens, last_only2));
  const std::vector<std::int32_t> bad{1, 2, 3, static_cast<std::int32_t>(C::vocab)};
  CHECK_THROWS_WITH_AS(run.forward(*p, tokens, bad), doctest::Contains("outside the vocabulary"), tlm::error);
  const std::vector<std::int32_t> short_batch{1, 2, 3};
  CHECK_THROWS_AS(run.forward(*p, short_batch, short_batch), tlm::shape_error);
}

TEST_CASE("the embedding gradient of every row the batch uses equals finite differences, ignored targets included") {
  // A token at an ignored-target position still reaches later positions through
  // attention, so its embedding row has a gradient; only the last position of a sequence,
  // ignored, reaches nothing. Every row the batch uses is checked, since a sample of the
  // large embedding matrix misses most of them. Untied, so a row no token uses must be
  // exactly zero.
  using C = tlm::tiny_untied;
  constexpr std::size_t B = 2, T = 4, D = decltype(tlm::trainable<C, double>::token_embd)::cols;
  const std::int32_t x = tlm::ignore_target;
  // Token 12 is at an ignored position in the first sequence and a counted one in the
  // second (its rows add up); 23 is last in its sequence with its target ignored.
  const std::vector<std::int32_t> tokens{10, 11, 12, 13, 12, 21, 22, 23};
  const std::vector<std::int32_t> targets{x, 5, x, 7, 8, x, 9, x};
  auto p = random_params<C, double>(51);
  tlm::training<C, double> run({.batch = B, .seq = T, .threads = 1});
  auto g = std::make_unique<tlm::trainable<C, double>>();
  run.forward(*p, tokens, targets);
  run.backward(*p, *g);

  const auto row_max = [&](std::int32_t r) {
    double m = 0.0;
    for (std::size_t c = 0; c < D; ++c) m = std::max(m, std::abs(g->token_embd.data()[static_cast<std::size_t>(r) * D + c]));
    return m;
  };
  for (std::size_t r = 0; r < C::vocab; ++r) {
    const bool used = std::find(tokens.begin(), tokens.end(), static_cast<std::int32_t>(r)) != tokens.end();
    INFO("row " << r);
    if (!used || r == 23) CHECK(row_max(static_cast<std::int32_t>(r)) == 0.0);
    else CHECK(row_max(static_cast<std::int32_t>(r)) > 1e-6);  // ignored-target rows 10, 12 and 21 included
  }
  double worst = 0.0;
  for (const std::int32_t r : {10, 11, 12, 13, 21, 22, 23}) {
    const double scale = std::max(row_max(r), 1e-3);  // row 23 is all zero: compare with a typical size
    // Every 9th entry of the row and its largest one (each costs two forward passes; the
    // whole row's zero / non-zero pattern is checked above).
    std::vector<std::size_t> cols;
    for (std::size_t c = 0; c < D; c += 9) cols.push_back(c);
    std::size_t largest = 0;
    for (std::size_t c = 0; c < D; ++c)
      if (std::abs(g->token_embd.data()[static_cast<std::size_t>(r) * D + c]) >
          std::abs(g->token_embd.data()[static_cast<std::size_t>(r) * D + largest]))
        largest = c;
    cols.push_back(largest);
    double err = 0.0;
    for (const std::size_t c : cols) {
      double& w = p->token_embd.data()[static_cast<std::size_t>(r) * D + c];
      const double saved = w, h = 1e-5 * std::max(1.0, std::abs(saved));
      w = saved + h;
      const double up = run.forward(*p, tokens, targets);
      w = saved - h;
      const double down = run.forward(*p, tokens, targets);
      w = saved;
      err = std::max(err, std::abs((up - down) / (2 * h) - g->token_embd.data()[static_cast<std::size_t>(r) * D + c]));
    }
    INFO("row " << r << ": max |fd - grad| = " << err << ", max |grad| = " << row_max(r));
    CHECK(err <= 1e-6 * scale);
    worst = std::max(worst, err / scale);
  }
  MESSAGE("embedding rows against finite differences: worst relative error " << worst);
}

}  // namespace test_train_gradients
