// gguf::writer: round trips through the reader, alignment, generated tensors, the
// errors it raises for tensors that cannot be written, and atomic replacement of the
// target file (no temporary file left behind, old file intact on failure).
#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>
#include <tlm/format/quant.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_gguf_writer {

namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(TLM_BINARY_DIR) / "test_gguf_writer.tmp";
  fs::create_directories(dir);
  return dir / name;
}

std::vector<std::byte> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

bool temp_files_left(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp-") != std::string::npos) return true;
  }
  return false;
}

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

}  // namespace

TEST_CASE("quantized tensors round trip through the reader") {
  const auto x = random_values(128 * 4, 7);
  tlm::gguf::writer w;
  w.set("general.architecture", "llama");
  for (const auto enc : {tlm::encoding::f32, tlm::encoding::f16, tlm::encoding::bf16, tlm::encoding::q8_0, tlm::encoding::q4_0,
                         tlm::encoding::q4_1}) {
    w.add_tensor_f32(std::string("t.") + std::string(tlm::name(enc)), {128, 4}, enc, x);
  }
  CHECK(w.tensor_count() == 6);
  const auto bytes = w.to_bytes();
  const auto f = tlm::gguf::file::from_memory(bytes);
  REQUIRE(f.tensors().size() == 6);
  for (const auto& t : f.tensors()) {
    CAPTURE(t.name);
    CHECK(t.dims == std::array<std::uint64_t, 4>{128, 4, 1, 1});
    CHECK(t.offset % 32 == 0);
    // The stored bytes are exactly what quantize_row produces.
    std::vector<std::byte> expect(tlm::row_bytes(t.enc, 128) * 4);
    for (int r = 0; r < 4; ++r) {
      tlm::quantize_row(t.enc, x.data() + r * 128, expect.data() + r * tlm::row_bytes(t.enc, 128), 128);
    }
    CHECK(std::equal(expect.begin(), expect.end(), t.data.begin(), t.data.end()));
    std::vector<float> y(128);
    double max_err = 0;
    for (std::uint64_t r = 0; r < 4; ++r) {
      tlm::dequantize_row(t.enc, t.data.data() + r * tlm::row_bytes(t.enc, 128), y.data(), 128);
      for (int j = 0; j < 128; ++j) max_err = std::max(max_err, double(std::fabs(y[j] - x[r * 128 + j])));
    }
    if (t.enc == tlm::encoding::f32) CHECK(max_err == 0.0);
    else CHECK(max_err < 0.02);  // values are N(0, 0.02); a 4-bit step is at most ~0.01
  }
}

TEST_CASE("raw tensors, replaced metadata, copied values and a 64-byte alignment") {
  tlm::gguf::writer src;
  src.set_string_array("tokenizer.ggml.tokens", std::vector<std::string_view>{"x", "yy"});
  src.set_array("tokenizer.ggml.scores", std::vector<float>{-1.0f, -2.5f});
  src.set("tokenizer.ggml.model", "gpt2");
  const auto src_bytes = src.to_bytes();
  const auto sf = tlm::gguf::file::from_memory(src_bytes);

  tlm::gguf::writer w;
  w.set_alignment(64);
  w.set("a", std::uint32_t{1});
  w.set("b", "first");
  w.set("a", std::uint32_t{2});  // replaces, keeps position 1 (after general.alignment)
  for (const auto& e : sf.metadata()) w.set_value(e.key, e.val);
  std::vector<std::byte> raw(18 * 2);
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::byte>(i * 7);
  w.add_tensor("q", {32, 2}, tlm::encoding::q4_0, raw);
  w.add_tensor_generated("g", {256}, tlm::encoding::q6_k, [](std::span<std::byte> out) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(255 - i % 256);
  });
  const auto bytes = w.to_bytes();
  const auto f = tlm::gguf::file::from_memory(bytes);
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() % 64 == 0);
  REQUIRE(f.metadata().size() == 6);
  CHECK(f.metadata()[1].key == "a");
  CHECK(f.get_uint("a") == 2);
  CHECK(f.get_string("b") == "first");
  CHECK(f.get_string_array("tokenizer.ggml.tokens") == std::vector<std::string_view>{"x", "yy"});
  CHECK(f.get_float_array("tokenizer.ggml.scores") == std::vector<double>{-1.0, -2.5});
  CHECK(f.get_string("tokenizer.ggml.model") == "gpt2");
  const auto* q = f.find_tensor("q");
  CHECK(std::equal(raw.begin(), raw.end(), q->data.begin(), q->data.end()));
  const auto* g = f.find_tensor("g");
  CHECK(g->offset % 64 == 0);
  REQUIRE(g->data.size() == 210);
  CHECK(g->data[0] == std::byte{255});
  CHECK(g->data[209] == std::byte{255 - 209});
  CHECK(bytes.size() % 64 == 0);
}

TEST_CASE("tensors the writer cannot write are rejected when added") {
  tlm::gguf::writer w;
  std::vector<std::byte> raw(34);
  CHECK_THROWS_AS(w.add_tensor("t", {32}, tlm::encoding::q8_0, std::span<const std::byte>(raw).first(33)), tlm::shape_error);
  CHECK_THROWS_AS(w.add_tensor("t", {48}, tlm::encoding::q8_0, raw), tlm::shape_error);
  CHECK_THROWS_AS(w.add_tensor("t", {}, tlm::encoding::q8_0, raw), tlm::shape_error);
  CHECK_THROWS_AS(w.add_tensor("t", {32, 1, 1, 1, 1}, tlm::encoding::q8_0, raw), tlm::shape_error);
  CHECK_THROWS_AS(w.add_tensor("t", {32, 0}, tlm::encoding::q8_0, raw), tlm::shape_error);
  CHECK_THROWS_AS(w.add_tensor("", {32}, tlm::encoding::q8_0, raw), tlm::format_error);
  CHECK_THROWS_AS(w.add_tensor_f32("t", {32}, tlm::encoding::q8_0, std::vector<float>(31)), tlm::shape_error);
  // Q8_K is an activation encoding (llama.cpp's, for the K-quants' products): no file stores it.
  CHECK_THROWS_AS(w.add_tensor_f32("t", {256}, tlm::encoding::q8_k, std::vector<float>(256)), tlm::shape_error);
  // Q4_K is written, but only in whole blocks of 256.
  CHECK_THROWS_AS(w.add_tensor_f32("t", {128}, tlm::encoding::q4_k, std::vector<float>(128)), tlm::shape_error);
  w.add_tensor("t", {32}, tlm::encoding::q8_0, raw);
  CHECK_THROWS_AS(w.add_tensor("t", {32}, tlm::encoding::q8_0, raw), tlm::format_error);
  CHECK_THROWS_AS(w.set_alignment(48), tlm::format_error);
  CHECK_THROWS_AS(w.set("general.alignment", std::uint64_t{64}), tlm::format_error);  // must be u32
  CHECK_THROWS_AS(w.set("general.alignment", std::uint32_t{24}), tlm::format_error);
  // Setting the key directly moves the data layout too.
  w.set("general.alignment", std::uint32_t{128});
  const auto bytes = w.to_bytes();
  const auto f = tlm::gguf::file::from_memory(bytes);
  CHECK(f.alignment() == 128);
  CHECK(f.data_offset() % 128 == 0);
  CHECK(w.tensor_count() == 1);
}

TEST_CASE("write is atomic: same bytes as to_bytes, no temporary left, old file kept on failure") {
  const fs::path path = scratch("model.gguf");
  tlm::gguf::writer w;
  w.set("general.name", "first");
  w.add_tensor_f32("x", {64}, tlm::encoding::q4_1, random_values(64, 3));
  w.write(path);
  CHECK(read_all(path) == w.to_bytes());
  CHECK_FALSE(temp_files_left(path.parent_path()));

  // Overwriting replaces the file.
  tlm::gguf::writer w2;
  w2.set("general.name", "second");
  w2.write(path);
  CHECK(tlm::gguf::file(path).get_string("general.name") == "second");

  // A generator that fails mid-write leaves the previous file untouched and no temporary.
  tlm::gguf::writer bad;
  bad.set("general.name", "third");
  bad.add_tensor_generated("g", {32}, tlm::encoding::f32, [](std::span<std::byte>) { throw tlm::numeric_error("generator failed"); });
  CHECK_THROWS_AS(bad.write(path), tlm::numeric_error);
  CHECK(tlm::gguf::file(path).get_string("general.name") == "second");
  CHECK_FALSE(temp_files_left(path.parent_path()));

  // An unwritable destination is a tlm::error naming the path.
  try {
    w.write(scratch("no-such-dir") / "x.gguf");
    FAIL("writing into a missing directory must fail");
  } catch (const tlm::error& e) {
    CHECK(std::string(e.what()).find("no-such-dir") != std::string::npos);
  }
  fs::remove_all(path.parent_path());
}

}  // namespace test_gguf_writer
