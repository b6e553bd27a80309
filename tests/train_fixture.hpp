#pragma once
// Reads the PyTorch training fixtures (tests/fixtures/train/README.md) and runs what
// they describe with tlm: the loss and gradients of one batch, then 10 AdamW steps.
// Shared by the unit test (committed fixtures) and train_probe (the live check).
#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/step.hpp>
#include <tlm/train/weights.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tlm_test {

inline std::vector<float> read_f32(const tlm::gguf::file& f, const std::string& name, std::size_t expect) {
  const auto* t = f.find_tensor(name);
  if (t == nullptr) throw tlm::error(f.name() + ": no tensor " + name);
  if (t->enc != tlm::encoding::f32 || t->elements != expect) {
    throw tlm::error(f.name() + ": tensor " + name + " must be F32 with " + std::to_string(expect) + " values");
  }
  std::vector<float> v(expect);
  std::memcpy(v.data(), t->data.data(), expect * sizeof(float));
  return v;
}

template <class W>
void read_weights(const tlm::gguf::file& f, W& w, const std::string& prefix = "") {
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, auto& t) {
        const auto v = read_f32(f, prefix + name.str(), t.values().size());
        for (std::size_t i = 0; i < v.size(); ++i) t.data()[i] = static_cast<typename std::remove_cvref_t<decltype(t)>::value_type>(v[i]);
      },
      w);
}

// GGUF dims of a tensor: {cols, rows} for a matrix, {N} for a vector.
template <class U>
std::vector<std::uint64_t> gguf_dims() {
  if constexpr (U::rank == 1) return {U::cols};
  else return {U::cols, U::rows};
}

template <class W>
void write_weights(tlm::gguf::writer& out, const W& w, const std::string& prefix) {
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        std::vector<float> v(t.values().begin(), t.values().end());
        out.add_tensor_f32(prefix + name.str(), gguf_dims<U>(), tlm::encoding::f32, v);
      },
      w);
}

template <tlm::LlamaConfig C, tlm::Element T>
struct fixture_result {
  double loss = 0;
  std::vector<double> losses;                      // [steps] before each step
  std::unique_ptr<tlm::trainable<C, T>> grads;     // of the first batch
  std::unique_ptr<tlm::trainable<C, T>> stepped;   // after the steps
};

// The AdamW settings a fixture file records (tlm.fixture.*), for `steps` steps.
inline tlm::adamw_options fixture_adamw(const tlm::gguf::file& f, std::size_t steps) {
  return {.lr = f.get_float("tlm.fixture.lr"),
          .beta1 = f.get_float("tlm.fixture.beta1"),
          .beta2 = f.get_float("tlm.fixture.beta2"),
          .eps = f.get_float("tlm.fixture.eps"),
          .weight_decay = f.get_float("tlm.fixture.weight_decay"),
          .clip = f.get_float("tlm.fixture.clip"),
          .warmup = f.get_uint("tlm.fixture.warmup"),
          .total_steps = steps,
          .min_lr = f.get_float("tlm.fixture.min_lr")};
}

template <tlm::LlamaConfig C, tlm::Element T>
fixture_result<C, T> run_fixture(const tlm::gguf::file& f, std::size_t threads = 1) {
  const std::size_t B = f.get_uint("tlm.fixture.batch"), S = f.get_uint("tlm.fixture.seq");
  const std::size_t steps = f.get_uint("tlm.fixture.steps");
  auto ids = [&](const char* name) {
    const auto v = read_f32(f, name, B * S);
    return std::vector<std::int32_t>(v.begin(), v.end());
  };
  const auto tokens = ids("train.tokens"), targets = ids("train.targets");
  fixture_result<C, T> r;
  auto p = std::make_unique<tlm::trainable<C, T>>();
  read_weights(f, *p);
  auto g = std::make_unique<tlm::trainable<C, T>>();
  tlm::training<C, T> run({.batch = B, .seq = S, .threads = threads});
  tlm::adamw<tlm::trainable<C, T>> opt(fixture_adamw(f, steps));
  for (std::size_t s = 0; s < steps; ++s) {
    const double loss = run.forward(*p, tokens, targets);
    r.losses.push_back(loss);
    tlm::zero(*g);
    run.backward(*p, *g);
    if (s == 0) {
      r.loss = loss;
      r.grads = tlm::convert<T>(*g);
    }
    opt.step(*p, *g, &run.pool());
  }
  r.stepped = std::move(p);
  return r;
}

}  // namespace tlm_test
