#pragma once
// Shared by the training tests: random parameters scaled for gradient checks, random
// batches, and central finite differences against a backward's gradients.
#include <tlm/format/quant.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/checkpoint.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/step.hpp>
#include <tlm/train/weights.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <memory>
#include <random>
#include <type_traits>
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

// An adapter whose factors are all non-zero (after init_lora B is zero, and A's
// gradient with it), so every factor has a gradient to compare; alpha 8.
template <class A>
std::unique_ptr<A> lively_adapter(std::uint64_t seed) {
  auto ad = std::make_unique<A>();
  tlm::init_lora(*ad, seed);
  tlm::normal_rng rng(seed + 1);
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, auto& t) {
        for (auto& v : t.values()) v = static_cast<float>(0.05 * rng.normal());
      },
      *ad);
  ad->alpha = 8;
  return ad;
}

// The worst difference of two structs of tensors, each tensor's measured against its
// largest magnitude (elementwise ratios are meaningless for values that are zero up to
// rounding): max over tensors of max|a - b| / max|b| (max|a - b| where b is all zero).
template <class A, class B>
double worst_relative(const A& a, const B& b) {
  double worst = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, const auto& x, const auto& y) {
        double diff = 0, scale = 0;
        for (std::size_t i = 0; i < x.values().size(); ++i) {
          diff = std::max(diff, std::abs(static_cast<double>(x.data()[i]) - static_cast<double>(y.data()[i])));
          scale = std::max(scale, std::abs(static_cast<double>(y.data()[i])));
        }
        worst = std::max(worst, scale > 0 ? diff / scale : diff);
      },
      a, b);
  return worst;
}

// Every tensor's bytes equal.
template <class A>
bool same_bits(const A& a, const A& b) {
  bool same = true;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, const auto& x, const auto& y) {
        same = same && std::memcmp(x.data(), y.data(), x.values().size() * sizeof(*x.data())) == 0;
      },
      a, b);
  return same;
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

// A model's weights in a file's encodings, mapped (bound) onto bytes this struct
// owns: matrices in `enc`, vectors F32 (as binding requires). Made from owned float
// weights, so the dequantized copy (to_trainable) is the function the base computes.
template <tlm::LlamaConfig C>
struct mapped_base {
  tlm::model_weights<C, tlm::mapped> w;
  std::vector<std::vector<std::byte>> bytes;

  mapped_base(const mapped_base&) = delete;  // w views this object's bytes
  mapped_base(const tlm::trainable<C, float>& src, tlm::encoding enc) {
    tlm::for_each_tensor(
        [&](const tlm::tensor_name& name, auto& dst, const auto& t) {
          using U = std::remove_cvref_t<decltype(t)>;
          const tlm::encoding e = U::rank == 1 ? tlm::encoding::f32 : enc;
          const std::size_t rb = tlm::row_bytes(e, U::cols);
          auto& b = bytes.emplace_back(rb * U::rows);
          for (std::size_t r = 0; r < U::rows; ++r) tlm::quantize_row(e, t.data() + r * U::cols, b.data() + r * rb, U::cols);
          dst.bind(e, b, name.str());
        },
        w, src);
  }
};

// BUILD/<test>/<name>, emptied: a trainer's --out for one case.
inline std::filesystem::path fresh_dir(const std::string& test, const std::string& name) {
  const auto dir = std::filesystem::path(TLM_BINARY_DIR) / test / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A small corpus with structure to learn (a repeated sentence with a counter) in
// BUILD/<test>/corpus.txt, so the windows come from the same loader as examples/train's.
// Written once per program: a data_source may still map the file.
inline std::string cat_corpus(const std::string& test) {
  static std::set<std::string> written;
  const auto dir = std::filesystem::path(TLM_BINARY_DIR) / test;
  const auto path = dir / "corpus.txt";
  if (written.insert(test).second) {
    std::filesystem::create_directories(dir);
    std::ofstream out(path);
    for (int i = 0; i < 200; ++i) out << "the cat sat on mat " << i % 7 << ".\n";
  }
  return path.string();
}

// A tiny_train base in Q4_1 in BUILD/<test>/base-q4_1.gguf, written once per program:
// what a LoRA run adapts, mapped read-only.
inline const tlm::gguf::file& tiny_train_q4_base(const std::string& test) {
  static std::map<std::string, std::unique_ptr<tlm::gguf::file>> files;
  auto& f = files[test];
  if (!f) {
    const auto dir = std::filesystem::path(TLM_BINARY_DIR) / test;
    std::filesystem::create_directories(dir);
    const auto path = dir / "base-q4_1.gguf";
    auto w = std::make_unique<tlm::trainable<tlm::tiny_train, float>>();
    tlm::init_weights(*w, 11);
    tlm::write_model<tlm::tiny_train>(path, *w, tlm::encoding::q4_1, nullptr, 0);
    f = std::make_unique<tlm::gguf::file>(path);
  }
  return *f;
}

// The entries of a tensor a finite-difference check perturbs: every one of a tensor of at
// most `every_up_to` values, else `samples` drawn from rng (and, with `with_largest`, the
// entry of largest |gradient|, where a wrong scale shows most).
template <class G>
std::vector<std::size_t> entries_to_check(const G& g, std::size_t every_up_to, int samples, bool with_largest,
                                          std::mt19937_64& rng) {
  const std::size_t n = g.values().size();
  std::vector<std::size_t> idx;
  if (n <= every_up_to) {
    for (std::size_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  std::uniform_int_distribution<std::size_t> pick(0, n - 1);
  for (int k = 0; k < samples; ++k) idx.push_back(pick(rng));
  if (with_largest) {
    const auto values = g.values();
    const auto largest = std::max_element(values.begin(), values.end(),
                                          [](auto a, auto b) { return std::abs(a) < std::abs(b); });
    idx.push_back(static_cast<std::size_t>(largest - values.begin()));
  }
  return idx;
}

struct finite_difference_result {
  double relative_error = 0;  // max |fd - grad| / max |grad| over the entries
  double max_gradient = 0;    // max of |grad| and |fd|: 0 when the tensor has no part in the loss
  std::size_t entries = 0;
};

// Central differences (loss(w + h) - loss(w - h)) / 2h with h = 1e-5 max(1, |w|), in
// double (the step balances truncation against rounding: errors near 1e-9 relative),
// each entry put back after it is measured.
template <class W, class G, class Loss>
finite_difference_result central_differences(W& w, const G& g, const std::vector<std::size_t>& idx, Loss&& loss) {
  finite_difference_result r;
  double max_err = 0.0;
  for (std::size_t i : idx) {
    const double saved = w.data()[i];
    const double h = 1e-5 * std::max(1.0, std::abs(saved));
    w.data()[i] = saved + h;
    const double up = loss();
    w.data()[i] = saved - h;
    const double down = loss();
    w.data()[i] = saved;
    const double fd = (up - down) / (2 * h);
    r.max_gradient = std::max({r.max_gradient, std::abs(g.data()[i]), std::abs(fd)});
    max_err = std::max(max_err, std::abs(fd - g.data()[i]));
    ++r.entries;
  }
  r.relative_error = r.max_gradient > 0 ? max_err / r.max_gradient : max_err;
  return r;
}

}  // namespace tlm_test
