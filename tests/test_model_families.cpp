// The traits of the Llama family's configs end to end: a model written by the one
// walk (architecture prefix, bias names, rope_freqs)
// binds to its config and computes through the inference path what the training
// path computes; a file of another architecture, scaling or bias set is refused with
// the key, what was expected and what was found.
#include <doctest/doctest.h>

#include <tlm/model.hpp>
#include <tlm/train/checkpoint.hpp>
#include <tlm/train/step.hpp>
#include <tlm/train/weights.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "scratch_files.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_model_families {

namespace {

std::filesystem::path temp_path(const std::string& name) { return tlm_test::scratch_path("test_model_families", name); }

// Seeded trainable weights with every bias non-zero (init_weights starts them at 0,
// which would hide a bias the inference path forgets).
template <tlm::LlamaConfig C>
std::unique_ptr<tlm::trainable<C, float>> weights_with_biases(std::uint64_t seed) {
  auto p = std::make_unique<tlm::trainable<C, float>>();
  tlm::init_weights(*p, seed, 0.2);
  tlm::normal_rng rng(seed + 1);
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& n, auto& t) {
        if (n.is_bias())
          for (auto& v : t.values()) v = static_cast<float>(0.5 * rng.normal());
      },
      *p);
  return p;
}

template <tlm::LlamaConfig C>
std::filesystem::path write_file(const std::string& name, const tlm::trainable<C, float>& p) {
  return tlm_test::write_model_file<C>(temp_path(name), p);
}

// The inference path (mapped f32 weights, block_forward over the KV cache) against
// the training path (owned double weights) on the same file: every position's logits.
template <tlm::LlamaConfig C>
double inference_against_training(const std::string& name) {
  const auto p = weights_with_biases<C>(7);
  const auto path = write_file<C>(name, *p);
  auto m = tlm::model<C>::load(path, {.threads = 1});
  const std::vector<std::int32_t> tokens{3, 17, 42, 5, 88, 1, 60, 33};
  tlm::kv_cache<C> cache(tokens.size());
  std::vector<float> all;
  m.prefill(tokens, cache, &all);

  const auto pd = tlm::to_trainable<double>(m.weights());
  tlm::training<C, double> run({.batch = 1, .seq = tokens.size(), .threads = 1});
  run.forward(*pd, tokens, tokens);
  double worst = 0.0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto ref = run.logits().row(i);
    double mx = 0.0;
    for (std::size_t v = 0; v < C::vocab; ++v) mx = std::max(mx, std::abs(ref[v]));
    for (std::size_t v = 0; v < C::vocab; ++v)
      worst = std::max(worst, std::abs(static_cast<double>(all[i * C::vocab + v]) - ref[v]) / mx);
  }
  return worst;
}

template <tlm::LlamaConfig C>
std::string bind_problems(const std::filesystem::path& path) {
  try {
    (void)tlm::bind<C>(tlm::gguf::file(path));
  } catch (const tlm::bind_error& e) {
    std::string s;
    for (const auto& p : e.problems()) s += p + "\n";
    return s;
  }
  return "";
}

// tiny_gqa with linear RoPE scaling (position interpolation by 4).
struct tiny_linear : tlm::tiny_gqa {
  static constexpr auto rope_scaling = tlm::rope_linear(4.0);
};

}  // namespace

TEST_CASE("a qwen2 model (biases, half-split pairing) written by the walk runs as the training path computes") {
  const double worst = inference_against_training<tlm::tiny_qwen2>("tiny_qwen2.gguf");
  MESSAGE("tiny_qwen2: inference against training (double), worst logit error relative to the largest: " << worst);
  CHECK(worst <= 1e-5);
  const tlm::gguf::file f(temp_path("tiny_qwen2.gguf"));
  CHECK(f.get_string("general.architecture") == "qwen2");
  CHECK(f.get_uint("qwen2.block_count") == 2);
  CHECK(!f.has("llama.block_count"));
  CHECK(f.find_tensor("blk.1.attn_k.bias") != nullptr);
  CHECK(f.find_tensor("blk.1.attn_k.bias")->dims[0] == tlm::kv_dim<tlm::tiny_qwen2>);
}

TEST_CASE("a Llama 3 model (rope_freqs) and one with every trait run as the training path computes") {
  const double worst = inference_against_training<tlm::tiny_llama3>("tiny_llama3.gguf");
  MESSAGE("tiny_llama3: worst logit error relative to the largest: " << worst);
  CHECK(worst <= 1e-5);
  const tlm::gguf::file f(temp_path("tiny_llama3.gguf"));
  const auto* rf = f.find_tensor("rope_freqs.weight");
  REQUIRE(rf != nullptr);
  CHECK(rf->dims[0] == tlm::tiny_llama3::half_head);
  const double worst_all = inference_against_training<tlm::tiny_traits>("tiny_traits.gguf");
  MESSAGE("tiny_traits: worst logit error relative to the largest: " << worst_all);
  CHECK(worst_all <= 1e-5);
}

TEST_CASE("binding refuses a file of another architecture, scaling or bias set, naming the key") {
  const auto qwen = write_file<tlm::tiny_qwen2>("q.gguf", *weights_with_biases<tlm::tiny_qwen2>(1));
  const auto llama3 = write_file<tlm::tiny_llama3>("l3.gguf", *weights_with_biases<tlm::tiny_llama3>(2));
  const auto plain = write_file<tlm::tiny_gqa>("plain.gguf", *weights_with_biases<tlm::tiny_gqa>(3));

  CHECK(bind_problems<tlm::tiny_qwen2>(qwen).empty());
  CHECK(bind_problems<tlm::tiny_llama3>(llama3).empty());
  // A qwen2 file on a llama config and the reverse: one line, key, expected, found.
  CHECK(bind_problems<tlm::tiny_gqa>(qwen) ==
        "general.architecture: expected \"llama\" (tiny_gqa), found \"qwen2\"\n");
  CHECK(bind_problems<tlm::tiny_qwen2>(plain) ==
        "general.architecture: expected \"qwen2\" (tiny_qwen2), found \"llama\"\n");
  // No scaling declared, a file with rope_freqs; scaling declared, a file without.
  CHECK(bind_problems<tlm::tiny_gqa>(llama3) ==
        "rope_freqs.weight: the file scales RoPE frequencies (Llama 3), but tiny_gqa declares no llama3 rope_scaling\n");
  CHECK(bind_problems<tlm::tiny_llama3>(plain).starts_with(
      "rope_freqs.weight: missing; expected dims {4} (tiny_llama3 declares llama3 RoPE scaling"));
}

TEST_CASE("rope_freqs must hold the config's divisors, at the config's length") {
  using C = tlm::tiny_llama3;
  auto p = weights_with_biases<C>(4);
  p->rope_freqs.values()[2] *= 1.001f;
  CHECK(bind_problems<C>(write_file<C>("l3_other_factors.gguf", *p)).starts_with("rope_freqs.weight: pair 2 divides by"));

  // A rope_freqs of 3 values: the binding's dims check, from the type's E/2.
  const auto good = write_file<C>("l3_good.gguf", *weights_with_biases<C>(5));
  const tlm::gguf::file src(good);
  tlm::gguf::writer w;
  for (const auto& e : src.metadata()) w.set_value(e.key, e.val);
  for (const auto& t : src.tensors()) {
    if (t.name == "rope_freqs.weight") {
      const std::vector<float> three{1.0f, 1.0f, 8.0f};
      w.add_tensor_f32(t.name, {3}, tlm::encoding::f32, three);
    } else {
      w.add_tensor(t.name, std::vector<std::uint64_t>(t.dims.begin(), t.dims.begin() + t.n_dims), t.enc, t.data);
    }
  }
  const auto short_path = temp_path("l3_short.gguf");
  w.write(short_path);
  CHECK(bind_problems<C>(short_path) == "rope_freqs.weight: expected dims {4}, found {3}\n");
}

TEST_CASE("linear RoPE scaling: written as llama.cpp's keys, checked on binding, divides every frequency") {
  const auto d = tlm::rope_divisors<tiny_linear>();
  CHECK(std::all_of(d.begin(), d.end(), [](double x) { return x == 4.0; }));
  const auto path = write_file<tiny_linear>("linear.gguf", *weights_with_biases<tiny_linear>(6));
  const tlm::gguf::file f(path);
  CHECK(f.get_string("llama.rope.scaling.type") == "linear");
  CHECK(f.get_float("llama.rope.scaling.factor") == 4.0);
  CHECK(bind_problems<tiny_linear>(path).empty());
  CHECK(bind_problems<tlm::tiny_gqa>(path).starts_with("llama.rope.scaling.type: expected \"none\" (tiny_gqa), found \"linear\""));
  // Position p under linear scaling turns as position p / 4 unscaled.
  const tlm::rope_angles<tiny_linear, double> scaled(8);
  const tlm::rope_angles<tlm::tiny_gqa, double> plain(2);
  for (std::size_t i = 0; i < tlm::tiny_gqa::half_head; ++i) CHECK(scaled.cos[i] == doctest::Approx(plain.cos[i]).epsilon(1e-12));
}

}  // namespace test_model_families
