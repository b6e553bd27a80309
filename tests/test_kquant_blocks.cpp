// K-quant blocks (Q4_K, Q5_K, Q6_K) filled with random bytes: tlm::dequantize_row
// against an element-by-element decoder written here from llama.cpp's layout
// (ggml-quants.c, dequantize_row_q*_K), bit for bit; then matvec and matmul, exact and
// fast, at every kernel level this CPU runs against the dot products of dequantize_row's
// values.
// Random bytes reach every nibble, high bit and 6-bit scale of a block, which fixed
// blocks with a few set values do not: a decoder that swaps the order of Q6_K's
// nibbles or bit pairs differs from the layout in most values here.
// Only the public dequantize_row, matvec, matmul, force_kernel_level and
// supported_kernel_levels are used, so SIMD decoders added later are held to the same.
#include <doctest/doctest.h>

#include <tlm/format/quant.hpp>
#include <tlm/kernels.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernel_levels.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_kquant_blocks {

using tlm_test::level_guard;

namespace {

using tlm::encoding;

constexpr std::size_t block_values = 256;

std::uint16_t u16_at(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }

// a * b - c with each operation rounded to float, as the C in ggml computes it on a CPU
// without FMA contraction; written through double so no compiler fuses it here either.
float mul_sub(float a, float b, float c) {
  const float ab = a * b;
  return static_cast<float>(static_cast<double>(ab) - static_cast<double>(c));
}

// ggml's get_scale_min_k4: eight 6-bit scales and mins packed in 12 bytes.
void scale_min(const std::uint8_t* q, int j, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// One block of 256 values. Byte offsets from ggml's block_q4_K, block_q5_K, block_q6_K.
void decode_block(encoding enc, const std::uint8_t* b, float* y) {
  if (enc == encoding::q4_k || enc == encoding::q5_k) {
    const float d = tlm::fp16_to_f32(u16_at(b)), dmin = tlm::fp16_to_f32(u16_at(b + 2));
    const std::uint8_t* scales = b + 4;
    const std::uint8_t* qh = b + 16;  // Q5_K only
    const std::uint8_t* qs = b + (enc == encoding::q4_k ? 16 : 48);
    int u1 = 1, u2 = 2;  // Q5_K: the qh bits of this pair of sub-blocks
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, qs += 32, u1 <<= 2, u2 <<= 2) {
      int sc = 0, m = 0;
      scale_min(scales, is, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      scale_min(scales, is + 1, sc, m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        int lo = qs[l] & 0xF, hi = qs[l] >> 4;
        if (enc == encoding::q5_k) {
          lo += (qh[l] & u1) ? 16 : 0;
          hi += (qh[l] & u2) ? 16 : 0;
        }
        y[j + l] = mul_sub(d1, static_cast<float>(lo), m1);
        y[j + 32 + l] = mul_sub(d2, static_cast<float>(hi), m2);
      }
    }
    return;
  }
  // Q6_K: ql[128], qh[64], int8 scales[16], d.
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = tlm::fp16_to_f32(u16_at(b + 208));
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[n + l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[n + l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[n + l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[n + l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// A random finite half: sign, exponent 2^-10..2^-1, mantissa all random.
std::uint16_t random_half(std::mt19937& rng) {
  std::uniform_int_distribution<int> sign(0, 1), exponent(5, 14), mantissa(0, 1023);
  return static_cast<std::uint16_t>((sign(rng) << 15) | (exponent(rng) << 10) | mantissa(rng));
}

void put_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v & 0xFF);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}

// rows x cols values in random blocks: every byte random except the float16 factors,
// which are finite so every value is.
std::vector<std::byte> random_blocks(encoding enc, std::size_t rows, std::size_t cols, std::mt19937& rng) {
  const std::size_t bb = tlm::row_bytes(enc, block_values);
  std::vector<std::uint8_t> raw(rows * cols / block_values * bb);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : raw) b = static_cast<std::uint8_t>(byte(rng));
  for (std::size_t i = 0; i < raw.size(); i += bb) {
    if (enc == encoding::q6_k) {
      put_u16(&raw[i + 208], random_half(rng));
    } else {
      put_u16(&raw[i], random_half(rng));
      put_u16(&raw[i + 2], random_half(rng));
    }
  }
  std::vector<std::byte> out(raw.size());
  std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

constexpr encoding kquants[] = {encoding::q4_k, encoding::q5_k, encoding::q6_k};

}  // namespace

TEST_CASE("K-quant blocks of random bytes: dequantize_row equals llama.cpp's layout, bit for bit") {
  std::mt19937 rng(2024);
  for (const encoding enc : kquants) {
    const std::size_t bb = tlm::row_bytes(enc, block_values);
    CHECK(bb == (enc == encoding::q4_k ? 144u : enc == encoding::q5_k ? 176u : 210u));
    constexpr std::size_t blocks = 64;
    const auto w = random_blocks(enc, 1, blocks * block_values, rng);
    std::vector<float> got(blocks * block_values), want(blocks * block_values);
    tlm::dequantize_row(enc, w.data(), got.data(), got.size());
    for (std::size_t b = 0; b < blocks; ++b)
      decode_block(enc, reinterpret_cast<const std::uint8_t*>(w.data()) + b * bb, want.data() + b * block_values);
    int differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) {
        INFO(tlm::name(enc) << " value " << i << " (block " << i / block_values << ", index " << i % block_values << ")");
        CHECK(got[i] == want[i]);
      }
    }
    INFO(tlm::name(enc));
    CHECK(differ == 0);
  }
}

TEST_CASE("K-quant blocks of random bytes: matvec and matmul at every kernel level against dequantize_row") {
  level_guard guard;
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::string ran;
  for (const auto level : tlm::supported_kernel_levels()) {
    tlm::kernels::force_kernel_level(level);
    ran += std::string(ran.empty() ? "" : ", ") + std::string(tlm::kernel_level_name(level));
    for (const encoding enc : kquants) {
      // 19 rows: a row group of 16 and a rest. 1536 columns: six blocks, over two of
      // the decoders' 1024-value chunks.
      for (const std::size_t cols : {std::size_t{256}, std::size_t{1536}}) {
        constexpr std::size_t rows = 19;
        const auto w = random_blocks(enc, rows, cols, rng);
        const std::size_t rb = tlm::row_bytes(enc, cols);
        std::vector<float> dense(rows * cols);
        for (std::size_t r = 0; r < rows; ++r) tlm::dequantize_row(enc, w.data() + r * rb, dense.data() + r * cols, cols);
        for (const auto p : {tlm::kernels::precision::exact, tlm::kernels::precision::fast})
        for (const std::size_t batch : {std::size_t{1}, std::size_t{2}, std::size_t{5}, std::size_t{17}, std::size_t{40}}) {
          // Exact: a float sum in another order. Fast (integer kernels, where an encoding
          // has them; otherwise exact): x rounded to int8 per block of 32 as well, about
          // 1e-4 of sum |w x| on random rows. One misdecoded value in a block of 256
          // random ones moves a product by a few percent of it.
          const double tolerance = p == tlm::kernels::precision::exact ? 1e-5 : 2e-3;
          std::vector<float> x(batch * cols), y(batch * rows, -777.0f);
          for (auto& v : x) v = unit(rng);
          if (batch == 1) tlm::kernels::matvec(enc, w.data(), x.data(), y.data(), rows, cols, nullptr, p);
          else tlm::kernels::matmul(enc, w.data(), x.data(), y.data(), rows, cols, batch, nullptr, p);
          int bad = 0;
          for (std::size_t b = 0; b < batch; ++b) {
            for (std::size_t r = 0; r < rows; ++r) {
              double want = 0, size = 0;
              for (std::size_t c = 0; c < cols; ++c) {
                const double t = static_cast<double>(dense[r * cols + c]) * x[b * cols + c];
                want += t;
                size += std::fabs(t);
              }
              const double got = y[b * rows + r];
              if (!(std::fabs(got - want) <= tolerance * size) && bad++ == 0) {
                INFO(tlm::kernel_level_name(level) << " " << tlm::name(enc) << std::string(p == tlm::kernels::precision::fast ? " fast" : " exact")
                                                   << " cols " << cols << " batch " << batch << ": row " << r
                                                   << " of batch row " << b);
                CHECK(got == doctest::Approx(want));
              }
            }
          }
          INFO(tlm::kernel_level_name(level) << " " << tlm::name(enc) << std::string(p == tlm::kernels::precision::fast ? " fast" : " exact")
                                             << " cols " << cols << " batch " << batch);
          CHECK(bad == 0);
        }
      }
    }
  }
  MESSAGE("K-quant kernels checked at levels: " << ran);
}

}  // namespace test_kquant_blocks
