// The block operations on their own.
#include <doctest/doctest.h>

#include <tlm/ops.hpp>

#include <cmath>
#include <random>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_ops {

TEST_CASE("the pairwise sum of squares is closer to float64 than a sequential sum") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  double tree_worst = 0, seq_worst = 0;
  for (std::size_t n : {1000u, 65536u, 1u << 20}) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = u(rng) * std::pow(10.0f, static_cast<float>(static_cast<int>(i % 7) - 3));
    double exact = 0;
    float seq = 0;
    for (float v : x) {
      exact += static_cast<double>(v) * v;
      seq += v * v;
    }
    const double tree_err = std::fabs(tlm::sum_squares(x.data(), n) - exact) / exact;
    const double seq_err = std::fabs(seq - exact) / exact;
    MESSAGE("n = ", n, ": tree relative error ", tree_err, ", sequential ", seq_err);
    CHECK(tree_err < 1e-6);
    tree_worst = std::max(tree_worst, tree_err);
    seq_worst = std::max(seq_worst, seq_err);
  }
  CHECK(tree_worst < seq_worst);
}

TEST_CASE("rmsnorm normalises to unit RMS before the gain") {
  constexpr std::size_t N = 64;
  std::vector<float> x(N), g(N, 1.0f), y(N);
  for (std::size_t i = 0; i < N; ++i) x[i] = static_cast<float>(i) - 20.0f;
  tlm::rmsnorm<N>(std::span<const float, N>(x.data(), N), std::span<const float, N>(g.data(), N), 0.0f,
                  std::span<float, N>(y.data(), N));
  double ss = 0;
  for (float v : y) ss += static_cast<double>(v) * v;
  CHECK(std::sqrt(ss / N) == doctest::Approx(1.0).epsilon(1e-6));
}

TEST_CASE("softmax in attention is stable for huge scores and reads only the given positions") {
  using C = tlm::tiny_gqa;
  constexpr std::size_t E = tlm::head_dim<C>;
  std::vector<float> q(E, 0.0f), keys(3 * E, 0.0f), values(3 * E, 0.0f), scores(3), out(E);
  q[0] = 1e4f;
  keys[0] = 1.0f;       // position 0: score 1e4 / sqrt(E)
  keys[E] = 1.0f;       // position 1: the same
  keys[2 * E] = -1.0f;  // position 2: far below
  for (std::size_t e = 0; e < E; ++e) {
    values[e] = 1.0f;
    values[E + e] = 3.0f;
    values[2 * E + e] = 1000.0f;
  }
  tlm::attend<C>(std::span<const float, E>(q.data(), E), keys, values, scores, std::span<float, E>(out.data(), E));
  for (float v : out) CHECK(v == doctest::Approx(2.0));
  CHECK(scores[2] == 0.0f);
  // Two positions only: position 2 is never read.
  tlm::attend<C>(std::span<const float, E>(q.data(), E), std::span<const float>(keys.data(), 2 * E),
                 std::span<const float>(values.data(), 2 * E), scores, std::span<float, E>(out.data(), E));
  CHECK(out[0] == doctest::Approx(2.0));
}

TEST_CASE("silu-gated MLP activation") {
  constexpr std::size_t F = 4;
  const float gate[F] = {0.0f, 1.0f, -1.0f, 20.0f}, up[F] = {5.0f, 2.0f, 2.0f, 1.0f};
  float out[F];
  tlm::swiglu<F>(std::span<const float, F>(gate), std::span<const float, F>(up), std::span<float, F>(out));
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == doctest::Approx(2.0 / (1.0 + std::exp(-1.0))));
  CHECK(out[2] == doctest::Approx(-2.0 / (1.0 + std::exp(1.0))));
  CHECK(out[3] == doctest::Approx(20.0));
}

}  // namespace test_ops
