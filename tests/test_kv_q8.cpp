// The int8 KV cache's parts without a model: its two kernels at every dispatch level
// against their scalar references (across sizes and misalignments), the quantizer,
// attention over int8 entries against its dequantize-first reference (across head
// sizes), the storage's bytes, copies, errors, and the context shift's re-rotation.
#include <doctest/doctest.h>

#include <tlm/block.hpp>
#include <tlm/kv.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernel_levels.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_kv_q8 {

namespace k = tlm::kernels;
using tlm_test::level_guard;
using tlm_test::placed;
using tlm_test::random_floats;
using tlm_test::testable_levels;

using tlm_test::random_codes;

TEST_CASE("dot_i8 and axpy_i8 against their references at every level, sizes and misalignments") {
  level_guard guard;
  std::mt19937 rng(11);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    INFO("level " << tlm::kernel_level_name(level));
    for (std::size_t n = 0; n <= 140; ++n) {
      for (std::size_t off = 0; off < 8; ++off) {
        const auto a = random_floats(n, rng);
        const auto b = random_codes(n, rng, -128);
        const placed<float> pa(a, off % 4, -777.0f);
        const placed<std::int8_t> pb(b, off, std::int8_t{99});  // odd byte offsets included
        const float d = k::dot_i8(pa.data, pb.data, n);
        const float dr = k::dot_i8_reference(pa.data, pb.data, n);
        double mag = 0;  // sum |a b|: the scale of the summation-order error
        for (std::size_t i = 0; i < n; ++i) mag += std::fabs(static_cast<double>(a[i]) * b[i]);
        CHECK(std::fabs(static_cast<double>(d) - dr) <= 1e-5 * mag + 1e-30);

        const auto y = random_floats(n, rng, 50.0f);
        placed<float> y1(y, (off + 1) % 4, -777.0f), y2(y, 0, -777.0f);
        k::axpy_i8(0.0625f, pb.data, y1.data, n);
        k::axpy_i8_reference(0.0625f, pb.data, y2.data, n);
        // 0.0625 * code is exact, so FMA and multiply-then-add round the same sum once.
        for (std::size_t i = 0; i < n; ++i) CHECK(y1.data[i] == y2.data[i]);
        CHECK(y1.data[n] == -777.0f);  // nothing written past the end
      }
    }
  }
}

TEST_CASE("quantize_q8_row: absmax maps to 127, every value within half a step, zeros stay zero") {
  std::mt19937 rng(3);
  for (std::size_t n : {1u, 7u, 64u, 129u}) {
    auto x = random_floats(n, rng, 4.0f);
    x[n / 2] = -5.0f;  // the absmax, negative
    std::vector<std::int8_t> codes(n);
    const float scale = tlm::quantize_q8_row(x.data(), n, codes.data());
    CHECK(scale == doctest::Approx(5.0 / 127.0).epsilon(1e-7));
    CHECK(codes[n / 2] == -127);
    std::vector<float> back(n);
    tlm::dequantize_q8_row(codes.data(), scale, n, back.data());
    for (std::size_t i = 0; i < n; ++i) CHECK(std::fabs(back[i] - x[i]) <= 0.5f * scale * (1 + 1e-6f));
  }
  std::vector<float> zero(16, 0.0f);
  std::vector<std::int8_t> codes(16, 5);
  CHECK(tlm::quantize_q8_row(zero.data(), 16, codes.data()) == 0.0f);
  CHECK(std::all_of(codes.begin(), codes.end(), [](std::int8_t c) { return c == 0; }));
}

TEST_CASE("attention_row_q8 equals its dequantize-first reference across head sizes, lengths and levels") {
  level_guard guard;
  std::mt19937 rng(5);
  double worst_out = 0, worst_lse = 0;
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    INFO("level " << tlm::kernel_level_name(level));
    for (std::size_t E : {1u, 2u, 3u, 7u, 8u, 15u, 16u, 17u, 31u, 32u, 33u, 48u, 63u, 64u, 65u, 100u, 128u}) {
      for (std::size_t len : {1u, 2u, 5u, 63u, 64u, 65u, 130u}) {
        CAPTURE(E);
        CAPTURE(len);
        const auto q = random_floats(E, rng, 2.0f);
        std::vector<std::int8_t> kc(len * E), vc(len * E);  // [len, E]
        std::vector<float> ks(len), vs(len);                 // [len]
        for (std::size_t j = 0; j < len; ++j) {
          const auto kf = random_floats(E, rng, 3.0f), vf = random_floats(E, rng, 1.5f);
          ks[j] = tlm::quantize_q8_row(kf.data(), E, kc.data() + j * E);
          vs[j] = tlm::quantize_q8_row(vf.data(), E, vc.data() + j * E);
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(E));
        // Codes one byte off any alignment, as a cache of odd E would have them.
        const placed<std::int8_t> pk(kc, 1, 0), pv(vc, 3, 0);
        std::vector<float> out(E), ref(E);
        float entropy = -1.0f;
        const float lse = tlm::attention_row_q8(q.data(), pk.data, ks.data(), pv.data, vs.data(), len, E, scale, out.data(),
                                                &entropy);
        const float lse_ref =
            tlm::attention_row_q8_reference(q.data(), kc.data(), ks.data(), vc.data(), vs.data(), len, E, scale, ref.data());
        const double vmax = *std::max_element(vs.begin(), vs.end()) * 127.0;
        for (std::size_t e = 0; e < E; ++e) {
          const double d = std::fabs(static_cast<double>(out[e]) - ref[e]);
          worst_out = std::max(worst_out, d / vmax);
          CHECK(d <= 2e-6 * vmax);
        }
        worst_lse = std::max(worst_lse, std::fabs(static_cast<double>(lse) - lse_ref));
        CHECK(std::fabs(lse - lse_ref) <= 2e-5 * std::max(1.0f, std::fabs(lse_ref)));
        CHECK(entropy >= -1e-5f);
        CHECK(entropy <= std::log(static_cast<float>(len)) + 1e-4f);
      }
    }
  }
  MESSAGE("attention_row_q8 against the reference: worst |out| error " << worst_out << " of the largest value, worst lse "
                                                                        << worst_lse);
}

using G = tlm::tiny_gqa;
constexpr std::size_t EG = tlm::head_dim<G>;

TEST_CASE("q8 cache: bytes per position exactly, for the tiny config and SmolLM2-135M") {
  using S = tlm::smollm2_135m;
  // 30 layers x 3 kv heads x (key + value) x 64 values of 4 bytes.
  CHECK(tlm::kv_storage<S>::bytes_per_position(tlm::kv_type::f32) == 46080);
  // The same with 64 one-byte codes plus a 4-byte scale per vector.
  CHECK(tlm::kv_storage<S>::bytes_per_position(tlm::kv_type::q8) == 12240);
  CHECK(tlm::kv_cache<S>(100, tlm::kv_type::q8).bytes() == 1224000);
  CHECK(tlm::kv_cache<S>(100).bytes() == 4608000);
  CHECK(tlm::kv_storage<G>::bytes_per_position(tlm::kv_type::q8) ==
        2 * G::layers * G::kv_heads * (EG + sizeof(float)));
  const tlm::kv_cache<G> c(5, tlm::kv_type::q8);
  CHECK(c.type() == tlm::kv_type::q8);
  CHECK(c.storage().key_values() == G::layers * 5 * tlm::kv_dim<G>);
}

TEST_CASE("q8 cache: store, clone, truncate, and the wrong element type is a clear error") {
  std::mt19937 rng(9);
  tlm::kv_cache<G> cache(6, tlm::kv_type::q8);
  std::vector<std::vector<float>> keys;  // [positions * layers * kv_heads][E]
  for (std::size_t p = 0; p < 4; ++p) {
    cache.push();
    for (std::size_t l = 0; l < G::layers; ++l)
      for (std::size_t g = 0; g < G::kv_heads; ++g) {
        keys.push_back(random_floats(EG, rng));
        const auto v = random_floats(EG, rng);
        cache.storage().store(l, g, p, keys.back().data(), v.data());
      }
  }
  const tlm::kv_cache<G> copy = cache.clone();
  CHECK(copy.length() == 4);
  CHECK(copy.type() == tlm::kv_type::q8);
  std::size_t i = 0;
  std::vector<float> a(EG), b(EG);
  for (std::size_t p = 0; p < 4; ++p)
    for (std::size_t l = 0; l < G::layers; ++l)
      for (std::size_t g = 0; g < G::kv_heads; ++g, ++i) {
        cache.storage().load_key(l, g, p, a.data());
        copy.storage().load_key(l, g, p, b.data());
        CHECK(a == b);
        const float step = *copy.storage().key_scales(l, g, p);
        for (std::size_t e = 0; e < EG; ++e) CHECK(std::fabs(b[e] - keys[i][e]) <= 0.5f * step * 1.0001f);
      }
  tlm::kv_cache<G> plain_copy = cache;  // an ordinary copy works too
  plain_copy.truncate(2);
  CHECK(plain_copy.length() == 2);
  CHECK(cache.length() == 4);
  try {
    (void)cache.keys(0, 0);
    FAIL("a float read of an int8 cache must throw");
  } catch (const tlm::error& e) {
    CHECK(std::string(e.what()).find("stores q8") != std::string::npos);
  }
  CHECK_THROWS_AS((void)tlm::kv_cache<G>(4).storage().key_codes(0, 0, 0), tlm::error);
  tlm::kv_storage<G> other(6);
  CHECK_THROWS_AS(other.copy_positions(cache.storage(), 2), tlm::capacity_error);
}

// A server's sequence whose next request needs more positions gets a larger cache and
// keeps the shared prefix: a copy between capacities puts each (layer, kv head)'s rows
// where the larger cache keeps them.
TEST_CASE("copy_positions copies between caches of different capacities, of either type") {
  std::mt19937 rng(31);
  for (auto type : {tlm::kv_type::f32, tlm::kv_type::q8}) {
    CAPTURE(to_string(type));
    tlm::kv_storage<G> small(5, type), large(37, type);
    std::vector<float> k(EG), v(EG), a(EG), b(EG);
    for (std::size_t p = 0; p < 5; ++p)
      for (std::size_t l = 0; l < G::layers; ++l)
        for (std::size_t g = 0; g < G::kv_heads; ++g) {
          k = random_floats(EG, rng);
          v = random_floats(EG, rng);
          small.store(l, g, p, k.data(), v.data());
        }
    large.copy_positions(small, 4);
    for (std::size_t p = 0; p < 4; ++p)
      for (std::size_t l = 0; l < G::layers; ++l)
        for (std::size_t g = 0; g < G::kv_heads; ++g) {
          small.load_key(l, g, p, a.data());
          large.load_key(l, g, p, b.data());
          CHECK(a == b);
          small.load_value(l, g, p, a.data());
          large.load_value(l, g, p, b.data());
          CHECK(a == b);
        }
    // And back into the smaller one, as far as it holds.
    tlm::kv_storage<G> back(4, type);
    back.copy_positions(large, 4);
    large.load_key(G::layers - 1, G::kv_heads - 1, 3, a.data());
    back.load_key(G::layers - 1, G::kv_heads - 1, 3, b.data());
    CHECK(a == b);
    CHECK_THROWS_WITH_AS(back.copy_positions(large, 5), doctest::Contains("5 positions from a cache of 37"),
                         tlm::capacity_error);
  }
}

// Keys written as the block writes them (rotated for their position), shifted, must
// equal keys rotated for their new position: exactly up to float rounding for f32,
// within a quantization step for q8.
TEST_CASE("context shift: later entries move down and their keys are re-rotated for the new position") {
  std::mt19937 rng(21);
  for (auto pairing : {tlm::rope_pairing::adjacent, tlm::rope_pairing::half_split}) {
    for (auto type : {tlm::kv_type::f32, tlm::kv_type::q8}) {
      CAPTURE(tlm::to_string(type));
      const std::size_t n = 12, keep = 3, drop = 4;
      tlm::kv_cache<G> cache(16, type);
      std::vector<std::vector<float>> raw_k, raw_v;  // [n * L * G][E] before rotation
      for (std::size_t p = 0; p < n; ++p) {
        cache.push();
        const tlm::rope_angles<G> at(p);
        for (std::size_t l = 0; l < G::layers; ++l)
          for (std::size_t g = 0; g < G::kv_heads; ++g) {
            raw_k.push_back(random_floats(EG, rng, 2.0f));
            raw_v.push_back(random_floats(EG, rng, 2.0f));
            std::vector<float> k = raw_k.back();
            tlm::rope<G, EG>(std::span<float, EG>(k.data(), EG), at, pairing);
            cache.storage().store(l, g, p, k.data(), raw_v.back().data());
          }
      }
      cache.shift(keep, drop, pairing);
      CHECK(cache.length() == n - drop);
      double worst = 0;
      std::vector<float> got(EG), gotv(EG);
      for (std::size_t p = 0; p < n - drop; ++p) {
        const std::size_t src = p < keep ? p : p + drop;  // which written position landed here
        const tlm::rope_angles<G> at(p);
        for (std::size_t l = 0; l < G::layers; ++l)
          for (std::size_t g = 0; g < G::kv_heads; ++g) {
            const std::size_t idx = (src * G::layers + l) * G::kv_heads + g;
            std::vector<float> want = raw_k[idx];
            tlm::rope<G, EG>(std::span<float, EG>(want.data(), EG), at, pairing);
            cache.storage().load_key(l, g, p, got.data());
            cache.storage().load_value(l, g, p, gotv.data());
            // q8: up to one quantization step of the stored key, and one more from requantizing.
            const float tol = type == tlm::kv_type::f32 ? 2e-6f : 2.0f * 2.0f * std::sqrt(2.0f) / 127.0f;
            for (std::size_t e = 0; e < EG; ++e) {
              worst = std::max(worst, static_cast<double>(std::fabs(got[e] - want[e])));
              CHECK(std::fabs(got[e] - want[e]) <= tol);
              CHECK(std::fabs(gotv[e] - raw_v[idx][e]) <= (type == tlm::kv_type::f32 ? 0.0f : 2.0f / 127.0f));
            }
          }
      }
      MESSAGE(tlm::to_string(type) << " shift: worst key difference from a direct rotation " << worst);
    }
  }
  tlm::kv_cache<G> c(8);
  c.push();
  c.push();
  CHECK_THROWS_AS(c.shift(1, 2, tlm::rope_pairing::adjacent), tlm::capacity_error);
}

}  // namespace test_kv_q8
