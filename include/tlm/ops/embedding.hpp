#pragma once
// Embedding lookup and its backward pass.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include <tlm/error.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/shape.hpp>

namespace tlm {

// out = row `token` of the embedding matrix.   e: [V, D]   out: [D]
// A mapped matrix is decoded from its encoding; an owned one is copied.
template <std::size_t V, std::size_t D, Storage S, class T>
void embed(const mat<V, D, S>& e, std::int32_t token, std::span<T, D> out) {
  if (token < 0 || static_cast<std::size_t>(token) >= V) {
    throw error("token id " + std::to_string(token) + " is outside the vocabulary of " + std::to_string(V) +
                " tokens; ids come from this model's tokenizer");
  }
  const std::size_t t = static_cast<std::size_t>(token);
  if constexpr (is_owned_v<S>) {
    for (std::size_t i = 0; i < D; ++i) out[i] = static_cast<T>(e.data()[t * D + i]);
  } else {
    static_assert(std::same_as<T, float>, "a mapped embedding decodes to float activations");
    const std::size_t rb = row_bytes(e.enc(), D);
    dequantize_row(e.enc(), e.bytes().data() + t * rb, out.data(), D);
  }
}

// de[token] += dy. Rows of repeated tokens add up.   dy: [D]   de: [V, D]
template <std::size_t V, std::size_t D, class T>
void embed_backward(std::int32_t token, std::span<const T, D> dy, mat<V, D, owned<T>>& de) {
  T* row = de.data() + static_cast<std::size_t>(token) * D;
  for (std::size_t i = 0; i < D; ++i) row[i] += dy[i];
}

}  // namespace tlm
