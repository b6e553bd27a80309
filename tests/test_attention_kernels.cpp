// The attention kernels (kernels/attention_scalar.hpp) at every level this CPU runs,
// against their double references across block sizes 0..140, head sizes, strides and
// misalignments; and the SIMD levels' exp against its scalar form (bit for bit) and
// against the correctly rounded exp (ulps).
#include <doctest/doctest.h>

#include <tlm/kernels/attention.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernel_levels.hpp"

namespace k = tlm::kernels;
using tlm_test::level_guard;
using tlm_test::testable_levels;

namespace {

// |y - exp(x)| in units of the last place of the correctly rounded exp(x).
double ulps(float y, float x) {
  const double ref = std::exp(static_cast<double>(x));
  const float rounded = static_cast<float>(ref);
  const double ulp = std::ldexp(1.0, std::ilogb(rounded) - 23);
  return std::fabs(static_cast<double>(y) - ref) / ulp;
}

// Copies of `src` placed `offset` elements into guarded buffers, so reads or writes
// past the end and alignment assumptions show.
template <class T>
struct placed {
  std::vector<T> storage;
  T* data;
  placed(const std::vector<T>& src, std::size_t offset, T guard) : storage(src.size() + offset + 64, guard) {
    data = storage.data() + offset;
    std::copy(src.begin(), src.end(), data);
  }
};

std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float range) {
  std::uniform_real_distribution<float> d(-range, range);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<std::int8_t> random_codes(std::size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<std::int8_t> v(n);
  for (auto& c : v) c = static_cast<std::int8_t>(d(rng));
  return v;
}

constexpr std::size_t head_sizes[] = {64, 128, 16, 8, 24, 48, 80, 5, 33};

}  // namespace

TEST_CASE("exp_poly: within 1.02 ulp of exp over every 61st float of its normal range") {
  double worst = 0;
  float worst_x = 0;
  for (float sign : {1.0f, -1.0f}) {
    const float end = sign > 0 ? k::exp_constants::highest : k::exp_constants::lowest;
    const std::uint32_t last = std::bit_cast<std::uint32_t>(std::fabs(end));
    for (std::uint32_t b = 0; b <= last; b += 61) {
      const float x = sign * std::bit_cast<float>(b);
      const double e = ulps(k::exp_poly(x), x);
      if (e > worst) worst = e, worst_x = x;
    }
    const double e = ulps(k::exp_poly(end), end);  // the end itself
    worst = std::max(worst, e);
  }
  MESSAGE("exp_poly: max error " << worst << " ulp at x = " << worst_x);
  CHECK(worst <= 1.02);  // every float measured: 1.014 (attention_scalar.hpp)
}

TEST_CASE("exp_poly: the edges flush to zero or infinity, never a subnormal or a NaN from a number") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(k::exp_poly(-inf) == 0.0f);
  CHECK(k::exp_poly(-1e30f) == 0.0f);
  CHECK(k::exp_poly(-100.0f) == 0.0f);
  CHECK(k::exp_poly(std::nextafter(k::exp_constants::lowest, -inf)) == 0.0f);
  CHECK(k::exp_poly(k::exp_constants::lowest) >= std::numeric_limits<float>::min());
  CHECK(k::exp_poly(k::exp_constants::highest) < inf);
  CHECK(k::exp_poly(std::nextafter(k::exp_constants::highest, inf)) == inf);
  CHECK(k::exp_poly(inf) == inf);
  CHECK(k::exp_poly(1e30f) == inf);
  CHECK(std::isnan(k::exp_poly(std::numeric_limits<float>::quiet_NaN())));
  CHECK(k::exp_poly(0.0f) == 1.0f);
  CHECK(k::exp_poly(-0.0f) == 1.0f);
  CHECK(k::exp_poly(1e-30f) == 1.0f);
  std::size_t subnormal = 0;
  for (float x = -120.0f; x < 0.0f; x += 0.001f) {
    const float y = k::exp_poly(x);
    if (y != 0.0f && y < std::numeric_limits<float>::min()) ++subnormal;
  }
  CHECK(subnormal == 0);
}

TEST_CASE("the exp kernel at every level: sizes 0..140, wide and special inputs, misalignments") {
  level_guard guard;
  std::mt19937 rng(7);
  const float inf = std::numeric_limits<float>::infinity();
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    INFO("level " << tlm::kernel_level_name(level));
    double worst = 0;
    for (std::size_t n = 0; n <= 140; ++n) {
      // From far below the flush to zero up to exp(60), whose sums stay finite.
      auto s = random_floats(n, rng, 130.0f);
      for (auto& x : s) x = std::min(x, 60.0f);
      if (n > 3) s[1] = -inf, s[2] = 0.0f, s[3] = -1e30f;
      const float m = n % 3 == 0 ? 0.0f : 30.5f;
      const placed<float> ps(s, n % 4, 5.0f);
      placed<float> pp(std::vector<float>(n, 0.0f), (n + 1) % 4, -777.0f);
      const float sum = k::attention().exp(ps.data, n, m, pp.data);
      double ref_sum = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const float x = s[j] - m;
        CAPTURE(x);
        if (level == tlm::kernel_level::scalar) {
          CHECK(pp.data[j] == std::exp(x));
        } else {
          CHECK(std::bit_cast<std::uint32_t>(pp.data[j]) == std::bit_cast<std::uint32_t>(k::exp_poly(x)));
          if (pp.data[j] >= std::numeric_limits<float>::min()) worst = std::max(worst, ulps(pp.data[j], x));
        }
        ref_sum += pp.data[j];
      }
      CHECK(pp.data[n] == -777.0f);  // nothing past the end
      CHECK(std::fabs(sum - ref_sum) <= 1e-6 * ref_sum);
    }
    CHECK(worst <= 1.02);
    // NaN in, NaN out: a broken score is not hidden as a weight.
    std::vector<float> s{1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f}, p(3);
    k::attention().exp(s.data(), 3, 2.0f, p.data());
    CHECK(std::isnan(p[1]));
    CHECK(p[0] == doctest::Approx(std::exp(-1.0f)));
  }
}

TEST_CASE("scores and scores_q8 at every level against the double reference: n 0..140, head sizes, strides") {
  level_guard guard;
  std::mt19937 rng(11);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    INFO("level " << tlm::kernel_level_name(level));
    for (std::size_t E : head_sizes) {
      for (std::size_t n = 0; n <= 140; n += (E == 64 ? 1 : 7)) {
        CAPTURE(E);
        CAPTURE(n);
        const std::size_t stride = E + (n % 3) * 8;  // the cache (E) and wider rows (a training batch)
        const std::size_t off = n % 5;
        const auto q = random_floats(E, rng, 2.0f);
        const auto keys = random_floats(n * stride, rng, 3.0f);
        const placed<float> pq(q, off % 4, 9.0f), pk(keys, (off + 1) % 4, 9.0f);
        placed<float> s(std::vector<float>(n), off, -777.0f);
        std::vector<float> ref(n);
        const float scale = 0.125f;
        k::attention().scores(pq.data, pk.data, stride, n, E, scale, s.data);
        k::attention_scores_reference(q.data(), keys.data(), stride, n, E, scale, ref.data());
        for (std::size_t j = 0; j < n; ++j) {
          double mag = 0;  // sum |q k| scale: the size of the summation-order error
          for (std::size_t e = 0; e < E; ++e) mag += std::fabs(q[e] * keys[j * stride + e]) * scale;
          CHECK(std::fabs(s.data[j] - ref[j]) <= 2e-6 * mag + 1e-30);
        }
        CHECK(s.data[n] == -777.0f);

        const auto codes = random_codes(n * E, rng);
        auto ks = random_floats(n, rng, 0.05f);
        for (auto& x : ks) x = std::fabs(x);
        const placed<std::int8_t> pc(codes, off, std::int8_t{99});  // odd byte offsets included
        const placed<float> pks(ks, (off + 2) % 4, 9.0f);
        k::attention().scores_q8(pq.data, pc.data, pks.data, n, E, scale, s.data);
        k::attention_scores_q8_reference(q.data(), codes.data(), ks.data(), n, E, scale, ref.data());
        for (std::size_t j = 0; j < n; ++j) {
          double mag = 0;
          for (std::size_t e = 0; e < E; ++e) mag += std::fabs(q[e] * codes[j * E + e]) * ks[j] * scale;
          CHECK(std::fabs(s.data[j] - ref[j]) <= 2e-6 * mag + 1e-30);
        }
        CHECK(s.data[n] == -777.0f);
      }
    }
  }
}

TEST_CASE("accumulate and accumulate_q8 at every level against the double reference: n 0..140, head sizes") {
  level_guard guard;
  std::mt19937 rng(13);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    INFO("level " << tlm::kernel_level_name(level));
    for (std::size_t E : head_sizes) {
      for (std::size_t n = 0; n <= 140; n += (E == 64 ? 1 : 7)) {
        CAPTURE(E);
        CAPTURE(n);
        const std::size_t stride = E + (n % 3) * 8;
        const std::size_t off = n % 5;
        auto p = random_floats(n, rng, 1.0f);
        for (auto& x : p) x = std::fabs(x);
        const auto values = random_floats(n * stride, rng, 2.0f);
        const auto out0 = random_floats(E, rng, 1.0f);
        const float c = n % 2 == 0 ? 0.0f : 0.37f;  // 0: the first block, where the sum starts
        const placed<float> pp(p, off % 4, 9.0f), pv(values, (off + 3) % 4, 9.0f);
        placed<float> out(out0, off, -777.0f);
        std::vector<float> ref = out0;
        k::attention().accumulate(c, pp.data, pv.data, stride, n, E, out.data);
        k::attention_accumulate_reference(c, p.data(), values.data(), stride, n, E, ref.data());
        for (std::size_t e = 0; e < E; ++e) {
          double mag = std::fabs(c * out0[e]);
          for (std::size_t j = 0; j < n; ++j) mag += std::fabs(p[j] * values[j * stride + e]);
          CHECK(std::fabs(out.data[e] - ref[e]) <= 1e-5 * mag + 1e-30);
        }
        CHECK(out.data[E] == -777.0f);

        const auto codes = random_codes(n * E, rng);
        auto vs = random_floats(n, rng, 0.02f);
        for (auto& x : vs) x = std::fabs(x);
        const placed<std::int8_t> pc(codes, off, std::int8_t{99});
        const placed<float> pvs(vs, (off + 1) % 4, 9.0f);
        placed<float> out8(out0, (off + 2) % 5, -777.0f);
        ref = out0;
        k::attention().accumulate_q8(c, pp.data, pc.data, pvs.data, n, E, out8.data);
        k::attention_accumulate_q8_reference(c, p.data(), codes.data(), vs.data(), n, E, ref.data());
        for (std::size_t e = 0; e < E; ++e) {
          double mag = std::fabs(c * out0[e]);
          for (std::size_t j = 0; j < n; ++j) mag += std::fabs(p[j] * vs[j] * codes[j * E + e]);
          CHECK(std::fabs(out8.data[e] - ref[e]) <= 1e-5 * mag + 1e-30);
        }
        CHECK(out8.data[E] == -777.0f);
      }
    }
  }
}
