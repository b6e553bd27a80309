// Block encodings: hand-built blocks with known values, half-float edge cases,
// quantize/dequantize round trips within their error bounds, and the errors for
// rows that do not fit an encoding. Bit-exact agreement with gguf-py is checked
// live by tests/reference/check_gguf.py.
#include <tlm/format/quant.hpp>
#include <tlm/format/quantize_mix.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_quant {

namespace {

template <class Block>
std::vector<std::byte> bytes_of(const Block& b) {
  std::vector<std::byte> out(sizeof b);
  std::memcpy(out.data(), &b, sizeof b);
  return out;
}

std::vector<float> dequant(tlm::encoding enc, const std::vector<std::byte>& src, std::size_t n) {
  std::vector<float> out(n);
  tlm::dequantize_row(enc, src.data(), out.data(), n);
  return out;
}

std::vector<std::byte> quant(tlm::encoding enc, const std::vector<float>& x) {
  std::vector<std::byte> out(tlm::row_bytes(enc, x.size()));
  tlm::quantize_row(enc, x.data(), out.data(), x.size());
  return out;
}

std::vector<float> normal_values(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

}  // namespace

TEST_CASE("fp16 conversions: edge cases") {
  CHECK(tlm::fp16_to_f32(0x0000) == 0.0f);
  CHECK(std::signbit(tlm::fp16_to_f32(0x8000)));
  CHECK(tlm::fp16_to_f32(0x3c00) == 1.0f);
  CHECK(tlm::fp16_to_f32(0xc000) == -2.0f);
  CHECK(tlm::fp16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(tlm::fp16_to_f32(0x03ff) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(tlm::fp16_to_f32(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(tlm::fp16_to_f32(0x7bff) == 65504.0f);
  CHECK(std::isinf(tlm::fp16_to_f32(0x7c00)));
  CHECK(tlm::fp16_to_f32(0xfc00) < 0.0f);
  CHECK(std::isnan(tlm::fp16_to_f32(0x7e00)));

  CHECK(tlm::f32_to_fp16(65504.0f) == 0x7bff);
  CHECK(tlm::f32_to_fp16(65519.0f) == 0x7bff);  // below the halfway point to 65536
  CHECK(tlm::f32_to_fp16(65520.0f) == 0x7c00);  // halfway rounds to even, which overflows
  CHECK(tlm::f32_to_fp16(std::ldexp(1.0f, -25)) == 0x0000);  // halfway to the smallest subnormal: even is 0
  CHECK(tlm::f32_to_fp16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(tlm::f32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);        // tie, rounds to even
  CHECK(tlm::f32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);    // tie, rounds up to even
  CHECK(std::isnan(tlm::fp16_to_f32(tlm::f32_to_fp16(std::nanf("")))));
}

TEST_CASE("fp16 conversions: every finite half survives a round trip") {
  int checked = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto half = static_cast<std::uint16_t>(h);
    if ((half & 0x7c00) == 0x7c00 && (half & 0x03ff) != 0) continue;  // NaN payloads are not preserved exactly
    REQUIRE(tlm::f32_to_fp16(tlm::fp16_to_f32(half)) == half);
    ++checked;
  }
  CHECK(checked == 65536 - 2 * 1023);
}

TEST_CASE("Q4_0 fixed block") {
  tlm::block_q4_0 b{};
  b.d = 0x3c00;  // 1.0
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(tlm::encoding::q4_0, bytes_of(b), 32);
  for (int j = 0; j < 16; ++j) {
    CHECK(y[j] == static_cast<float>(j - 8));
    CHECK(y[j + 16] == static_cast<float>(7 - j));
  }
}

TEST_CASE("Q4_1 fixed block") {
  tlm::block_q4_1 b{};
  b.d = 0x3800;  // 0.5
  b.m = 0xbc00;  // -1.0
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(tlm::encoding::q4_1, bytes_of(b), 32);
  for (int j = 0; j < 16; ++j) {
    CHECK(y[j] == 0.5f * static_cast<float>(j) - 1.0f);
    CHECK(y[j + 16] == 0.5f * static_cast<float>(15 - j) - 1.0f);
  }
}

TEST_CASE("Q5_0 fixed block: the fifth bit of value j is bit j of the little-endian qh") {
  tlm::block_q5_0 b{};
  b.d = 0x3800;  // 0.5
  // Codes 0..31 in value order: the low nibble of value j (j < 16) is qs[j] & 15 and of
  // value j + 16 is qs[j] >> 4; code j has its fifth bit set exactly for j >= 16.
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>(j | (j << 4));
  b.qh[2] = 0xff;
  b.qh[3] = 0xff;
  auto y = dequant(tlm::encoding::q5_0, bytes_of(b), 32);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == 0.5f * static_cast<float>(j - 16));
  // One bit at a time: only value 9 (byte 1, bit 1) gains 16.
  b = {};
  b.d = 0x3c00;  // 1.0
  b.qh[1] = 0x02;
  y = dequant(tlm::encoding::q5_0, bytes_of(b), 32);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == (j == 9 ? 0.0f : -16.0f));
}

TEST_CASE("Q5_1 fixed block") {
  tlm::block_q5_1 b{};
  b.d = 0x3400;  // 0.25
  b.m = 0xc000;  // -2.0
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<std::uint8_t>((15 - j) | (j << 4));
  b.qh[0] = 0xaa;  // odd values 1..7 get their fifth bit
  b.qh[3] = 0x80;  // and value 31
  const auto y = dequant(tlm::encoding::q5_1, bytes_of(b), 32);
  for (int j = 0; j < 32; ++j) {
    int code = j < 16 ? 15 - j : j - 16;
    if ((j < 8 && j % 2 == 1) || j == 31) code += 16;
    CHECK(y[j] == 0.25f * static_cast<float>(code) - 2.0f);
  }
}

TEST_CASE("Q8_0 fixed block") {
  tlm::block_q8_0 b{};
  b.d = 0x3400;  // 0.25
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<std::int8_t>(j * 8 - 128);
  const auto y = dequant(tlm::encoding::q8_0, bytes_of(b), 32);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == static_cast<float>(j * 8 - 128) / 4.0f);
}

TEST_CASE("Q4_K fixed block: 6-bit scales and mins, including their high bits") {
  tlm::block_q4_k b{};
  b.d = 0x3c00;
  b.dmin = 0x3c00;
  const std::uint8_t sc[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::uint8_t mn[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = sc[j];
    b.scales[j + 4] = mn[j];
    b.scales[j + 8] = static_cast<std::uint8_t>(sc[j + 4] | (mn[j + 4] << 4));
  }
  std::fill(std::begin(b.qs), std::end(b.qs), std::uint8_t{0x21});  // low nibble 1, high nibble 2
  // Sub-block 2c uses the low nibble (1), 2c+1 the high nibble (2): value = sc*q - m.
  const float expect[8] = {1, 3, 1, 5, 1, 7, 1, 9};
  auto y = dequant(tlm::encoding::q4_k, bytes_of(b), 256);
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) REQUIRE(y[32 * s + l] == expect[s]);
  }
  // The top two bits of bytes 0..3 extend the scales of sub-blocks 4..7, those of
  // bytes 4..7 extend their mins.
  b.scales[0] |= 0x40;  // sc[4] = 5 + 16 = 21
  b.scales[4] |= 0x80;  // mn[4] = 4 + 32 = 36
  b.d = 0x4000;         // 2.0
  y = dequant(tlm::encoding::q4_k, bytes_of(b), 256);
  CHECK(y[0] == 2.0f * 1 * 1 - 0);
  CHECK(y[32 * 4] == 2.0f * 21 * 1 - 36);
  CHECK(y[32 * 5] == 2.0f * 6 * 2 - 5);
}

TEST_CASE("Q5_K fixed block: the fifth bit of sub-block s is bit s of qh") {
  tlm::block_q5_k b{};
  b.d = 0x3c00;
  b.dmin = 0x3800;  // 0.5
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = 1;
    b.scales[j + 4] = 2;
    b.scales[j + 8] = static_cast<std::uint8_t>(1 | (2 << 4));
  }
  std::fill(std::begin(b.qs), std::end(b.qs), std::uint8_t{0x73});  // low 3, high 7
  b.qh[5] = 0b00000101;  // value 5 of sub-blocks 0 and 2 gets +16
  const auto y = dequant(tlm::encoding::q5_k, bytes_of(b), 256);
  for (int s = 0; s < 8; ++s) {
    const float q = (s % 2 == 0) ? 3.0f : 7.0f;
    for (int l = 0; l < 32; ++l) {
      const float extra = (l == 5 && (s == 0 || s == 2)) ? 16.0f : 0.0f;
      REQUIRE(y[32 * s + l] == (q + extra) - 1.0f);  // dmin * m = 0.5 * 2
    }
  }
}

TEST_CASE("Q6_K fixed block: low nibbles, high bit pairs and signed scales") {
  tlm::block_q6_k b{};
  b.d = 0x3c00;
  std::fill(std::begin(b.scales), std::end(b.scales), std::int8_t{1});
  b.scales[6] = -2;          // values 96..111
  b.ql[0] = 0x35;            // value 0: low 5; value 64: low 3
  b.qh[0] = 0b11000001;      // value 0: high 1; value 32: high 0; value 64: high 0; value 96: high 3
  b.ql[64 + 32 + 1] = 0xf0;  // second half: value 128 + 32 + 1 low 0, value 128 + 96 + 1 low 15
  const auto y = dequant(tlm::encoding::q6_k, bytes_of(b), 256);
  CHECK(y[0] == (5 + 16) - 32);
  CHECK(y[32] == -32);
  CHECK(y[64] == 3 - 32);
  CHECK(y[96] == -2.0f * (48 - 32));
  CHECK(y[97] == -2.0f * -32);
  CHECK(y[128 + 33] == -32);
  CHECK(y[128 + 97] == 15 - 32);
  CHECK(y[255] == -32);
}

TEST_CASE("F16 and BF16 rows") {
  const std::vector<float> x = {1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24), 0.1f, 3.14159f, -0.0f, 1e-3f};
  const auto h = quant(tlm::encoding::f16, x);
  const auto yh = dequant(tlm::encoding::f16, h, x.size());
  const auto b = quant(tlm::encoding::bf16, x);
  const auto yb = dequant(tlm::encoding::bf16, b, x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(yh[i] == tlm::fp16_to_f32(tlm::f32_to_fp16(x[i])));
    CHECK(std::fabs(yb[i] - x[i]) <= std::fabs(x[i]) * std::ldexp(1.0f, -8));
  }
  CHECK(yh[0] == 1.0f);
  CHECK(yh[2] == 65504.0f);
  CHECK(yb[1] == -2.5f);
  // bf16 rounds to nearest even on the dropped 16 bits.
  const std::vector<float> ties = {std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u)};
  const auto bt = dequant(tlm::encoding::bf16, quant(tlm::encoding::bf16, ties), 2);
  CHECK(std::bit_cast<std::uint32_t>(bt[0]) == 0x3f800000u);
  CHECK(std::bit_cast<std::uint32_t>(bt[1]) == 0x3f820000u);
}

TEST_CASE("Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 round trips stay within their error bounds") {
  const std::size_t n = 32 * 256;
  for (const unsigned seed : {1u, 2u, 3u}) {
    const auto x = normal_values(n, seed, seed == 3 ? 1e-3f : 1.0f);
    for (const auto enc : {tlm::encoding::q8_0, tlm::encoding::q4_0, tlm::encoding::q4_1, tlm::encoding::q5_0,
                           tlm::encoding::q5_1}) {
      CAPTURE(tlm::name(enc));
      const auto y = dequant(enc, quant(enc, x), n);
      double err2 = 0, sig2 = 0;
      for (std::size_t b = 0; b < n / 32; ++b) {
        float lo = x[b * 32], hi = lo, amax = 0;
        for (int j = 0; j < 32; ++j) {
          lo = std::min(lo, x[b * 32 + j]);
          hi = std::max(hi, x[b * 32 + j]);
          amax = std::max(amax, std::fabs(x[b * 32 + j]));
        }
        // Half a step, plus the rounding of the fp16 scale (and min) times the largest quant;
        // the absolute term covers scales that are fp16 subnormals (seed 3: d ~ 2e-5).
        const float sub = std::ldexp(1.0f, -25);
        float bound = 0;
        if (enc == tlm::encoding::q8_0) bound = amax / 127 * 0.5f + amax * std::ldexp(1.0f, -10) + 128 * sub;
        if (enc == tlm::encoding::q4_0) bound = amax / 8 * 1.0f + amax * std::ldexp(1.0f, -9) + 8 * sub;  // the clipped +8 step costs a whole step
        if (enc == tlm::encoding::q4_1) bound = (hi - lo) / 15 * 0.5f + (std::fabs(hi) + std::fabs(lo)) * std::ldexp(1.0f, -9) + 16 * sub;
        if (enc == tlm::encoding::q5_0) bound = amax / 16 * 1.0f + amax * std::ldexp(1.0f, -9) + 16 * sub;  // as Q4_0: the clipped +16 step
        if (enc == tlm::encoding::q5_1) bound = (hi - lo) / 31 * 0.5f + (std::fabs(hi) + std::fabs(lo)) * std::ldexp(1.0f, -9) + 32 * sub;
        for (int j = 0; j < 32; ++j) {
          const std::size_t i = b * 32 + j;
          REQUIRE(std::fabs(y[i] - x[i]) <= bound);
          err2 += double(y[i] - x[i]) * double(y[i] - x[i]);
          sig2 += double(x[i]) * double(x[i]);
        }
      }
      const double rel = std::sqrt(err2 / sig2);
      MESSAGE(tlm::name(enc), " relative rms error ", rel);
      const bool five = enc == tlm::encoding::q5_0 || enc == tlm::encoding::q5_1;
      CHECK(rel < (enc == tlm::encoding::q8_0 ? 0.01 : five ? 0.075 : 0.15));
      CHECK(rel > 0.0);
    }
  }
}

TEST_CASE("values already on the grid survive exactly") {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = -2.0f + 0.5f * static_cast<float>(j % 16);  // Q4_1 grid: m = -2, d = 0.5
  CHECK(dequant(tlm::encoding::q4_1, quant(tlm::encoding::q4_1, x), 32) == x);
  std::vector<float> q8(32);
  for (int j = 0; j < 32; ++j) q8[j] = static_cast<float>(j * 4 - 127);  // max 127: d = 1, exact
  CHECK(dequant(tlm::encoding::q8_0, quant(tlm::encoding::q8_0, q8), 32) == q8);
  std::vector<float> q4(32);
  for (int j = 0; j < 32; ++j) q4[j] = static_cast<float>(j % 16 - 8);  // the first -8 sets d = 1
  CHECK(dequant(tlm::encoding::q4_0, quant(tlm::encoding::q4_0, q4), 32) == q4);
}

TEST_CASE("quantizers follow ggml's reference choices") {
  // Q4_0: the signed value of largest magnitude maps to -8 (d = max / -8).
  std::vector<float> x(32, 0.0f);
  x[3] = -4.0f;
  x[7] = 2.0f;
  auto bytes = quant(tlm::encoding::q4_0, x);
  tlm::block_q4_0 b;
  std::memcpy(&b, bytes.data(), sizeof b);
  CHECK(tlm::fp16_to_f32(b.d) == 0.5f);
  CHECK((b.qs[3] & 15) == 0);   // -4 / 0.5 = -8, stored as 0
  CHECK((b.qs[7] & 15) == 12);  // 2 / 0.5 = 4, stored as 12
  CHECK((b.qs[0] & 15) == 8);   // zero
  // Q8_0 rounds half away from zero: with amax 127, d = 1 and 2.5 -> 3, -2.5 -> -3.
  std::vector<float> y(32, 0.0f);
  y[0] = 127.0f;
  y[1] = 2.5f;
  y[2] = -2.5f;
  bytes = quant(tlm::encoding::q8_0, y);
  tlm::block_q8_0 q;
  std::memcpy(&q, bytes.data(), sizeof q);
  CHECK(q.qs[1] == 3);
  CHECK(q.qs[2] == -3);
  // An all-zero block has scale 0 and decodes to zeros.
  const std::vector<float> zeros(32, 0.0f);
  for (const auto enc : {tlm::encoding::q8_0, tlm::encoding::q4_0, tlm::encoding::q4_1, tlm::encoding::q5_0,
                         tlm::encoding::q5_1}) {
    CHECK(dequant(enc, quant(enc, zeros), 32) == zeros);
  }
  // Q5_0: the value of largest magnitude maps to -16 (d = max / -16), so a block whose
  // largest value is positive uses code 0 for it and clips the other end at 31.
  std::vector<float> z(32, 0.0f);
  z[4] = 8.0f;
  z[5] = -4.0f;
  bytes = quant(tlm::encoding::q5_0, z);
  tlm::block_q5_0 b5;
  std::memcpy(&b5, bytes.data(), sizeof b5);
  CHECK(tlm::fp16_to_f32(b5.d) == -0.5f);
  CHECK(tlm::detail::q5_code(b5.qs, b5.qh, 4) == 0);   // 8 / -0.5 = -16
  CHECK(tlm::detail::q5_code(b5.qs, b5.qh, 5) == 24);  // -4 / -0.5 = 8, + 16
  CHECK(tlm::detail::q5_code(b5.qs, b5.qh, 0) == 16);  // zero
}

TEST_CASE("rows that do not fit an encoding are rejected") {
  std::vector<std::byte> buf(1024);
  std::vector<float> x(64, 1.0f);
  CHECK_THROWS_AS(tlm::dequantize_row(tlm::encoding::q4_0, buf.data(), x.data(), 33), tlm::shape_error);
  CHECK_THROWS_AS(tlm::dequantize_row(tlm::encoding::q4_k, buf.data(), x.data(), 64), tlm::shape_error);
  CHECK_THROWS_AS(tlm::dequantize_row(tlm::encoding::q8_1, buf.data(), x.data(), 32), tlm::shape_error);
  CHECK_THROWS_AS(tlm::dequantize_row(static_cast<tlm::encoding>(77), buf.data(), x.data(), 32), tlm::shape_error);
  CHECK_THROWS_AS(tlm::quantize_row(tlm::encoding::q4_1, x.data(), buf.data(), 48), tlm::shape_error);
  CHECK_THROWS_AS(tlm::quantize_row(tlm::encoding::q4_k, x.data(), buf.data(), 64), tlm::shape_error);
  x[5] = std::nanf("");
  CHECK_THROWS_AS(tlm::quantize_row(tlm::encoding::q8_0, x.data(), buf.data(), 64), tlm::numeric_error);
  x[5] = INFINITY;
  CHECK_THROWS_AS(tlm::quantize_row(tlm::encoding::q4_1, x.data(), buf.data(), 64), tlm::numeric_error);
  try {
    tlm::dequantize_row(tlm::encoding::q4_0, buf.data(), x.data(), 33);
    FAIL("expected a shape_error");
  } catch (const tlm::shape_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("33") != std::string::npos);
    CHECK(msg.find("Q4_0") != std::string::npos);
    CHECK(msg.find("32") != std::string::npos);
  }
}

namespace {

// Deterministic values with heavy tails, from integer arithmetic and float products
// only (exact across compilers and libraries, unlike std::normal_distribution), scaled
// per super-block by 1, 2^-6, 2^6 and 2^-20. The same recipe in Python fed llama.cpp's
// quantize_row_*_ref for the checksums below.
std::vector<float> lcg_values(std::size_t n, std::uint64_t seed) {
  const float scales[4] = {1.0f, 0.015625f, 64.0f, std::ldexp(1.0f, -20)};
  std::vector<float> x(n);
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (std::int64_t{1} << 23)) / 8388608.0f;
    const float u2 = u * u;
    const float u3 = u2 * u;
    x[i] = u3 * scales[(i / 256) % 4];
  }
  return x;
}

std::uint64_t fnv1a(const std::vector<std::byte>& b) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const std::byte c : b) {
    h ^= static_cast<std::uint64_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

TEST_CASE("Q4_K, Q5_K, Q6_K, Q4_0 and Q5_0 write llama.cpp's bytes (checksums of its reference quantizers)") {
  // Checksums of the output of llama.cpp's quantize_row_q4_K_ref (etc.) from
  // llama-cpp-python 0.3.36's libggml-base on the same 2048 values (8 super-blocks, one
  // with a zero sub-block). tests/reference/check_quantize.py compares whole models.
  auto x = lcg_values(256 * 8, 7);
  std::fill(x.begin() + 256 * 7, x.begin() + 256 * 7 + 16, 0.0f);
  CHECK(fnv1a(quant(tlm::encoding::q4_k, x)) == 0x8a216986a11f0762ull);
  CHECK(fnv1a(quant(tlm::encoding::q5_k, x)) == 0xf711990e863941b8ull);
  CHECK(fnv1a(quant(tlm::encoding::q6_k, x)) == 0xfaeba907fea73c43ull);
  CHECK(fnv1a(quant(tlm::encoding::q5_0, x)) == 0x91503f7c6a324cd3ull);
  CHECK(fnv1a(quant(tlm::encoding::q4_0, x)) == 0x528f3fbe494b6a0full);
}

TEST_CASE("Q4_K, Q5_K and Q6_K round trips stay within their error bounds") {
  const std::size_t n = 256 * 64;
  for (const unsigned seed : {1u, 2u, 3u}) {
    // seed 3: tiny values, where the fp16 super-block scales lose precision.
    const auto x = normal_values(n, seed, seed == 3 ? 1e-3f : 1.0f);
    for (const auto enc : {tlm::encoding::q4_k, tlm::encoding::q5_k, tlm::encoding::q6_k}) {
      CAPTURE(tlm::name(enc));
      const auto y = dequant(enc, quant(enc, x), n);
      // Per element: a sub-block's step is about its range / levels, and the 6-bit (8-bit
      // for Q6_K) sub-block scale is rounded against the super-block's largest, so allow
      // a step of the super-block's range (a wrong layout errs by the whole range).
      const float levels = enc == tlm::encoding::q4_k ? 15.0f : enc == tlm::encoding::q5_k ? 31.0f : 63.0f;
      double err2 = 0, sig2 = 0;
      for (std::size_t b = 0; b < n / 256; ++b) {
        const auto [lo, hi] = std::minmax_element(x.begin() + static_cast<std::ptrdiff_t>(b * 256),
                                                  x.begin() + static_cast<std::ptrdiff_t>(b * 256 + 256));
        // The absolute term: the fp16 scales of seed 3 are subnormal (step 2^-24),
        // off by half a step times a sub-block scale (< 128) times a code (<= levels).
        const float bound = (*hi - *lo) / levels + 128 * (levels + 1) * std::ldexp(1.0f, -25);
        for (std::size_t i = b * 256; i < b * 256 + 256; ++i) {
          REQUIRE(std::fabs(y[i] - x[i]) <= bound);
          err2 += double(y[i] - x[i]) * double(y[i] - x[i]);
          sig2 += double(x[i]) * double(x[i]);
        }
      }
      const double rel = std::sqrt(err2 / sig2);
      MESSAGE(tlm::name(enc), " relative rms error ", rel);
      CHECK(rel < (enc == tlm::encoding::q4_k ? 0.08 : enc == tlm::encoding::q5_k ? 0.042 : 0.021));
      CHECK(rel > 0.0);
    }
  }
  // An all-zero super-block decodes to zeros; a constant one to that constant (a min
  // and no steps, or for Q6_K the largest value mapped exactly).
  const std::vector<float> zeros(256, 0.0f);
  for (const auto enc : {tlm::encoding::q4_k, tlm::encoding::q5_k, tlm::encoding::q6_k})
    CHECK(dequant(enc, quant(enc, zeros), 256) == zeros);
  std::vector<float> fours(256, -4.0f);
  for (const auto enc : {tlm::encoding::q4_k, tlm::encoding::q5_k, tlm::encoding::q6_k}) {
    CAPTURE(tlm::name(enc));
    const auto y = dequant(enc, quant(enc, fours), 256);
    for (const float v : y) CHECK(std::fabs(v + 4.0f) <= 4.0f / 64);
  }
}

namespace {

// SmolLM2-135M's tensors (dim 576, ffn 1536, 30 blocks, tied embeddings), in the order
// its GGUF file lists them: blk.10 before blk.2, as a name sort puts them.
std::vector<std::string> smollm2_names() {
  std::vector<std::string> names{"token_embd.weight", "output_norm.weight"};
  std::vector<std::string> blocks;
  for (int i = 0; i < 30; ++i) blocks.push_back(std::to_string(i));
  std::sort(blocks.begin(), blocks.end());
  for (const auto& b : blocks)
    for (const char* t : {"attn_k.weight", "attn_norm.weight", "attn_output.weight", "attn_q.weight", "attn_v.weight",
                          "ffn_down.weight", "ffn_gate.weight", "ffn_norm.weight", "ffn_up.weight"})
      names.push_back("blk." + b + "." + t);
  return names;
}

}  // namespace

TEST_CASE("quantize_mix: llama.cpp's choices for SmolLM2-135M (checked against its files by check_quantize.py)") {
  const auto names = smollm2_names();
  std::vector<tlm::tensor_desc> descs;
  for (const auto& n : names) {
    const bool norm = n.find("_norm") != std::string::npos;
    const bool down = n.find("ffn_down") != std::string::npos;
    descs.push_back({n, norm ? 1u : 2u, down ? 1536u : 576u, norm ? tlm::encoding::f32 : tlm::encoding::q4_1});
  }
  const auto chosen = tlm::choose_encodings(*tlm::find_quant_type("Q4_K_M"), descs);
  // use_more_bits over 30 blocks, by block number (not by the file's order).
  const std::set<int> more{0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29};
  for (std::size_t i = 0; i < names.size(); ++i) {
    CAPTURE(names[i]);
    const std::string& n = names[i];
    const int block = n.starts_with("blk.") ? std::stoi(n.substr(4)) : -1;
    tlm::encoding want = tlm::encoding::q5_0;                           // Q4_K's fallback for rows of 576
    if (n.find("_norm") != std::string::npos) want = tlm::encoding::f32;  // kept
    else if (n == "token_embd.weight") want = tlm::encoding::q8_0;       // tied output: Q6_K's fallback
    else if (n.find("attn_v") != std::string::npos && more.count(block)) want = tlm::encoding::q8_0;
    else if (n.find("ffn_down") != std::string::npos) want = more.count(block) ? tlm::encoding::q6_k : tlm::encoding::q4_k;
    CHECK(chosen[i] == want);
  }
  // Q4_K_S: the first four attn_v in Q5_K (here falling back to Q5_1), the first eighth
  // of ffn_down (blocks 0..2) in Q5_K.
  const auto s = tlm::choose_encodings(*tlm::find_quant_type("q4_k"), descs);
  CHECK(s[std::find(names.begin(), names.end(), "blk.3.attn_v.weight") - names.begin()] == tlm::encoding::q5_1);
  CHECK(s[std::find(names.begin(), names.end(), "blk.4.attn_v.weight") - names.begin()] == tlm::encoding::q5_0);
  CHECK(s[std::find(names.begin(), names.end(), "blk.2.ffn_down.weight") - names.begin()] == tlm::encoding::q5_k);
  CHECK(s[std::find(names.begin(), names.end(), "blk.3.ffn_down.weight") - names.begin()] == tlm::encoding::q4_k);
  // Plain types keep the type's encoding, except the tied output (Q6_K, here Q8_0).
  const auto q8 = tlm::choose_encodings(*tlm::find_quant_type("q4_1"), descs);
  CHECK(q8[0] == tlm::encoding::q8_0);
  CHECK(q8[2] == tlm::encoding::q4_1);
  CHECK(tlm::find_quant_type("q3_k") == nullptr);
  CHECK(tlm::quant_type_list() == "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m, q5_k_m");
  // general.file_type as llama.cpp's llama_ftype numbers them (llama.h): plain types
  // from the encoding table, the _S mixes as their encoding, the _M mixes their own.
  const std::pair<const char*, std::uint32_t> file_types[] = {{"f32", 0},  {"f16", 1},     {"bf16", 32},   {"q8_0", 7},
                                                              {"q4_0", 2}, {"q4_1", 3},    {"q5_0", 8},    {"q5_1", 9},
                                                              {"q4_k", 14}, {"q5_k", 16},  {"q6_k", 18},   {"q4_k_m", 15},
                                                              {"q5_k_m", 17}};
  for (const auto& entry : file_types) {
    const std::string_view type = entry.first;
    CHECK_MESSAGE(tlm::find_quant_type(type)->llama_file_type() == entry.second, type);
  }
  // Rows no fallback can hold are an error naming the tensor.
  const std::vector<tlm::tensor_desc> odd{{"blk.0.attn_q.weight", 2, 100, tlm::encoding::f32}};
  CHECK_THROWS_WITH_AS(tlm::choose_encodings(*tlm::find_quant_type("q8_0"), odd), doctest::Contains("blk.0.attn_q.weight"),
                       tlm::shape_error);
}

}  // namespace test_quant
