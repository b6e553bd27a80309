#pragma once
// Element encodings of tensor data, numbered as ggml numbers them in GGUF files,
// with the block geometry each one needs. Encodings are run-time values: one file
// mixes several, while shapes stay compile-time (see shape.hpp).
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tlm {

enum class encoding : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
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

// Returns false for an id no supported encoding uses (an unknown ggml type).
constexpr bool known_encoding(std::uint32_t id) {
  switch (id) {
    case 0: case 1: case 2: case 3: case 8: case 9: case 12: case 13: case 14: case 15: case 30:
      return true;
    default:
      return false;
  }
}

constexpr encoding_traits traits(encoding e) {
  switch (e) {
    case encoding::f32: return {"F32", 1, 4};
    case encoding::f16: return {"F16", 1, 2};
    case encoding::bf16: return {"BF16", 1, 2};
    case encoding::q4_0: return {"Q4_0", 32, 18};
    case encoding::q4_1: return {"Q4_1", 32, 20};
    case encoding::q8_0: return {"Q8_0", 32, 34};
    case encoding::q8_1: return {"Q8_1", 32, 36};
    case encoding::q4_k: return {"Q4_K", 256, 144};
    case encoding::q5_k: return {"Q5_K", 256, 176};
    case encoding::q6_k: return {"Q6_K", 256, 210};
    case encoding::q8_k: return {"Q8_K", 256, 292};
  }
  return {"?", 0, 0};
}

constexpr std::string_view name(encoding e) { return traits(e).name; }

// Bytes of one row of `cols` values, or 0 when `cols` is not a whole number of blocks.
constexpr std::size_t row_bytes(encoding e, std::size_t cols) {
  const auto t = traits(e);
  if (t.block_values == 0 || cols % t.block_values != 0) return 0;
  return cols / t.block_values * t.block_bytes;
}

}  // namespace tlm
