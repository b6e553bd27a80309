// The fast kernels against their scalar references, for every encoding, level, size,
// batch, misalignment and thread count.
//
// Tolerance: for each output y[r] = sum_c W[r,c] x[c] (reference summed in double),
//   |y_fast - y_ref| <= 1e-5 * sum_c |W[r,c] x[c]|.
// The fast kernels sum at most a few thousand float32 products in 4..8 independent
// accumulators; the rounding error of such a sum is a small multiple of
// sqrt(n) * 2^-24 times sum |terms| in practice, far inside 1e-5. Decoded weights are
// exact (bit for bit equal to dequantize_row, checked below), so only summation order
// differs.
#include <doctest/doctest.h>

#include "kernel_levels.hpp"

#include <tlm/kernels.hpp>
#include <tlm/kernels/adamw.hpp>

#ifdef TLM_HAVE_AVX2_KERNELS
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_kernels {

namespace {

using tlm::encoding;
namespace k = tlm::kernels;

constexpr double rel_tol = 1e-5;

const encoding all_encodings[] = {encoding::f32,  encoding::f16,  encoding::bf16, encoding::q8_0,
                                  encoding::q4_0, encoding::q4_1, encoding::q5_0, encoding::q5_1,
                                  encoding::q4_k, encoding::q5_k, encoding::q6_k};

using tlm_test::level_guard;
using tlm_test::random_floats;
using tlm_test::testable_levels;

void put_half(std::byte* p, float v) {
  const std::uint16_t h = tlm::f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Random but valid tensor bytes: quant bytes uniformly random (every code occurs),
// scales set to finite halves of realistic size.
std::vector<std::byte> random_rows(encoding enc, std::size_t rows, std::size_t cols, std::mt19937& rng) {
  const auto t = tlm::traits(enc);
  const std::size_t bytes = rows * tlm::row_bytes(enc, cols);
  std::vector<std::byte> out(bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : out) b = static_cast<std::byte>(byte(rng));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  const std::size_t blocks = rows * cols / t.block_values;
  for (std::size_t i = 0; i < blocks; ++i) {
    std::byte* p = out.data() + i * t.block_bytes;
    switch (enc) {
      case encoding::f32: {
        const float v = unit(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case encoding::f16: put_half(p, unit(rng)); break;
      case encoding::bf16: {
        const float v = unit(rng);
        std::uint32_t u;
        std::memcpy(&u, &v, 4);
        const auto h = static_cast<std::uint16_t>(u >> 16);
        std::memcpy(p, &h, 2);
        break;
      }
      case encoding::q8_0:
      case encoding::q4_0:
      case encoding::q5_0: put_half(p, scale(rng) * (byte(rng) & 1 ? 1.0f : -1.0f)); break;
      case encoding::q4_1:
      case encoding::q5_1:
      case encoding::q4_k:
      case encoding::q5_k:
        put_half(p, scale(rng));
        put_half(p + 2, enc == encoding::q4_1 || enc == encoding::q5_1 ? -8.0f * scale(rng) : scale(rng));
        break;
      case encoding::q6_k: put_half(p + 208, scale(rng) * 0.1f); break;
      default: FAIL("random_rows: no generator for " << tlm::name(enc));
    }
  }
  return out;
}

// sum_c |W[r,c] x[c]| for every row, from the reference decoder.
std::vector<double> abs_sums(encoding enc, const std::byte* w, const float* x, std::size_t rows, std::size_t cols) {
  std::vector<double> out(rows);
  std::vector<float> row(cols);
  const std::size_t rb = tlm::row_bytes(enc, cols);
  for (std::size_t r = 0; r < rows; ++r) {
    tlm::dequantize_row(enc, w + r * rb, row.data(), cols);
    double s = 0;
    for (std::size_t c = 0; c < cols; ++c) s += std::fabs(static_cast<double>(row[c]) * x[c]);
    out[r] = s;
  }
  return out;
}

// Worst |fast - ref| / (rel_tol * sum|w x|) seen, so a run can report its margin.
double worst_ratio = 0;

// Checks y_fast against y_ref row by row; returns the number of rows out of tolerance
// and reports the first one.
int compare(const float* fast, const float* ref, const std::vector<double>& sums, std::size_t n, std::size_t stride_rows,
            const std::string& where) {
  int bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double s = sums[i % stride_rows];
    const double err = std::fabs(static_cast<double>(fast[i]) - static_cast<double>(ref[i]));
    const double allowed = rel_tol * s + 1e-30;
    worst_ratio = std::max(worst_ratio, err / allowed);
    if (!(err <= allowed)) {
      if (bad == 0) {
        INFO(where);
        INFO("output " << i << ": fast " << fast[i] << " ref " << ref[i] << " sum|wx| " << s);
        CHECK(err <= allowed);
      }
      ++bad;
    }
  }
  return bad;
}

std::vector<std::size_t> cols_for(encoding enc) {
  const std::size_t bv = tlm::traits(enc).block_values;
  if (bv == 1) return {1, 3, 7, 8, 9, 15, 31, 32, 33, 64, 100, 257, 576, 1536};
  if (bv == 32) return {32, 64, 96, 128, 160, 192, 224, 256, 288, 576, 1536};
  return {256, 512, 768, 1024, 1280, 1536, 2304};
}

const std::size_t row_counts[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 33, 64, 67};

using placed_bytes = tlm_test::placed<std::byte>;
// The checks look for -777 around an output: any other value there was written out of bounds.
struct placed_floats : tlm_test::placed<float> {
  placed_floats(const std::vector<float>& src, std::size_t offset) : placed(src, offset, -777.0f) {}
};


}  // namespace

TEST_CASE("reference matvec on a hand-computed Q4_1 block") {
  // d = 0.5, m = -1, every byte 0x21: values 0..15 are 1*0.5-1 = -0.5, values 16..31 are 2*0.5-1 = 0.
  std::vector<std::byte> blk(20);
  put_half(blk.data(), 0.5f);
  put_half(blk.data() + 2, -1.0f);
  for (int j = 0; j < 16; ++j) blk[4 + j] = std::byte{0x21};
  std::vector<float> x(32, 1.0f);
  x[0] = 3.0f;   // weight -0.5 -> contributes -1.5
  x[31] = 5.0f;  // weight 0 -> contributes 0
  float y = 0;
  k::matvec_reference(encoding::q4_1, blk.data(), x.data(), &y, 1, 32);
  CHECK(y == doctest::Approx(-0.5 * (15 + 3)));
  for (auto level : testable_levels()) {
    level_guard g;
    k::force_kernel_level(level);
    float yf = 0;
    k::matvec(encoding::q4_1, blk.data(), x.data(), &yf, 1, 32);
    CHECK(yf == -9.0f);
  }
}

TEST_CASE("streamed_row visits every row of a range once, as 4 streams far apart") {
  for (std::size_t r0 : {std::size_t{0}, std::size_t{5}}) {
    for (std::size_t n = 0; n < 70; ++n) {
      std::vector<int> seen(n, 0);
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t r = k::detail::streamed_row(r0, r0 + n, i);
        REQUIRE(r >= r0);
        REQUIRE(r < r0 + n);
        ++seen[r - r0];
      }
      CHECK_MESSAGE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }), "r0 " << r0 << " n " << n);
    }
  }
  // 42 rows: parts of 10 rows, then the remainder 40, 41 in order.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < 42; ++i) order.push_back(k::detail::streamed_row(3, 45, i));
  CHECK(std::vector<std::size_t>(order.begin(), order.begin() + 6) == std::vector<std::size_t>{3, 13, 23, 33, 4, 14});
  CHECK(std::vector<std::size_t>(order.end() - 2, order.end()) == std::vector<std::size_t>{43, 44});
}

TEST_CASE("matvec: every level and encoding against the reference, across sizes and misalignments") {
  level_guard g;
  std::mt19937 rng(1234);
  std::size_t cases = 0;
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : all_encodings) {
      for (std::size_t cols : cols_for(enc)) {
        for (std::size_t rows : row_counts) {
          const auto wsrc = random_rows(enc, rows, cols, rng);
          const auto xsrc = random_floats(cols, rng);
          const std::size_t woff = (rows * 7 + cols) % 8;  // 0..7 bytes, odd ones included
          const std::size_t xoff = rows % 4, yoff = (rows + cols) % 4;
          placed_bytes w(wsrc, woff);
          placed_floats x(xsrc, xoff);
          placed_floats y(std::vector<float>(rows, 0.0f), yoff);
          std::vector<float> ref(rows);
          k::matvec(enc, w.data, x.data, y.data, rows, cols);
          k::matvec_reference(enc, w.data, x.data, ref.data(), rows, cols);
          const auto sums = abs_sums(enc, w.data, x.data, rows, cols);
          const std::string where = std::string(tlm::kernel_level_name(level)) + " " + std::string(tlm::name(enc)) +
                                    " rows " + std::to_string(rows) + " cols " + std::to_string(cols) +
                                    " offsets w/x/y " + std::to_string(woff) + "/" + std::to_string(xoff) + "/" +
                                    std::to_string(yoff);
          CHECK_MESSAGE(compare(y.data, ref.data(), sums, rows, rows, where) == 0, where);
          // Nothing written outside y.
          CHECK(std::all_of(y.storage.begin(), y.storage.begin() + static_cast<std::ptrdiff_t>(yoff),
                            [](float v) { return v == -777.0f; }));
          CHECK(std::all_of(y.storage.begin() + static_cast<std::ptrdiff_t>(yoff + rows), y.storage.end(),
                            [](float v) { return v == -777.0f; }));
          ++cases;
        }
      }
    }
  }
  MESSAGE("matvec cases: " << cases << ", worst error / tolerance: " << worst_ratio);
  CHECK(cases > 1000);
}

TEST_CASE("matvec: misalignment of every byte offset gives the same result") {
  level_guard g;
  std::mt19937 rng(99);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : all_encodings) {
      const std::size_t cols = tlm::traits(enc).block_values == 256 ? 512 : 576, rows = 5;
      const auto wsrc = random_rows(enc, rows, cols, rng);
      const auto xsrc = random_floats(cols, rng);
      placed_bytes w0(wsrc, 0);
      placed_floats x0(xsrc, 0);
      std::vector<float> y0(rows);
      k::matvec(enc, w0.data, x0.data, y0.data(), rows, cols);
      for (std::size_t woff = 1; woff < 8; ++woff) {
        for (std::size_t xoff = 1; xoff < 4; ++xoff) {
          placed_bytes w(wsrc, woff);
          placed_floats x(xsrc, xoff);
          placed_floats y(std::vector<float>(rows, 0.0f), 4 - xoff);
          k::matvec(enc, w.data, x.data, y.data, rows, cols);
          // Same arithmetic in the same order: bitwise equal, whatever the addresses.
          for (std::size_t r = 0; r < rows; ++r) CHECK(y.data[r] == y0[r]);
        }
      }
    }
  }
}

TEST_CASE("matmul: every level and encoding against the reference, batch 1..9 and more") {
  level_guard g;
  std::mt19937 rng(777);
  worst_ratio = 0;
  std::size_t cases = 0;
  // 16, 31, 32, 33: around the batch where the AVX-512 level hands short batches to
  // its narrow (AVX2) kernel.
  const std::size_t batches[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 31, 32, 33, 64, 67};
  const std::size_t mm_rows[] = {1, 3, 4, 5, 8, 13, 67};
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : all_encodings) {
      const auto all_cols = cols_for(enc);
      for (std::size_t ci = 0; ci < all_cols.size(); ci += 2) {
        const std::size_t cols = all_cols[ci];
        for (std::size_t rows : mm_rows) {
          for (std::size_t batch : batches) {
            if (batch > 9 && (rows > 13 || cols > 600)) continue;  // keep the big batches cheap
            const auto wsrc = random_rows(enc, rows, cols, rng);
            const auto xsrc = random_floats(batch * cols, rng);
            const std::size_t woff = (batch + rows) % 8, xoff = batch % 4, yoff = (batch + 1) % 4;
            placed_bytes w(wsrc, woff);
            placed_floats x(xsrc, xoff);
            placed_floats y(std::vector<float>(batch * rows, 0.0f), yoff);
            std::vector<float> ref(batch * rows);
            k::matmul(enc, w.data, x.data, y.data, rows, cols, batch);
            k::matmul_reference(enc, w.data, x.data, ref.data(), rows, cols, batch);
            // Tolerance per output (b, r) uses row r and activation row b.
            int bad = 0;
            for (std::size_t b = 0; b < batch; ++b) {
              const auto sums = abs_sums(enc, w.data, x.data + b * cols, rows, cols);
              const std::string where = std::string(tlm::kernel_level_name(level)) + " " +
                                        std::string(tlm::name(enc)) + " rows " + std::to_string(rows) + " cols " +
                                        std::to_string(cols) + " batch " + std::to_string(batch) + " b " +
                                        std::to_string(b);
              bad += compare(y.data + b * rows, ref.data() + b * rows, sums, rows, rows, where);
            }
            CHECK(bad == 0);
            CHECK(std::all_of(y.storage.begin() + static_cast<std::ptrdiff_t>(yoff + batch * rows), y.storage.end(),
                              [](float v) { return v == -777.0f; }));
            ++cases;
          }
        }
      }
    }
  }
  MESSAGE("matmul cases: " << cases << ", worst error / tolerance: " << worst_ratio);
  CHECK(cases > 500);
}

TEST_CASE("every level's own prefill kernel at every batch, including those matmul hands to a narrower one") {
  std::mt19937 rng(778);
  std::size_t cases = 0;
  for (auto level : testable_levels()) {
    const auto& t = k::detail::table_for(level);
    for (encoding enc : all_encodings) {
      const std::size_t s = static_cast<std::size_t>(k::detail::slot(enc));
      const std::size_t rows = 13, cols = cols_for(enc)[2];  // 7, 96 or 768: a body and a tail
      const std::size_t rb = tlm::row_bytes(enc, cols);
      for (std::size_t batch : {1, 2, 5, 15, 16, 17, 31}) {
        const auto wsrc = random_rows(enc, rows, cols, rng);
        const auto xsrc = random_floats(batch * cols, rng);
        placed_bytes w(wsrc, batch % 8);
        placed_floats x(xsrc, batch % 4);
        std::vector<float> y(batch * rows), ref(batch * rows);
        t.matmul[s](enc, w.data, rb, x.data, y.data(), 0, rows, rows, cols, batch);
        k::matmul_reference(enc, w.data, x.data, ref.data(), rows, cols, batch);
        int bad = 0;
        for (std::size_t b = 0; b < batch; ++b) {
          const auto sums = abs_sums(enc, w.data, x.data + b * cols, rows, cols);
          bad += compare(y.data() + b * rows, ref.data() + b * rows, sums, rows, rows,
                         std::string(tlm::kernel_level_name(level)) + " own kernel " + std::string(tlm::name(enc)) +
                             " batch " + std::to_string(batch));
        }
        CHECK(bad == 0);
        ++cases;
      }
    }
  }
  CHECK(cases >= 7 * 9);
}

TEST_CASE("matmul row b agrees with matvec of activation row b") {
  level_guard g;
  std::mt19937 rng(5);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : {encoding::q4_1, encoding::q8_0}) {
      const std::size_t rows = 37, cols = 576, batch = 7;
      const auto w = random_rows(enc, rows, cols, rng);
      const auto x = random_floats(batch * cols, rng);
      std::vector<float> y(batch * rows), yv(rows);
      k::matmul(enc, w.data(), x.data(), y.data(), rows, cols, batch);
      for (std::size_t b = 0; b < batch; ++b) {
        k::matvec(enc, w.data(), x.data() + b * cols, yv.data(), rows, cols);
        const auto sums = abs_sums(enc, w.data(), x.data() + b * cols, rows, cols);
        CHECK(compare(y.data() + b * rows, yv.data(), sums, rows, rows, "matmul vs matvec") == 0);
      }
    }
  }
}

TEST_CASE("thread pools of 1, 2 and 3 threads give bitwise the single-threaded result") {
  level_guard g;
  std::mt19937 rng(31337);
  tlm::thread_pool p1(1), p2(2), p3(3);
  tlm::thread_pool* pools[] = {&p1, &p2, &p3};
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : all_encodings) {
      const std::size_t cols = tlm::traits(enc).block_values == 256 ? 768 : 576;
      for (std::size_t rows : {std::size_t{1}, std::size_t{3}, std::size_t{67}, std::size_t{1536}}) {
        const auto w = random_rows(enc, rows, cols, rng);
        const std::size_t batch = 5;
        const auto x = random_floats(batch * cols, rng);
        std::vector<float> y0(rows), m0(batch * rows);
        k::matvec(enc, w.data(), x.data(), y0.data(), rows, cols);
        k::matmul(enc, w.data(), x.data(), m0.data(), rows, cols, batch);
        for (auto* pool : pools) {
          std::vector<float> y(rows, -1.0f), m(batch * rows, -1.0f);
          k::matvec(enc, w.data(), x.data(), y.data(), rows, cols, pool);
          k::matmul(enc, w.data(), x.data(), m.data(), rows, cols, batch, pool);
          INFO(tlm::name(enc) << " rows " << rows << " threads " << pool->size());
          CHECK(std::memcmp(y.data(), y0.data(), rows * sizeof(float)) == 0);
          CHECK(std::memcmp(m.data(), m0.data(), batch * rows * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("SIMD decoders are bit for bit dequantize_row") {
#ifdef TLM_HAVE_AVX2_KERNELS
  if (!tlm::kernel_level_supported(tlm::kernel_level::avx2)) {
    CHECK_THROWS_AS(k::force_kernel_level(tlm::kernel_level::avx2), tlm::error);
    return;
  }
  std::mt19937 rng(4242);
  auto check = [&](encoding enc, auto decode) {
    // A body and a tail of blocks for every block size (32, or 256 for the K-quants).
    const std::size_t cols = tlm::traits(enc).block_values == 256 ? 1536 + 256 : 1536 + 32;
    const auto w = random_rows(enc, 3, cols, rng);
    const std::size_t rb = tlm::row_bytes(enc, cols);
    for (std::size_t r = 0; r < 3; ++r) {
      std::vector<float> a(cols), b(cols);
      tlm::dequantize_row(enc, w.data() + r * rb, a.data(), cols);
      decode(enc, w.data() + r * rb, b.data(), cols);
      INFO(tlm::name(enc));
      CHECK(std::memcmp(a.data(), b.data(), cols * sizeof(float)) == 0);
    }
  };
  namespace a2 = tlm::kernels::avx2;
  check(encoding::f32, a2::decode_row<encoding::f32>);
  check(encoding::f16, a2::decode_row<encoding::f16>);
  check(encoding::bf16, a2::decode_row<encoding::bf16>);
  check(encoding::q8_0, a2::decode_row<encoding::q8_0>);
  check(encoding::q4_0, a2::decode_row<encoding::q4_0>);
  check(encoding::q4_1, a2::decode_row<encoding::q4_1>);
  check(encoding::q5_0, a2::decode_row<encoding::q5_0>);
  check(encoding::q5_1, a2::decode_row<encoding::q5_1>);
  check(encoding::q4_k, a2::decode_row_k<encoding::q4_k>);
  check(encoding::q5_k, a2::decode_row_k<encoding::q5_k>);
  check(encoding::q6_k, a2::decode_row_k<encoding::q6_k>);
#else
  CHECK_THROWS_AS(k::force_kernel_level(tlm::kernel_level::avx2), tlm::error);
#endif
}

TEST_CASE("dot and axpy against their references, with misaligned operands") {
  level_guard g;
  std::mt19937 rng(8);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (std::size_t n = 0; n <= 130; ++n) {
      for (std::size_t off = 0; off < 4; ++off) {
        const auto a = random_floats(n, rng), b = random_floats(n, rng);
        placed_floats pa(a, off), pb(b, 3 - off);
        const float d = k::dot(pa.data, pb.data, n);
        const float dr = k::dot_reference(pa.data, pb.data, n);
        double s = 0;
        for (std::size_t i = 0; i < n; ++i) s += std::fabs(static_cast<double>(a[i]) * b[i]);
        CHECK(std::fabs(static_cast<double>(d) - dr) <= rel_tol * s);

        placed_floats y1(b, off), y2(b, off);
        k::axpy(0.375f, pa.data, y1.data, n);
        k::axpy_reference(0.375f, pa.data, y2.data, n);
        // One rounding per element either way (FMA or multiply-then-add): within 1 ulp of |y|+|a x|.
        for (std::size_t i = 0; i < n; ++i) {
          const double mag = std::fabs(static_cast<double>(b[i])) + std::fabs(0.375 * a[i]);
          CHECK(std::fabs(static_cast<double>(y1.data[i]) - y2.data[i]) <= mag * 1.2e-7);
        }
        CHECK(y1.storage[off + n] == -777.0f);
      }
    }
  }
}

TEST_CASE("bad arguments are reported, not computed") {
  std::vector<std::byte> w(1024);
  std::vector<float> x(64), y(64);
  CHECK_THROWS_AS(k::matvec(encoding::q4_1, w.data(), x.data(), y.data(), 2, 48), tlm::shape_error);
  CHECK_THROWS_AS(k::matmul(encoding::q8_0, w.data(), x.data(), y.data(), 2, 33, 2), tlm::shape_error);
  CHECK_THROWS_AS(k::matvec(encoding::q4_k, w.data(), x.data(), y.data(), 1, 32), tlm::shape_error);
  CHECK_THROWS_AS(k::matvec(encoding::q8_1, w.data(), x.data(), y.data(), 1, 32), tlm::shape_error);
  CHECK_THROWS_AS(k::matvec(encoding::q8_k, w.data(), x.data(), y.data(), 1, 256), tlm::shape_error);
  CHECK_THROWS_AS(k::matvec(static_cast<encoding>(77), w.data(), x.data(), y.data(), 1, 32), tlm::shape_error);
  CHECK_THROWS_AS(k::matvec_reference(encoding::q4_0, w.data(), x.data(), y.data(), 1, 20), tlm::shape_error);
  CHECK_THROWS_AS(k::matvec(encoding::f32, nullptr, x.data(), y.data(), 1, 4), tlm::error);
  try {
    k::matvec(encoding::q4_1, w.data(), x.data(), y.data(), 2, 48);
    FAIL("no exception");
  } catch (const tlm::shape_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("48") != std::string::npos);
    CHECK(msg.find("Q4_1") != std::string::npos);
  }
  // Zero columns: the empty sum.
  std::fill(y.begin(), y.end(), 5.0f);
  k::matvec(encoding::f32, w.data(), x.data(), y.data(), 3, 0);
  CHECK(y[0] == 0.0f);
  CHECK(y[2] == 0.0f);
  CHECK(y[3] == 5.0f);
}

TEST_CASE("kernel level override: force_kernel_level and TLM_KERNELS") {
  level_guard g;
  const auto prev = k::force_kernel_level(tlm::kernel_level::scalar);
  CHECK(k::active_kernel_level() == tlm::kernel_level::scalar);
  CHECK(k::kernel_level_name() == "scalar");
  CHECK(k::force_kernel_level(prev) == tlm::kernel_level::scalar);
  CHECK(k::active_kernel_level() == prev);

  CHECK(tlm::parse_kernel_level("scalar") == tlm::kernel_level::scalar);
  CHECK(tlm::parse_kernel_level("avx2") == tlm::kernel_level::avx2);
  CHECK(tlm::parse_kernel_level("avx512") == tlm::kernel_level::avx512);
  CHECK(tlm::parse_kernel_level("amx") == tlm::kernel_level::amx);
  CHECK_THROWS_AS(tlm::parse_kernel_level("avx1024"), tlm::error);
  CHECK_THROWS_AS(tlm::parse_kernel_level(""), tlm::error);

  const char* old = std::getenv("TLM_KERNELS");
  const std::string saved = old ? old : "";
  ::setenv("TLM_KERNELS", "scalar", 1);
  CHECK(tlm::startup_kernel_level() == tlm::kernel_level::scalar);
  ::setenv("TLM_KERNELS", "sse9", 1);
  CHECK_THROWS_AS(tlm::startup_kernel_level(), tlm::error);
  ::unsetenv("TLM_KERNELS");
  CHECK(tlm::startup_kernel_level() == tlm::best_kernel_level());
  if (old) ::setenv("TLM_KERNELS", saved.c_str(), 1);

  // The start-up choice never exceeds what the CPU supports.
  CHECK(tlm::kernel_level_supported(tlm::best_kernel_level()));
  const auto& f = tlm::cpu();
  if (f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.amx_tile && f.amx_bf16 &&
      f.avx512bf16) {
    CHECK(tlm::best_kernel_level() == tlm::kernel_level::amx);
  } else if (f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) {
    CHECK(tlm::best_kernel_level() == tlm::kernel_level::avx512);
    CHECK_THROWS_AS(k::force_kernel_level(tlm::kernel_level::amx), tlm::error);
  } else if (f.avx2 && f.fma && f.f16c) {
    CHECK(tlm::best_kernel_level() == tlm::kernel_level::avx2);
    CHECK_THROWS_AS(k::force_kernel_level(tlm::kernel_level::avx512), tlm::error);
  } else {
    CHECK(tlm::best_kernel_level() == tlm::kernel_level::scalar);
    CHECK_THROWS_AS(k::force_kernel_level(tlm::kernel_level::avx2), tlm::error);
  }
  MESSAGE("cpu features: " << tlm::cpu_feature_string() << "; start-up level " << k::kernel_level_name());
}

// ---- precision::fast -------------------------------------------------------------
//
// Three properties:
//  1. Every level quantizes the activations bit for bit as the scalar reference
//     (same IEEE operations, round to nearest even), so all levels see the same
//     integers.
//  2. Every level's fast kernel equals the scalar fast reference up to the order of
//     float additions: the integer sums are exact, and each block's float term is
//     (d_w d_x) isum (+ m s), or for a K-quant a super-block's (d_w D) times its
//     integer sum (the steps k_b folded into the sub-block scales). Tolerance 1e-6 of
//     the sum of the absolute values of the terms' parts,
//     bound_b = d_x sum_j |w_j - m| |q_j| + |m s| (a SIMD kernel may split an integer
//     sum over lanes before scaling).
//  3. Fast against exact: each activation is replaced by q d with |x - q d| <= d/2,
//     so |y_fast - y| <= sum_b (d_b / 2) sum_j |w_j| (plus float rounding, held to
//     the exact mode's 1e-5 sum|w x|). This is the documented error bound of the mode.
namespace {

constexpr double fast_rel_tol = 1e-6;

const encoding fast_encodings[] = {encoding::q8_0, encoding::q4_0, encoding::q4_1, encoding::q5_0,
                                   encoding::q5_1, encoding::q4_k, encoding::q5_k, encoding::q6_k};

// The same list as a type, for calling a kernel template once per encoding.
template <encoding... E>
struct encoding_list {};
constexpr encoding_list<encoding::q8_0, encoding::q4_0, encoding::q4_1, encoding::q5_0, encoding::q5_1, encoding::q4_k,
                        encoding::q5_k, encoding::q6_k>
    fast_encoding_list{};

struct fast_bounds {
  std::vector<double> vs_reference;  // [rows] property 2
  std::vector<double> vs_exact;      // [rows] property 3
  std::vector<double> abs_wx;        // [rows] sum |w x|
};

fast_bounds bounds_for(encoding enc, const std::byte* w, const float* x, std::size_t rows, std::size_t cols) {
  tlm::kernels::q8_activations q;
  tlm::kernels::detail::quantize_scalar(x, 1, cols, tlm::kernels::activation_group(enc), q);
  const std::size_t rb = tlm::row_bytes(enc, cols), bb = tlm::traits(enc).block_bytes;
  fast_bounds out;
  std::vector<float> row(cols);
  for (std::size_t r = 0; r < rows; ++r) {
    tlm::dequantize_row(enc, w + r * rb, row.data(), cols);
    double ref = 0, ex = 0, awx = 0;
    const bool k_quant = tlm::traits(enc).block_values == 256;
    for (std::size_t b = 0; b < cols / 32; ++b) {
      const std::byte* p = w + r * rb + (k_quant ? b / 8 : b) * bb;
      // The value a code of 0 stands for: the min of Q4_1 / Q5_1, minus dmin*m of a
      // Q4_K / Q5_K sub-block, 0 for the others (whose codes are centred).
      double m = 0;
      if (enc == encoding::q4_1 || enc == encoding::q5_1) m = tlm::fp16_to_f32(tlm::load_u16(p + 2));
      if (enc == encoding::q4_k || enc == encoding::q5_k) {
        std::uint8_t sc, mn;
        tlm::detail::k_scale_min(reinterpret_cast<const std::uint8_t*>(p) + 4, static_cast<int>(b % 8), sc, mn);
        m = -static_cast<double>(tlm::fp16_to_f32(tlm::load_u16(p + 2))) * mn;
      }
      const double d = q.ds[2 * b], sq = q.ds[2 * b + 1];
      double codes = 0, absw = 0;
      for (std::size_t j = 0; j < 32; ++j) {
        const double wj = row[32 * b + j];
        codes += std::fabs(wj - m) * std::abs(q.q[32 * b + j]);
        absw += std::fabs(wj);
        awx += std::fabs(wj * x[32 * b + j]);
      }
      ref += d * codes + std::fabs(m * sq);
      ex += d / 2 * absw;
    }
    out.vs_reference.push_back(fast_rel_tol * ref + 1e-30);
    out.vs_exact.push_back(ex * (1 + 1e-5) + rel_tol * awx + 1e-30);
    out.abs_wx.push_back(awx);
  }
  return out;
}

std::string describe(tlm::kernel_level level, encoding enc, std::size_t rows, std::size_t cols, std::size_t batch = 1) {
  return std::string(tlm::kernel_level_name(level)) + " " + std::string(tlm::name(enc)) + " rows " +
         std::to_string(rows) + " cols " + std::to_string(cols) + " batch " + std::to_string(batch);
}

}  // namespace

TEST_CASE("fast: every level quantizes the activations bit for bit as the scalar reference") {
  level_guard g;
  std::mt19937 rng(11);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (std::size_t group : {32, 256}) {
      for (std::size_t cols : {32, 64, 96, 256, 576, 1536}) {
        if (cols % group != 0) continue;
        for (std::size_t rows : {1, 3}) {
          auto x = random_floats(rows * cols, rng);
          // Edge cases: an all-zero block (d = 0 when the group is one block), exact ties
          // (x * (1/d) = k + 0.5), large values, and a group whose largest value is in its
          // last block (every block of a group takes that one d).
          std::fill(x.begin(), x.begin() + 32, 0.0f);
          if (cols >= 64) {
            for (std::size_t j = 0; j < 32; ++j) x[32 + j] = static_cast<float>(static_cast<int>(j) - 16) * 0.5f + 0.25f;
            x[32] = 127.0f;
          }
          if (cols >= 256) x[255] = -300.0f;
          x.back() = 3.0e4f;
          k::q8_activations a, b;
          k::detail::quantize_scalar(x.data(), rows, cols, group, a);
          k::detail::table().quantize(x.data(), rows, cols, group, b);
          INFO(tlm::kernel_level_name(level) << " group " << group << " cols " << cols << " rows " << rows);
          REQUIRE(a.q.size() == b.q.size());
          CHECK(a.rows == b.rows);
          CHECK(a.blocks == b.blocks);
          CHECK(a.group == group);
          CHECK(b.group == group);
          CHECK(std::memcmp(a.q.data(), b.q.data(), a.q.size()) == 0);
          CHECK(std::memcmp(a.ds.data(), b.ds.data(), a.ds.size() * sizeof(float)) == 0);
          CHECK(a.sums == b.sums);
          CHECK(a.units == b.units);
          CHECK(a.steps == b.steps);
          // Block b's d: the largest |x| of the block over 127 (group 32); for a group of
          // 256, k_b D with D = the group's largest |x| / (127 * 16) and k_b the least
          // step whose d covers the block's largest value (at least 1, at most 16).
          CHECK(a.units.size() == (group == 256 ? rows * cols / 256 : 0));
          CHECK(a.steps.size() == (group == 256 ? rows * cols / 32 : 0));
          for (std::size_t i = 0; i < rows * cols; i += group) {
            float amax = 0;
            for (std::size_t j = 0; j < group; ++j) amax = std::max(amax, std::fabs(x[i + j]));
            for (std::size_t j = 0; j < group; j += 32) {
              const std::size_t blk = (i + j) / 32;
              float bmax = 0;
              for (std::size_t l = 0; l < 32; ++l) bmax = std::max(bmax, std::fabs(x[i + j + l]));
              if (group == 32) {
                CHECK(a.ds[2 * blk] == amax / 127.0f);
                continue;
              }
              const double unit = a.units[i / 256];
              const int k = a.steps[blk];
              CHECK(a.units[i / 256] == amax / 127.0f / 16.0f);
              CHECK(a.ds[2 * blk] == static_cast<float>(unit * k));
              CHECK(k >= 1);
              CHECK(k <= 16);
              if (amax > 0) {
                CHECK(k * unit * 127 >= bmax * (1 - 1e-6));
                if (k > 1) CHECK((k - 1) * unit * 127 < bmax);
              }
            }
          }
          for (std::size_t i = 0; i < rows * cols; ++i) {
            const double d = a.ds[2 * (i / 32)];
            CHECK(std::fabs(x[i] - a.q[i] * d) <= d * 0.5 * (1 + 1e-6));
          }
          for (std::size_t blk = 0; blk < rows * cols / 32; ++blk) {
            int sum = 0;
            for (std::size_t j = 0; j < 32; ++j) sum += a.q[32 * blk + j];
            CHECK(a.ds[2 * blk + 1] == a.ds[2 * blk] * static_cast<float>(sum));
          }
          // Q8_K's sums of 16, for the K-quants' mins and offsets; none by 32.
          CHECK(a.sums.size() == (group == 256 ? rows * cols / 16 : 0));
          for (std::size_t h = 0; h < a.sums.size(); ++h) {
            int sum = 0;
            for (std::size_t j = 0; j < 16; ++j) sum += a.q[16 * h + j];
            CHECK(a.sums[h] == sum);
          }
        }
      }
    }
  }
}

TEST_CASE("fast: matvec at every level against the scalar integer reference, and against exact") {
  level_guard g;
  std::mt19937 rng(2718);
  double worst_ref = 0, worst_exact = 0, sum_rel = 0;
  std::size_t cases = 0, outputs = 0;
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : fast_encodings) {
      for (std::size_t cols : cols_for(enc)) {
        for (std::size_t rows : row_counts) {
          const auto wsrc = random_rows(enc, rows, cols, rng);
          const auto xsrc = random_floats(cols, rng);
          const std::size_t woff = (rows * 5 + cols) % 8, xoff = (rows + 1) % 4, yoff = rows % 4;
          placed_bytes w(wsrc, woff);
          placed_floats x(xsrc, xoff);
          placed_floats y(std::vector<float>(rows, 0.0f), yoff);
          std::vector<float> ref(rows), exact(rows);
          k::matvec(enc, w.data, x.data, y.data, rows, cols, nullptr, k::precision::fast);
          k::matvec_fast_reference(enc, w.data, x.data, ref.data(), rows, cols);
          k::matvec_reference(enc, w.data, x.data, exact.data(), rows, cols);
          const auto bounds = bounds_for(enc, w.data, x.data, rows, cols);
          const std::string where = describe(level, enc, rows, cols) + " offsets " + std::to_string(woff) + "/" +
                                    std::to_string(xoff) + "/" + std::to_string(yoff);
          for (std::size_t r = 0; r < rows; ++r) {
            const double e_ref = std::fabs(static_cast<double>(y.data[r]) - ref[r]);
            const double e_exact = std::fabs(static_cast<double>(y.data[r]) - exact[r]);
            worst_ref = std::max(worst_ref, e_ref / bounds.vs_reference[r]);
            worst_exact = std::max(worst_exact, e_exact / bounds.vs_exact[r]);
            sum_rel += e_exact / (bounds.abs_wx[r] + 1e-30);
            ++outputs;
            if (!(e_ref <= bounds.vs_reference[r]) || !(e_exact <= bounds.vs_exact[r])) {
              INFO(where << " row " << r << ": fast " << y.data[r] << " fast ref " << ref[r] << " exact " << exact[r]);
              CHECK(e_ref <= bounds.vs_reference[r]);
              CHECK(e_exact <= bounds.vs_exact[r]);
              break;
            }
          }
          CHECK(std::all_of(y.storage.begin(), y.storage.begin() + static_cast<std::ptrdiff_t>(yoff),
                            [](float v) { return v == -777.0f; }));
          CHECK(std::all_of(y.storage.begin() + static_cast<std::ptrdiff_t>(yoff + rows), y.storage.end(),
                            [](float v) { return v == -777.0f; }));
          ++cases;
        }
      }
    }
  }
  MESSAGE("fast matvec cases: " << cases << "; worst error / tolerance against the fast reference: " << worst_ref
                                << ", against the exact bound: " << worst_exact
                                << "; mean |fast - exact| / sum|w x|: " << sum_rel / static_cast<double>(outputs));
  CHECK(cases > 300);
}

// A block of NaN activations (a model whose weights hold a NaN: its norms spread it over
// whole rows) must come out as NaN, never as finite numbers: the generator refuses
// non-finite logits, and a finite answer would hide the fault.
TEST_CASE("fast: a block of NaN activations gives NaN outputs at every level and grouping") {
  level_guard g;
  std::mt19937 rng(404);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : fast_encodings) {
      const std::size_t rows = 21, cols = 512;
      const auto w = random_rows(enc, rows, cols, rng);
      for (std::size_t nan_block : {std::size_t{0}, std::size_t{9}, std::size_t{15}}) {
        auto x = random_floats(cols, rng);
        std::fill(x.begin() + static_cast<std::ptrdiff_t>(32 * nan_block),
                  x.begin() + static_cast<std::ptrdiff_t>(32 * nan_block + 32), std::numeric_limits<float>::quiet_NaN());
        std::vector<float> y(rows, 0.0f), ref(rows, 0.0f);
        k::matvec(enc, w.data(), x.data(), y.data(), rows, cols, nullptr, k::precision::fast);
        k::matvec_fast_reference(enc, w.data(), x.data(), ref.data(), rows, cols);
        INFO(describe(level, enc, rows, cols) << " NaN block " << nan_block);
        CHECK(std::all_of(y.begin(), y.end(), [](float v) { return std::isnan(v); }));
        CHECK(std::all_of(ref.begin(), ref.end(), [](float v) { return std::isnan(v); }));
      }
    }
  }
}

TEST_CASE("fast: matmul at every level against the scalar integer reference, and row b equals matvec of row b") {
  level_guard g;
  // The integer kernels, also on CPUs whose automatic choice is the float32 GEMM.
  const tlm_test::prefill_guard integer(k::prefill_path::integer);
  std::mt19937 rng(1618);
  double worst = 0;
  const std::size_t batches[] = {2, 3, 4, 5, 7, 9, 64, 67};
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : fast_encodings) {
      const bool k_quant = tlm::traits(enc).block_values == 256;
      for (std::size_t cols : k_quant ? std::vector<std::size_t>{256, 768, 1536} : std::vector<std::size_t>{32, 96, 576, 1536}) {
        for (std::size_t rows : {1, 5, 13, 67}) {
          for (std::size_t batch : batches) {
            if (batch > 9 && cols > 600) continue;
            const auto wsrc = random_rows(enc, rows, cols, rng);
            const auto xsrc = random_floats(batch * cols, rng);
            const std::size_t woff = (batch + rows) % 8, xoff = batch % 4, yoff = (batch + 3) % 4;
            placed_bytes w(wsrc, woff);
            placed_floats x(xsrc, xoff);
            placed_floats y(std::vector<float>(batch * rows, 0.0f), yoff);
            std::vector<float> ref(batch * rows), yv(rows);
            k::matmul(enc, w.data, x.data, y.data, rows, cols, batch, nullptr, k::precision::fast);
            k::matmul_fast_reference(enc, w.data, x.data, ref.data(), rows, cols, batch);
            int bad = 0;
            for (std::size_t b = 0; b < batch; ++b) {
              const auto bounds = bounds_for(enc, w.data, x.data + b * cols, rows, cols);
              k::matvec(enc, w.data, x.data + b * cols, yv.data(), rows, cols, nullptr, k::precision::fast);
              for (std::size_t r = 0; r < rows; ++r) {
                const double e = std::fabs(static_cast<double>(y.data[b * rows + r]) - ref[b * rows + r]);
                const double ev = std::fabs(static_cast<double>(y.data[b * rows + r]) - yv[r]);
                worst = std::max(worst, e / bounds.vs_reference[r]);
                if (!(e <= bounds.vs_reference[r]) || !(ev <= 2 * bounds.vs_reference[r])) ++bad;
              }
            }
            INFO(describe(level, enc, rows, cols, batch));
            CHECK(bad == 0);
            CHECK(std::all_of(y.storage.begin() + static_cast<std::ptrdiff_t>(yoff + batch * rows), y.storage.end(),
                              [](float v) { return v == -777.0f; }));
          }
        }
      }
    }
  }
  MESSAGE("fast matmul: worst error / tolerance against the fast reference: " << worst);
}

// The crossovers documented in kernels/table.hpp (set_integer_max_batch): the most rows a
// fast matmul runs through the integer kernels, above which it takes the float32 GEMM, on
// every vendor. At the scalar level every matmul of 2 or more rows is the exact one.
std::size_t documented_integer_max_batch(tlm::kernel_level level, encoding enc) {
  const bool k_quant = tlm::traits(enc).block_values == 256;
  if (level == tlm::kernel_level::scalar) return 1;
  // The amx level's fast kernels are avx512's.
  if ((level == tlm::kernel_level::avx512 || level == tlm::kernel_level::amx) && tlm::cpu().avx512vnni)
    return std::numeric_limits<std::size_t>::max();  // weight rows in the lanes: no crossover
  return k_quant ? 16 : 8;
}

TEST_CASE("fast: a matmul runs the integer kernels up to the documented batch size and the exact product above it") {
  level_guard g;
  std::mt19937 rng(6);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : fast_encodings) {
      const std::size_t crossover = documented_integer_max_batch(level, enc);
      for (std::size_t batch : {std::size_t{2}, std::size_t{8}, std::size_t{9}, std::size_t{12}, std::size_t{13},
                                std::size_t{16}, std::size_t{17}, std::size_t{24}, std::size_t{25}, std::size_t{40}}) {
        const std::size_t rows = 37, cols = tlm::traits(enc).block_values == 256 ? 768 : 576;
        const auto w = random_rows(enc, rows, cols, rng);
        const auto x = random_floats(batch * cols, rng);
        std::vector<float> automatic(batch * rows), integer(batch * rows), exact(batch * rows);
        {
          const tlm_test::prefill_guard p(k::prefill_path::automatic);
          CHECK(k::integer_matmul(enc, batch) == (batch <= crossover));
          k::matmul(enc, w.data(), x.data(), automatic.data(), rows, cols, batch, nullptr, k::precision::fast);
        }
        {
          const tlm_test::prefill_guard p(k::prefill_path::integer);
          k::matmul(enc, w.data(), x.data(), integer.data(), rows, cols, batch, nullptr, k::precision::fast);
        }
        k::matmul(enc, w.data(), x.data(), exact.data(), rows, cols, batch, nullptr, k::precision::exact);
        INFO(describe(level, enc, rows, cols, batch) << ", crossover " << crossover);
        // The two paths differ (int8 activations), so which one ran is visible.
        CHECK(std::memcmp(integer.data(), exact.data(), exact.size() * sizeof(float)) != 0);
        const auto& want = batch <= crossover ? integer : exact;
        CHECK(std::memcmp(automatic.data(), want.data(), want.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("fast: on the float32 prefill path a fast matmul is the exact one bit for bit") {
  level_guard g;
  std::mt19937 rng(5);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    const tlm_test::prefill_guard f32(k::prefill_path::float32);
    CHECK_FALSE(k::integer_matmul(encoding::q4_1, 2));
    for (encoding enc : fast_encodings) {
      for (std::size_t batch : {std::size_t{2}, std::size_t{7}, std::size_t{64}}) {
        const std::size_t rows = 37, cols = tlm::traits(enc).block_values == 256 ? 768 : 576;
        const auto w = random_rows(enc, rows, cols, rng);
        const auto x = random_floats(batch * cols, rng);
        std::vector<float> fast(batch * rows), exact(batch * rows);
        k::matmul(enc, w.data(), x.data(), fast.data(), rows, cols, batch, nullptr, k::precision::fast);
        k::matmul(enc, w.data(), x.data(), exact.data(), rows, cols, batch, nullptr, k::precision::exact);
        INFO(describe(level, enc, rows, cols, batch));
        CHECK(std::memcmp(fast.data(), exact.data(), fast.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("fast: thread pools of 1, 2 and 3 threads give bitwise the single-threaded result") {
  level_guard g;
  std::mt19937 rng(4);
  tlm::thread_pool p2(2), p3(3);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (encoding enc : all_encodings) {
      const std::size_t cols = tlm::traits(enc).block_values == 256 ? 768 : 576;
      for (std::size_t rows : {std::size_t{1}, std::size_t{67}, std::size_t{1536}}) {
        const auto w = random_rows(enc, rows, cols, rng);
        const std::size_t batch = 6;
        const auto x = random_floats(batch * cols, rng);
        std::vector<float> y0(rows), m0(batch * rows);
        k::matvec(enc, w.data(), x.data(), y0.data(), rows, cols, nullptr, k::precision::fast);
        k::matmul(enc, w.data(), x.data(), m0.data(), rows, cols, batch, nullptr, k::precision::fast);
        for (auto* pool : {&p2, &p3}) {
          std::vector<float> y(rows, -1.0f), m(batch * rows, -1.0f);
          k::matvec(enc, w.data(), x.data(), y.data(), rows, cols, pool, k::precision::fast);
          k::matmul(enc, w.data(), x.data(), m.data(), rows, cols, batch, pool, k::precision::fast);
          INFO(tlm::kernel_level_name(level) << " " << tlm::name(enc) << " rows " << rows << " threads " << pool->size());
          CHECK(std::memcmp(y.data(), y0.data(), rows * sizeof(float)) == 0);
          CHECK(std::memcmp(m.data(), m0.data(), batch * rows * sizeof(float)) == 0);
        }
        if (!k::has_fast_kernel(enc)) {
          // No integer path: fast is the exact product, bit for bit.
          std::vector<float> ye(rows);
          k::matvec(enc, w.data(), x.data(), ye.data(), rows, cols);
          CHECK(std::memcmp(ye.data(), y0.data(), rows * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("adamw_update at every level against its reference, across sizes and misalignments") {
  level_guard g;
  std::mt19937 rng(99);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const tlm::kernels::adamw_constants c{0.7f, 0.999f, 0.9f, 0.95f, 3e-3f, 0.31f, 1e-8f};
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (std::size_t size : {0, 1, 7, 8, 15, 16, 17, 31, 33, 100, 1000}) {
      for (std::size_t off : {0, 1, 3}) {
        std::vector<float> p(size + off), gr(size + off), m(size + off), v(size + off);
        for (auto* x : {&p, &gr, &m}) for (auto& y : *x) y = n(rng);
        for (auto& y : v) y = std::abs(n(rng));
        auto p2 = p, m2 = m, v2 = v;
        k::adamw_update(p.data() + off, gr.data() + off, m.data() + off, v.data() + off, size, c);
        k::adamw_update_reference(p2.data() + off, gr.data() + off, m2.data() + off, v2.data() + off, size, c);
        for (std::size_t i = 0; i < size + off; ++i) {
          INFO(tlm::kernel_level_name(level) << " size " << size << " offset " << off << " i " << i);
          CHECK(p[i] == doctest::Approx(p2[i]).epsilon(1e-6));
          CHECK(m[i] == doctest::Approx(m2[i]).epsilon(1e-6));
          CHECK(v[i] == doctest::Approx(v2[i]).epsilon(1e-6));
        }
      }
    }
  }
}

TEST_CASE("adamw_update at every level: ε outside the root where √v is as small as ε, against double") {
  // With v near ε² the denominator √v / √(1 − β2ᵗ) + ε is half ε, so ε inside the root,
  // or added before dividing by √(1 − β2ᵗ), moves the update by a large factor; with
  // v near 1 (the case above) ε is invisible. 37 elements: SIMD blocks and a tail.
  level_guard g;
  for (const float eps : {1e-8f, 1e-4f}) {
    const float beta1 = 0.9f, beta2 = 0.95f, scale = 0.3f, bc2 = 0.31f;
    const tlm::kernels::adamw_constants c{scale, 1.0f, beta1, beta2, 2e-3f, bc2, eps};
    constexpr std::size_t n = 37;
    std::vector<float> g0(n), m0(n), v0(n);
    for (std::size_t i = 0; i < n; ++i) {
      // |g · scale| from ε/10 to 10ε times √(1 − β2ᵗ) / √(1 − β2), so √v / bc2 spans ε/10..10ε.
      const float r = std::pow(10.0f, -1.0f + 2.0f * static_cast<float>(i) / (n - 1));
      const float sign = i % 3 == 0 ? -1.0f : 1.0f;
      g0[i] = sign * r * eps * bc2 / std::sqrt(1.0f - beta2) / scale;
      m0[i] = i % 2 == 0 ? 0.0f : 0.5f * g0[i];
      v0[i] = i % 4 == 0 ? 0.0f : 0.25f * eps * eps * bc2 * bc2;
    }
    for (auto level : testable_levels()) {
      k::force_kernel_level(level);
      std::vector<float> p(n, 0.0f), m = m0, v = v0;
      k::adamw_update(p.data(), g0.data(), m.data(), v.data(), n, c);
      for (std::size_t i = 0; i < n; ++i) {
        INFO(tlm::kernel_level_name(level) << " eps " << eps << " i " << i);
        const double gi = static_cast<double>(g0[i]) * scale;
        const double mi = static_cast<double>(beta1) * m0[i] + (1.0 - beta1) * gi;
        const double vi = static_cast<double>(beta2) * v0[i] + (1.0 - beta2) * gi * gi;
        const double want = -static_cast<double>(c.step_size) * mi / (std::sqrt(vi) / bc2 + eps);
        CHECK(std::fabs(m[i] - mi) <= 1e-6 * std::fabs(mi));
        CHECK(std::fabs(v[i] - vi) <= 1e-6 * vi);
        CHECK(std::fabs(p[i] - want) <= 1e-5 * std::fabs(want));
      }
    }
  }
}

TEST_CASE("adamw_update at every level: from v = 0, v is (1 − β2)(g · clip)² for every element") {
  // The clip factor scales the gradient before it is squared: v must not see the raw g.
  level_guard g;
  std::mt19937 rng(101);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const tlm::kernels::adamw_constants c{0.25f, 0.999f, 0.9f, 0.95f, 3e-3f, 0.31f, 1e-8f};
  constexpr std::size_t n = 45;
  std::vector<float> gr(n);
  for (auto& x : gr) x = d(rng);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
    k::adamw_update(p.data(), gr.data(), m.data(), v.data(), n, c);
    for (std::size_t i = 0; i < n; ++i) {
      INFO(tlm::kernel_level_name(level) << " i " << i);
      const double gi = static_cast<double>(gr[i]) * c.scale;
      CHECK(std::fabs(v[i] - (1.0 - c.beta2) * gi * gi) <= 1e-6 * (1.0 - c.beta2) * gi * gi);
      CHECK(std::fabs(m[i] - (1.0 - c.beta1) * gi) <= 1e-6 * std::fabs((1.0 - c.beta1) * gi));
    }
  }
}

TEST_CASE("default precision: exact unless TLM_PRECISION says fast") {
  const char* env = std::getenv("TLM_PRECISION");
  const bool fast = env != nullptr && std::string(env) == "fast";
  CHECK(k::default_precision() == (fast ? k::precision::fast : k::precision::exact));
  CHECK(k::has_fast_kernel(encoding::q4_1));
  CHECK(k::has_fast_kernel(encoding::q8_0));
  CHECK(k::has_fast_kernel(encoding::q4_0));
  for (encoding e : {encoding::q5_0, encoding::q5_1, encoding::q4_k, encoding::q5_k, encoding::q6_k})
    CHECK(k::has_fast_kernel(e));
  CHECK_FALSE(k::has_fast_kernel(encoding::f32));
  CHECK_FALSE(k::has_fast_kernel(encoding::f16));
  CHECK_FALSE(k::has_fast_kernel(encoding::bf16));
}

// A matvec kernel called directly (not through the table), against the exact reference
// across cols_for(enc) and 1, 5 and 33 rows; `prepare` rewrites x as the kernel wants it.
// Returns the number of cases run.
template <class Kernel, class Prepare>
std::size_t check_exact_direct(const char* level, encoding enc, Kernel kernel, Prepare prepare, std::mt19937& rng) {
  std::size_t cases = 0;
  for (std::size_t cols : cols_for(enc)) {
    for (std::size_t rows : {std::size_t{1}, std::size_t{5}, std::size_t{33}}) {
      const auto wsrc = random_rows(enc, rows, cols, rng);
      const auto xsrc = random_floats(cols, rng);
      placed_bytes w(wsrc, (rows + cols) % 8);
      std::vector<float> prepared, y(rows), ref(rows);
      prepare(xsrc.data(), cols, prepared);
      kernel(enc, w.data, tlm::row_bytes(enc, cols), prepared.data(), y.data(), 0, rows, cols);
      k::matvec_reference(enc, w.data, xsrc.data(), ref.data(), rows, cols);
      const auto sums = abs_sums(enc, w.data, xsrc.data(), rows, cols);
      CHECK(compare(y.data(), ref.data(), sums, rows, rows, std::string(level) + " direct " + std::string(tlm::name(enc))) == 0);
      ++cases;
    }
  }
  return cases;
}

void copy_x(const float* x, std::size_t n, std::vector<float>& out) { out.assign(x, x + n); }

TEST_CASE("AVX-512 exact matvec kernels against the reference, also where the table prefers others") {
#ifdef TLM_HAVE_AVX512_KERNELS
  if (!tlm::kernel_level_supported(tlm::kernel_level::avx512)) {
    MESSAGE("skipped: this CPU has no AVX-512 F/BW/VL/DQ (" << tlm::cpu_feature_string() << ")");
    return;
  }
  // On AMD the avx512 table runs the AVX2 kernels for quantized exact matvec (they
  // measured faster there); the AVX-512 ones are checked here directly.
  namespace a5 = tlm::kernels::avx512;
  std::mt19937 rng(515);
  auto check = [&](encoding enc, auto kernel, auto prepare) { check_exact_direct("avx512", enc, kernel, prepare, rng); };
  auto copy = copy_x;
  check(encoding::q8_0, a5::matvec_rows<encoding::q8_0>, copy);
  check(encoding::q4_0, a5::matvec_rows<encoding::q4_0>, a5::prepare_q4_x<encoding::q4_0>);
  check(encoding::q4_1, a5::matvec_rows<encoding::q4_1>, a5::prepare_q4_x<encoding::q4_1>);
  check(encoding::q5_0, a5::matvec_rows<encoding::q5_0>, a5::prepare_q4_x<encoding::q5_0>);
  check(encoding::q5_1, a5::matvec_rows<encoding::q5_1>, a5::prepare_q4_x<encoding::q5_1>);
  check(encoding::q4_k, a5::matvec_rows<encoding::q4_k>, a5::prepare_k_x<encoding::q4_k>);
  check(encoding::q5_k, a5::matvec_rows<encoding::q5_k>, a5::prepare_k_x<encoding::q5_k>);
  check(encoding::q6_k, a5::matvec_rows<encoding::q6_k>, a5::prepare_k_x<encoding::q6_k>);
  check(encoding::f32, a5::matvec_rows<encoding::f32>, copy);
  check(encoding::f16, a5::matvec_rows<encoding::f16>, copy);
  check(encoding::bf16, a5::matvec_rows<encoding::bf16>, copy);
  // x as three bytes (the table's exact Q5 kernels on Intel CPUs with VNNI).
  if (tlm::cpu().avx512vnni) {
    check(encoding::q5_0, a5::matvec_rows_q5_digits<encoding::q5_0>, a5::prepare_q5_digits<encoding::q5_0>);
    check(encoding::q5_1, a5::matvec_rows_q5_digits<encoding::q5_1>, a5::prepare_q5_digits<encoding::q5_1>);
    check(encoding::q4_k, a5::matvec_rows_k_digits<encoding::q4_k>, a5::prepare_k_digits<encoding::q4_k>);
    check(encoding::q5_k, a5::matvec_rows_k_digits<encoding::q5_k>, a5::prepare_k_digits<encoding::q5_k>);
    check(encoding::q6_k, a5::matvec_rows_k_digits<encoding::q6_k>, a5::prepare_k_digits<encoding::q6_k>);
  }
#else
  MESSAGE("skipped: no AVX-512 kernels on this architecture");
#endif
}

// What multiplies each x's rounding in the kernels that take x as three bytes: the weight
// less what is applied with the float sums of x (Q5_1's, Q4_K's and Q5_K's mins; Q6_K's
// offset of 32), |d c| per value, bounded here by weights decoded from altered blocks.
std::vector<float> rounding_weights(encoding enc, const std::vector<std::byte>& w, std::size_t rows, std::size_t cols) {
  const std::size_t rb = tlm::row_bytes(enc, cols), bb = tlm::traits(enc).block_bytes;
  const std::size_t blocks = rows * cols / tlm::traits(enc).block_values;
  std::vector<float> out(rows * cols), a(cols), b(cols);
  std::vector<std::byte> altered = w;
  if (enc == encoding::q5_1 || enc == encoding::q4_k || enc == encoding::q5_k)
    for (std::size_t k = 0; k < blocks; ++k) put_half(altered.data() + k * bb + 2, 0.0f);  // no min
  if (enc == encoding::q6_k)  // every code 0: -32 d sc, so |d sc c| <= |w| + |that|
    for (std::size_t k = 0; k < blocks; ++k) std::fill_n(altered.data() + k * bb, 192, std::byte{0});
  for (std::size_t r = 0; r < rows; ++r) {
    tlm::dequantize_row(enc, w.data() + r * rb, a.data(), cols);
    tlm::dequantize_row(enc, altered.data() + r * rb, b.data(), cols);
    for (std::size_t c = 0; c < cols; ++c)
      out[r * cols + c] = enc == encoding::q6_k ? std::fabs(a[c]) + std::fabs(b[c]) : std::fabs(enc == encoding::q5_0 ? a[c] : b[c]);
  }
  return out;
}

// An exact matvec that takes x prepared once per matvec (the table's prepare hook).
struct prepared_matvec {
  using kernel_fn = void (*)(encoding, const std::byte*, std::size_t, const float*, float*, std::size_t, std::size_t,
                             std::size_t);
  using prepare_fn = void (*)(const float*, std::size_t, std::vector<float>&);
  encoding enc;
  kernel_fn kernel;
  prepare_fn prepare;

  std::vector<float> operator()(const std::vector<std::byte>& w, const std::vector<float>& x, std::size_t rows) const {
    std::vector<float> prepared, y(rows);
    prepare(x.data(), x.size(), prepared);
    kernel(enc, w.data(), tlm::row_bytes(enc, x.size()), prepared.data(), y.data(), 0, rows, x.size());
    return y;
  }
};

// x [cols] with each 32 values in one regime: scales[regime] times uniform(-1, 1), and in
// regime 1 one value of 1e4 among them.
std::vector<float> x_in_regimes(std::size_t cols, const std::vector<float>& scales, std::mt19937& rng) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const std::size_t groups = cols / 32;
  std::vector<float> x(cols);
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t regime = (g + groups) % scales.size();
    for (std::size_t i = 0; i < 32; ++i) x[32 * g + i] = scales[regime] * unit(rng);
    if (regime == 1) x[32 * g + (g * 7) % 32] = 1e4f;
  }
  return x;
}

// x with a NaN, then an infinity, at each of `at`: every row NaN for the NaN; for the
// infinity NaN too (nan_for_infinity) or at least not finite.
void check_non_finite(const prepared_matvec& m, const std::vector<std::byte>& w, const std::vector<float>& x,
                      std::size_t rows, std::initializer_list<std::size_t> at, bool nan_for_infinity) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    for (std::size_t i : at) {
      std::vector<float> xb = x;
      xb[i] = bad;
      const auto y = m(w, xb, rows);
      INFO(tlm::name(m.enc) << " cols " << x.size() << " x[" << i << "] = " << bad);
      if (std::isnan(bad) || nan_for_infinity) CHECK(std::all_of(y.begin(), y.end(), [](float t) { return std::isnan(t); }));
      else CHECK(std::none_of(y.begin(), y.end(), [](float t) { return std::isfinite(t); }));
    }
  }
}

TEST_CASE("exact matvec with x as three bytes (Q5, K-quants): within its stated bound over a wide range of x, NaN for a non-finite block") {
#ifdef TLM_HAVE_AVX512_KERNELS
  if (!tlm::kernel_level_supported(tlm::kernel_level::avx512) || !tlm::cpu().avx512vnni) {
    MESSAGE("skipped: this CPU has no AVX-512 VNNI (" << tlm::cpu_feature_string() << ")");
    return;
  }
  namespace a5 = tlm::kernels::avx512;
  const prepared_matvec variants[] = {
      {encoding::q5_0, a5::matvec_rows_q5_digits<encoding::q5_0>, a5::prepare_q5_digits<encoding::q5_0>},
      {encoding::q5_1, a5::matvec_rows_q5_digits<encoding::q5_1>, a5::prepare_q5_digits<encoding::q5_1>},
      {encoding::q4_k, a5::matvec_rows_k_digits<encoding::q4_k>, a5::prepare_k_digits<encoding::q4_k>},
      {encoding::q5_k, a5::matvec_rows_k_digits<encoding::q5_k>, a5::prepare_k_digits<encoding::q5_k>},
      {encoding::q6_k, a5::matvec_rows_k_digits<encoding::q6_k>, a5::prepare_k_digits<encoding::q6_k>},
  };
  std::mt19937 rng(2412);
  std::size_t cases = 0;
  double worst = 0;
  for (const prepared_matvec& v : variants) {
    const bool k_quant = tlm::traits(v.enc).block_values == 256;
    for (std::size_t cols : k_quant ? std::vector<std::size_t>{256, 1536, 2048} : std::vector<std::size_t>{32, 96, 576, 1536}) {
      const std::size_t rows = 9, rb = tlm::row_bytes(v.enc, cols);
      const auto w = random_rows(v.enc, rows, cols, rng);
      // Regimes: ordinary, one value 1e4 times the rest, values near 1e-30, subnormal
      // values, all zero, values near 1e30.
      const auto x = x_in_regimes(cols, {1.0f, 1.0f, 1e-30f, 1e-40f, 0.0f, 1e30f}, rng);
      const auto y = v(w, x, rows);
      std::vector<float> wr(cols);
      // Bound (digits_of_32): each x moves by at most max(1.2e-7 max|x of its 4|, 2^-149),
      // times rounding_weights; the float steps after the integer sums within rel_tol of
      // sum |w x|.
      const auto a = rounding_weights(v.enc, w, rows, cols);
      for (std::size_t r = 0; r < rows; ++r) {
        tlm::dequantize_row(v.enc, w.data() + r * rb, wr.data(), cols);
        double exact = 0, sum_abs = 0, moved = 0;
        for (std::size_t g = 0; g < cols / 4; ++g) {
          double top = 0;
          for (std::size_t i = 4 * g; i < 4 * g + 4; ++i) top = std::max(top, std::fabs(static_cast<double>(x[i])));
          const double step = std::max(1.2e-7 * top, std::ldexp(1.0, -149));
          for (std::size_t i = 4 * g; i < 4 * g + 4; ++i) {
            exact += static_cast<double>(wr[i]) * x[i];
            sum_abs += std::fabs(static_cast<double>(wr[i]) * x[i]);
            moved += static_cast<double>(a[r * cols + i]) * step;
          }
        }
        const double err = std::fabs(y[r] - exact), allowed = moved + rel_tol * sum_abs;
        worst = std::max(worst, err / allowed);
        INFO(tlm::name(v.enc) << " cols " << cols << " row " << r << ": " << y[r] << " against " << exact);
        CHECK(err <= allowed);
        ++cases;
      }
      // A NaN or an infinity in one value: NaN in every row.
      check_non_finite(v, w, x, rows, {cols - 1}, true);
    }
  }
  MESSAGE("x as three bytes: " << cases << " rows, worst error / bound " << worst);
  CHECK(cases == (2 * 4 + 3 * 3) * 9);
#else
  MESSAGE("skipped: no AVX-512 kernels on this architecture");
#endif
}

// avx2::matvec_rows_q5 takes byte k of each code dword as c 2^(8k) and x's values 4i + 1
// and 4i + 2 times 2^-8 and 2^-16 (prepare_q5_x): the same products, except that x below
// 2^-110 (subnormal once scaled) keeps fewer bits, each value moving by at most
// 2^(8k - 149). Q5_0's -16 per code is -16 times each 4 values' float sum.
TEST_CASE("avx2 exact Q5 matvec: within its stated bound over a wide range of x, non-finite for a non-finite value") {
#ifdef TLM_HAVE_AVX2_KERNELS
  if (!tlm::kernel_level_supported(tlm::kernel_level::avx2)) {
    MESSAGE("skipped: this CPU has no AVX2 (" << tlm::cpu_feature_string() << ")");
    return;
  }
  namespace a2 = tlm::kernels::avx2;
  const prepared_matvec variants[] = {
      {encoding::q5_0, a2::matvec_rows_q5<encoding::q5_0>, a2::prepare_q5_x<encoding::q5_0>},
      {encoding::q5_1, a2::matvec_rows_q5<encoding::q5_1>, a2::prepare_q5_x<encoding::q5_1>},
  };
  std::mt19937 rng(2413);
  std::size_t cases = 0;
  double worst = 0;
  for (const prepared_matvec& v : variants) {
    for (std::size_t cols : {32, 96, 576, 960}) {
      const std::size_t rows = 9, rb = tlm::row_bytes(v.enc, cols), bb = rb / (cols / 32);
      const auto w = random_rows(v.enc, rows, cols, rng);
      // Regimes: ordinary, one value 1e4 times the rest, near 1e-30 (full precision), near
      // 1e-35 (below 2^-110), subnormal, all zero, near 1e30.
      const auto x = x_in_regimes(cols, {1.0f, 1.0f, 1e-30f, 1e-35f, 1e-40f, 0.0f, 1e30f}, rng);
      const auto y = v(w, x, rows);
      std::vector<float> wr(cols);
      for (std::size_t r = 0; r < rows; ++r) {
        tlm::dequantize_row(v.enc, w.data() + r * rb, wr.data(), cols);
        double exact = 0, sum_abs = 0, moved = 0;
        for (std::size_t i = 0; i < cols; ++i) {
          exact += static_cast<double>(wr[i]) * x[i];
          sum_abs += std::fabs(static_cast<double>(wr[i]) * x[i]);
          // x moved by up to 2^(8k - 149) in groups 1 and 2, times a stored code (up to 31) and d.
          const double d = std::fabs(tlm::fp16_to_f32(tlm::load_u16(w.data() + r * rb + (i / 32) * bb)));
          const int k = static_cast<int>(i % 4);
          if (k == 1 || k == 2) moved += d * 31.0 * std::ldexp(1.0, 8 * k - 149);
          // The float steps' own subnormal roundings (4 a value, 2^-149 each, times d).
          moved += d * 4.0 * std::ldexp(1.0, -149);
          // What the offset (Q5_0, -16 d) or the min (Q5_1) is applied with, the float sums of
          // x, rounds at their size: within 2^-16 of |offset x| a value (the 4 values' sum
          // and the lane's 4 steps: (3 16 + 4 47) 2^-24 = 2^-16.1 for Q5_0).
          const double offset = v.enc == encoding::q5_0
                                    ? 16.0 * d
                                    : std::fabs(tlm::fp16_to_f32(tlm::load_u16(w.data() + r * rb + (i / 32) * bb + 2)));
          moved += offset * std::fabs(static_cast<double>(x[i])) * std::ldexp(1.0, -16);
        }
        const double err = std::fabs(y[r] - exact), allowed = moved + rel_tol * sum_abs;
        worst = std::max(worst, err / allowed);
        INFO(tlm::name(v.enc) << " cols " << cols << " row " << r << ": " << y[r] << " against " << exact);
        CHECK(err <= allowed);
        ++cases;
      }
      // A NaN in one value: NaN in every row; an infinity: no finite row (inf, or NaN where
      // it meets a zero weight or the offset's opposite sign).
      check_non_finite(v, w, x, rows, {1, cols - 1}, false);
    }
  }
  MESSAGE("avx2 exact Q5: " << cases << " rows, worst error / bound " << worst);
  CHECK(cases == 2 * 4 * 9);
#else
  MESSAGE("skipped: no AVX2 kernels on this architecture");
#endif
}

// Outputs of y [batch, rows] farther from the scalar integer reference ref than property 2
// above allows (x [batch, cols] the activations); the largest error / tolerance goes to worst.
int outside_fast_bound(encoding enc, const std::byte* w, const float* x, const float* y, const float* ref,
                       std::size_t rows, std::size_t cols, std::size_t batch, double& worst) {
  int bad = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    const auto bounds = bounds_for(enc, w, x + b * cols, rows, cols);
    for (std::size_t r = 0; r < rows; ++r) {
      const double e = std::fabs(static_cast<double>(y[b * rows + r]) - ref[b * rows + r]);
      worst = std::max(worst, e / bounds.vs_reference[r]);
      if (!(e <= bounds.vs_reference[r])) ++bad;
    }
  }
  return bad;
}

// Whether this CPU runs the AVX-512 VNNI kernels; says so when it does not.
bool vnni_runs_here() {
  if (tlm::kernel_level_supported(tlm::kernel_level::avx512) && tlm::cpu().avx512vnni) return true;
  MESSAGE("skipped: this CPU has no AVX-512 VNNI (" << tlm::cpu_feature_string() << ")");
  return false;
}

// A fast matvec kernel called directly, against the scalar integer reference, across
// 6 widths (5 for the K-quants) and 1, 5 and 33 rows. Returns the number of cases run;
// the largest error / tolerance goes to worst.
template <class Kernel>
std::size_t check_fast_direct(const char* level, encoding enc, Kernel matvec_q8, std::mt19937& rng, double& worst) {
  const bool k_quant = tlm::traits(enc).block_values == 256;
  const std::vector<std::size_t> all_cols =
      k_quant ? std::vector<std::size_t>{256, 512, 768, 1536, 2304} : std::vector<std::size_t>{32, 64, 96, 160, 576, 1536};
  std::size_t cases = 0;
  for (std::size_t cols : all_cols) {
    for (std::size_t rows : {std::size_t{1}, std::size_t{5}, std::size_t{33}}) {
      const auto wsrc = random_rows(enc, rows, cols, rng);
      const auto xsrc = random_floats(cols, rng);
      placed_bytes w(wsrc, (rows + cols) % 8);
      const std::size_t rb = tlm::row_bytes(enc, cols);
      k::q8_activations q;
      k::detail::quantize_scalar(xsrc.data(), 1, cols, k::activation_group(enc), q);
      std::vector<float> y(rows), ref(rows);
      matvec_q8(enc, w.data, rb, q, y.data(), 0, rows, cols);
      k::detail::matvec_q8_scalar(enc, w.data, rb, q, ref.data(), 0, rows, cols);
      INFO(level << " direct fast " << tlm::name(enc) << " rows " << rows << " cols " << cols);
      CHECK(outside_fast_bound(enc, w.data, xsrc.data(), y.data(), ref.data(), rows, cols, 1, worst) == 0);
      ++cases;
    }
  }
  return cases;
}

TEST_CASE("AVX-512 VNNI fast matvec against the scalar integer reference, called directly") {
#ifdef TLM_HAVE_AVX512_KERNELS
  if (!vnni_runs_here()) return;
  // The table installs these only with VNNI (the VBMI ones only on AMD); here each is
  // called directly, so a kernel the table does not choose on this CPU is still held to
  // the reference.
  namespace a5 = tlm::kernels::avx512;
  std::mt19937 rng(516);
  std::size_t cases = 0;
  double worst = 0;
  auto check = [&](encoding enc, auto matvec_q8) { cases += check_fast_direct("avx512", enc, matvec_q8, rng, worst); };
  check(encoding::q8_0, a5::matvec_q8<encoding::q8_0>);
  check(encoding::q4_0, a5::matvec_q8<encoding::q4_0>);
  check(encoding::q4_1, a5::matvec_q8<encoding::q4_1>);
  check(encoding::q5_0, a5::matvec_q8<encoding::q5_0>);
  check(encoding::q5_1, a5::matvec_q8<encoding::q5_1>);
  check(encoding::q4_k, a5::matvec_q8_k<encoding::q4_k>);
  check(encoding::q5_k, a5::matvec_q8_k<encoding::q5_k>);
  check(encoding::q6_k, a5::matvec_q8_k<encoding::q6_k>);
  // The byte-permute kernels, which the table installs only on AMD (table.hpp says why).
  const bool vbmi = tlm::cpu().avx512vbmi;
  if (vbmi) {
    check(encoding::q4_0, a5::matvec_q8_vbmi<encoding::q4_0>);
    check(encoding::q4_1, a5::matvec_q8_vbmi<encoding::q4_1>);
  }
  MESSAGE("avx512 direct fast cases: " << cases << ", worst error / tolerance: " << worst
                                       << std::string(vbmi ? "" : " (no VBMI here: its kernels not checked)"));
  CHECK(cases == (vbmi ? 7 : 5) * 6 * 3 + 3 * 5 * 3);  // encodings x cols x rows
#else
  MESSAGE("skipped: no AVX-512 kernels on this architecture");
#endif
}

TEST_CASE("AVX2 matvecs with and without software prefetch, both called directly") {
#ifdef TLM_HAVE_AVX2_KERNELS
  if (!tlm::kernel_level_supported(tlm::kernel_level::avx2)) {
    MESSAGE("skipped: this CPU has no AVX2 (" << tlm::cpu_feature_string() << ")");
    return;
  }
  // The table installs one of each pair by vendor (without prefetch on AMD, table.hpp
  // says why), so the other is never reached through it on this CPU; both are held to
  // the references here.
  namespace a2 = tlm::kernels::avx2;
  std::mt19937 rng(517);
  std::size_t cases = 0;
  double worst = 0;
  auto check_exact = [&](encoding enc, auto kernel, auto prepare) { cases += check_exact_direct("avx2", enc, kernel, prepare, rng); };
  auto check_fast = [&](encoding enc, auto matvec_q8) { cases += check_fast_direct("avx2", enc, matvec_q8, rng, worst); };
  auto copy = copy_x;
  check_exact(encoding::q8_0, a2::matvec_rows_q8<true>, copy);
  check_exact(encoding::q8_0, a2::matvec_rows_q8<false>, copy);
  check_exact(encoding::q4_0, a2::matvec_rows_q4<encoding::q4_0, true>, a2::prepare_q4_x<encoding::q4_0>);
  check_exact(encoding::q4_0, a2::matvec_rows_q4<encoding::q4_0, false>, a2::prepare_q4_x<encoding::q4_0>);
  check_exact(encoding::q4_1, a2::matvec_rows_q4<encoding::q4_1, true>, a2::prepare_q4_x<encoding::q4_1>);
  check_exact(encoding::q4_1, a2::matvec_rows_q4<encoding::q4_1, false>, a2::prepare_q4_x<encoding::q4_1>);
  const std::size_t exact_cases = cases;
  check_fast(encoding::q8_0, a2::matvec_q8<encoding::q8_0, true>);
  check_fast(encoding::q8_0, a2::matvec_q8<encoding::q8_0, false>);
  check_fast(encoding::q4_0, a2::matvec_q8<encoding::q4_0, true>);
  check_fast(encoding::q4_0, a2::matvec_q8<encoding::q4_0, false>);
  check_fast(encoding::q4_1, a2::matvec_q8<encoding::q4_1, true>);
  check_fast(encoding::q4_1, a2::matvec_q8<encoding::q4_1, false>);
  check_fast(encoding::q4_k, a2::matvec_q8_k<encoding::q4_k, true>);
  check_fast(encoding::q4_k, a2::matvec_q8_k<encoding::q4_k, false>);
  check_fast(encoding::q5_k, a2::matvec_q8_k<encoding::q5_k, true>);
  check_fast(encoding::q5_k, a2::matvec_q8_k<encoding::q5_k, false>);
  check_fast(encoding::q6_k, a2::matvec_q8_k<encoding::q6_k, true>);
  check_fast(encoding::q6_k, a2::matvec_q8_k<encoding::q6_k, false>);
  MESSAGE("avx2 direct cases: " << cases << ", fast worst error / tolerance: " << worst);
  const std::size_t exact_per_variant = 3 * (cols_for(encoding::q8_0).size() + cols_for(encoding::q4_0).size() +
                                             cols_for(encoding::q4_1).size());
  CHECK(exact_cases == 2 * exact_per_variant);
  CHECK(cases == exact_cases + 2 * (3 * 6 * 3 + 3 * 5 * 3));  // variants x encodings x cols x rows
#else
  MESSAGE("skipped: no AVX2 kernels on this architecture");
#endif
}

#ifdef TLM_HAVE_AVX512_KERNELS
// transpose_lanes is an always-inline AVX-512 helper: called from a function built for it.
[[gnu::target(TLM_TARGET_AVX512 ",avx512vnni")]] void transpose_lanes_into(const std::byte* p, std::size_t rb,
                                                                          __mmask16 live, std::size_t n,
                                                                          std::int32_t* out) {
  __m512i v[16];
  tlm::kernels::avx512::transpose_lanes(p, rb, live, n, v);
  for (std::size_t k = 0; k < n; ++k) _mm512_storeu_si512(out + 16 * k, v[k]);
}
#endif

// The lanes kernels' unpacking reads 16 rows' super-blocks by transpose_lanes instead of a
// gather per dword: the same vectors, and nothing read past the n dwords of a live row.
TEST_CASE("transpose_lanes: dword k of row l in lane l of vector k, 0 outside the live rows") {
#ifdef TLM_HAVE_AVX512_KERNELS
  if (!vnni_runs_here()) return;
  std::mt19937 rng(4242);
  std::size_t cases = 0;
  bool all_equal = true;
  // Row strides of a Q4_K, Q5_K and Q6_K super-block row and of 2048-wide rows; live
  // masks as matmul_q8 makes them (the first n rows of a group).
  for (std::size_t rb : {144, 176, 210, 1152, 1680}) {
    for (std::size_t rows = 1; rows <= 16; ++rows) {
      const auto live = static_cast<__mmask16>((1u << rows) - 1);
      for (std::size_t n = 1; n <= 16; ++n) {
        const std::size_t offset = (rb + rows + n) % 4;  // super-blocks of 210 bytes start anywhere
        // Exactly the bytes the live rows hold, so a read past them is a sanitizer error.
        std::vector<std::byte> bytes((rows - 1) * rb + 4 * n + offset);
        for (auto& b : bytes) b = static_cast<std::byte>(rng());
        std::vector<std::int32_t> got(16 * n, -1);
        transpose_lanes_into(bytes.data() + offset, rb, live, n, got.data());
        for (std::size_t k = 0; k < n; ++k) {
          for (std::size_t l = 0; l < 16; ++l) {
            std::int32_t want = 0;
            if (l < rows) std::memcpy(&want, bytes.data() + offset + l * rb + 4 * k, 4);
            all_equal = all_equal && got[16 * k + l] == want;
          }
        }
        ++cases;
      }
    }
  }
  CHECK(all_equal);
  CHECK(cases == 5 * 16 * 16);
#else
  MESSAGE("skipped: no AVX-512 kernels on this architecture");
#endif
}

// The batched kernel (the table's matmul_q8 with VNNI), called directly.
TEST_CASE("AVX-512 VNNI fast matmul, weight rows in the lanes, against the scalar integer reference") {
#ifdef TLM_HAVE_AVX512_KERNELS
  if (!vnni_runs_here()) return;
  namespace a5 = tlm::kernels::avx512;
  std::mt19937 rng(1729);
  std::size_t cases = 0;
  double worst = 0;
  // Rows: a part of one 16-row group, one group, a group and 1, two and 1 (the masked
  // tail); batches: the tiles of 8, 4, 2 and 1 rows alone and together.
  auto check = [&](encoding enc, auto kernel) {
    const bool k_quant = tlm::traits(enc).block_values == 256;
    for (std::size_t cols : k_quant ? std::vector<std::size_t>{256, 768, 1536, 2304} : std::vector<std::size_t>{32, 96, 576, 1536}) {
      for (std::size_t rows : {1, 5, 16, 17, 33}) {
        for (std::size_t batch : {2, 3, 7, 8, 9, 15, 16, 17, 30}) {
          const auto wsrc = random_rows(enc, rows, cols, rng);
          const auto xsrc = random_floats(batch * cols, rng);
          placed_bytes w(wsrc, (rows + cols + batch) % 8);
          const std::size_t rb = tlm::row_bytes(enc, cols);
          k::q8_activations q;
          k::detail::quantize_scalar(xsrc.data(), batch, cols, k::activation_group(enc), q);
          // y [batch, rows] and a guard after it: the masked tail must write nothing else.
          std::vector<float> y(batch * rows + 16, -777.0f), ref(batch * rows), parts(batch * rows + 16, -777.0f);
          kernel(enc, w.data, rb, q, y.data(), 0, rows, rows, cols);
          k::detail::matmul_q8_scalar(enc, w.data, rb, q, ref.data(), 0, rows, rows, cols);
          const int bad = outside_fast_bound(enc, w.data, xsrc.data(), y.data(), ref.data(), rows, cols, batch, worst);
          // Rows split as threads split them, and at a row that is not a group's start:
          // each part writes its rows only, and every output is the whole call's, bit for bit.
          const std::size_t cut = rows / 3;
          kernel(enc, w.data, rb, q, parts.data(), 0, cut, rows, cols);
          bool others_untouched = true;
          for (std::size_t b = 0; b < batch; ++b)
            for (std::size_t r = cut; r < rows; ++r) others_untouched = others_untouched && parts[b * rows + r] == -777.0f;
          kernel(enc, w.data, rb, q, parts.data(), cut, rows, rows, cols);
          INFO("avx512 lanes " << tlm::name(enc) << " rows " << rows << " cols " << cols << " batch " << batch);
          CHECK(bad == 0);
          CHECK(others_untouched);
          CHECK(std::equal(y.begin(), y.end(), parts.begin()));
          CHECK(std::all_of(y.begin() + static_cast<std::ptrdiff_t>(batch * rows), y.end(),
                            [](float v) { return v == -777.0f; }));
          ++cases;
        }
      }
    }
  };
  [&]<encoding... E>(encoding_list<E...>) { (check(E, a5::matmul_q8<E>), ...); }(fast_encoding_list);
  MESSAGE("avx512 lanes cases: " << cases << ", worst error / tolerance: " << worst);
  CHECK(cases == 8 * 4 * 5 * 9);  // encodings x cols x rows x batches
#else
  MESSAGE("skipped: no AVX-512 kernels on this architecture");
#endif
}

TEST_CASE("matvec_group: each product bit for bit its own matvec, at every level, precision and pool size") {
  level_guard g;
  std::mt19937 rng(77);
  tlm::thread_pool p2(2), p3(3);
  // Mixed encodings (x prepared per encoding: Q4_0 and Q4_1 need different sums), row
  // counts that are not multiples of the 16-row groups, and an empty product.
  // 768 columns: whole blocks for the K-quants too.
  constexpr std::size_t n = 7;
  const encoding encs[n] = {encoding::q4_1, encoding::q4_0, encoding::q8_0, encoding::f16,
                            encoding::q5_0, encoding::q4_k, encoding::q6_k};
  const std::size_t rows[n] = {67, 0, 200, 13, 45, 33, 18};
  const std::size_t cols = 768;
  std::vector<std::vector<std::byte>> w;
  for (std::size_t i = 0; i < n; ++i) w.push_back(random_rows(encs[i], rows[i], cols, rng));
  const auto x = random_floats(cols, rng);
  std::size_t checked = 0;
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (auto prec : {k::precision::exact, k::precision::fast}) {
      std::vector<std::vector<float>> want(n);
      for (std::size_t i = 0; i < n; ++i) {
        want[i].resize(rows[i]);
        k::matvec(encs[i], w[i].data(), x.data(), want[i].data(), rows[i], cols, nullptr, prec);
      }
      for (tlm::thread_pool* pool : {static_cast<tlm::thread_pool*>(nullptr), &p2, &p3}) {
        std::vector<std::vector<float>> got(n);
        std::array<k::shared_input_product, n> group{};
        for (std::size_t i = 0; i < n; ++i) {
          got[i].assign(rows[i], -1.0f);
          group[i] = {encs[i], w[i].data(), got[i].data(), rows[i]};
        }
        k::matvec_group(group, x.data(), cols, pool, prec);
        for (std::size_t i = 0; i < n; ++i) {
          INFO(tlm::kernel_level_name(level) << (prec == k::precision::fast ? " fast " : " exact ") << tlm::name(encs[i])
                                             << " threads " << (pool ? pool->size() : 1));
          // An empty vector's data() may be null, which memcmp must not see.
          CHECK((rows[i] == 0 || std::memcmp(got[i].data(), want[i].data(), rows[i] * sizeof(float)) == 0));
          ++checked;
        }
      }
    }
  }
  CHECK(checked >= 42);
  // A bad member is refused before anything runs, naming the call.
  std::vector<float> y(3);
  const std::array<k::shared_input_product, 1> bad{{{encoding::q4_1, w[0].data(), y.data(), 3}}};
  CHECK_THROWS_WITH_AS(k::matvec_group(bad, x.data(), 100, nullptr), doctest::Contains("matvec_group"), tlm::shape_error);
}

}  // namespace test_kernels
