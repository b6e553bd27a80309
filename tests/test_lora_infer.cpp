// Low-rank adapters at inference (lora_adapter.hpp, model::add_lora): a model over
// its mapped base with adapters computes what a model whose weights are
// W + Σ scale · alpha / r · B A, merged in float, computes, at prefill and at decode;
// scale 0 is the base bit for bit; a file of another model, a damaged one or a
// missing one is refused with its tensor's name.
#include <doctest/doctest.h>

#include <tlm/model.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/lora_file.hpp>
#include <tlm/train/weights.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "scratch_files.hpp"
#include "train_common.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_lora_infer {

namespace {

using tlm::lora_target;

std::filesystem::path temp_path(const std::string& name) { return tlm_test::scratch_path("test_lora_infer", name); }

template <tlm::LlamaConfig C>
std::filesystem::path write_model_file(const std::string& name, const tlm::trainable<C, float>& p) {
  return tlm_test::write_model_file<C>(temp_path(name), p);
}

// Every factor random, B included (the initialisation's B = 0 would hide the path).
template <class A>
std::unique_ptr<A> random_adapter(std::uint64_t seed, double alpha) {
  auto ad = std::make_unique<A>();
  tlm::normal_rng rng(seed);
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        for (auto& v : t.values()) v = static_cast<float>(0.5 * rng.normal() / std::sqrt(static_cast<double>(U::cols)));
      },
      *ad);
  ad->alpha = alpha;
  return ad;
}

// W += scale · alpha / r · B A for each matrix `ad` targets, summed in double.
template <class A, class P>
void merge(P& p, const A& ad, double scale) {
  using L = typename A::layer_type;
  const double s = scale * ad.scale();
  auto one = [&]<lora_target t>(std::size_t l) {
    if constexpr (L::template targets<t>) {
      auto& w = std::remove_cvref_t<decltype(p.layers[l])>::template matrix<t>(p.layers[l]);
      const auto& a = L::template a_of<t>(ad.layers[l]);
      const auto& b = L::template b_of<t>(ad.layers[l]);
      using W = std::remove_cvref_t<decltype(w)>;
      for (std::size_t i = 0; i < W::rows; ++i)
        for (std::size_t j = 0; j < W::cols; ++j) {
          double d = 0;
          for (std::size_t k = 0; k < A::rank; ++k) d += double(b.data()[i * A::rank + k]) * a.data()[k * W::cols + j];
          w.data()[i * W::cols + j] = static_cast<float>(w.data()[i * W::cols + j] + s * d);
        }
    }
  };
  for (std::size_t l = 0; l < p.layers.size(); ++l) {
    one.template operator()<lora_target::q>(l);
    one.template operator()<lora_target::k>(l);
    one.template operator()<lora_target::v>(l);
    one.template operator()<lora_target::o>(l);
    one.template operator()<lora_target::gate>(l);
    one.template operator()<lora_target::up>(l);
    one.template operator()<lora_target::down>(l);
  }
}

const std::vector<std::int32_t> prompt{3, 17, 42, 5, 88, 1, 60, 33};
const std::vector<std::int32_t> decoded{7, 90, 2, 51};

// Logits at every prompt position (prefill) then of each decoded token: [rows, V].
template <tlm::LlamaConfig C>
std::vector<float> run(tlm::model<C>& m) {
  tlm::kv_cache<C> cache(prompt.size() + decoded.size());
  std::vector<float> all;
  m.prefill(prompt, cache, &all);
  for (auto t : decoded) {
    const auto l = m.forward(t, cache);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

// The largest difference relative to the largest logit of the reference.
double worst_relative(const std::vector<float>& x, const std::vector<float>& ref) {
  REQUIRE(x.size() == ref.size());
  double top = 0, worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    top = std::max(top, std::abs(double(ref[i])));
    worst = std::max(worst, std::abs(double(x[i]) - ref[i]));
  }
  return worst / top;
}

template <tlm::LlamaConfig C, lora_target Targets>
void check_against_merged(const std::string& tag) {
  CAPTURE(tag);
  const auto p = tlm_test::random_params<C, float>(71);
  const auto base_path = write_model_file<C>(tag + "-base.gguf", *p);
  using A = tlm::lora<C, 4, Targets>;
  const auto ad = random_adapter<A>(72, 8.0);  // alpha / r = 2
  const auto ad_path = temp_path(tag + "-adapter.gguf");
  tlm::write_lora(ad_path, *ad);
  const float scale = 0.75f;

  auto merged_p = std::make_unique<tlm::trainable<C, float>>(*p);
  merge(*merged_p, *ad, scale);
  auto merged = tlm::model<C>::load(write_model_file<C>(tag + "-merged.gguf", *merged_p), {.threads = 2});
  const auto want = run(merged);

  auto m = tlm::model<C>::load(base_path, {.threads = 2});
  const auto base = run(m);
  CHECK(m.add_lora(ad_path, scale) == 0);
  REQUIRE(m.loras().size() == 1);
  CHECK(m.loras()[0].max_rank == 4);
  const auto got = run(m);
  const double err = worst_relative(got, want);
  MESSAGE(tag << ": adapter against merged, worst |difference| / max |logit| = " << err);
  CHECK(err < 5e-6);
  CHECK(worst_relative(base, want) > 100 * err);  // the adapter changes the logits

  // Scale 0: the base, bit for bit.
  m.set_lora_scale(0, 0.0f);
  const auto zero = run(m);
  CHECK(std::memcmp(zero.data(), base.data(), base.size() * sizeof(float)) == 0);

  // One thread computes what two do, within rounding of the split.
  auto one = tlm::model<C>::load(base_path, {.threads = 1});
  one.add_lora(ad_path, scale);
  CHECK(worst_relative(run(one), want) < 5e-6);
}

}  // namespace

TEST_CASE("lora at inference: q, k, v, o equal the merged model at prefill and decode") {
  check_against_merged<tlm::tiny_gqa, tlm::lora_default_targets>("gqa-qkvo");
  check_against_merged<tlm::tiny_qwen2, tlm::lora_default_targets>("qwen2-qkvo");
}

TEST_CASE("lora at inference: all seven targets equal the merged model at prefill and decode") {
  check_against_merged<tlm::tiny_gqa, tlm::all_layer_matrices>("gqa-all");
  check_against_merged<tlm::tiny_untied, tlm::all_layer_matrices>("untied-all");
}

TEST_CASE("lora at inference: two adapters at once equal the model with both merged") {
  using C = tlm::tiny_gqa;
  const auto p = tlm_test::random_params<C, float>(81);
  const auto base_path = write_model_file<C>("two-base.gguf", *p);
  using A1 = tlm::lora<C, 4, tlm::lora_default_targets>;
  using A2 = tlm::lora<C, 2, lora_target::v | lora_target::gate | lora_target::down>;
  const auto a1 = random_adapter<A1>(82, 8.0);
  const auto a2 = random_adapter<A2>(83, 1.0);
  tlm::write_lora(temp_path("two-a1.gguf"), *a1);
  tlm::write_lora(temp_path("two-a2.gguf"), *a2);

  auto merged_p = std::make_unique<tlm::trainable<C, float>>(*p);
  merge(*merged_p, *a1, 0.5);
  merge(*merged_p, *a2, -1.25);
  auto merged = tlm::model<C>::load(write_model_file<C>("two-merged.gguf", *merged_p), {.threads = 2});
  const auto want = run(merged);

  auto m = tlm::model<C>::load(base_path, {.threads = 2});
  m.add_lora(temp_path("two-a1.gguf"), 0.5f);
  CHECK(m.add_lora(temp_path("two-a2.gguf"), -1.25f) == 1);
  const double err = worst_relative(run(m), want);
  MESSAGE("two adapters against both merged: " << err);
  CHECK(err < 5e-6);

  // Removing the second's effect with scale 0 leaves the first alone.
  auto only1_p = std::make_unique<tlm::trainable<C, float>>(*p);
  merge(*only1_p, *a1, 0.5);
  auto only1 = tlm::model<C>::load(write_model_file<C>("two-only1.gguf", *only1_p), {.threads = 2});
  m.set_lora_scale(1, 0.0f);
  CHECK(worst_relative(run(m), run(only1)) < 5e-6);
  m.clear_loras();
  auto base = tlm::model<C>::load(base_path, {.threads = 2});
  const auto b0 = run(base), b1 = run(m);
  CHECK(std::memcmp(b0.data(), b1.data(), b0.size() * sizeof(float)) == 0);
}

TEST_CASE("lora at inference: an adapter of another model, a damaged one or a missing one is refused") {
  using C = tlm::tiny_gqa;
  auto m = tlm::model<C>::load(write_model_file<C>("refuse-base.gguf", *tlm_test::random_params<C, float>(91)),
                               {.threads = 1});
  auto message = [&](const std::filesystem::path& path) -> std::string {
    try {
      m.add_lora(path);
    } catch (const tlm::format_error& e) {
      return e.what();
    }
    return "(accepted)";
  };

  // Another config's shapes: named by its first tensor that does not fit.
  const auto other = random_adapter<tlm::lora<tlm::tiny_untied, 4>>(92, 4.0);
  tlm::write_lora(temp_path("other.gguf"), *other);
  const std::string e1 = message(temp_path("other.gguf"));
  CAPTURE(e1);
  CHECK(e1.find("tensor 'blk.") != std::string::npos);
  CHECK(e1.find("another model") != std::string::npos);

  // Another architecture.
  const auto qwen = random_adapter<tlm::lora<tlm::tiny_qwen2, 4>>(93, 4.0);
  tlm::write_lora(temp_path("qwen.gguf"), *qwen);
  const std::string e2 = message(temp_path("qwen.gguf"));
  CAPTURE(e2);
  CHECK(e2.find("architecture \"qwen2\"") != std::string::npos);

  // One byte of a tensor changed: its checksum names it.
  const auto good = random_adapter<tlm::lora<C, 4>>(94, 4.0);
  const auto path = temp_path("damaged.gguf");
  tlm::write_lora(path, *good);
  std::vector<char> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::size_t offset = 0;
  {
    // Found by its bytes: the tensor's first 32 bytes of random floats occur once.
    const tlm::gguf::file f(path);
    const auto* t = f.find_tensor("blk.1.attn_v.weight.lora_b");
    REQUIRE(t != nullptr);
    const auto* d = reinterpret_cast<const char*>(t->data.data());
    const auto it = std::search(bytes.begin(), bytes.end(), d, d + 32);
    REQUIRE(it != bytes.end());
    offset = static_cast<std::size_t>(it - bytes.begin()) + 5;
  }
  bytes[offset] = static_cast<char>(bytes[offset] ^ 0x40);
  {
    std::ofstream out(temp_path("damaged2.gguf"), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const std::string e3 = message(temp_path("damaged2.gguf"));
  CAPTURE(e3);
  CHECK(e3.find("tensor 'blk.1.attn_v.weight.lora_b' fails its checksum") != std::string::npos);

  // A model file is not an adapter.
  const std::string e4 = message(temp_path("refuse-base.gguf"));
  CHECK(e4.find("general.type") != std::string::npos);

  // A missing file.
  CHECK_THROWS_AS(m.add_lora(temp_path("nonexistent.gguf")), tlm::format_error);
  CHECK(m.loras().empty());  // nothing half-added
}

}  // namespace test_lora_infer
