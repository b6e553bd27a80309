// The amx level's exact prefill product (kernels/amx.hpp), called directly on shapes that
// cross every edge of its blocking: k blocks of 256 (and a k tail that is not a multiple
// of 32), weight chunks of 512 rows and panels of 16, token slices of 256 and tiles of 16,
// a row range that starts inside the matrix (as a thread's does). Held against the float64
// product of the dequantized weights at 1e-6 of sum |w x|, ten times tighter than the
// kernel tests' tolerance for every level, which the amx level also passes there
// (test_kernels.cpp sweeps every level this CPU runs).
// Only on a CPU with AMX and the OS's permission to use it; elsewhere the test says so.
#include <doctest/doctest.h>

#include <tlm/format/quant.hpp>
#include <tlm/kernels.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace test_amx {

namespace k = tlm::kernels;
using tlm::encoding;

struct shape {
  encoding enc;
  std::size_t rows, cols, batch, r0, r1;
};

// Weights from random floats through tlm's quantizer, so every block is one a file holds.
std::vector<std::byte> random_matrix(encoding enc, std::size_t rows, std::size_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.05f);
  const std::size_t rb = tlm::row_bytes(enc, cols);
  std::vector<std::byte> w(rows * rb);
  std::vector<float> row(cols);
  for (std::size_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = normal(rng);
    tlm::quantize_row(enc, row.data(), w.data() + r * rb, cols);
  }
  return w;
}

TEST_CASE("amx: exact prefill on tiles across k blocks, weight chunks and token slices, against float64") {
  if (!tlm::kernel_level_supported(tlm::kernel_level::amx)) {
    MESSAGE("amx prefill not checked: this CPU lacks "
            << tlm::missing_cpu_features(tlm::cpu(), tlm::kernel_level_row_of(tlm::kernel_level::amx).target));
    return;
  }
  const auto& table = k::detail::table_for(tlm::kernel_level::amx);
  const auto& avx512 = k::detail::table_for(tlm::kernel_level::avx512);
  const shape shapes[] = {
      {encoding::f32, 40, 1000, 33, 3, 40},     // k tail of 1000 - 768 = 232, not a multiple of 32
      {encoding::f16, 17, 33, 32, 0, 17},       // one k step, two token tiles, a partial panel
      {encoding::bf16, 20, 300, 47, 2, 19},
      {encoding::q8_0, 600, 576, 64, 5, 600},   // two chunks (512 + 83 rows), 3 k blocks
      {encoding::q4_0, 70, 1536, 40, 0, 70},
      {encoding::q4_1, 33, 512, 260, 1, 33},    // two slices (256 + 4 tokens)
      {encoding::q5_0, 48, 576, 100, 16, 48},
      {encoding::q5_1, 31, 288, 35, 0, 31},
      {encoding::q4_k, 528, 768, 48, 0, 528},   // a chunk and one more panel
      {encoding::q5_k, 19, 2304, 36, 3, 19},
      {encoding::q6_k, 64, 1280, 80, 0, 64},
      // The scaled path under two token tiles (from amx::scaled_min_batch the table sends
      // batches there): one partial token tile, one whole, one and a bit.
      {encoding::q4_k, 40, 512, 4, 0, 40},
      {encoding::q5_0, 33, 576, 16, 1, 33},
      {encoding::q8_0, 20, 256, 17, 0, 20},
      {encoding::q4_1, 48, 128, 5, 7, 41},
  };
  std::mt19937 rng(4242);
  std::normal_distribution<float> act(0.0f, 1.0f);
  double worst = 0, worst_rms_ratio = 0;
  for (const shape& s : shapes) {
    const std::string where = std::string(tlm::name(s.enc)) + " rows " + std::to_string(s.rows) + " [" +
                              std::to_string(s.r0) + ", " + std::to_string(s.r1) + ") cols " + std::to_string(s.cols) +
                              " batch " + std::to_string(s.batch);
    INFO(where);
    const auto w = random_matrix(s.enc, s.rows, s.cols, rng);
    std::vector<float> x(s.batch * s.cols);
    for (auto& v : x) v = act(rng);
    // Outside rows [r0, r1) the guard must stay: the kernel owns only its rows.
    const float guard = -777.0f;
    std::vector<float> y(s.batch * s.rows, guard);
    const std::size_t rb = tlm::row_bytes(s.enc, s.cols);
    const auto slot = static_cast<std::size_t>(k::detail::slot(s.enc));
    table.matmul[slot](s.enc, w.data(), rb, x.data(), y.data(), s.r0, s.r1, s.rows, s.cols, s.batch);
    std::vector<float> y512(s.batch * s.rows);
    avx512.matmul[slot](s.enc, w.data(), rb, x.data(), y512.data(), s.r0, s.r1, s.rows, s.cols, s.batch);
    std::vector<float> wr(s.cols);
    int bad = 0, touched = 0;
    double squares = 0, squares512 = 0;  // of the errors against float64
    for (std::size_t r = 0; r < s.rows; ++r) {
      tlm::dequantize_row(s.enc, w.data() + r * rb, wr.data(), s.cols);
      for (std::size_t b = 0; b < s.batch; ++b) {
        const float got = y[b * s.rows + r];
        if (r < s.r0 || r >= s.r1) {
          touched += got != guard;
          continue;
        }
        double ref = 0, mag = 0;
        for (std::size_t c = 0; c < s.cols; ++c) {
          const double p = static_cast<double>(wr[c]) * static_cast<double>(x[b * s.cols + c]);
          ref += p;
          mag += std::fabs(p);
        }
        squares += (got - ref) * (got - ref);
        squares512 += (y512[b * s.rows + r] - ref) * (y512[b * s.rows + r] - ref);
        const double ratio = std::fabs(static_cast<double>(got) - ref) / (1e-6 * mag + 1e-30);
        worst = std::max(worst, ratio);
        if (!(ratio <= 1.0) && bad++ == 0) {
          INFO("row " << r << " token " << b << ": amx " << got << ", float64 " << ref << ", sum |w x| " << mag);
          CHECK(ratio <= 1.0);
        }
      }
    }
    CHECK(bad == 0);
    CHECK(touched == 0);
    // Of a float32 product's order, as amx.hpp says: measured 0.64-2.0 times the avx512
    // level's rms error on these shapes. A dropped piece product (mid.mid) is hundreds.
    const double rms_ratio = std::sqrt(squares / squares512);
    INFO("rms error, amx / avx512: " << rms_ratio);
    CHECK(rms_ratio < 3.0);
    worst_rms_ratio = std::max(worst_rms_ratio, rms_ratio);
  }
  MESSAGE("amx prefill: worst |error| / (1e-6 sum |w x|) = " << worst << "; rms error at most " << worst_rms_ratio
                                                             << " times the avx512 level's");
}

// The tiles' worst case in amx.hpp: many small products beside one large one in the same
// instruction. Token 0 is [1, t, t, ..., t] with t = 0.375 ulp of 1 (a bf16 value, so its
// mid and lo pieces are zero and all 32 products are in the one hi.hi instruction),
// against a row of ones: 1 + 31 t = 1 + 11.625 ulp exactly. An FMA chain gives 1 (each
// product is under half an ulp); the tiles gave 1 + 6 ulp on an Intel Xeon (family 6,
// model 167). Both are within the 1e-6 of sum |w x| (8.4 ulp here) held above.
TEST_CASE("amx: small products beside a large one stay within 1e-6 of sum |w x|") {
  if (!tlm::kernel_level_supported(tlm::kernel_level::amx)) {
    MESSAGE("amx small products not checked: this CPU lacks AMX or the permission to use it");
    return;
  }
  constexpr std::size_t cols = 32, rows = 16, batch = 32;  // one k step, two token tiles
  const double ulp = 0x1p-23, t = 0.375 * ulp;
  std::vector<float> w(rows * cols, 1.0f);  // F32 "encoded": the row bytes are the floats
  std::vector<float> x(batch * cols, 0.0f);
  x[0] = 1.0f;
  for (std::size_t c = 1; c < cols; ++c) x[c] = static_cast<float>(t);
  std::vector<float> y(batch * rows);
  k::detail::table_for(tlm::kernel_level::amx)
      .matmul[static_cast<std::size_t>(k::detail::slot(encoding::f32))](
          encoding::f32, reinterpret_cast<const std::byte*>(w.data()), cols * sizeof(float), x.data(), y.data(), 0, rows,
          rows, cols, batch);
  const double exact = 1.0 + 31.0 * t;
  MESSAGE("amx: 1 + 31 x 0.375 ulp came to 1 + " << (y[0] - 1.0) / ulp << " ulp (exactly 11.625)");
  CHECK(std::fabs(y[0] - exact) <= 1e-6 * exact);
}

TEST_CASE("amx: which batches reach the tiles: the split path from 32 tokens, the scaled path from 4") {
  if (!tlm::kernel_level_supported(tlm::kernel_level::amx)) {
    MESSAGE("amx hand-off not checked: this CPU lacks AMX or the permission to use it");
    return;
  }
  std::mt19937 rng(9);
  std::normal_distribution<float> act(0.0f, 1.0f);
  const std::size_t rows = 40, cols = 512;
  // The split path (Q6_K) hands a batch under 32 to the avx512 level's kernel itself.
  {
    const std::size_t s = static_cast<std::size_t>(k::detail::slot(encoding::q6_k));
    const auto amx = k::detail::table_for(tlm::kernel_level::amx).matmul[s];
    const auto avx512 = k::detail::table_for(tlm::kernel_level::avx512).matmul[s];
    const std::size_t rb = tlm::row_bytes(encoding::q6_k, cols);
    const auto w = random_matrix(encoding::q6_k, rows, cols, rng);
    for (const std::size_t batch : {16, 31, 32}) {
      INFO("Q6_K batch " << batch);
      std::vector<float> x(batch * cols);
      for (auto& v : x) v = act(rng);
      std::vector<float> a(batch * rows), b(batch * rows);
      amx(encoding::q6_k, w.data(), rb, x.data(), a.data(), 0, rows, rows, cols, batch);
      avx512(encoding::q6_k, w.data(), rb, x.data(), b.data(), 0, rows, rows, cols, batch);
      // Under 32 tokens the same kernel; at 32 the tiles, which round otherwise.
      CHECK((a == b) == (batch < k::amx::min_batch));
    }
  }
  // The scaled path (Q4_K): the table's dispatch (kernels::matmul) sends a batch under 4 to
  // the AVX2 kernel, as the avx512 level does under 16; from 4 the tiles.
  {
    const auto w = random_matrix(encoding::q4_k, rows, cols, rng);
    const tlm::kernel_level before = k::force_kernel_level(tlm::kernel_level::amx);
    for (const std::size_t batch : {2, 3, 4, 15}) {
      INFO("Q4_K batch " << batch);
      std::vector<float> x(batch * cols);
      for (auto& v : x) v = act(rng);
      std::vector<float> a(batch * rows), b(batch * rows);
      k::force_kernel_level(tlm::kernel_level::amx);
      k::matmul(encoding::q4_k, w.data(), x.data(), a.data(), rows, cols, batch, nullptr, k::precision::exact);
      k::force_kernel_level(tlm::kernel_level::avx512);
      k::matmul(encoding::q4_k, w.data(), x.data(), b.data(), rows, cols, batch, nullptr, k::precision::exact);
      CHECK((a == b) == (batch < k::amx::scaled_min_batch));
    }
    k::force_kernel_level(before);
  }
}

TEST_CASE("amx: a NaN in an activation row makes that row's outputs NaN and leaves the others finite") {
  if (!tlm::kernel_level_supported(tlm::kernel_level::amx)) {
    MESSAGE("amx NaN propagation not checked: this CPU lacks AMX or the permission to use it");
    return;
  }
  const auto& table = k::detail::table_for(tlm::kernel_level::amx);
  std::mt19937 rng(7);
  const std::size_t rows = 20, cols = 512, batch = 40;  // three token tiles: on the tiles
  const auto w = random_matrix(encoding::q8_0, rows, cols, rng);
  std::vector<float> x(batch * cols, 0.5f);
  x[5 * cols + 300] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(batch * rows);
  table.matmul[static_cast<std::size_t>(k::detail::slot(encoding::q8_0))](
      encoding::q8_0, w.data(), tlm::row_bytes(encoding::q8_0, cols), x.data(), y.data(), 0, rows, rows, cols, batch);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t r = 0; r < rows; ++r) {
      INFO("token " << b << " row " << r);
      CHECK(std::isnan(y[b * rows + r]) == (b == 5));
    }
  }
}

}  // namespace test_amx
