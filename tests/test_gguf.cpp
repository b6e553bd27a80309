// The GGUF reader on well-formed input: every metadata value type and its getters,
// tensor infos and spans, version 2 files, files on disk, moves, and the real
// SmolLM2-135M file (whose contents are checked against what the notes predict).
#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>
#include <tlm/format/quant.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_gguf {

namespace {

namespace fs = std::filesystem;
using tlm::gguf::value_type;

tlm::gguf::writer every_type_writer() {
  tlm::gguf::writer w;
  w.set("t.u8", std::uint8_t{200});
  w.set("t.i8", std::int8_t{-5});
  w.set("t.u16", std::uint16_t{60000});
  w.set("t.i16", std::int16_t{-30000});
  w.set("t.u32", std::uint32_t{4000000000u});
  w.set("t.i32", std::int32_t{-2000000000});
  w.set("t.f32", 0.1f);
  w.set("t.bool", true);
  w.set("t.string", "héllo\nworld");
  w.set("t.u64", std::numeric_limits<std::uint64_t>::max());
  w.set("t.i64", std::numeric_limits<std::int64_t>::min());
  w.set("t.f64", 1e300);
  w.set_array("t.arr.i32", std::vector<std::int32_t>{-1, 0, 7});
  w.set_array("t.arr.u8", std::vector<std::uint8_t>{1, 2, 255});
  w.set_array("t.arr.f32", std::vector<float>{0.5f, -1.25f});
  w.set_array("t.arr.u64", std::vector<std::uint64_t>{1, std::numeric_limits<std::uint64_t>::max()});
  static constexpr std::array<bool, 3> flags{true, false, true};
  w.set_array("t.arr.bool", std::span<const bool>(flags));
  w.set_array("t.arr.empty", std::vector<std::int16_t>{});
  w.set_string_array("t.arr.str", std::vector<std::string>{"a", "", "long string with spaces"});
  return w;
}

std::string error_of(auto fn) {
  try {
    fn();
  } catch (const tlm::format_error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("metadata of every value type reads back through the getters") {
  const auto bytes = every_type_writer().to_bytes();
  const auto f = tlm::gguf::file::from_memory(bytes, "types.gguf");
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.tensors().empty());

  CHECK(f.get_uint("t.u8") == 200);
  CHECK(f.get_int("t.i8") == -5);
  CHECK(f.get_uint("t.u16") == 60000);
  CHECK(f.get_int("t.i16") == -30000);
  CHECK(f.get_uint("t.u32") == 4000000000u);
  CHECK(f.get_int("t.u32") == 4000000000);
  CHECK(f.get_int("t.i32") == -2000000000);
  CHECK(f.get_float("t.f32") == static_cast<double>(0.1f));
  CHECK(f.get_bool("t.bool"));
  CHECK(f.get_string("t.string") == "héllo\nworld");
  CHECK(f.get_uint("t.u64") == std::numeric_limits<std::uint64_t>::max());
  CHECK(f.get_int("t.i64") == std::numeric_limits<std::int64_t>::min());
  CHECK(f.get_float("t.f64") == 1e300);
  CHECK(f.get_float("t.i32") == -2000000000.0);  // integers are numbers too

  CHECK(f.get_int_array("t.arr.i32") == std::vector<std::int64_t>{-1, 0, 7});
  CHECK(f.get_int_array("t.arr.u8") == std::vector<std::int64_t>{1, 2, 255});
  CHECK(f.get_float_array("t.arr.f32") == std::vector<double>{0.5, -1.25});
  CHECK(f.get_float_array("t.arr.i32") == std::vector<double>{-1, 0, 7});
  CHECK(f.get_int_array("t.arr.empty").empty());
  CHECK(f.find("t.arr.bool")->element_type == value_type::boolean);
  CHECK(f.find("t.arr.bool")->integer(0).magnitude == 1);
  CHECK(f.find("t.arr.bool")->integer(1).magnitude == 0);
  CHECK(f.find("t.arr.bool")->integer(2).magnitude == 1);
  CHECK(f.get_string_array("t.arr.str") == std::vector<std::string_view>{"a", "", "long string with spaces"});

  // Range and type checks name the key and the file.
  std::string m = error_of([&] { (void)f.get_uint("t.i8"); });
  CHECK(m.find("types.gguf") != std::string::npos);
  CHECK(m.find("'t.i8' holds -5, expected a non-negative integer") != std::string::npos);
  m = error_of([&] { (void)f.get_int("t.u64"); });
  CHECK(m.find("'t.u64' holds 18446744073709551615, expected a signed 64-bit integer") != std::string::npos);
  m = error_of([&] { (void)f.get_int_array("t.arr.u64"); });
  CHECK(m.find("'t.arr.u64'") != std::string::npos);
  m = error_of([&] { (void)f.get_bool("t.u8"); });
  CHECK(m.find("has type u8, expected a bool") != std::string::npos);
  m = error_of([&] { (void)f.get_float("t.string"); });
  CHECK(m.find("has type string, expected a number") != std::string::npos);
  m = error_of([&] { (void)f.get_string_array("t.arr.i32"); });
  CHECK(m.find("has type array of i32, expected an array of strings") != std::string::npos);
  m = error_of([&] { (void)f.get_string("t.missing"); });
  CHECK(m.find("'t.missing' is missing") != std::string::npos);
  CHECK_FALSE(f.has("t.missing"));
  CHECK(f.has("t.u8"));

  // Generic enumeration keeps file order and types.
  REQUIRE(f.metadata().size() == 19);
  CHECK(f.metadata()[0].key == "t.u8");
  CHECK(f.metadata()[0].val.type == value_type::u8);
  CHECK(f.metadata()[12].key == "t.arr.i32");
  CHECK(f.metadata()[12].val.element_type == value_type::i32);
  CHECK(f.metadata()[12].val.count == 3);
  CHECK(f.find("t.arr.str")->strings().size() == 3);
}

TEST_CASE("tensors: dims, encodings, offsets and spans") {
  tlm::gguf::writer w;
  w.set("general.architecture", "test");
  std::vector<float> a(64 * 3), b(32);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.25f - 8.0f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i);
  w.add_tensor_f32("a", {64, 3}, tlm::encoding::q8_0, a);
  w.add_tensor_f32("b", {32}, tlm::encoding::f32, b);
  w.add_tensor_f32("c", {32, 2, 2, 2}, tlm::encoding::f16, std::vector<float>(256, 1.5f));
  const auto bytes = w.to_bytes();
  const auto f = tlm::gguf::file::from_memory(bytes);
  REQUIRE(f.tensors().size() == 3);
  const auto* ta = f.find_tensor("a");
  REQUIRE(ta != nullptr);
  CHECK(ta->n_dims == 2);
  CHECK(ta->dims == std::array<std::uint64_t, 4>{64, 3, 1, 1});
  CHECK(ta->enc == tlm::encoding::q8_0);
  CHECK(ta->elements == 192);
  CHECK(ta->rows() == 3);
  CHECK(ta->row_length() == 64);
  CHECK(ta->data.size() == 3 * 2 * 34);
  CHECK(ta->offset == 0);
  const auto* tb = f.find_tensor("b");
  CHECK(tb->offset % 32 == 0);
  CHECK(tb->offset >= ta->data.size());
  CHECK((tb->data.data() - bytes.data()) % 32 == 0);
  std::vector<float> got(32);
  tlm::dequantize_row(tb->enc, tb->data.data(), got.data(), 32);
  CHECK(got == b);
  const auto* tc = f.find_tensor("c");
  CHECK(tc->n_dims == 4);
  CHECK(tc->elements == 256);
  CHECK(tc->data.size() == 512);
  CHECK(f.find_tensor("d") == nullptr);
  CHECK(f.name() == "<memory>");
  // Dequantized Q8_0 is within half a step of the source.
  std::vector<float> row(64);
  for (std::size_t r = 0; r < 3; ++r) {
    tlm::dequantize_row(ta->enc, ta->data.data() + r * 68, row.data(), 64);
    for (std::size_t j = 0; j < 64; ++j) {
      float amax = 0;
      for (std::size_t k = j / 32 * 32; k < j / 32 * 32 + 32; ++k) amax = std::max(amax, std::fabs(a[r * 64 + k]));
      CHECK(std::fabs(row[j] - a[r * 64 + j]) <= amax / 127 * 0.51f + amax / 1024);
    }
  }
}

TEST_CASE("a version 2 file reads like version 3") {
  tlm::gguf::writer w;
  w.set("k", std::uint32_t{7});
  w.add_tensor_f32("t", {32}, tlm::encoding::f32, std::vector<float>(32, 2.0f));
  auto bytes = w.to_bytes();
  const std::uint32_t v2 = 2;
  std::memcpy(bytes.data() + 4, &v2, 4);
  const auto f = tlm::gguf::file::from_memory(bytes);
  CHECK(f.version() == 2);
  CHECK(f.get_uint("k") == 7);
  CHECK(f.find_tensor("t")->data.size() == 128);
}

TEST_CASE("files on disk are mapped, and moves keep the views valid") {
  const fs::path dir = fs::path(TLM_BINARY_DIR) / "test_gguf.tmp";
  fs::create_directories(dir);
  const fs::path path = dir / "small.gguf";
  auto w = every_type_writer();
  w.add_tensor_f32("x", {32, 2}, tlm::encoding::q4_1, std::vector<float>(64, 0.75f));
  w.write(path);
  tlm::gguf::file f(path);
  CHECK(f.name() == path.string());
  const auto s = f.get_string("t.string");
  const auto* data = f.find_tensor("x")->data.data();
  tlm::gguf::file g(std::move(f));
  CHECK(g.get_string("t.string") == s);
  CHECK(g.get_string("t.string").data() == s.data());
  CHECK(g.find_tensor("x")->data.data() == data);
  tlm::gguf::writer other;
  other.set("other", true);
  const auto other_bytes = other.to_bytes();
  tlm::gguf::file h = tlm::gguf::file::from_memory(other_bytes, "view");
  CHECK(h.get_bool("other"));
  h = std::move(g);  // move-assign releases h's old state and takes g's mapping
  std::vector<float> row(32);
  tlm::dequantize_row(tlm::encoding::q4_1, h.find_tensor("x")->data.data(), row.data(), 32);
  CHECK(row == std::vector<float>(32, 0.75f));
  CHECK(h.name() == path.string());
  CHECK_FALSE(h.has("other"));
  fs::remove_all(dir);
}

TEST_CASE("the real SmolLM2-135M-Instruct file") {
  const fs::path model = TLM_MODEL_PATH;
  if (!fs::exists(model)) FAIL("the model file ", model.string(), " is missing; run scripts/fetch-model");
  const tlm::gguf::file f(model);
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_uint("llama.context_length") == 8192);
  CHECK(f.get_uint("llama.block_count") == 30);
  CHECK(f.get_uint("llama.embedding_length") == 576);
  CHECK(f.get_uint("llama.feed_forward_length") == 1536);
  CHECK(f.get_uint("llama.attention.head_count") == 9);
  CHECK(f.get_uint("llama.attention.head_count_kv") == 3);
  CHECK(f.get_uint("llama.rope.dimension_count") == 64);
  CHECK(f.get_float("llama.rope.freq_base") == 100000.0);
  CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon") == static_cast<double>(1e-5f));
  CHECK(f.get_string("tokenizer.ggml.model") == "gpt2");
  CHECK(f.get_string("tokenizer.ggml.pre") == "smollm");
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  CHECK(tokens.size() == 49152);
  CHECK(tokens[0] == "<|endoftext|>");
  CHECK(f.get_int_array("tokenizer.ggml.token_type").size() == 49152);
  CHECK(f.get_string_array("tokenizer.ggml.merges").size() == 48900);
  CHECK(f.get_uint("tokenizer.ggml.bos_token_id") == 1);
  CHECK(f.get_uint("tokenizer.ggml.eos_token_id") == 2);

  REQUIRE(f.tensors().size() == 272);
  std::map<tlm::encoding, int> count;
  for (const auto& t : f.tensors()) ++count[t.enc];
  CHECK(count[tlm::encoding::q8_0] == 1);
  CHECK(count[tlm::encoding::q4_1] == 210);
  CHECK(count[tlm::encoding::f32] == 61);
  CHECK(f.find_tensor("output.weight") == nullptr);
  const auto* emb = f.find_tensor("token_embd.weight");
  REQUIRE(emb != nullptr);
  CHECK(emb->enc == tlm::encoding::q8_0);
  CHECK(emb->dims == std::array<std::uint64_t, 4>{576, 49152, 1, 1});
  for (const auto& t : f.tensors()) {
    CAPTURE(t.name);
    if (t.n_dims == 1) {
      CHECK(t.enc == tlm::encoding::f32);
      CHECK(t.name.ends_with("norm.weight"));
      CHECK(t.dims[0] == 576);
    } else if (t.name != "token_embd.weight") {
      CHECK(t.enc == tlm::encoding::q4_1);
    }
    // The first and last rows decode to finite values.
    std::vector<float> row(static_cast<std::size_t>(t.row_length()));
    const std::size_t rb = tlm::row_bytes(t.enc, row.size());
    for (const std::uint64_t r : {std::uint64_t{0}, t.rows() - 1}) {
      tlm::dequantize_row(t.enc, t.data.data() + r * rb, row.data(), row.size());
      bool finite = true, nonzero = false;
      for (const float v : row) {
        finite = finite && std::isfinite(v);
        nonzero = nonzero || v != 0.0f;
      }
      CHECK(finite);
      CHECK(nonzero);
    }
  }
  const auto* q = f.find_tensor("blk.0.attn_q.weight");
  REQUIRE(q != nullptr);
  CHECK(q->dims == std::array<std::uint64_t, 4>{576, 576, 1, 1});
  CHECK(f.find_tensor("blk.29.attn_k.weight")->dims[1] == 192);
  CHECK(f.find_tensor("blk.29.ffn_down.weight")->dims[0] == 1536);
}

TEST_CASE("the checked-in fixture (the fuzzing seed) opens and decodes") {
  const tlm::gguf::file f(fs::path(TLM_FIXTURES) / "gguf" / "tiny.gguf");
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_uint("llama.context_length") == 64);
  CHECK(f.get_string_array("tokenizer.ggml.tokens") == std::vector<std::string_view>{"<s>", "a", "b c"});
  REQUIRE(f.tensors().size() == 6);
  std::vector<float> f32(32), q8(32);
  tlm::dequantize_row(tlm::encoding::f32, f.find_tensor("f32")->data.data(), f32.data(), 32);
  tlm::dequantize_row(tlm::encoding::q8_0, f.find_tensor("q8")->data.data(), q8.data(), 32);
  for (int i = 0; i < 32; ++i) {
    CHECK(f32[i] == std::sin(0.1f * static_cast<float>(i)));
    CHECK(std::fabs(q8[i] - f32[i]) <= 1.0f / 127);
  }
  CHECK(f.find_tensor("q6k")->enc == tlm::encoding::q6_k);
}

}  // namespace test_gguf
