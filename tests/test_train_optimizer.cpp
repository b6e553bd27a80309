// AdamW, its schedule and its error handling; training a tiny model from scratch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "train_common.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_optimizer {

using tlm_test::random_params;

TEST_CASE("learning rate: linear warm-up, then cosine towards min_lr, the last step above it") {
  tlm::adamw_options o{.lr = 1.0, .warmup = 4, .total_steps = 14, .min_lr = 0.1};
  CHECK(tlm::learning_rate(o, 1) == doctest::Approx(0.25));
  CHECK(tlm::learning_rate(o, 4) == doctest::Approx(1.0));
  CHECK(tlm::learning_rate(o, 5) == doctest::Approx(1.0));  // the first step after warm-up: progress 0
  CHECK(tlm::learning_rate(o, 10) == doctest::Approx(0.1 + 0.45 * (1 + std::cos(M_PI * 0.5))));
  CHECK(tlm::learning_rate(o, 14) == doctest::Approx(0.1 + 0.45 * (1 + std::cos(M_PI * 0.9))));
  CHECK(tlm::learning_rate(o, 14) > 0.1);
  CHECK(tlm::learning_rate(o, 15) == doctest::Approx(0.1));
  CHECK(tlm::learning_rate(o, 100) == doctest::Approx(0.1));
  tlm::adamw_options constant{.lr = 0.5};
  CHECK(tlm::learning_rate(constant, 1) == 0.5);
  CHECK(tlm::learning_rate(constant, 1000) == 0.5);
}

TEST_CASE("learning rate: with no warm-up, step 1 of 3 is at the peak and step 3 above min_lr (0)") {
  // The trainer's defaults over a 3-step run: 3e-4, then progress 1/3 and 2/3.
  const tlm::adamw_options o{.lr = 3e-4, .warmup = 0, .total_steps = 3, .min_lr = 0};
  CHECK(tlm::learning_rate(o, 1) == doctest::Approx(3e-4).epsilon(1e-12));
  CHECK(tlm::learning_rate(o, 2) == doctest::Approx(2.25e-4).epsilon(1e-12));
  CHECK(tlm::learning_rate(o, 3) == doctest::Approx(7.5e-5).epsilon(1e-12));
}

TEST_CASE("one AdamW step equals the formula, element by element, with decay on matrices only") {
  using C = tlm::tiny_gqa;
  auto p = random_params<C, double>(1);
  auto g = random_params<C, double>(2);
  auto before = tlm::convert<double>(*p);
  tlm::adamw_options o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.5};
  tlm::adamw<tlm::trainable<C, double>> opt(o);
  const auto r = opt.step(*p, *g);
  CHECK(r.step == 1);
  CHECK(opt.steps() == 1);
  // Step 1: m = (1-b1) g, v = (1-b2) g², bias-corrected m̂ = g, v̂ = g²:
  // p' = p (1 - lr wd) - lr g / (|g| + eps).
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& after, const auto& b, const auto& gg) {
        using U = std::remove_cvref_t<decltype(after)>;
        const double decay = U::rank == 2 ? 1 - 0.01 * 0.5 : 1.0;
        for (std::size_t i = 0; i < after.values().size(); ++i) {
          const double gi = gg.data()[i];
          const double want = b.data()[i] * decay - 0.01 * gi / (std::abs(gi) + 1e-6);
          INFO(name.str() << "[" << i << "]");
          REQUIRE(after.data()[i] == doctest::Approx(want).epsilon(1e-12));
        }
      },
      *p, *before, *g);
}

TEST_CASE("an AdamW step split over threads is bit for bit the step on one thread") {
  using C = tlm::tiny_train;
  auto p1 = random_params<C, float>(8);
  auto p2 = tlm::convert<float>(*p1);
  auto g = random_params<C, float>(9);
  tlm::adamw<tlm::trainable<C, float>> a1({.lr = 0.01, .weight_decay = 0.1, .clip = 0.5});
  tlm::adamw<tlm::trainable<C, float>> a2({.lr = 0.01, .weight_decay = 0.1, .clip = 0.5});
  tlm::thread_pool pool(3);
  for (int s = 0; s < 3; ++s) {
    const auto r1 = a1.step(*p1, *g);
    const auto r2 = a2.step(*p2, *g, &pool);
    CHECK(r1.grad_norm == r2.grad_norm);
  }
  tlm::for_each_tensor(
      [](const tlm::tensor_name& name, const auto& a, const auto& b) {
        INFO(name.str());
        CHECK(std::equal(a.values().begin(), a.values().end(), b.values().begin()));
      },
      *p1, *p2);
}

TEST_CASE("zero on a pool clears every value of every tensor, pieces of any size") {
  using C = tlm::tiny_train;
  tlm::thread_pool pool(3);
  // 1 value a task, a piece that divides no tensor, and the default (one piece a tensor here).
  for (std::size_t piece : {std::size_t{1}, std::size_t{997}, std::size_t{1} << 16}) {
    CAPTURE(piece);
    auto g = random_params<C, float>(10);
    tlm::zero(*g, &pool, piece);
    tlm::for_each_tensor(
        [](const tlm::tensor_name& name, const auto& t) {
          INFO(name.str());
          CHECK(std::all_of(t.values().begin(), t.values().end(), [](float v) { return v == 0.0f; }));
        },
        *g);
  }
}

TEST_CASE("clipping scales gradients to the global norm") {
  using C = tlm::tiny_gqa;
  auto p = random_params<C, double>(3);
  auto g = random_params<C, double>(4);
  double sq = 0.0;
  tlm::for_each_tensor([&](const tlm::tensor_name&, const auto& t) {
    for (double v : t.values()) sq += v * v;
  }, *g);
  tlm::adamw<tlm::trainable<C, double>> opt({.lr = 0.01, .clip = 1.0});
  const auto r = opt.step(*p, *g);
  CHECK(r.grad_norm == doctest::Approx(std::sqrt(sq)));
  CHECK(r.clip_scale == doctest::Approx(1.0 / std::sqrt(sq)).epsilon(1e-5));
  // m after one step is (1 - b1) times the clipped gradient.
  CHECK(opt.m().output_norm.data()[0] == doctest::Approx(0.1 * g->output_norm.data()[0] * r.clip_scale));
}

TEST_CASE("a clipped float step: every v is (1 - b2)(g * clip_scale)^2 and every m (1 - b1) g * clip_scale") {
  // The float build runs the SIMD AdamW kernel; the clip factor must reach the squared
  // gradient as well as the first moment, in every tensor.
  using C = tlm::tiny_train;
  auto p = random_params<C, float>(12);
  auto g = random_params<C, float>(13);
  tlm::adamw<tlm::trainable<C, float>> opt({.lr = 0.01, .beta1 = 0.8, .beta2 = 0.9, .clip = 0.5});
  const auto r = opt.step(*p, *g);
  REQUIRE(r.clip_scale < 0.1);  // the gradient's norm is far above 0.5: clipping is active
  std::size_t checked = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& gg, const auto& m, const auto& v) {
        int bad = 0;
        for (std::size_t i = 0; i < gg.values().size(); ++i) {
          const double gi = static_cast<double>(gg.data()[i]) * static_cast<float>(r.clip_scale);
          const double want_v = 0.1 * gi * gi, want_m = 0.2 * gi;
          if (std::abs(v.data()[i] - want_v) > 1e-6 * want_v || std::abs(m.data()[i] - want_m) > 1e-6 * std::abs(want_m)) ++bad;
          ++checked;
        }
        INFO(name.str());
        CHECK(bad == 0);
      },
      *g, opt.m(), opt.v());
  CHECK(checked == tlm::parameter_count(*g));
}

TEST_CASE("a NaN or infinity in a gradient names the tensor and the step and changes nothing") {
  using C = tlm::tiny_gqa;
  auto p = random_params<C, float>(5);
  auto g = random_params<C, float>(6);
  tlm::adamw<tlm::trainable<C, float>> opt({.lr = 0.01});
  opt.step(*p, *g);
  auto p_before = tlm::convert<float>(*p);
  auto m_before = tlm::convert<float>(opt.m());
  g->layers[1].ffn_up.data()[17] = std::nanf("");
  CHECK_THROWS_WITH_AS(opt.step(*p, *g),
                       doctest::Contains("adamw step 2: the gradient of blk.1.ffn_up.weight holds a NaN at index 17"),
                       tlm::numeric_error);
  g->layers[1].ffn_up.data()[17] = 0.0f;
  g->output_norm.data()[3] = INFINITY;
  CHECK_THROWS_WITH_AS(opt.step(*p, *g), doctest::Contains("output_norm.weight holds an infinity"), tlm::numeric_error);
  CHECK(opt.steps() == 1);
  tlm::for_each_tensor(
      [](const tlm::tensor_name& name, const auto& a, const auto& b) {
        INFO(name.str());
        CHECK(std::equal(a.values().begin(), a.values().end(), b.values().begin()));
      },
      *p, *p_before);
  tlm::for_each_tensor(
      [](const tlm::tensor_name& name, const auto& a, const auto& b) {
        INFO(name.str());
        CHECK(std::equal(a.values().begin(), a.values().end(), b.values().begin()));
      },
      opt.m(), *m_before);
}

TEST_CASE("bad AdamW options are rejected with the rule they break") {
  using W = tlm::trainable<tlm::tiny_gqa, float>;
  CHECK_THROWS_WITH_AS(tlm::adamw<W>({.lr = -1}), doctest::Contains("lr must be"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::adamw<W>({.beta1 = 1.0}), doctest::Contains("beta1"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::adamw<W>({.eps = 0}), doctest::Contains("eps"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::adamw<W>({.clip = NAN}), doctest::Contains("clip"), tlm::error);
}

TEST_CASE("a non-finite loss is an error before any gradient exists") {
  using C = tlm::tiny_gqa;
  auto p = random_params<C, float>(7);
  p->output_norm.data()[0] = INFINITY;
  tlm::training<C, float> run({.batch = 1, .seq = 3, .threads = 1});
  const std::vector<std::int32_t> tokens{1, 2, 3}, targets{2, 3, 4};
  CHECK_THROWS_WITH_AS(run.forward(*p, tokens, targets), doctest::Contains("the loss is"), tlm::numeric_error);
  auto g = std::make_unique<tlm::trainable<C, float>>();
  tlm::training<C, float> fresh({.batch = 1, .seq = 3, .threads = 1});
  CHECK_THROWS_WITH_AS(fresh.backward(*p, *g), doctest::Contains("call forward() first"), tlm::error);
}

TEST_CASE("training tiny_train from scratch on a repeating text drives the loss below 0.1") {
  using C = tlm::tiny_train;
  constexpr std::size_t B = 4, T = 16;
  const std::string text = "the quick brown fox jumps over the lazy dog. ";
  auto p = std::make_unique<tlm::trainable<C, float>>();
  tlm::init_weights(*p, 1234);
  auto g = std::make_unique<tlm::trainable<C, float>>();
  tlm::training<C, float> run({.batch = B, .seq = T, .threads = 2});
  tlm::adamw<tlm::trainable<C, float>> opt({.lr = 3e-3, .weight_decay = 0.01, .clip = 1.0, .warmup = 20});
  std::vector<std::int32_t> tokens(B * T), targets(B * T);
  double first = 0.0, loss = 0.0;
  int step = 0;
  for (; step < 400; ++step) {
    for (std::size_t b = 0; b < B; ++b) {
      const std::size_t start = (static_cast<std::size_t>(step) * 7 + b * 13) % text.size();
      for (std::size_t t = 0; t < T; ++t) {
        tokens[b * T + t] = static_cast<unsigned char>(text[(start + t) % text.size()]);
        targets[b * T + t] = static_cast<unsigned char>(text[(start + t + 1) % text.size()]);
      }
    }
    loss = run.forward(*p, tokens, targets);
    if (step == 0) first = loss;
    if (loss < 0.1) break;
    tlm::zero(*g);
    run.backward(*p, *g);
    opt.step(*p, *g, &run.pool());
  }
  MESSAGE("loss " << first << " -> " << loss << " after " << step << " steps");
  CHECK(first > 5.0);  // about log(512) at the start
  CHECK(loss < 0.1);
}

}  // namespace test_train_optimizer
