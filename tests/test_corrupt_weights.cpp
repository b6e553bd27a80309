// A model file whose numbers are corrupt but whose shapes are sound: one block scale of
// the real model set to NaN. Binding accepts it (it checks shapes and encodings, not
// values); the generator must refuse the non-finite logits instead of sampling from
// them, and non_finite_values must name the tensor, row, column and block.
#include <doctest/doctest.h>

#include <tlm/format/gguf_writer.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/format/verify.hpp>
#include <tlm/generate.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "scratch_files.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_corrupt_weights {

namespace fs = std::filesystem;
using C = tlm::smollm2_135m;

namespace {

// A copy of the real model with the scale of block `block` of row `row` of `tensor` set
// to a NaN half.
fs::path corrupt_copy(const std::string& tensor, std::uint64_t row, std::uint64_t block) {
  const fs::path dir = fs::path(TLM_BINARY_DIR) / "test_corrupt_weights.tmp";
  fs::create_directories(dir);
  const fs::path out = dir / "nan-scale.gguf";
  std::size_t at = 0;
  {
    const tlm::gguf::file f(TLM_MODEL_PATH);
    const auto* t = f.find_tensor(tensor);
    REQUIRE(t != nullptr);
    const auto tr = tlm::traits(t->enc);
    at = static_cast<std::size_t>(t->data.data() - f.bytes().data()) +
         row * tlm::row_bytes(t->enc, t->row_length()) + block * tr.block_bytes;
  }
  std::ifstream in(TLM_MODEL_PATH, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::uint16_t nan_half = 0x7e00;  // the block's d comes first in Q4_1 and Q8_0
  std::memcpy(bytes.data() + at, &nan_half, 2);
  std::ofstream(out, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return out;
}

}  // namespace

TEST_CASE("a NaN block scale: bound as sound, named by non_finite_values, refused by the generator") {
  const auto path = corrupt_copy("blk.3.ffn_down.weight", 7, 5);
  const tlm::gguf::file f(path.string());
  const auto bad = tlm::non_finite_values(f);
  REQUIRE(bad.size() == 1);
  CHECK(bad[0].name == "blk.3.ffn_down.weight");
  CHECK(bad[0].count == 32);  // the block's 32 values, and nothing else
  CHECK(bad[0].row == 7);
  CHECK(bad[0].column == 5 * 32);
  CHECK(bad[0].byte == 7 * tlm::row_bytes(tlm::encoding::q4_1, 1536) + 5 * 20);

  for (auto p : {tlm::kernels::precision::exact, tlm::kernels::precision::fast}) {
    auto m = tlm::model<C>::load(path.string(), {.precision = p});
    const auto tok = tlm::tokenizer::from_gguf(m.file());
    tlm::generator<C> gen(m, tok);
    CHECK_THROWS_WITH_AS(gen.generate("The capital of France is", {.max_tokens = 4}),
                         doctest::Contains("logits at position 4 are not finite"), tlm::numeric_error);
    CHECK_THROWS_WITH_AS(gen.generate("The capital of France is", {.max_tokens = 4}),
                         doctest::Contains("inspect FILE --verify"), tlm::numeric_error);
  }
}

TEST_CASE("the logits check finds one value that is not finite at any position, and passes every finite one") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float big = std::numeric_limits<float>::max(), tiny = std::numeric_limits<float>::denorm_min();
  std::vector<float> store(80);
  for (std::size_t offset = 0; offset < 2; ++offset) {
    for (std::size_t n = 1; n <= 40; ++n) {
      const std::span<float> l(store.data() + offset, n);
      for (std::size_t i = 0; i < n; ++i) l[i] = i % 4 == 0 ? big : i % 4 == 1 ? -big : i % 4 == 2 ? tiny : -0.0f;
      CHECK_NOTHROW(tlm::detail::require_finite_logits(l, 9));
      for (std::size_t at = 0; at < n; ++at) {
        for (const float bad : {nan, inf, -inf}) {
          const float keep = l[at];
          l[at] = bad;
          const std::string named = "position 9 are not finite (token " + std::to_string(at) + ":";
          CHECK_THROWS_WITH_AS(tlm::detail::require_finite_logits(l, 9), doctest::Contains(named.c_str()),
                               tlm::numeric_error);
          l[at] = keep;
        }
      }
    }
  }
}

// Where each encoding keeps the half-precision scale that multiplies every value of its
// block (Q6_K keeps its d after the quants; the others first; Q4_K and Q5_K also have
// dmin right after d, which multiplies every block minimum).
struct scale_at {
  tlm::encoding enc;
  std::size_t offset;
};

TEST_CASE("a NaN scale in a block of each quantized encoding is named with its row, column and byte") {
  constexpr std::size_t rows = 4, cols = 512;  // two K-quant super-blocks a row
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> values(rows * cols);  // [rows, cols]
  for (auto& v : values) v = n(rng);
  const std::uint16_t nan_half = 0x7e00;
  for (const auto at : {scale_at{tlm::encoding::q4_0, 0}, scale_at{tlm::encoding::q4_1, 0},
                        scale_at{tlm::encoding::q5_0, 0}, scale_at{tlm::encoding::q5_1, 0},
                        scale_at{tlm::encoding::q8_0, 0}, scale_at{tlm::encoding::q4_k, 0},
                        scale_at{tlm::encoding::q4_k, 2}, scale_at{tlm::encoding::q5_k, 0},
                        scale_at{tlm::encoding::q5_k, 2}, scale_at{tlm::encoding::q6_k, 208}}) {
    const tlm::encoding enc = at.enc;
    const std::size_t offset = at.offset;
    const auto tr = tlm::traits(enc);
    const std::size_t rb = tlm::row_bytes(enc, cols);
    std::vector<std::byte> raw(rows * rb);  // [rows, rb]
    for (std::size_t r = 0; r < rows; ++r) tlm::quantize_row(enc, values.data() + r * cols, raw.data() + r * rb, cols);
    const std::size_t row = 2, block = tr.block_values == 256 ? 1 : 5;
    std::memcpy(raw.data() + row * rb + block * tr.block_bytes + offset, &nan_half, 2);
    tlm::gguf::writer w;
    w.set("general.architecture", "llama");
    w.add_tensor("blk.0.ffn_up.weight", {cols, rows}, enc, raw);
    const auto path = tlm_test::scratch_path("test_corrupt_weights", std::string(tr.name) + "-nan.gguf");
    w.write(path);
    const tlm::gguf::file f(path.string());
    const auto bad = tlm::non_finite_values(f);
    INFO(tr.name << " with a NaN half at byte " << offset << " of block " << block << " of row " << row);
    REQUIRE(bad.size() == 1);
    CHECK(bad[0].name == "blk.0.ffn_up.weight");
    CHECK(bad[0].count == tr.block_values);  // the scale multiplies every value of its block
    CHECK(bad[0].row == row);
    CHECK(bad[0].column == block * tr.block_values);
    CHECK(bad[0].byte == row * rb + block * tr.block_bytes);
  }
}

TEST_CASE("the real model has no value that is not finite") {
  const tlm::gguf::file f(TLM_MODEL_PATH);
  CHECK(tlm::non_finite_values(f).empty());
}

}  // namespace test_corrupt_weights
