#pragma once
// Element encodings of tensor data, numbered as ggml numbers them in GGUF files,
// with the block geometry each one needs. Encodings are run-time values: one file
// mixes several, while shapes stay compile-time (see shape.hpp).
//
// `encoding_table` is the one list of encodings: the reader's check of a tensor's
// type, its error message and the names all derive from it, so a new encoding is one
// row here (plus its blocks.hpp layout, its quant.hpp decoder and its kernels).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tlm {

enum class encoding : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  bf16 = 30,
};

struct encoding_traits {
  std::string_view name;
  std::size_t block_values;  // values that share one block (1 for plain floats)
  std::size_t block_bytes;   // bytes of one block
};

struct encoding_row {
  encoding enc;
  encoding_traits traits;
  bool writable;           // quantize_row (quant.hpp) can write it
  int llama_file_type;     // general.file_type of a file whose matrices are all this
                           // encoding (llama.cpp's llama_ftype; K-quants: the _S mix);
                           // -1 for activation-only encodings
};

inline constexpr std::array<encoding_row, 13> encoding_table{{
    {encoding::f32, {"F32", 1, 4}, true, 0},
    {encoding::f16, {"F16", 1, 2}, true, 1},
    {encoding::q4_0, {"Q4_0", 32, 18}, true, 2},
    {encoding::q4_1, {"Q4_1", 32, 20}, true, 3},
    {encoding::q5_0, {"Q5_0", 32, 22}, true, 8},
    {encoding::q5_1, {"Q5_1", 32, 24}, true, 9},
    {encoding::q8_0, {"Q8_0", 32, 34}, true, 7},
    {encoding::q8_1, {"Q8_1", 32, 36}, false, -1},
    {encoding::q4_k, {"Q4_K", 256, 144}, true, 14},
    {encoding::q5_k, {"Q5_K", 256, 176}, true, 16},
    {encoding::q6_k, {"Q6_K", 256, 210}, true, 18},
    {encoding::q8_k, {"Q8_K", 256, 292}, false, -1},
    {encoding::bf16, {"BF16", 1, 2}, true, 32},
}};

// The table's index of `e`, or the table's size when no row has it. An index, not a
// pointer: GCC's -fsanitize=undefined makes comparing a pointer with nullptr no longer a
// constant expression, and the kernels need row_bytes at compile time.
constexpr std::size_t encoding_index(encoding e) {
  std::size_t i = 0;
  while (i < encoding_table.size() && encoding_table[i].enc != e) ++i;
  return i;
}

constexpr const encoding_row* find_encoding(encoding e) {
  const std::size_t i = encoding_index(e);
  return i < encoding_table.size() ? &encoding_table[i] : nullptr;
}

// Returns false for an id no supported encoding uses (an unknown ggml type).
constexpr bool known_encoding(std::uint32_t id) {
  return encoding_index(static_cast<encoding>(id)) < encoding_table.size();
}

constexpr encoding_traits traits(encoding e) {
  const std::size_t i = encoding_index(e);
  return i < encoding_table.size() ? encoding_table[i].traits : encoding_traits{"?", 0, 0};
}

constexpr std::string_view name(encoding e) { return traits(e).name; }

constexpr bool writable(encoding e) {
  const std::size_t i = encoding_index(e);
  return i < encoding_table.size() && encoding_table[i].writable;
}

// The lower-case name a command line takes ("q4_1").
inline std::string lower_name(encoding e) {
  std::string n(name(e));
  for (auto& c : n)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return n;
}

// "f32, f16, q4_0, ...": the encodings a program can write, for usage and errors.
inline std::string writable_encodings_list() {
  std::string s;
  for (const auto& r : encoding_table) {
    if (!r.writable) continue;
    if (!s.empty()) s += ", ";
    s += lower_name(r.enc);
  }
  return s;
}

// The writable encoding named `s` (lower or upper case), or nullptr.
inline const encoding_row* parse_writable_encoding(std::string_view s) {
  for (const auto& r : encoding_table) {
    if (!r.writable) continue;
    const std::string n = lower_name(r.enc);
    if (n.size() != s.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < n.size(); ++i) {
      char c = s[i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      same = same && c == n[i];
    }
    if (same) return &r;
  }
  return nullptr;
}

// "F32 0, F16 1, ...": the supported ggml types, for error messages.
inline std::string known_encodings_list() {
  std::string s;
  for (const auto& r : encoding_table) {
    if (!s.empty()) s += ", ";
    s += std::string(r.traits.name) + " " + std::to_string(static_cast<std::uint32_t>(r.enc));
  }
  return s;
}

// Bytes of one row of `cols` values, or 0 when `cols` is not a whole number of blocks.
constexpr std::size_t row_bytes(encoding e, std::size_t cols) {
  const auto t = traits(e);
  if (t.block_values == 0 || cols % t.block_values != 0) return 0;
  return cols / t.block_values * t.block_bytes;
}

}  // namespace tlm
