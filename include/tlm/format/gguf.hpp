#pragma once
// Reader for GGUF files (versions 2 and 3, little-endian).
//
// The file is memory-mapped read-only and never copied: metadata strings and tensor
// data are views into the mapping, valid for as long as the gguf::file lives (moving
// the file keeps them valid, the mapping does not move). Everything is validated
// while the header is parsed, so a file that opens is safe to walk: every value,
// every string and every tensor span lies inside the file, tensors are aligned and
// do not overlap, and each row is a whole number of blocks.
#include <tlm/error.hpp>
#include <tlm/format/encoding.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tlm::gguf {

static_assert(std::endian::native == std::endian::little, "tlm::gguf reads little-endian GGUF files on little-endian hosts only");

// Metadata value types, numbered as in the GGUF specification.
enum class value_type : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

constexpr std::string_view type_name(value_type t) {
  switch (t) {
    case value_type::u8: return "u8";
    case value_type::i8: return "i8";
    case value_type::u16: return "u16";
    case value_type::i16: return "i16";
    case value_type::u32: return "u32";
    case value_type::i32: return "i32";
    case value_type::f32: return "f32";
    case value_type::boolean: return "bool";
    case value_type::string: return "string";
    case value_type::array: return "array";
    case value_type::u64: return "u64";
    case value_type::i64: return "i64";
    case value_type::f64: return "f64";
  }
  return "?";
}

// Bytes of one scalar of type t; 0 for string and array (variable length).
constexpr std::size_t scalar_size(value_type t) {
  switch (t) {
    case value_type::u8: case value_type::i8: case value_type::boolean: return 1;
    case value_type::u16: case value_type::i16: return 2;
    case value_type::u32: case value_type::i32: case value_type::f32: return 4;
    case value_type::u64: case value_type::i64: case value_type::f64: return 8;
    default: return 0;
  }
}

constexpr bool is_integer(value_type t) {
  switch (t) {
    case value_type::u8: case value_type::i8: case value_type::u16: case value_type::i16:
    case value_type::u32: case value_type::i32: case value_type::u64: case value_type::i64:
      return true;
    default:
      return false;
  }
}

constexpr bool is_signed(value_type t) {
  return t == value_type::i8 || t == value_type::i16 || t == value_type::i32 || t == value_type::i64;
}

constexpr bool is_float(value_type t) { return t == value_type::f32 || t == value_type::f64; }

namespace detail {

template <class T>
inline T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// An integer scalar of type t at p, split into magnitude and sign so that every
// u64 and every i64 fits.
struct integer {
  bool negative;
  std::uint64_t magnitude;
};

inline integer load_integer(value_type t, const std::byte* p) {
  auto sgn = [](std::int64_t v) {
    return v < 0 ? integer{true, static_cast<std::uint64_t>(-(v + 1)) + 1} : integer{false, static_cast<std::uint64_t>(v)};
  };
  switch (t) {
    case value_type::u8: case value_type::boolean: return {false, load<std::uint8_t>(p)};
    case value_type::i8: return sgn(load<std::int8_t>(p));
    case value_type::u16: return {false, load<std::uint16_t>(p)};
    case value_type::i16: return sgn(load<std::int16_t>(p));
    case value_type::u32: return {false, load<std::uint32_t>(p)};
    case value_type::i32: return sgn(load<std::int32_t>(p));
    case value_type::u64: return {false, load<std::uint64_t>(p)};
    case value_type::i64: return sgn(load<std::int64_t>(p));
    default: return {false, 0};
  }
}

inline double load_number(value_type t, const std::byte* p) {
  if (t == value_type::f32) return load<float>(p);
  if (t == value_type::f64) return load<double>(p);
  const integer v = load_integer(t, p);
  return v.negative ? -static_cast<double>(v.magnitude) : static_cast<double>(v.magnitude);
}

inline std::string hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), digits[v & 15]);
    v >>= 4;
  } while (v != 0);
  return "0x" + s;
}

}  // namespace detail

// One metadata value: a view of its bytes in the mapping.
struct value {
  value_type type = value_type::u8;
  value_type element_type = value_type::u8;  // arrays only
  std::uint64_t count = 1;                   // arrays: number of elements; scalars: 1
  std::span<const std::byte> payload;        // scalar bytes, string bytes, or the packed array elements
  std::uint64_t offset = 0;                  // byte offset of the value (after its type tag) in the file

  bool is_array() const { return type == value_type::array; }
  std::string_view str() const {  // string values only
    return {reinterpret_cast<const char*>(payload.data()), payload.size()};
  }
  // Element i of a numeric or bool array, or the scalar itself for i == 0.
  double number(std::size_t i = 0) const {
    const value_type t = is_array() ? element_type : type;
    return detail::load_number(t, payload.data() + i * scalar_size(t));
  }
  detail::integer integer(std::size_t i = 0) const {
    const value_type t = is_array() ? element_type : type;
    return detail::load_integer(t, payload.data() + i * scalar_size(t));
  }
  // The strings of a string array, in order.
  std::vector<std::string_view> strings() const {
    std::vector<std::string_view> out;
    out.reserve(static_cast<std::size_t>(count));
    std::size_t pos = 0;
    for (std::uint64_t i = 0; i < count; ++i) {  // lengths were validated when the file was opened
      const auto len = static_cast<std::size_t>(detail::load<std::uint64_t>(payload.data() + pos));
      out.emplace_back(reinterpret_cast<const char*>(payload.data() + pos + 8), len);
      pos += 8 + len;
    }
    return out;
  }
};

struct metadata_entry {
  std::string_view key;
  value val;
};

struct tensor_info {
  std::string name;
  std::uint32_t n_dims = 0;
  std::array<std::uint64_t, 4> dims{1, 1, 1, 1};  // dims[0] contiguous; unused dims are 1
  encoding enc = encoding::f32;
  std::uint64_t offset = 0;  // relative to the data section
  std::uint64_t elements = 0;
  std::span<const std::byte> data;  // [elements / dims[0] rows of row_bytes(enc, dims[0]) bytes]

  std::uint64_t row_length() const { return dims[0]; }
  std::uint64_t rows() const { return dims[0] == 0 ? 0 : elements / dims[0]; }
};

namespace detail {

// A read-only private mapping of a whole file; unmapped on destruction.
class mapping {
 public:
  mapping() = default;
  explicit mapping(const std::filesystem::path& path) {
    const std::string p = path.string();
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      throw format_error(p + ": cannot open: " + std::strerror(errno) + "; check the path (scripts/fetch-model fetches the model)");
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw format_error(p + ": not a regular file; pass the path of a .gguf file");
    }
    len_ = static_cast<std::size_t>(st.st_size);
    if (len_ == 0) {
      ::close(fd);
      throw format_error(p + ": byte 0: the file is empty, expected a GGUF header; fetch or write the file again");
    }
    void* addr = ::mmap(nullptr, len_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps its own reference to the file
    if (addr == MAP_FAILED) {
      len_ = 0;
      throw format_error(p + ": cannot memory-map " + std::to_string(st.st_size) + " bytes: " + std::strerror(err));
    }
    addr_ = addr;
  }
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  mapping(mapping&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  mapping& operator=(mapping&& o) noexcept {
    if (this != &o) {
      reset();
      addr_ = std::exchange(o.addr_, nullptr);
      len_ = std::exchange(o.len_, 0);
    }
    return *this;
  }
  ~mapping() { reset(); }

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(addr_), len_}; }

 private:
  void reset() {
    if (addr_ != nullptr) ::munmap(addr_, len_);
    addr_ = nullptr;
    len_ = 0;
  }
  void* addr_ = nullptr;
  std::size_t len_ = 0;
};

}  // namespace detail

class file {
 public:
  explicit file(const std::filesystem::path& path) : map_(path), name_(path.string()), bytes_(map_.bytes()) { parse(); }

  // Non-owning: `bytes` must outlive the returned file.
  static file from_memory(std::span<const std::byte> bytes, std::string name = "<memory>") {
    return file(bytes, std::move(name));
  }

  file(file&&) noexcept = default;
  file& operator=(file&&) noexcept = default;
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() = default;

  std::uint32_t version() const { return version_; }
  std::size_t alignment() const { return alignment_; }
  const std::string& name() const { return name_; }
  std::span<const std::byte> bytes() const { return bytes_; }
  std::uint64_t data_offset() const { return data_offset_; }  // absolute start of the data section

  // All metadata in file order.
  const std::vector<metadata_entry>& metadata() const { return meta_; }
  const value* find(std::string_view key) const {
    const auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &meta_[it->second].val;
  }
  bool has(std::string_view key) const { return find(key) != nullptr; }

  std::string_view get_string(std::string_view key) const { return require(key, value_type::string, "a string").str(); }

  std::uint64_t get_uint(std::string_view key) const {
    const value& v = require_integer(key);
    const auto i = v.integer();
    if (i.negative) bad_value(key, v, "a non-negative integer", "-" + std::to_string(i.magnitude));
    return i.magnitude;
  }

  std::int64_t get_int(std::string_view key) const {
    const value& v = require_integer(key);
    const auto i = v.integer();
    return checked_int(key, v, i);
  }

  double get_float(std::string_view key) const {
    const value& v = require_any(key);
    if (!(is_float(v.type) || is_integer(v.type))) wrong_type(key, v, "a number (f32, f64 or an integer)");
    return v.number();
  }

  bool get_bool(std::string_view key) const {
    return std::to_integer<std::uint8_t>(require(key, value_type::boolean, "a bool").payload[0]) != 0;
  }

  std::vector<std::string_view> get_string_array(std::string_view key) const {
    return require_array(key, [](value_type t) { return t == value_type::string; }, "an array of strings").strings();
  }

  std::vector<std::int64_t> get_int_array(std::string_view key) const {
    const value& v = require_array(key, is_integer, "an array of integers");
    std::vector<std::int64_t> out(static_cast<std::size_t>(v.count));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = checked_int(key, v, v.integer(i));
    return out;
  }

  std::vector<double> get_float_array(std::string_view key) const {
    const value& v = require_array(key, [](value_type t) { return is_float(t) || is_integer(t); }, "an array of numbers");
    std::vector<double> out(static_cast<std::size_t>(v.count));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = v.number(i);
    return out;
  }

  const std::vector<tensor_info>& tensors() const { return tensors_; }
  const tensor_info* find_tensor(std::string_view name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }

 private:
  file(std::span<const std::byte> bytes, std::string name) : name_(std::move(name)), bytes_(bytes) { parse(); }

  // ---- errors -------------------------------------------------------------------
  static constexpr const char* corrupt_hint = "the file is truncated or corrupt; fetch or write it again";

  [[noreturn]] void fail(std::uint64_t at, const std::string& what, const std::string& todo = corrupt_hint) const {
    throw format_error(name_ + ": byte " + std::to_string(at) + ": " + what + "; " + todo);
  }

  [[noreturn]] void missing(std::string_view key, const std::string& expected) const {
    throw format_error(name_ + ": metadata key '" + std::string(key) + "' is missing (expected " + expected +
                       "); the file was not written for this model type, or the converter is too old");
  }

  [[noreturn]] void wrong_type(std::string_view key, const value& v, const std::string& expected) const {
    std::string got(type_name(v.type));
    if (v.is_array()) got += " of " + std::string(type_name(v.element_type));
    fail(v.offset, "metadata key '" + std::string(key) + "' has type " + got + ", expected " + expected,
         "the file does not follow the GGUF conventions for this key; re-export it");
  }

  [[noreturn]] void bad_value(std::string_view key, const value& v, const std::string& expected, const std::string& got) const {
    fail(v.offset, "metadata key '" + std::string(key) + "' holds " + got + ", expected " + expected,
         "the value does not fit the type it is read as; check the file's metadata with `inspect --metadata`");
  }

  const value& require_any(std::string_view key) const {
    const value* v = find(key);
    if (v == nullptr) missing(key, "a value");
    return *v;
  }

  const value& require(std::string_view key, value_type t, const char* expected) const {
    const value* v = find(key);
    if (v == nullptr) missing(key, expected);
    if (v->type != t) wrong_type(key, *v, expected);
    return *v;
  }

  const value& require_integer(std::string_view key) const {
    const value* v = find(key);
    if (v == nullptr) missing(key, "an integer");
    if (!is_integer(v->type)) wrong_type(key, *v, "an integer");
    return *v;
  }

  template <class Pred>
  const value& require_array(std::string_view key, Pred pred, const char* expected) const {
    const value* v = find(key);
    if (v == nullptr) missing(key, expected);
    if (!v->is_array() || !pred(v->element_type)) wrong_type(key, *v, expected);
    return *v;
  }

  std::int64_t checked_int(std::string_view key, const value& v, detail::integer i) const {
    constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (!i.negative && i.magnitude > max) bad_value(key, v, "a signed 64-bit integer", std::to_string(i.magnitude));
    if (i.negative) return i.magnitude > max ? std::numeric_limits<std::int64_t>::min() : -static_cast<std::int64_t>(i.magnitude);
    return static_cast<std::int64_t>(i.magnitude);
  }

  // ---- parsing ------------------------------------------------------------------
  std::uint64_t remaining() const { return bytes_.size() - pos_; }

  void need(std::uint64_t n, const std::string& what) const {
    if (n > remaining()) {
      fail(pos_, what + " needs " + std::to_string(n) + " bytes but only " + std::to_string(remaining()) +
                     " remain (file size " + std::to_string(bytes_.size()) + ")");
    }
  }

  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    const T v = detail::load<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_string(const std::string& what) {
    const std::uint64_t at = pos_;
    const auto len = read<std::uint64_t>(what + " (string length)");
    if (len > remaining()) {
      fail(at, what + ": string length " + std::to_string(len) + " is larger than the " + std::to_string(remaining()) +
                   " bytes left in the file");
    }
    std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<std::size_t>(len));
    pos_ += len;
    return s;
  }

  value_type read_type(const std::string& what) {
    const std::uint64_t at = pos_;
    const auto t = read<std::uint32_t>(what + " (value type)");
    if (t > 12) {
      fail(at, what + ": unknown value type " + std::to_string(t) + " (expected 0..12)",
           "the file uses a GGUF extension this reader does not know, or is corrupt");
    }
    return static_cast<value_type>(t);
  }

  // Reads the value of type t at pos_ into v (payload and count), validating its extent.
  void read_value(value_type t, value& v, const std::string& what) {
    v.type = t;
    v.offset = pos_;
    if (t == value_type::string) {
      const auto s = read_string(what);
      v.payload = std::as_bytes(std::span(s.data(), s.size()));
      return;
    }
    if (t != value_type::array) {
      need(scalar_size(t), what + " (" + std::string(type_name(t)) + " value)");
      v.payload = bytes_.subspan(pos_, scalar_size(t));
      if (t == value_type::boolean) check_bool(pos_, what);
      pos_ += scalar_size(t);
      return;
    }
    v.element_type = read_type(what + " array element");
    const std::uint64_t count_at = pos_;
    v.count = read<std::uint64_t>(what + " (array length)");
    if (v.element_type == value_type::array) {
      fail(count_at - 4, what + ": arrays of arrays are not supported", "flatten the nested array when writing the file");
    }
    const std::uint64_t start = pos_;
    if (v.element_type == value_type::string) {
      // Each string takes at least its 8-byte length, which bounds the count before walking.
      if (v.count > remaining() / 8) {
        fail(count_at, what + ": array of " + std::to_string(v.count) + " strings cannot fit in the " +
                           std::to_string(remaining()) + " bytes left in the file");
      }
      // Inline rather than read_string: token lists hold ~50k strings, and a message is
      // built only when one fails.
      for (std::uint64_t i = 0; i < v.count; ++i) {
        const std::uint64_t at = pos_;
        if (remaining() < 8) need(8, what + " element " + std::to_string(i) + " (string length)");
        const auto len = detail::load<std::uint64_t>(bytes_.data() + pos_);
        pos_ += 8;
        if (len > remaining()) {
          fail(at, what + " element " + std::to_string(i) + ": string length " + std::to_string(len) + " is larger than the " +
                       std::to_string(remaining()) + " bytes left in the file");
        }
        pos_ += len;
      }
    } else {
      const std::size_t size = scalar_size(v.element_type);
      if (v.count > remaining() / size) {
        fail(count_at, what + ": array of " + std::to_string(v.count) + " " + std::string(type_name(v.element_type)) +
                           " values (" + std::to_string(size) + " bytes each) is larger than the " +
                           std::to_string(remaining()) + " bytes left in the file");
      }
      if (v.element_type == value_type::boolean) {
        for (std::uint64_t i = 0; i < v.count; ++i) {
          if (std::to_integer<std::uint8_t>(bytes_[pos_ + i]) > 1) check_bool(pos_ + i, what + " element " + std::to_string(i));
        }
      }
      pos_ += v.count * size;
    }
    v.payload = bytes_.subspan(start, pos_ - start);
  }

  void check_bool(std::uint64_t at, const std::string& what) const {
    const auto b = std::to_integer<std::uint8_t>(bytes_[at]);
    if (b > 1) fail(at, what + ": bool value " + std::to_string(b) + " (expected 0 or 1)");
  }

  void parse() {
    pos_ = 0;
    need(4, "magic 'GGUF'");
    if (std::memcmp(bytes_.data(), "GGUF", 4) != 0) {
      std::string got;
      for (int i = 0; i < 4; ++i) {
        const auto c = std::to_integer<unsigned char>(bytes_[i]);
        got += (c >= 0x20 && c < 0x7f) ? std::string(1, static_cast<char>(c)) : "\\x" + detail::hex(c).substr(2);
      }
      fail(0, "magic is '" + got + "', expected 'GGUF'", "this is not a GGUF file; pass a .gguf model file");
    }
    pos_ = 4;
    version_ = read<std::uint32_t>("version");
    if (version_ != 2 && version_ != 3) {
      std::string hint = "convert the file with a current llama.cpp (convert_hf_to_gguf.py) to GGUF version 3";
      const std::uint32_t swapped = (version_ >> 24) | ((version_ >> 8) & 0xff00u) | ((version_ << 8) & 0xff0000u) | (version_ << 24);
      if (version_ > 0xffff && swapped <= 3) hint = "the file looks big-endian; only little-endian GGUF is supported";
      fail(4, "unsupported GGUF version " + std::to_string(version_) + " (expected 2 or 3)", hint);
    }
    const std::uint64_t count_at = pos_;
    const auto n_tensors = read<std::uint64_t>("tensor count");
    const auto n_kv = read<std::uint64_t>("metadata count");
    // Bound the counts by the smallest possible record sizes so a corrupt count cannot
    // make us reserve huge vectors: a pair is at least 8+4+1 bytes, a tensor info 8+4+8+4+8.
    if (n_kv > remaining() / 13) {
      fail(count_at + 8, "metadata count " + std::to_string(n_kv) + " cannot fit in the " + std::to_string(remaining()) + " bytes left");
    }
    if (n_tensors > remaining() / 32) {
      fail(count_at, "tensor count " + std::to_string(n_tensors) + " cannot fit in the " + std::to_string(remaining()) + " bytes left");
    }

    meta_.clear();
    key_index_.clear();
    meta_.reserve(static_cast<std::size_t>(n_kv));
    for (std::uint64_t i = 0; i < n_kv; ++i) {
      const std::uint64_t at = pos_;
      const std::string what = "metadata pair " + std::to_string(i);
      metadata_entry e;
      e.key = read_string(what + " key");
      const std::string what_key = what + " '" + std::string(e.key) + "'";
      const value_type t = read_type(what_key);
      read_value(t, e.val, what_key);
      if (!key_index_.emplace(e.key, meta_.size()).second) {
        fail(at, "duplicate metadata key '" + std::string(e.key) + "'", "each key may appear once; rewrite the file without the duplicate");
      }
      meta_.push_back(e);
    }

    alignment_ = 32;
    if (const value* a = find("general.alignment")) {
      if (a->type != value_type::u32) wrong_type("general.alignment", *a, "u32");
      const auto al = a->integer().magnitude;
      if (al == 0 || !std::has_single_bit(al)) {
        fail(a->offset, "general.alignment is " + std::to_string(al) + ", expected a power of two",
             "fix the writer that produced this file");
      }
      alignment_ = static_cast<std::size_t>(al);
    }

    struct pending {
      std::uint64_t at;
      std::string_view name;
    };
    std::vector<pending> where;
    tensors_.clear();
    tensor_index_.clear();
    tensors_.reserve(static_cast<std::size_t>(n_tensors));
    where.reserve(static_cast<std::size_t>(n_tensors));
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      const std::uint64_t at = pos_;
      const std::string what = "tensor info " + std::to_string(i);
      tensor_info ti;
      const auto name = read_string(what + " name");
      ti.name = std::string(name);
      const std::string what_t = what + " '" + ti.name + "'";
      const std::uint64_t dims_at = pos_;
      ti.n_dims = read<std::uint32_t>(what_t + " n_dims");
      if (ti.n_dims == 0 || ti.n_dims > 4) {
        fail(dims_at, what_t + ": n_dims is " + std::to_string(ti.n_dims) + ", expected 1..4");
      }
      ti.elements = 1;
      for (std::uint32_t d = 0; d < ti.n_dims; ++d) {
        const std::uint64_t d_at = pos_;
        ti.dims[d] = read<std::uint64_t>(what_t + " dim " + std::to_string(d));
        if (ti.dims[d] == 0) fail(d_at, what_t + ": dim " + std::to_string(d) + " is 0, expected at least 1");
        if (ti.dims[d] > std::numeric_limits<std::uint64_t>::max() / ti.elements) {
          fail(d_at, what_t + ": the element count (product of the dims) overflows 64 bits");
        }
        ti.elements *= ti.dims[d];
      }
      const std::uint64_t type_at = pos_;
      const auto type_id = read<std::uint32_t>(what_t + " ggml type");
      if (!known_encoding(type_id)) {
        fail(type_at, what_t + ": unknown or unsupported ggml type " + std::to_string(type_id) +
                          " (supported: " + known_encodings_list() + ")",
             "requantize the model to a file of those types (llama-quantize: Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_1 or F16)");
      }
      ti.enc = static_cast<encoding>(type_id);
      const auto tr = traits(ti.enc);
      if (ti.dims[0] % tr.block_values != 0) {
        fail(dims_at, what_t + ": row length " + std::to_string(ti.dims[0]) + " is not a multiple of the " +
                          std::string(tr.name) + " block size " + std::to_string(tr.block_values));
      }
      const std::uint64_t off_at = pos_;
      ti.offset = read<std::uint64_t>(what_t + " offset");
      if (ti.offset % alignment_ != 0) {
        fail(off_at, what_t + ": data offset " + std::to_string(ti.offset) + " is not a multiple of the alignment " +
                         std::to_string(alignment_));
      }
      if (!tensor_index_.emplace(name, tensors_.size()).second) {
        fail(at, "duplicate tensor name '" + ti.name + "'", "each tensor may appear once; rewrite the file without the duplicate");
      }
      tensors_.push_back(std::move(ti));
      where.push_back({off_at, name});
    }

    // The data section starts at the first aligned position after the tensor infos.
    const std::uint64_t infos_end = pos_;
    const std::uint64_t pad = (alignment_ - infos_end % alignment_) % alignment_;
    data_offset_ = infos_end + pad;
    if (tensors_.empty()) return;
    if (data_offset_ > bytes_.size()) {
      fail(infos_end, "the data section would start at byte " + std::to_string(data_offset_) + ", past the end of the file (" +
                          std::to_string(bytes_.size()) + " bytes)");
    }
    const std::uint64_t data_size = bytes_.size() - data_offset_;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      tensor_info& ti = tensors_[i];
      const auto tr = traits(ti.enc);
      // elements / block_values * block_bytes cannot overflow past the file size check
      // below unless the block count itself is huge, so check that first.
      const std::uint64_t blocks = ti.elements / tr.block_values;
      if (blocks > data_size / tr.block_bytes || ti.offset > data_size || blocks * tr.block_bytes > data_size - ti.offset) {
        fail(where[i].at, "tensor '" + ti.name + "': its data (" + std::to_string(ti.elements) + " " + std::string(tr.name) +
                              " values at data offset " + std::to_string(ti.offset) + ") runs past the end of the file (data section is " +
                              std::to_string(data_size) + " bytes)");
      }
      ti.data = bytes_.subspan(static_cast<std::size_t>(data_offset_ + ti.offset), static_cast<std::size_t>(blocks * tr.block_bytes));
    }
    std::vector<std::size_t> order(tensors_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const tensor_info& prev = tensors_[order[k - 1]];
      const tensor_info& cur = tensors_[order[k]];
      if (prev.offset + prev.data.size() > cur.offset) {
        fail(where[order[k]].at, "tensor '" + cur.name + "' (data offset " + std::to_string(cur.offset) + ") overlaps tensor '" +
                                     prev.name + "' (data offset " + std::to_string(prev.offset) + ", " +
                                     std::to_string(prev.data.size()) + " bytes)");
      }
    }
  }

  detail::mapping map_;
  std::string name_;
  std::span<const std::byte> bytes_;
  std::uint64_t pos_ = 0;
  std::uint32_t version_ = 0;
  std::size_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<metadata_entry> meta_;
  std::unordered_map<std::string_view, std::size_t> key_index_;
  std::vector<tensor_info> tensors_;
  std::unordered_map<std::string_view, std::size_t> tensor_index_;  // names are views into the mapping
};

}  // namespace tlm::gguf
