// Malformed GGUF input: every defect gives a tlm::format_error whose message names
// the file, the byte offset and the key or tensor, and nothing reads out of bounds
// (run under -fsanitize=address,undefined to see the second half of that claim).
//
// The files are built byte by byte here rather than with gguf::writer, because the
// writer refuses to produce most of these defects.
#include <tlm/format/gguf.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_gguf_bad_input {

namespace {

// A little-endian byte builder that records the offset of each field it writes.
struct builder {
  std::vector<std::byte> b;
  std::size_t size() const { return b.size(); }
  void raw(const void* p, std::size_t n) {
    const auto* q = static_cast<const std::byte*>(p);
    b.insert(b.end(), q, q + n);
  }
  void u8(std::uint8_t v) { raw(&v, 1); }
  void u32(std::uint32_t v) { raw(&v, 4); }
  void u64(std::uint64_t v) { raw(&v, 8); }
  void str(std::string_view s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
    raw("GGUF", 4);
    u32(version);
    u64(n_tensors);
    u64(n_kv);
  }
  void kv_u32(std::string_view key, std::uint32_t v) {
    str(key);
    u32(4);
    u32(v);
  }
  void kv_str(std::string_view key, std::string_view v) {
    str(key);
    u32(8);
    str(v);
  }
  void tensor(std::string_view name, std::vector<std::uint64_t> dims, std::uint32_t type, std::uint64_t offset) {
    str(name);
    u32(static_cast<std::uint32_t>(dims.size()));
    for (auto d : dims) u64(d);
    u32(type);
    u64(offset);
  }
  void pad(std::size_t alignment = 32) {
    while (b.size() % alignment != 0) u8(0);
  }
  void zeros(std::size_t n) { b.insert(b.end(), n, std::byte{0}); }
  template <class T>
  void patch(std::size_t at, T v) {
    std::memcpy(b.data() + at, &v, sizeof v);
  }
};

std::string error_of(const std::vector<std::byte>& bytes, const std::string& name = "bad.gguf") {
  try {
    auto f = tlm::gguf::file::from_memory(bytes, name);
    return {};
  } catch (const tlm::format_error& e) {
    return e.what();
  }
}

// Checks that parsing fails with a message naming the file and containing each of `parts`.
void check_rejected(const std::vector<std::byte>& bytes, std::initializer_list<std::string_view> parts) {
  const std::string msg = error_of(bytes);
  INFO("message: ", msg);
  REQUIRE_FALSE(msg.empty());
  CHECK(msg.find("bad.gguf") != std::string::npos);
  CHECK(msg.find("byte ") != std::string::npos);
  for (const auto p : parts) CHECK(msg.find(p) != std::string::npos);
}

// A valid file: two metadata pairs (one string array) and two tensors.
struct valid_file {
  builder b;
  std::size_t kv_type_at = 0, array_count_at = 0, n_dims_at = 0, dim0_at = 0, type_at = 0, offset1_at = 0, data_at = 0;
  valid_file() {
    b.header(2, 3);
    b.kv_u32("general.alignment", 32);
    b.kv_str("general.architecture", "llama");
    b.str("tokenizer.ggml.tokens");
    kv_type_at = b.size();
    b.u32(9);
    b.u32(8);
    array_count_at = b.size();
    b.u64(2);
    b.str("a");
    b.str("bc");
    b.str("w");
    n_dims_at = b.size();
    b.u32(2);
    dim0_at = b.size();
    b.u64(32);
    b.u64(2);
    type_at = b.size();
    b.u32(2);  // Q4_0: 2 rows of 18 bytes = 36 bytes
    b.u64(0);
    b.str("n");
    b.u32(1);
    b.u64(8);
    b.u32(0);  // F32: 32 bytes
    offset1_at = b.size();
    b.u64(64);
    b.pad();
    data_at = b.size();
    b.zeros(64 + 32);
  }
};

}  // namespace

TEST_CASE("the hand-built file is valid") {
  valid_file v;
  const auto f = tlm::gguf::file::from_memory(v.b.b, "good.gguf");
  CHECK(f.tensors().size() == 2);
  CHECK(f.get_string_array("tokenizer.ggml.tokens") == std::vector<std::string_view>{"a", "bc"});
  CHECK(f.find_tensor("w")->data.size() == 36);
  CHECK(f.find_tensor("n")->data.data() == v.b.b.data() + v.data_at + 64);
}

TEST_CASE("truncation at every offset is rejected") {
  valid_file v;
  const std::size_t end_of_data = v.data_at + 64 + 32;
  REQUIRE(v.b.size() == end_of_data);
  for (std::size_t cut = 0; cut < end_of_data; ++cut) {
    const std::vector<std::byte> prefix(v.b.b.begin(), v.b.b.begin() + static_cast<std::ptrdiff_t>(cut));
    const std::string msg = error_of(prefix);
    INFO("cut at ", cut);
    REQUIRE_FALSE(msg.empty());
    CHECK(msg.find("bad.gguf: byte ") == 0);
  }
  CHECK(error_of(v.b.b).empty());  // the uncut file is accepted: the cuts are what is refused
}

TEST_CASE("wrong magic, version and value types") {
  {
    valid_file v;
    v.b.b[0] = std::byte{'G'};
    v.b.b[3] = std::byte{'X'};
    check_rejected(v.b.b, {"magic", "GGUX", "not a GGUF file"});
  }
  for (const std::uint32_t version : {0u, 1u, 4u, 0x03000000u}) {
    valid_file v;
    v.b.patch<std::uint32_t>(4, version);
    check_rejected(v.b.b, {"byte 4", "unsupported GGUF version", std::to_string(version)});
  }
  {
    valid_file v;
    v.b.patch<std::uint32_t>(4, 0x03000000u);
    check_rejected(v.b.b, {"big-endian"});
  }
  {
    valid_file v;
    v.b.patch<std::uint32_t>(v.kv_type_at, 13);
    check_rejected(v.b.b, {"byte " + std::to_string(v.kv_type_at), "tokenizer.ggml.tokens", "unknown value type 13"});
  }
  {
    valid_file v;
    v.b.patch<std::uint32_t>(v.kv_type_at + 4, 9);  // array of arrays
    check_rejected(v.b.b, {"arrays of arrays"});
  }
}

TEST_CASE("lengths and counts larger than the file") {
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.array_count_at, 1ull << 60);
    check_rejected(v.b.b, {"tokenizer.ggml.tokens", "cannot fit"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.array_count_at + 8, 1000);  // length of the first string
    check_rejected(v.b.b, {"string length 1000", "tokenizer.ggml.tokens"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(8, 1ull << 40);  // tensor count
    check_rejected(v.b.b, {"byte 8", "tensor count"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(16, ~0ull);  // metadata count
    check_rejected(v.b.b, {"byte 16", "metadata count"});
  }
  {
    builder b;
    b.header(0, 1);
    b.str("k");
    b.u32(9);
    b.u32(10);  // u64 array
    b.u64(3);
    b.u64(1);
    b.u64(2);  // one element short
    check_rejected(b.b, {"'k'", "array of 3 u64"});
  }
  {
    builder b;
    b.header(0, 1);
    b.u64(~0ull);  // key length
    b.zeros(16);
    check_rejected(b.b, {"metadata pair 0 key", "string length"});
  }
}

TEST_CASE("tensor infos: dims, types, offsets, extents") {
  {
    valid_file v;
    v.b.patch<std::uint32_t>(v.n_dims_at, 5);
    check_rejected(v.b.b, {"'w'", "n_dims is 5", "1..4"});
  }
  {
    valid_file v;
    v.b.patch<std::uint32_t>(v.n_dims_at, 0);
    check_rejected(v.b.b, {"'w'", "n_dims is 0"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.dim0_at, 0);
    check_rejected(v.b.b, {"'w'", "dim 0 is 0"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.dim0_at, 1ull << 40);
    v.b.patch<std::uint64_t>(v.dim0_at + 8, 1ull << 40);
    check_rejected(v.b.b, {"'w'", "overflows"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.dim0_at, 48);  // not a multiple of the Q4_0 block
    check_rejected(v.b.b, {"'w'", "row length 48", "Q4_0 block size 32"});
  }
  {
    valid_file v;
    v.b.patch<std::uint32_t>(v.type_at, 4);  // Q4_2, long removed
    check_rejected(v.b.b, {"byte " + std::to_string(v.type_at), "'w'", "ggml type 4", "requantize"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.offset1_at, 48);
    check_rejected(v.b.b, {"byte " + std::to_string(v.offset1_at), "'n'", "not a multiple of the alignment 32"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.offset1_at, 96);  // 96 + 32 > 96 bytes of data
    check_rejected(v.b.b, {"'n'", "past the end"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.offset1_at, ~0ull & ~31ull);
    check_rejected(v.b.b, {"'n'", "past the end"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.offset1_at, 32);  // 'w' occupies 0..36
    check_rejected(v.b.b, {"'n'", "overlaps tensor 'w'"});
  }
  {
    valid_file v;
    v.b.patch<std::uint64_t>(v.dim0_at + 8, 1ull << 58);  // huge row count: block count check must not overflow
    check_rejected(v.b.b, {"'w'", "past the end"});
  }
}

TEST_CASE("duplicates") {
  {
    builder b;
    b.header(0, 2);
    b.kv_u32("x", 1);
    b.kv_u32("x", 2);
    check_rejected(b.b, {"byte 41", "duplicate metadata key 'x'"});
  }
  {
    builder b;
    b.header(2, 0);
    b.tensor("t", {8}, 0, 0);
    const std::size_t second = b.size();
    b.tensor("t", {8}, 0, 32);
    b.pad();
    b.zeros(64);
    check_rejected(b.b, {"byte " + std::to_string(second), "duplicate tensor name 't'"});
  }
}

TEST_CASE("alignment key and bool values are validated") {
  {
    builder b;
    b.header(0, 1);
    b.kv_u32("general.alignment", 48);
    check_rejected(b.b, {"general.alignment is 48", "power of two"});
  }
  {
    builder b;
    b.header(0, 1);
    b.kv_str("general.alignment", "32");
    check_rejected(b.b, {"general.alignment", "type string", "expected u32"});
  }
  {
    builder b;
    b.header(0, 1);
    b.str("flag");
    b.u32(7);
    b.u8(2);
    check_rejected(b.b, {"'flag'", "bool value 2"});
  }
  {
    // A 64-byte alignment moves the data section and demands 64-aligned offsets.
    builder b;
    b.header(1, 1);
    b.kv_u32("general.alignment", 64);
    b.tensor("t", {8}, 0, 0);
    b.pad(64);
    const std::size_t data_at = b.size();
    b.zeros(32);
    const auto f = tlm::gguf::file::from_memory(b.b, "a64.gguf");
    CHECK(f.alignment() == 64);
    CHECK(f.data_offset() == data_at);
    CHECK(data_at % 64 == 0);
  }
}

TEST_CASE("getters name the key, the file and the expected type") {
  valid_file v;
  const auto f = tlm::gguf::file::from_memory(v.b.b, "meta.gguf");
  auto message = [&](auto fn) {
    try {
      fn();
    } catch (const tlm::format_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string m = message([&] { (void)f.get_uint("llama.block_count"); });
  CHECK(m.find("meta.gguf") != std::string::npos);
  CHECK(m.find("'llama.block_count' is missing") != std::string::npos);
  m = message([&] { (void)f.get_uint("general.architecture"); });
  CHECK(m.find("'general.architecture' has type string, expected an integer") != std::string::npos);
  m = message([&] { (void)f.get_string("general.alignment"); });
  CHECK(m.find("has type u32, expected a string") != std::string::npos);
  m = message([&] { (void)f.get_int_array("tokenizer.ggml.tokens"); });
  CHECK(m.find("array of string") != std::string::npos);
}

TEST_CASE("random byte corruption never crashes: it parses or throws format_error") {
  valid_file v;
  std::mt19937 rng(12345);
  int parsed = 0, rejected = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    auto bytes = v.b.b;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      // Mostly hit the header and infos, where the structure lives.
      const std::size_t at = rng() % v.data_at;
      bytes[at] = static_cast<std::byte>(rng() & 0xff);
    }
    try {
      const auto f = tlm::gguf::file::from_memory(bytes, "fuzz.gguf");
      for (const auto& t : f.tensors()) {
        REQUIRE(t.data.data() >= bytes.data());
        REQUIRE(t.data.data() + t.data.size() <= bytes.data() + bytes.size());
      }
      for (const auto& e : f.metadata()) {
        if (e.val.is_array() && e.val.element_type == tlm::gguf::value_type::string) {
          REQUIRE(e.val.strings().size() == e.val.count);
        }
      }
      ++parsed;
    } catch (const tlm::format_error&) {
      ++rejected;
    }
  }
  MESSAGE("corrupted files: ", parsed, " parsed, ", rejected, " rejected");
  // Both outcomes are exercised (every trial ends in one of them by construction, so
  // their sum says nothing): some corruptions leave a readable file, most do not.
  CHECK(parsed > 0);
  CHECK(rejected > parsed);
}

TEST_CASE("files on disk: missing, empty, a directory") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(TLM_BINARY_DIR) / "test_gguf_bad_input.tmp";
  fs::create_directories(dir);
  CHECK_THROWS_AS(tlm::gguf::file{dir / "does-not-exist.gguf"}, tlm::format_error);
  CHECK_THROWS_AS(tlm::gguf::file{dir}, tlm::format_error);
  const fs::path empty = dir / "empty.gguf";
  { std::FILE* f = std::fopen(empty.c_str(), "wb"); REQUIRE(f != nullptr); std::fclose(f); }
  try {
    tlm::gguf::file f(empty);
    FAIL("an empty file must not open");
  } catch (const tlm::format_error& e) {
    CHECK(std::string(e.what()).find("empty") != std::string::npos);
    CHECK(std::string(e.what()).find(empty.string()) != std::string::npos);
  }
  fs::remove_all(dir);
}

}  // namespace test_gguf_bad_input
