#pragma once
// Trainable weights: an owned copy of a loaded (mapped, possibly quantized) model,
// or fresh weights from a seeded initialisation. Both are one walk over the
// weight structs.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include <tlm/config.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/ops/rope.hpp>
#include <tlm/shape.hpp>
#include <tlm/thread_pool.hpp>
#include <tlm/weights.hpp>

namespace tlm {

template <LlamaConfig C, Element T = float>
using trainable = model_weights<C, owned<T>>;

// A decoded, owned copy of a model's weights: each tensor dequantized from its file
// encoding (exactly; see format/quant.hpp) into T. On the heap: 135M parameters are 540 MB.
template <Element T = float, LlamaConfig C>
std::unique_ptr<trainable<C, T>> to_trainable(const model_weights<C, mapped>& w) {
  auto out = std::make_unique<trainable<C, T>>();
  std::vector<float> row;
  for_each_tensor(
      [&](const tensor_name& name, auto& dst, const auto& src) {
        using U = std::remove_cvref_t<decltype(dst)>;
        if (!src.bound()) throw shape_error(name.str() + ": unbound tensor; load a model before copying its weights");
        const std::size_t rb = row_bytes(src.enc(), U::cols);
        row.resize(U::cols);
        for (std::size_t r = 0; r < U::rows; ++r) {
          dequantize_row(src.enc(), src.bytes().data() + r * rb, row.data(), U::cols);
          for (std::size_t c = 0; c < U::cols; ++c) dst.data()[r * U::cols + c] = static_cast<T>(row[c]);
        }
      },
      *out, w);
  return out;
}

// The same copy between element types (a float model's double twin for gradient checks).
template <Element T, LlamaConfig C, Element U>
std::unique_ptr<trainable<C, T>> convert(const trainable<C, U>& w) {
  auto out = std::make_unique<trainable<C, T>>();
  for_each_tensor(
      [](const tensor_name&, auto& dst, const auto& src) {
        for (std::size_t i = 0; i < src.values().size(); ++i) dst.data()[i] = static_cast<T>(src.data()[i]);
      },
      *out, w);
  return out;
}

// Sets every value to zero (gradients before a step accumulate with +=).
template <class W>
  requires trainable_weights<W>
void zero(W& w) {
  for_each_tensor([](const tensor_name&, auto& t) { std::fill(t.values().begin(), t.values().end(), 0); }, w);
}

// The same on a pool's threads, `piece` values a task: a 135M model's gradients are
// 540 MB, which one core clears while the others wait.
template <class W>
  requires trainable_weights<W>
void zero(W& w, thread_pool* pool, std::size_t piece = std::size_t{1} << 16) {
  if (pool == nullptr || pool->size() <= 1 || piece == 0) return zero(w);
  for_each_tensor(
      [&](const tensor_name&, auto& t) {
        const auto v = t.values();
        pool->parallel_for((v.size() + piece - 1) / piece, 1, [&](std::size_t b, std::size_t e) {
          std::fill(v.begin() + static_cast<std::ptrdiff_t>(b * piece),
                    v.begin() + static_cast<std::ptrdiff_t>(std::min(v.size(), e * piece)), 0);
        });
      },
      w);
}

// A small, portable normal generator (splitmix64 + Box-Muller), so that the same
// seed gives the same weights with any standard library.
class normal_rng {
 public:
  explicit normal_rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1): 53 random bits, never 0.
  double uniform() { return (static_cast<double>(next_u64() >> 11) + 0.5) * 0x1.0p-53; }
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform())), a = 2.0 * std::numbers::pi * uniform();
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }
  std::uint64_t state() const { return state_; }

 private:
  std::uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Initialisation for training from scratch, as GPT-2 and Llama reference code do it:
// norm gains 1; biases 0; Llama 3's rope_freqs the divisors of the config (a
// constant, weights.hpp); matrices N(0, std²) with std = 0.02, except the two projections that
// write into the residual stream (attn_output, ffn_down), scaled by 1/sqrt(2 L) so
// the stream's variance does not grow with depth. The seed fixes every value.
template <class W>
  requires trainable_weights<W>
void init_weights(W& w, std::uint64_t seed, double std_dev = 0.02) {
  using C = typename W::config;
  normal_rng rng(seed);
  const double residual_std = std_dev / std::sqrt(2.0 * static_cast<double>(C::layers));
  for_each_tensor(
      [&](const tensor_name& name, auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        if constexpr (U::rank == 1) {
          if (name.member == "rope_freqs") {
            const auto d = rope_divisors<C>();
            std::copy(d.begin(), d.end(), t.values().begin());
          } else {
            std::fill(t.values().begin(), t.values().end(), name.is_bias() ? 0 : 1);
          }
        } else {
          const bool residual = name.member == "attn_output" || name.member == "ffn_down";
          const double s = residual ? residual_std : std_dev;
          for (auto& v : t.values()) v = static_cast<typename U::value_type>(s * rng.normal());
        }
      },
      w);
}

}  // namespace tlm
