#pragma once
// Byte layouts of the quantized blocks found in GGUF files, and the half-float
// conversions their scales need. Shared by the dequantizers (quant.hpp) and the
// kernels (kernels.hpp), so a layout is written down exactly once.
#include <bit>
#include <cstdint>
#include <cstring>

namespace tlm {

// IEEE binary16 -> binary32, exact for every input (subnormals, inf and NaN included).
constexpr float fp16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t bits = 0;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal half: shift the mantissa up until its leading one is implicit.
    std::uint32_t e = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// binary32 -> binary16 with round-to-nearest-even; NaN stays NaN, overflow gives inf.
constexpr std::uint16_t f32_to_fp16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t exp = (x >> 23) & 0xffu;
  std::uint32_t man = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    man |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t half_man = man >> shift;
    const std::uint32_t rest = man & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half_man & 1u))) ++half_man;
    return static_cast<std::uint16_t>(sign | half_man);
  }
  std::uint32_t out = (static_cast<std::uint32_t>(e) << 10) | (man >> 13);
  const std::uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (out & 1u))) ++out;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(sign | out);
}

constexpr float bf16_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// Unaligned little-endian loads from tensor bytes (GGUF data is only 32-byte aligned
// per tensor, and blocks of 18 or 34 bytes are not aligned at all).
inline std::uint16_t load_u16(const void* p) {
  std::uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// 32 values: x[j] = (q[j] - 8) * d; low nibbles hold values 0..15, high nibbles 16..31.
struct block_q4_0 {
  std::uint16_t d;
  std::uint8_t qs[16];
};
// 32 values: x[j] = q[j] * d + m, nibbles as in q4_0.
struct block_q4_1 {
  std::uint16_t d;
  std::uint16_t m;
  std::uint8_t qs[16];
};
// 32 values: x[j] = (q[j] - 16) * d, q[j] = nibble | (bit j of qh) << 4; nibbles as in
// q4_0 (low: values 0..15, high: 16..31), qh a little-endian 32-bit word.
struct block_q5_0 {
  std::uint16_t d;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
// 32 values: x[j] = q[j] * d + m, q[j] as in q5_0.
struct block_q5_1 {
  std::uint16_t d;
  std::uint16_t m;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
// 32 values: x[j] = qs[j] * d.
struct block_q8_0 {
  std::uint16_t d;
  std::int8_t qs[32];
};
// Activations only: s = d * sum(qs).
struct block_q8_1 {
  std::uint16_t d;
  std::uint16_t s;
  std::int8_t qs[32];
};
// 256 values in 8 sub-blocks of 32, 6-bit scales and mins packed in `scales`.
struct block_q4_k {
  std::uint16_t d;
  std::uint16_t dmin;
  std::uint8_t scales[12];
  std::uint8_t qs[128];
};
struct block_q5_k {
  std::uint16_t d;
  std::uint16_t dmin;
  std::uint8_t scales[12];
  std::uint8_t qh[32];
  std::uint8_t qs[128];
};
// 256 values in 16 sub-blocks of 16, 8-bit signed scales, 6-bit quants (4 low + 2 high bits).
struct block_q6_k {
  std::uint8_t ql[128];
  std::uint8_t qh[64];
  std::int8_t scales[16];
  std::uint16_t d;
};

static_assert(sizeof(block_q4_0) == 18 && alignof(block_q4_0) == 2);
static_assert(sizeof(block_q4_1) == 20);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q8_1) == 36);
static_assert(sizeof(block_q4_k) == 144);
static_assert(sizeof(block_q5_k) == 176);
static_assert(sizeof(block_q6_k) == 210);

}  // namespace tlm
