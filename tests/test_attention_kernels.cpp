// The attention kernels (kernels/attention_scalar.hpp) at every level this CPU runs,
// against their double references across block sizes 0..140, head sizes, strides and
// misalignments; and the SIMD levels' exp against its scalar form (bit for bit) and
// against the correctly rounded exp (ulps); and every level against stored outputs of the
// double references, so a level is held to fixed numbers on whichever machine runs it.
#include <doctest/doctest.h>

#include <tlm/kernels/attention.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_levels.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_attention_kernels {

namespace k = tlm::kernels;
using tlm_test::level_guard;
using tlm_test::placed;
using tlm_test::random_codes;
using tlm_test::random_floats;
using tlm_test::testable_levels;

namespace {

// |y - exp(x)| in units of the last place of the correctly rounded exp(x).
double ulps(float y, float x) {
  const double ref = std::exp(static_cast<double>(x));
  const float rounded = static_cast<float>(ref);
  const double ulp = std::ldexp(1.0, std::ilogb(rounded) - 23);
  return std::fabs(static_cast<double>(y) - ref) / ulp;
}

constexpr std::size_t head_sizes[] = {64, 128, 16, 8, 24, 48, 80, 5, 33};

namespace fixture {

// Inputs from an integer hash, exact in float and the same on every platform (unlike
// std::uniform_real_distribution, whose output the standard leaves open).
float input(std::uint32_t seed, std::uint32_t i, float range) {
  std::uint32_t h = (seed * 0x9E3779B1u) ^ (i * 0x85EBCA77u);
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return static_cast<float>(static_cast<int>(h % 2049u) - 1024) * (range / 1024.0f);
}
std::int8_t code(std::uint32_t seed, std::uint32_t i) {
  return static_cast<std::int8_t>(static_cast<int>(input(seed, i, 1024.0f)) % 128);
}
float positive(std::uint32_t seed, std::uint32_t i) { return (input(seed, i, 1024.0f) + 1025.0f) / 65536.0f; }

// 37 keys: two whole blocks of 16 and a tail of 5, so a block's offset into the key or
// value scales shows; E 64 (the model's head size) takes every SIMD level's own path.
constexpr std::size_t n = 37, E = 64, stride = 72;
constexpr float scale = 0.125f, c = 0.375f;

// Printed with %a from the double references of tlm/kernels/attention.hpp on the inputs
// above (each rounded once to float). They are stored rather than computed so that a
// level is held to fixed numbers wherever it runs; the test checks that the references
// still give them bit for bit.
constexpr float want_scores[] = {
    -0x1.ab974p-1f, -0x1.4fac18p+1f, -0x1.436fcp+1f, -0x1.b1339p+0f,
    -0x1.1c8cfcp+2f, 0x1.8d303p+1f, 0x1.c1d33p+0f, -0x1.4f078p+0f,
    -0x1.283d18p+1f, -0x1.5fc67p+0f, -0x1.042fp+0f, 0x1.fdf24p+0f,
    -0x1.66ffcp-1f, -0x1.98ea98p+1f, 0x1.b22dep+0f, -0x1.898p-4f,
    0x1.fff61p+0f, 0x1.5d798p+1f, -0x1.9c152cp+2f, 0x1.8c108p-3f,
    -0x1.4d70ep+1f, -0x1.3e9a8p-3f, 0x1.dbd44p+0f, 0x1.fe11ep+0f,
    -0x1.d242dp+1f, -0x1.b1da6p+0f, -0x1.4733e8p+1f, -0x1.4ea2p-1f,
    0x1.63c7d8p+1f, -0x1.d31528p+1f, -0x1.ff7ep-4f, 0x1.e2a2fp+0f,
    -0x1.64fd8p-3f, -0x1.ca227p+0f, 0x1.e9f9cp-2f, -0x1.4296p-3f,
    0x1.423d9p+1f};
constexpr float want_scores_q8[] = {
    -0x1.a6d366p-2f, 0x1.118f36p-4f, -0x1.995f76p+0f, -0x1.72e956p-1f,
    0x1.9d84aap-4f, -0x1.d98dep-2f, 0x1.4c33c6p+0f, 0x1.010548p+1f,
    -0x1.24d7fcp-1f, -0x1.6b66a4p+0f, 0x1.a7adc6p-2f, -0x1.bd4dbcp-6f,
    0x1.0f80cep+2f, 0x1.0f1098p-7f, -0x1.9e494p-2f, -0x1.7a9dd4p-5f,
    -0x1.e72d5cp-5f, 0x1.961b58p-1f, 0x1.02d242p+0f, 0x1.17f518p-1f,
    0x1.cf8548p+1f, 0x1.a27d4cp+1f, 0x1.68514ep+1f, -0x1.0ee6e4p+1f,
    0x1.f08098p-2f, -0x1.d5e6ecp+0f, 0x1.bbb97p-1f, 0x1.018d94p-4f,
    0x1.443018p-4f, -0x1.81843cp+0f, 0x1.a3480cp-3f, -0x1.a2f0d4p-3f,
    -0x1.6549fp+2f, 0x1.4f37aep+1f, -0x1.7fded2p+0f, 0x1.563342p+1f,
    -0x1.8b7522p+0f};
constexpr float want_accumulate[] = {
    -0x1.faba2p+0f, 0x1.6d1cp-4f, -0x1.2f0a48p+1f, 0x1.7e1e98p+2f,
    -0x1.503c48p+1f, -0x1.d2d48p+0f, -0x1.0ea88cp+2f, -0x1.664308p+1f,
    -0x1.54564p+1f, -0x1.5396cp-2f, -0x1.878e2p-1f, -0x1.65aef4p+2f,
    -0x1.2ca7ap-1f, 0x1.c0f848p+1f, 0x1.e9d64p+0f, -0x1.a558cp-1f,
    -0x1.27b138p+1f, -0x1.78d2a8p+1f, 0x1.40bd44p+2f, 0x1.9f21e4p+2f,
    -0x1.9232e8p+1f, -0x1.cfbec8p+1f, -0x1.b989ep+0f, 0x1.1e3a98p+2f,
    -0x1.5c115p+2f, 0x1.1d1848p+3f, -0x1.1ce094p+2f, 0x1.2f5aep-1f,
    -0x1.22277cp+2f, -0x1.f136ep-1f, -0x1.11f13p+1f, 0x1.274b54p+2f,
    -0x1.10ac7p+1f, -0x1.11ef84p+2f, -0x1.75ae98p+1f, 0x1.57342p+1f,
    0x1.0fbb26p+3f, 0x1.74ad98p+2f, -0x1.28318p+1f, -0x1.051aa8p+1f,
    -0x1.a5e76p+1f, 0x1.e4a08p+1f, 0x1.dfacfp+1f, 0x1.023638p+1f,
    0x1.32b58p+2f, 0x1.87217p+2f, 0x1.e311p-2f, -0x1.828dfp+1f,
    -0x1.a2a228p+2f, 0x1.99264p-1f, -0x1.b280ep+0f, 0x1.97cf0cp+2f,
    0x1.5d658p-2f, -0x1.86242p+0f, 0x1.3b778p+0f, 0x1.7cba6p+0f,
    -0x1.0ee7p+1f, -0x1.4cafe4p+3f, -0x1.2fbf4p+0f, -0x1.8811cp+0f,
    -0x1.765bap+0f, -0x1.12dccp-2f, -0x1.6d991p+1f, -0x1.629184p+2f};
constexpr float want_accumulate_q8[] = {
    0x1.7efd7ep+1f, 0x1.e56adcp+1f, 0x1.24ffb2p-2f, -0x1.1d365cp+0f,
    0x1.143b72p+0f, 0x1.473892p+2f, -0x1.935ceep+1f, -0x1.51ca8cp+2f,
    0x1.5e258ap+3f, -0x1.21812cp+0f, 0x1.58bf5ep+2f, 0x1.9dcd78p+2f,
    -0x1.849374p+2f, -0x1.abb67p+2f, -0x1.e52706p-1f, -0x1.91ecap-3f,
    0x1.534fc4p+3f, 0x1.be6caap+0f, 0x1.b09d7ep+1f, 0x1.53f812p+2f,
    -0x1.2b24cp+1f, -0x1.595cdcp+3f, -0x1.f46c58p-3f, -0x1.124dfap+3f,
    0x1.33b10ep+2f, 0x1.f9c0c4p+1f, -0x1.db0d9ep+2f, 0x1.2fc9bap+2f,
    -0x1.9e8378p-1f, -0x1.4ca7e8p+1f, 0x1.fcfa9ap+2f, 0x1.0cc8dp+1f,
    0x1.04a1dcp+2f, 0x1.59db28p+3f, -0x1.8b1f92p+2f, 0x1.580926p+0f,
    0x1.41b57ap+2f, -0x1.7edbdep+2f, -0x1.4d2cccp+1f, 0x1.bf3a32p+0f,
    -0x1.54315ap+2f, 0x1.78011cp-1f, 0x1.da5c0ep+1f, -0x1.7af2cap+1f,
    -0x1.ab62e8p-4f, 0x1.4ac41cp+2f, -0x1.46071ap+3f, -0x1.26ec6p+2f,
    -0x1.a4b3ep-1f, 0x1.2787b4p+3f, -0x1.f5a15p+0f, 0x1.cd7e86p+0f,
    0x1.373098p+2f, -0x1.08c542p+3f, -0x1.092264p+1f, 0x1.0e40c4p+1f,
    0x1.7cd0f6p+1f, 0x1.684ac8p+2f, 0x1.0bf81p+1f, 0x1.047fd2p+1f,
    -0x1.4766c8p+2f, 0x1.897fd4p+2f, 0x1.792654p+0f, -0x1.81d982p+1f};
}  // namespace fixture

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

TEST_CASE("the exp kernel at every level: sizes 0..140, scales, wide and special inputs, misalignments") {
  level_guard guard;
  std::mt19937 rng(7);
  const float inf = std::numeric_limits<float>::infinity();
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    INFO("level " << tlm::kernel_level_name(level));
    double worst = 0;
    for (std::size_t n = 0; n <= 140; ++n) {
      // 1 (decode, cross-entropy) or a head's 1 / sqrt(E) on raw scores (training tiles).
      const float scale = n % 2 == 0 ? 1.0f : 0.125f + 0.01f * static_cast<float>(n % 5);
      // From far below the flush to zero up to exp(60), whose sums stay finite.
      auto s = random_floats(n, rng, 130.0f);
      for (auto& x : s) x = std::min(x * (1.0f / scale), 60.0f / scale);
      if (n > 3) s[1] = -inf, s[2] = 0.0f, s[3] = -1e30f;
      const float m = n % 3 == 0 ? 0.0f : 30.5f;
      const placed<float> ps(s, n % 4, 5.0f);
      placed<float> pp(std::vector<float>(n, 0.0f), (n + 1) % 4, -777.0f);
      const float sum = k::attention().exp(ps.data, n, scale, m, pp.data);
      double ref_sum = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const bool scalar = level == tlm::kernel_level::scalar;
        // The scalar level rounds the product and the difference apart; the SIMD levels once.
        const float x = scalar ? scale * s[j] - m : std::fma(scale, s[j], -m);
        CAPTURE(x);
        CAPTURE(scale);
        if (scalar) {
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
    k::attention().exp(s.data(), 3, 1.0f, 2.0f, p.data());
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

        const auto codes = random_codes(n * E, rng, -127);
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

// The AVX-512 level scores heads of 64 and 128 with the query in registers and the keys'
// products written out (attention_avx512::group_dots_fixed), other sizes with a loop;
// both are the same operations in the same order. A head padded with 16 zeros takes the
// loop and adds only zero products, so its scores must be the same bits.
TEST_CASE("scores and scores_q8 of heads of 64 and 128 equal those of the same heads padded with zeros, bit for bit") {
  level_guard guard;
  std::mt19937 rng(12);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    INFO("level " << tlm::kernel_level_name(level));
    for (std::size_t E : {std::size_t{64}, std::size_t{128}}) {
      const std::size_t P = E + 16;
      for (std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{37}, std::size_t{64}}) {
        CAPTURE(E);
        CAPTURE(n);
        const auto q = random_floats(E, rng, 2.0f);
        const auto keys = random_floats(n * E, rng, 3.0f);
        const auto codes = random_codes(n * E, rng, -127);
        auto ks = random_floats(n, rng, 0.05f);
        for (auto& x : ks) x = std::fabs(x) + 0.01f;
        std::vector<float> qp(P, 0.0f), keys_p(n * P, 0.0f);
        std::vector<std::int8_t> codes_p(n * P, 0);
        std::copy(q.begin(), q.end(), qp.begin());
        for (std::size_t j = 0; j < n; ++j) {
          std::copy_n(keys.begin() + static_cast<std::ptrdiff_t>(j * E), E, keys_p.begin() + static_cast<std::ptrdiff_t>(j * P));
          std::copy_n(codes.begin() + static_cast<std::ptrdiff_t>(j * E), E, codes_p.begin() + static_cast<std::ptrdiff_t>(j * P));
        }
        std::vector<float> s(n), sp(n);
        k::attention().scores(q.data(), keys.data(), E, n, E, 0.125f, s.data());
        k::attention().scores(qp.data(), keys_p.data(), P, n, P, 0.125f, sp.data());
        for (std::size_t j = 0; j < n; ++j) CHECK(std::bit_cast<std::uint32_t>(s[j]) == std::bit_cast<std::uint32_t>(sp[j]));
        k::attention().scores_q8(q.data(), codes.data(), ks.data(), n, E, 0.125f, s.data());
        k::attention().scores_q8(qp.data(), codes_p.data(), ks.data(), n, P, 0.125f, sp.data());
        for (std::size_t j = 0; j < n; ++j) CHECK(std::bit_cast<std::uint32_t>(s[j]) == std::bit_cast<std::uint32_t>(sp[j]));
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

        const auto codes = random_codes(n * E, rng, -127);
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

namespace {
// SwiGLU's definitions in double: silu(g) * u, and the backward's two terms.
double swiglu_double(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }
double swiglu_dgate_double(double a, double u, double dh) {
  const double s = 1.0 / (1.0 + std::exp(-a));
  return dh * u * s * (1.0 + a * (1.0 - s));
}
double swiglu_dup_double(double a, double dh) { return dh * a / (1.0 + std::exp(-a)); }
}  // namespace

TEST_CASE("swiglu and swiglu_backward at every level against double: n 0..140, misalignments, in place, edges") {
  level_guard guard;
  std::mt19937 rng(29);
  const double eps = std::ldexp(1.0, -23);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    INFO("level " << tlm::kernel_level_name(level));
    for (std::size_t n = 0; n <= 140; ++n) {
      CAPTURE(n);
      auto gate = random_floats(n, rng, 12.0f);
      // Past the exp's edges both ways (exp(-g) overflows or flushes to 0), and zero.
      if (n > 4) gate[1] = -100.0f, gate[2] = 100.0f, gate[3] = 0.0f, gate[4] = -1.2785f;
      const auto up = random_floats(n, rng, 2.0f), dh = random_floats(n, rng, 3.0f);
      const auto dgate0 = random_floats(n, rng, 1.0f), dup0 = random_floats(n, rng, 1.0f);
      const std::size_t off = n % 5;
      const placed<float> pg(gate, off % 4, 9.0f), pu(up, (off + 1) % 4, 9.0f), pd(dh, (off + 2) % 4, 9.0f);
      placed<float> out(std::vector<float>(n, 0.0f), off, -777.0f);
      k::attention().swiglu(pg.data, pu.data, out.data, n);
      placed<float> dg(dgate0, (off + 3) % 5, -777.0f), du(dup0, (off + 1) % 5, -777.0f);
      k::attention().swiglu_backward(pg.data, pu.data, pd.data, dg.data, du.data, n);
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        const double a = gate[i], u = up[i], d = dh[i];
        const double want = swiglu_double(a, u);
        CHECK(std::isfinite(out.data[i]));
        CHECK(std::fabs(out.data[i] - want) <= 4 * eps * std::fabs(want) + 1e-37);
        // The slope's 1 + a (1 - s) cancels near a = -1.28: bound by the terms' sizes.
        const double s = 1.0 / (1.0 + std::exp(-a));
        const double dg_want = dgate0[i] + swiglu_dgate_double(a, u, d);
        CHECK(std::fabs(dg.data[i] - dg_want) <= 8 * eps * (std::fabs(dgate0[i]) + std::fabs(d * u * s) * (1 + std::fabs(a))) + 1e-37);
        const double du_want = dup0[i] + swiglu_dup_double(a, d);
        CHECK(std::fabs(du.data[i] - du_want) <= 6 * eps * (std::fabs(dup0[i]) + std::fabs(d * a * s)) + 1e-37);
      }
      CHECK(out.data[n] == -777.0f);  // nothing past the end
      CHECK(dg.data[n] == -777.0f);
      CHECK(du.data[n] == -777.0f);
      // In place (out is up), as the inference block may call it: the same values.
      placed<float> inplace(up, (off + 1) % 4, 9.0f);
      k::attention().swiglu(pg.data, inplace.data, inplace.data, n);
      for (std::size_t i = 0; i < n; ++i) CHECK(inplace.data[i] == out.data[i]);
    }
    // NaN in, NaN out.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> g{1.0f, nan, 2.0f}, u{1.0f, 1.0f, 1.0f}, o(3), dgv(3, 0.0f), duv(3, 0.0f);
    k::attention().swiglu(g.data(), u.data(), o.data(), 3);
    CHECK(std::isnan(o[1]));
    CHECK(o[0] == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))));
    k::attention().swiglu_backward(g.data(), u.data(), u.data(), dgv.data(), duv.data(), 3);
    CHECK(std::isnan(dgv[1]));
    CHECK(std::isnan(duv[1]));
  }
}

TEST_CASE("every kernel level against stored outputs of the double references (fixture), levels named") {
  namespace f = fixture;
  level_guard guard;
  std::vector<float> q(f::E), keys(f::n * f::stride), ks(f::n), p(f::n), values(f::n * f::stride), out0(f::E), vs(f::n);
  std::vector<std::int8_t> kc(f::n * f::E), vc(f::n * f::E);
  for (std::uint32_t e = 0; e < f::E; ++e) q[e] = f::input(1, e, 2.0f), out0[e] = f::input(6, e, 1.0f);
  for (std::uint32_t i = 0; i < f::n * f::stride; ++i) keys[i] = f::input(2, i, 4.0f), values[i] = f::input(5, i, 2.0f);
  for (std::uint32_t i = 0; i < f::n * f::E; ++i) kc[i] = f::code(3, i), vc[i] = f::code(7, i);
  for (std::uint32_t j = 0; j < f::n; ++j) ks[j] = f::positive(4, j), p[j] = f::positive(8, j) * 32.0f, vs[j] = f::positive(9, j);

  // The references still give the stored numbers, so the fixture and the code agree.
  std::vector<float> s(f::n), a(out0);
  k::attention_scores_reference(q.data(), keys.data(), f::stride, f::n, f::E, f::scale, s.data());
  for (std::size_t j = 0; j < f::n; ++j) CHECK(s[j] == f::want_scores[j]);
  k::attention_scores_q8_reference(q.data(), kc.data(), ks.data(), f::n, f::E, f::scale, s.data());
  for (std::size_t j = 0; j < f::n; ++j) CHECK(s[j] == f::want_scores_q8[j]);
  k::attention_accumulate_reference(f::c, p.data(), values.data(), f::stride, f::n, f::E, a.data());
  for (std::size_t e = 0; e < f::E; ++e) CHECK(a[e] == f::want_accumulate[e]);
  a = out0;
  k::attention_accumulate_q8_reference(f::c, p.data(), vc.data(), vs.data(), f::n, f::E, a.data());
  for (std::size_t e = 0; e < f::E; ++e) CHECK(a[e] == f::want_accumulate_q8[e]);

  // Bounds as in the cases above: a float summation order's error against the size of
  // the terms summed.
  std::string ran;
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    ran += std::string(ran.empty() ? "" : ", ") + std::string(tlm::kernel_level_name(level));
    INFO("level " << tlm::kernel_level_name(level));
    k::attention().scores(q.data(), keys.data(), f::stride, f::n, f::E, f::scale, s.data());
    for (std::size_t j = 0; j < f::n; ++j) {
      double mag = 0;
      for (std::size_t e = 0; e < f::E; ++e) mag += std::fabs(q[e] * keys[j * f::stride + e]) * f::scale;
      CAPTURE(j);
      CHECK(std::fabs(s[j] - f::want_scores[j]) <= 2e-6 * mag);
    }
    k::attention().scores_q8(q.data(), kc.data(), ks.data(), f::n, f::E, f::scale, s.data());
    for (std::size_t j = 0; j < f::n; ++j) {
      double mag = 0;
      for (std::size_t e = 0; e < f::E; ++e) mag += std::fabs(q[e] * kc[j * f::E + e]) * ks[j] * f::scale;
      CAPTURE(j);
      CHECK(std::fabs(s[j] - f::want_scores_q8[j]) <= 2e-6 * mag);
    }
    a = out0;
    k::attention().accumulate(f::c, p.data(), values.data(), f::stride, f::n, f::E, a.data());
    for (std::size_t e = 0; e < f::E; ++e) {
      double mag = std::fabs(f::c * out0[e]);
      for (std::size_t j = 0; j < f::n; ++j) mag += std::fabs(p[j] * values[j * f::stride + e]);
      CAPTURE(e);
      CHECK(std::fabs(a[e] - f::want_accumulate[e]) <= 1e-5 * mag);
    }
    a = out0;
    k::attention().accumulate_q8(f::c, p.data(), vc.data(), vs.data(), f::n, f::E, a.data());
    for (std::size_t e = 0; e < f::E; ++e) {
      double mag = std::fabs(f::c * out0[e]);
      for (std::size_t j = 0; j < f::n; ++j) mag += std::fabs(p[j] * vs[j] * vc[j * f::E + e]);
      CAPTURE(e);
      CHECK(std::fabs(a[e] - f::want_accumulate_q8[e]) <= 1e-5 * mag);
    }
  }
  // Which levels this machine held to the fixture: a level it cannot run is not tested
  // here, and the log says so rather than passing in silence.
  std::string skipped;
  for (auto level : {tlm::kernel_level::scalar, tlm::kernel_level::avx2, tlm::kernel_level::avx512})
    if (!tlm::kernel_level_supported(level))
      skipped += std::string(skipped.empty() ? "" : ", ") + std::string(tlm::kernel_level_name(level));
  MESSAGE("attention kernel levels run against the fixture: " << ran
          << "; not run (this CPU lacks them): " << (skipped.empty() ? std::string("none") : skipped));
  CHECK(!ran.empty());
}

}  // namespace test_attention_kernels
