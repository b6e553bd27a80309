#pragma once
// Shared by the training tests: random parameters scaled for gradient checks, and
// random batches.
#include <tlm/train/adamw.hpp>
#include <tlm/train/step.hpp>
#include <tlm/train/weights.hpp>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

namespace tlm_test {

// Weights whose activations and gradients are O(1) (unlike the 0.02 training init,
// whose gradients at the first layers are tiny): matrices N(0, 1/in), embeddings
// N(0, 1), gains 1 + 0.1 N(0, 1).
template <tlm::LlamaConfig C, class T = double>
std::unique_ptr<tlm::trainable<C, T>> random_params(std::uint64_t seed) {
  auto p = std::make_unique<tlm::trainable<C, T>>();
  tlm::normal_rng rng(seed);
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        for (auto& v : t.values()) {
          double x = rng.normal();
          if constexpr (U::rank == 1) x = 1.0 + 0.1 * x;
          else if (name.member != "token_embd") x /= std::sqrt(static_cast<double>(U::cols));
          // Rounded through float, so float and double copies hold the same values.
          v = static_cast<T>(static_cast<float>(x));
        }
      },
      *p);
  return p;
}

struct batch {
  std::vector<std::int32_t> tokens, targets;
};

// Random tokens; targets are the next token, with a few positions ignored.
inline batch random_batch(std::size_t b, std::size_t t, std::size_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(vocab) - 1);
  batch out;
  for (std::size_t i = 0; i < b * t; ++i) {
    out.tokens.push_back(tok(rng));
    out.targets.push_back(tok(rng));
  }
  out.targets[0] = tlm::ignore_target;
  if (b * t > 3) out.targets[b * t / 2] = tlm::ignore_target;
  return out;
}

}  // namespace tlm_test
