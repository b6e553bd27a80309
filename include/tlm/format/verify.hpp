#pragma once
// Finds the values of a GGUF file that are not finite. Binding a file checks its
// shapes and encodings, not its numbers: reading every block at load would touch the
// whole mapping, which a model never needs to do before its first token. A NaN or
// infinite block scale or weight instead makes the logits non-finite, which the
// generator refuses (generation/decode.hpp, require_finite_logits) pointing here, and
// `examples/inspect FILE --verify` runs this to name the tensor.
#include <tlm/format/encoding.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/format/quant.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tlm {

struct non_finite_tensor {
  std::string name;
  std::uint64_t count = 0;  // values of the tensor that are not finite
  std::uint64_t row = 0;    // the first one's row and column
  std::uint64_t column = 0;
  float value = 0;
  std::uint64_t byte = 0;   // offset in the tensor's data of the block that holds it
};

// Every tensor whose decoded values (as dequantize_row decodes them, which the kernels
// match bit for bit) include NaN or infinity; empty for a sound file. Activation-only
// encodings (Q8_1, Q8_K) never hold weights and are skipped.
inline std::vector<non_finite_tensor> non_finite_values(const gguf::file& f) {
  std::vector<non_finite_tensor> out;
  for (const auto& t : f.tensors()) {
    if (t.enc == encoding::q8_1 || t.enc == encoding::q8_k) continue;
    const std::size_t cols = static_cast<std::size_t>(t.row_length());
    const std::size_t rb = row_bytes(t.enc, cols);
    const auto tr = traits(t.enc);
    std::vector<float> row(cols);  // [cols]
    non_finite_tensor bad{t.name};
    for (std::uint64_t r = 0; r < t.rows(); ++r) {
      dequantize_row(t.enc, t.data.data() + r * rb, row.data(), cols);
      for (std::size_t c = 0; c < cols; ++c) {
        if (std::isfinite(row[c])) continue;
        if (bad.count++ == 0) {
          bad.row = r;
          bad.column = c;
          bad.value = row[c];
          bad.byte = r * rb + c / tr.block_values * tr.block_bytes;
        }
      }
    }
    if (bad.count != 0) out.push_back(std::move(bad));
  }
  return out;
}

}  // namespace tlm
