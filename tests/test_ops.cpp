// The block operations on their own.
#include <doctest/doctest.h>

#include <tlm/block.hpp>
#include <tlm/ops.hpp>
#include <tlm/thread_pool.hpp>

#include <algorithm>
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

TEST_CASE("rmsnorm_backward_rows on 1, 2 and 3 threads is the row loop on one thread, bit for bit") {
  // D = 200: four runs of columns for the gain's sum, the last one short.
  constexpr std::size_t D = 200, n = 37;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  tlm::rows<D, float> x, dy;
  x.resize(n);
  dy.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < D; ++j) x.row(i)[j] = normal(rng), dy.row(i)[j] = normal(rng);
  std::vector<float> gain(D);
  for (auto& g : gain) g = 1.0f + 0.1f * normal(rng);
  const std::span<const float, D> gs(gain.data(), D);
  // The definition: every row in order on one thread, dgain and dx accumulated from 0.5.
  tlm::rows<D, float> want_dx;
  want_dx.resize(n);
  std::vector<float> want_dgain(D, 0.5f);
  for (std::size_t i = 0; i < n; ++i) {
    std::fill(want_dx.row(i).begin(), want_dx.row(i).end(), 0.5f);
    tlm::rmsnorm_backward<D, float, float>(x.row(i), gs, 1e-5f, dy.row(i), want_dx.row(i), want_dgain.data());
  }
  for (std::size_t threads : {1, 2, 3}) {
    CAPTURE(threads);
    tlm::thread_pool pool(threads);
    tlm::rows<D, float> dx;
    dx.resize(n);
    for (std::size_t i = 0; i < n; ++i) std::fill(dx.row(i).begin(), dx.row(i).end(), 0.5f);
    std::vector<float> dgain(D, 0.5f), rms;
    tlm::detail::rmsnorm_backward_rows<D, float, float>(x, gs, 1e-5f, dy, dx, dgain.data(), rms, &pool);
    CHECK(dgain == want_dgain);
    for (std::size_t i = 0; i < n; ++i) CHECK(std::equal(dx.row(i).begin(), dx.row(i).end(), want_dx.row(i).begin()));
    // A frozen gain (LoRA): dx alone, the same.
    std::vector<float> untouched(D, 0.5f);
    tlm::rows<D, float> dx2;
    dx2.resize(n);
    for (std::size_t i = 0; i < n; ++i) std::fill(dx2.row(i).begin(), dx2.row(i).end(), 0.5f);
    tlm::detail::rmsnorm_backward_rows<D, float, float>(x, gs, 1e-5f, dy, dx2, nullptr, rms, &pool);
    for (std::size_t i = 0; i < n; ++i) CHECK(std::equal(dx2.row(i).begin(), dx2.row(i).end(), want_dx.row(i).begin()));
  }
}

}  // namespace test_ops
