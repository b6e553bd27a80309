#pragma once
// Which encoding each tensor of a model gets when it is quantized to a named type
// (q4_k_m, q6_k, q8_0, ...): the one place that rule lives, used by
// examples/quantize and usable by any exporter.
//
// The rule is llama.cpp's (llama_tensor_get_type in its quantizer, no importance
// matrix, no overrides), restricted to the types tlm writes, so that a file we write
// holds the encodings llama.cpp's quantizer would write for the same input, tensor by
// tensor (tests/reference/check_quantize.py compares them):
//  - only matrices named *weight are quantized; norms and other vectors keep their
//    encoding (F32 in every file llama.cpp writes);
//  - the output matrix, or the token embedding when it is tied (no output.weight),
//    takes Q6_K, or Q8_0 when its rows are not whole blocks of the type (or the type
//    is Q8_0);
//  - Q4_K_M and Q5_K_M give attn_v and ffn_down Q6_K in the first and last eighth of
//    the layers and every third layer between (use_more_bits); the plain q4_k (llama.cpp's
//    Q4_K_S) gives the first four attn_v and the first eighth of ffn_down Q5_K;
//  - a matrix whose rows are not a multiple of the chosen type's block falls back:
//    Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16 if even that does not fit.
#include <tlm/error.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/text/strings.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tlm {

// A target a user names. `base` is the encoding of most matrices; `variant` is the
// llama.cpp mix it follows.
struct quant_type {
  enum class mix { plain, k_s, k_m };
  std::string_view name;  // lower case, as a command line takes it
  encoding base;
  mix variant;
  int mix_file_type = -1;  // llama.cpp's llama_ftype of a _M mix; the others take their
                           // encoding's number from encoding_table, which holds it once

  // general.file_type of a file quantized to this type.
  constexpr std::uint32_t llama_file_type() const {
    return static_cast<std::uint32_t>(variant == mix::k_m ? mix_file_type : encoding_table[encoding_index(base)].llama_file_type);
  }
};

inline constexpr std::array<quant_type, 13> quant_types{{
    {"f32", encoding::f32, quant_type::mix::plain},
    {"f16", encoding::f16, quant_type::mix::plain},
    {"bf16", encoding::bf16, quant_type::mix::plain},
    {"q8_0", encoding::q8_0, quant_type::mix::plain},
    {"q4_0", encoding::q4_0, quant_type::mix::plain},
    {"q4_1", encoding::q4_1, quant_type::mix::plain},
    {"q5_0", encoding::q5_0, quant_type::mix::plain},
    {"q5_1", encoding::q5_1, quant_type::mix::plain},
    {"q4_k", encoding::q4_k, quant_type::mix::k_s},  // llama.cpp's Q4_K_S
    {"q5_k", encoding::q5_k, quant_type::mix::k_s},  // llama.cpp's Q5_K_S
    {"q6_k", encoding::q6_k, quant_type::mix::plain},
    {"q4_k_m", encoding::q4_k, quant_type::mix::k_m, 15},
    {"q5_k_m", encoding::q5_k, quant_type::mix::k_m, 17},
}};

// Every name above must be a writable encoding's or a mix of one: a type the table
// cannot write would fail only when a file is quantized. And every file type is set.
consteval bool quant_types_writable() {
  for (const auto& t : quant_types)
    if (!writable(t.base) || (t.variant == quant_type::mix::k_m) != (t.mix_file_type >= 0)) return false;
  return true;
}
static_assert(quant_types_writable(), "quant_types names an encoding quant.hpp cannot write");

// "f32, f16, ..., q5_k_m": for usage lines and errors.
inline std::string quant_type_list() {
  std::string s;
  for (const auto& t : quant_types) {
    if (!s.empty()) s += ", ";
    s += t.name;
  }
  return s;
}

// The type named `s` (any case; q4_k_s and q5_k_s name q4_k and q5_k), or nullptr.
inline const quant_type* find_quant_type(std::string_view s) {
  std::string lower(s);
  for (auto& c : lower)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  if (lower == "q4_k_s") lower = "q4_k";
  if (lower == "q5_k_s") lower = "q5_k";
  for (const auto& t : quant_types)
    if (t.name == lower) return &t;
  return nullptr;
}

// What the rule needs to know of a tensor.
struct tensor_desc {
  std::string_view name;
  std::size_t n_dims;
  std::uint64_t row_length;  // dims[0]
  encoding enc;              // its encoding now
};

namespace detail {

// llama.cpp's use_more_bits: the first and last eighth of the layers, and every third
// layer between, are the ones whose errors cost the most perplexity.
constexpr bool use_more_bits(std::size_t i, std::size_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i >= n / 8 && (i - n / 8) % 3 == 2);
}

inline bool fits(encoding e, std::uint64_t row_length) { return row_length % traits(e).block_values == 0; }

}  // namespace detail

// The order llama.cpp's quantizer visits (and writes) tensors: by block number, tensors
// outside the blocks first, then by name. Its attn_v / ffn_down counters run in this
// order, so use_more_bits sees the block number even when a file lists blk.10 before
// blk.2 (as SmolLM2's does).
inline std::vector<std::size_t> llama_tensor_order(std::span<const tensor_desc> tensors) {
  const auto block = [](std::string_view n) -> long {
    if (!n.starts_with("blk.")) return -1;
    long v = 0;
    std::size_t i = 4;
    if (i >= n.size() || n[i] < '0' || n[i] > '9') return -1;
    for (; i < n.size() && n[i] >= '0' && n[i] <= '9'; ++i) v = v * 10 + (n[i] - '0');
    return i < n.size() && n[i] == '.' ? v : -1;
  };
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const long la = block(tensors[a].name), lb = block(tensors[b].name);
    return la != lb ? la < lb : tensors[a].name < tensors[b].name;
  });
  return order;
}

// The encoding of every tensor (same order as `tensors`) when the model is quantized
// to `type`. A tensor whose result equals its current encoding is to be copied as is.
// Throws shape_error for a matrix no encoding of the type's fallbacks can hold.
inline std::vector<encoding> choose_encodings(const quant_type& type, std::span<const tensor_desc> tensors) {
  using mix = quant_type::mix;
  const encoding base = type.base;
  const bool quantized = base != encoding::f32 && base != encoding::f16 && base != encoding::bf16;
  // The counts and running indices of attn_v and ffn_down, in file order, as llama.cpp
  // counts them (its layer number for these rules is the running index).
  std::size_t n_attn_v = 0, n_ffn_down = 0, i_attn_v = 0, i_ffn_down = 0;
  bool has_output = false;
  for (const auto& t : tensors) {
    if (detail::contains(t.name, "attn_v.weight") || detail::contains(t.name, "attn_qkv.weight")) ++n_attn_v;
    if (detail::contains(t.name, "ffn_down")) ++n_ffn_down;
    if (t.name == "output.weight") has_output = true;
  }
  std::vector<encoding> out(tensors.size());
  for (const std::size_t k : llama_tensor_order(tensors)) {
    const tensor_desc& t = tensors[k];
    const bool matrix = t.name.ends_with("weight") && t.n_dims >= 2 && !detail::contains(t.name, "_norm.weight") &&
                        !detail::contains(t.name, "ffn_gate_inp.weight") && t.name != "position_embd.weight" &&
                        t.name != "token_types.weight";
    if (!matrix) {
      out[k] = t.enc;
      continue;
    }
    encoding e = base;
    if (quantized) {
      if (t.name == "output.weight" || (!has_output && t.name == "token_embd.weight")) {
        if (!detail::fits(e, t.row_length)) e = encoding::q8_0;
        else if (e != encoding::q8_0) e = encoding::q6_k;
      } else if (t.name == "token_embd.weight") {
        // the type's own encoding
      } else if (detail::contains(t.name, "attn_v.weight")) {
        if (type.variant == mix::k_m && detail::use_more_bits(i_attn_v, n_attn_v)) e = encoding::q6_k;
        else if (type.variant == mix::k_s && base == encoding::q4_k && i_attn_v < 4) e = encoding::q5_k;
        ++i_attn_v;
      } else if (detail::contains(t.name, "ffn_down")) {
        if (type.variant == mix::k_m && detail::use_more_bits(i_ffn_down, n_ffn_down)) e = encoding::q6_k;
        else if (type.variant == mix::k_s && base == encoding::q4_k && i_ffn_down < n_ffn_down / 8) e = encoding::q5_k;
        ++i_ffn_down;
      } else if (detail::contains(t.name, "attn_qkv.weight")) {
        if (type.variant == mix::k_m) e = base == encoding::q4_k ? encoding::q5_k : encoding::q6_k;
      }
      if (!detail::fits(e, t.row_length)) {
        switch (e) {
          case encoding::q4_k: e = encoding::q5_0; break;
          case encoding::q5_k: e = encoding::q5_1; break;
          case encoding::q6_k: e = encoding::q8_0; break;
          default:
            throw shape_error("quantize: tensor '" + std::string(t.name) + "' has rows of " + std::to_string(t.row_length) +
                              " values, not a multiple of the " + std::string(name(e)) + " block of " +
                              std::to_string(traits(e).block_values) + "; choose a K-quant type (it falls back) or f16");
        }
        if (!detail::fits(e, t.row_length)) e = encoding::f16;
      }
    }
    out[k] = e;
  }
  return out;
}

}  // namespace tlm
