// The typed products against a naive loop, on small f32 matrices.
#include <doctest/doctest.h>

#include <tlm/linalg.hpp>

#include <cmath>
#include <random>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_linalg {

template <std::size_t R, std::size_t C>
void check_matvec(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  tlm::mat<R, C, tlm::owned<>> w;
  tlm::vec<C> x;
  for (auto& v : w.values()) v = u(rng);
  for (std::size_t i = 0; i < C; ++i) x[i] = u(rng);
  const tlm::vec<R> y = tlm::matvec(w, x);
  for (std::size_t r = 0; r < R; ++r) {
    double want = 0, scale = 0;
    for (std::size_t c = 0; c < C; ++c) {
      want += static_cast<double>(w(r, c)) * x[c];
      scale += std::fabs(static_cast<double>(w(r, c)) * x[c]);
    }
    CHECK(std::fabs(y[r] - want) <= 1e-6 * scale + 1e-30);
  }
}

TEST_CASE("matvec on f32 matrices equals a naive loop") {
  check_matvec<1, 1>(1);
  check_matvec<3, 5>(2);
  check_matvec<7, 33>(3);
  check_matvec<16, 64>(4);
  check_matvec<33, 100>(5);
}

TEST_CASE("matmul over a batch of rows equals one matvec per row") {
  constexpr std::size_t R = 9, C = 17, n = 5;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  tlm::mat<R, C, tlm::owned<>> w;
  for (auto& v : w.values()) v = u(rng);
  tlm::rows<C> x(n);
  tlm::rows<R> y;
  for (auto& v : x.values()) v = u(rng);
  tlm::matmul(w, x, y);
  REQUIRE(y.count() == n);
  for (std::size_t b = 0; b < n; ++b) {
    tlm::vec<C> xb;
    for (std::size_t c = 0; c < C; ++c) xb[c] = x.row(b)[c];
    const auto yb = tlm::matvec(w, xb);
    for (std::size_t r = 0; r < R; ++r) CHECK(y.row(b)[r] == doctest::Approx(yb[r]).epsilon(1e-5));
  }
}

TEST_CASE("a product with an unbound mapped matrix is an error, not a crash") {
  tlm::mat<4, 32> w;
  tlm::vec<32> x;
  CHECK_THROWS_AS(tlm::matvec(w, x), tlm::shape_error);
}

}  // namespace test_linalg
