// Low-rank adapters over a frozen base (train/lora.hpp): names and shapes, PEFT's
// initialisation, the base's logits at B = 0, the gradients of A and B against central
// finite differences in double, the mapped quantized base against its dequantized
// copy, the transposed product over quantized rows, and AdamW on the adapter alone.
#include <doctest/doctest.h>

#include <tlm/format/quant.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/lora_file.hpp>
#include <tlm/train/step.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "train_common.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_lora {

namespace {

using tlm::lora_target;
using tlm_test::random_batch;
using tlm_test::mapped_base;
using tlm_test::random_params;

constexpr lora_target all_seven = tlm::all_layer_matrices;

// An adapter with every value random (B too, unlike the initialisation, so that A's
// gradient is not zero) and alpha / r = 2, so the scale is exercised.
template <class A>
std::unique_ptr<A> random_adapter(std::uint64_t seed) {
  auto ad = std::make_unique<A>();
  tlm::normal_rng rng(seed);
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        for (auto& v : t.values())
          v = static_cast<typename U::value_type>(static_cast<float>(rng.normal() / std::sqrt(static_cast<double>(U::cols))));
      },
      *ad);
  ad->alpha = 2.0 * static_cast<double>(A::rank);
  return ad;
}

template <class A, class B>
void copy_values(const A& from, B& to) {
  to.alpha = from.alpha;
  tlm::for_each_tensor(
      [](const tlm::tensor_name&, auto& d, const auto& s) {
        for (std::size_t i = 0; i < s.values().size(); ++i)
          d.data()[i] = static_cast<typename std::remove_cvref_t<decltype(d)>::value_type>(s.data()[i]);
      },
      to, from);
}

// Central finite differences in double of the loss over every entry of a small
// adapter tensor (sampled entries of a larger one), against the backward's gradient.
template <tlm::LlamaConfig C, lora_target Targets, class Base>
void check_adapter_gradients(const Base& base, const std::string& what) {
  using A = tlm::lora<C, 3, Targets, double>;
  constexpr std::size_t B = 2, T = 5;
  auto ad = random_adapter<A>(31);
  const auto data = random_batch(B, T, C::vocab, 32);
  tlm::training<C, double> run({.batch = B, .seq = T, .threads = 1});
  auto grads = std::make_unique<A>();
  run.forward(base, *ad, data.tokens, data.targets);
  run.backward(base, *ad, *grads);

  std::mt19937_64 rng(33);
  std::size_t tensors = 0, entries = 0;
  double worst = 0.0;
  std::string worst_name;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, auto& w, const auto& g) {
        const auto idx = tlm_test::entries_to_check(g, 96, 48, false, rng);
        const auto fd = tlm_test::central_differences(w, g, idx, [&] { return run.forward(base, *ad, data.tokens, data.targets); });
        const double rel = fd.relative_error;
        entries += fd.entries;
        INFO(what << ": " << name.str() << ": max |fd - grad| / max |grad| = " << rel);
        CHECK(fd.max_gradient > 0);  // every factor takes part in the loss
        CHECK(rel <= 1e-6);
        if (rel >= worst) {
          worst = rel;
          worst_name = name.str();
        }
        ++tensors;
      },
      *ad, *grads);
  MESSAGE(what << ": " << tensors << " adapter tensors, " << entries << " entries; worst relative error " << worst
               << " (" << worst_name << ")");
  CHECK(tensors == tlm::tensor_count(*ad));
}

template <tlm::LlamaConfig C, lora_target Targets = all_seven>
void check_over_f32_base() {
  auto base = random_params<C, double>(41);
  check_adapter_gradients<C, Targets>(*base, "owned f64 base");
}

// The base's function when it is quantized is its dequantized values: the double
// check runs over them exactly.
template <tlm::LlamaConfig C>
void check_over_quantized_base(tlm::encoding enc) {
  auto pf = random_params<C, float>(42);
  const mapped_base<C> mb(*pf, enc);
  auto base = tlm::to_trainable<double>(mb.w);
  check_adapter_gradients<C, all_seven>(*base, std::string(tlm::traits(enc).name));
}

// The float path over the mapped base itself (forward kernels on quantized rows,
// backward through matmul_backward_input) against the double path over the same
// base dequantized: loss and adapter gradients.
template <tlm::LlamaConfig C>
void check_mapped_against_double(tlm::encoding enc, std::size_t threads) {
  using Af = tlm::lora<C, 4, all_seven, float>;
  using Ad = tlm::lora<C, 4, all_seven, double>;
  constexpr std::size_t B = 3, T = 7;
  auto pf = random_params<C, float>(51);
  const mapped_base<C> mb(*pf, enc);
  auto pd = tlm::to_trainable<double>(mb.w);
  auto af = random_adapter<Af>(52);
  auto ad = std::make_unique<Ad>();
  copy_values(*af, *ad);
  const auto data = random_batch(B, T, C::vocab, 53);
  tlm::training<C, float> rf({.batch = B, .seq = T, .threads = threads});
  tlm::training<C, double> rd({.batch = B, .seq = T, .threads = 1});
  const double lf = rf.forward(mb.w, *af, data.tokens, data.targets);
  const double ld = rd.forward(*pd, *ad, data.tokens, data.targets);
  CHECK(std::abs(lf - ld) / std::abs(ld) <= 1e-5);
  auto gf = std::make_unique<Af>();
  auto gd = std::make_unique<Ad>();
  rf.backward(mb.w, *af, *gf);
  rd.backward(*pd, *ad, *gd);
  double worst = 0.0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& a, const auto& b) {
        double max_ref = 0.0, max_err = 0.0;
        for (std::size_t i = 0; i < a.values().size(); ++i) {
          max_ref = std::max(max_ref, std::abs(a.data()[i]));
          max_err = std::max(max_err, std::abs(a.data()[i] - static_cast<double>(b.data()[i])));
        }
        INFO(std::string(tlm::traits(enc).name) << " " << name.str());
        CHECK(max_ref > 0);
        CHECK(max_err / max_ref <= 1e-4);
        worst = std::max(worst, max_err / max_ref);
      },
      *gd, *gf);
  MESSAGE("mapped " << std::string(tlm::traits(enc).name) << " base, float, " << threads
                    << " thread(s), against double over its dequantized copy: loss " << lf << " vs " << ld
                    << ", worst gradient error " << worst);
}

}  // namespace

TEST_CASE("lora: tensor names are llama.cpp's, untargeted matrices have no member, the count is the walk's") {
  using A = tlm::lora<tlm::tiny_gqa, 4>;  // q, k, v, o
  auto ad = std::make_unique<A>();
  std::vector<std::string> names;
  std::size_t values = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& t) {
        names.push_back(name.str());
        values += t.values().size();
      },
      *ad);
  REQUIRE(names.size() == 2 * 4 * 2);  // layers x targets x {A, B}
  CHECK(names[0] == "blk.0.attn_q.weight.lora_a");
  CHECK(names[1] == "blk.0.attn_q.weight.lora_b");
  CHECK(names[7] == "blk.0.attn_output.weight.lora_b");
  CHECK(names[8] == "blk.1.attn_q.weight.lora_a");
  constexpr std::size_t D = tlm::dim<tlm::tiny_gqa>, K = tlm::kv_dim<tlm::tiny_gqa>;  // 32, 16
  // Per layer: q and o are A [4, D] + B [D, 4]; k and v are A [4, D] + B [K, 4].
  CHECK(values == 2 * (2 * (4 * D + D * 4) + 2 * (4 * D + K * 4)));
  CHECK(tlm::parameter_count(*ad) == values);
  static_assert(std::same_as<decltype(ad->layers[0].ffn_up_lora_a), tlm::absent>);
  static_assert(std::same_as<decltype(ad->layers[0].attn_q_lora_a), tlm::mat<4, D, tlm::owned<float>>>);
  static_assert(std::same_as<decltype(ad->layers[0].attn_k_lora_b), tlm::mat<K, 4, tlm::owned<float>>>);

  using G = tlm::lora<tlm::tiny_untied, 2, lora_target::gate | lora_target::down>;
  auto g = std::make_unique<G>();
  std::set<std::string> gnames;
  tlm::for_each_tensor([&](const tlm::tensor_name& name, const auto&) { gnames.insert(name.str()); }, *g);
  CHECK(gnames == std::set<std::string>{"blk.0.ffn_gate.weight.lora_a", "blk.0.ffn_gate.weight.lora_b",
                                        "blk.0.ffn_down.weight.lora_a", "blk.0.ffn_down.weight.lora_b",
                                        "blk.1.ffn_gate.weight.lora_a", "blk.1.ffn_gate.weight.lora_b",
                                        "blk.1.ffn_down.weight.lora_a", "blk.1.ffn_down.weight.lora_b"});
  static_assert(std::same_as<decltype(g->layers[0].ffn_down_lora_a), tlm::mat<2, tlm::tiny_untied::ffn, tlm::owned<float>>>);
}

TEST_CASE("lora: a_of and b_of give each target the factors the walk names for it") {
  using A = tlm::lora<tlm::tiny_gqa, 3, tlm::all_layer_matrices>;
  using L = A::layer_type;
  auto ad = std::make_unique<A>();
  std::map<const void*, std::string> walked;  // address -> file name
  tlm::for_each_tensor([&](const tlm::tensor_name& name, const auto& t) { walked[&t] = name.str(); }, *ad);
  std::size_t checked = 0;
  auto check = [&]<lora_target t>() {
    const std::string stem = "blk.1." + std::string(tlm::lora_targets_table[tlm::lora_target_index(t)].tensor) + ".weight.lora_";
    CHECK(walked[&L::template a_of<t>(ad->layers[1])] == stem + "a");
    CHECK(walked[&L::template b_of<t>(ad->layers[1])] == stem + "b");
    ++checked;
  };
  check.template operator()<lora_target::q>();
  check.template operator()<lora_target::k>();
  check.template operator()<lora_target::v>();
  check.template operator()<lora_target::o>();
  check.template operator()<lora_target::gate>();
  check.template operator()<lora_target::up>();
  check.template operator()<lora_target::down>();
  CHECK(checked == 7);
}

TEST_CASE("lora: initialisation as PEFT's (B = 0, A uniform within 1/sqrt(in)), fixed by the seed") {
  using A = tlm::lora<tlm::tiny_untied, 4, all_seven>;
  auto a1 = std::make_unique<A>(), a2 = std::make_unique<A>(), a3 = std::make_unique<A>();
  tlm::init_lora(*a1, 7);
  tlm::init_lora(*a2, 7);
  tlm::init_lora(*a3, 8);
  CHECK(a1->scale() == 1.0);  // alpha defaults to the rank
  std::size_t same_seed_diffs = 0, other_seed_diffs = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& x, const auto& y, const auto& z) {
        using U = std::remove_cvref_t<decltype(x)>;
        INFO(name.str());
        const auto v = x.values();
        if (name.member.ends_with("_lora_b")) {
          CHECK(std::all_of(v.begin(), v.end(), [](float f) { return f == 0.0f; }));
        } else {
          const double bound = 1.0 / std::sqrt(static_cast<double>(U::cols));
          const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
          CHECK(*lo >= -bound);
          CHECK(*hi <= bound);
          // Spread over the interval: the extremes near the bounds, the mean near 0.
          CHECK(*lo < -0.8 * bound);
          CHECK(*hi > 0.8 * bound);
          double mean = 0;
          for (float f : v) mean += f;
          CHECK(std::abs(mean / static_cast<double>(v.size())) < 0.2 * bound);
        }
        for (std::size_t i = 0; i < v.size(); ++i) {
          same_seed_diffs += x.data()[i] != y.data()[i];
          other_seed_diffs += x.data()[i] != z.data()[i];
        }
      },
      *a1, *a2, *a3);
  CHECK(same_seed_diffs == 0);
  CHECK(other_seed_diffs > 0);
}

TEST_CASE("lora: at initialisation (B = 0) the adapted model's logits are the base's, exactly") {
  auto check = [](auto tag) {
    using C = decltype(tag);
    constexpr std::size_t B = 2, T = 6;
    auto p = random_params<C, float>(61);
    auto ad = std::make_unique<tlm::lora<C, 4, all_seven>>();
    tlm::init_lora(*ad, 62);
    ad->alpha = 16;
    const auto data = random_batch(B, T, C::vocab, 63);
    tlm::training<C, float> run({.batch = B, .seq = T, .threads = 2});
    const double l0 = run.forward(*p, data.tokens, data.targets);
    const auto base = run.logits();
    const double l1 = run.forward(*p, *ad, data.tokens, data.targets);
    CHECK(l1 == l0);
    const auto& adapted = run.logits();
    REQUIRE(adapted.count() == base.count());
    CHECK(std::memcmp(adapted.data(), base.data(), base.count() * C::vocab * sizeof(float)) == 0);
  };
  check(tlm::tiny_gqa{});
  check(tlm::tiny_untied{});
  check(tlm::tiny_qwen2{});
  check(tlm::tiny_traits{});
}

TEST_CASE("lora: gradients of A and B equal central finite differences in double, over an F32 base") {
  check_over_f32_base<tlm::tiny_gqa>();                      // tied, group 2
  check_over_f32_base<tlm::tiny_untied>();                   // separate output, group 4
  check_over_f32_base<tlm::tiny_qwen2>();                    // q/k/v biases, half-split pairing
  check_over_f32_base<tlm::tiny_llama3>();                   // Llama 3 RoPE scaling
  check_over_f32_base<tlm::tiny_traits>();                   // all of them, untied
  check_over_f32_base<tlm::tiny_gqa, tlm::lora_default_targets>();
  check_over_f32_base<tlm::tiny_untied, lora_target::v | lora_target::up>();
}

TEST_CASE("lora: gradients of A and B equal central finite differences in double, over a quantized base") {
  check_over_quantized_base<tlm::tiny_gqa>(tlm::encoding::q8_0);
  check_over_quantized_base<tlm::tiny_untied>(tlm::encoding::q4_1);
  check_over_quantized_base<tlm::tiny_qwen2>(tlm::encoding::q4_1);
}

TEST_CASE("lora: float training over a mapped quantized base equals double over its dequantized copy") {
  check_mapped_against_double<tlm::tiny_gqa>(tlm::encoding::q8_0, 1);
  check_mapped_against_double<tlm::tiny_untied>(tlm::encoding::q4_1, 2);
  check_mapped_against_double<tlm::tiny_qwen2>(tlm::encoding::q4_1, 2);
  check_mapped_against_double<tlm::tiny_traits>(tlm::encoding::f16, 1);
  check_mapped_against_double<tlm::tiny_untied>(tlm::encoding::f32, 2);
}

namespace {

// dX += dY W over a mapped matrix in `enc`, against the product in double over the
// dequantized rows (dequantize_row), starting from a non-zero dX (it accumulates).
template <std::size_t R, std::size_t Cc>
void check_transposed_product(tlm::encoding enc, std::size_t n, tlm::thread_pool* pool) {
  std::mt19937_64 rng(R * 1000 + Cc + n);
  std::normal_distribution<float> nd;
  std::vector<float> wf(R * Cc);
  for (auto& v : wf) v = nd(rng);
  const std::size_t rb = tlm::row_bytes(enc, Cc);
  std::vector<std::byte> bytes(R * rb);
  for (std::size_t r = 0; r < R; ++r) tlm::quantize_row(enc, wf.data() + r * Cc, bytes.data() + r * rb, Cc);
  tlm::mat<R, Cc, tlm::mapped> w;
  w.bind(enc, bytes, "w");
  std::vector<float> deq(R * Cc);
  for (std::size_t r = 0; r < R; ++r) tlm::dequantize_row(enc, bytes.data() + r * rb, deq.data() + r * Cc, Cc);

  tlm::rows<R, float> dy(n);
  tlm::rows<Cc, float> dx(n);
  for (std::size_t i = 0; i < n * R; ++i) dy.data()[i] = nd(rng);
  for (std::size_t i = 0; i < n * Cc; ++i) dx.data()[i] = nd(rng);
  std::vector<double> ref(dx.data(), dx.data() + n * Cc);
  double scale = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < Cc; ++c) {
      double s = 0, a = 0;
      for (std::size_t r = 0; r < R; ++r) {
        s += static_cast<double>(dy.data()[i * R + r]) * deq[r * Cc + c];
        a += std::abs(static_cast<double>(dy.data()[i * R + r]) * deq[r * Cc + c]);
      }
      ref[i * Cc + c] += s;
      scale = std::max(scale, a);
    }
  tlm::matmul_backward_input(w, dy, dx, pool);
  double err = 0;
  for (std::size_t i = 0; i < n * Cc; ++i) err = std::max(err, std::abs(dx.data()[i] - ref[i]));
  INFO(std::string(tlm::traits(enc).name) << " [" << R << ", " << Cc << "], n = " << n << ": max error " << err
                             << " against a largest |sum| of " << scale);
  CHECK(err <= 1e-5 * scale);
}

template <std::size_t R, std::size_t Cc>
void check_transposed_sizes(tlm::encoding enc, tlm::thread_pool* pool) {
  for (std::size_t n : {1, 2, 7, 33}) check_transposed_product<R, Cc>(enc, n, pool);
}

}  // namespace

TEST_CASE("matmul_backward_input over quantized rows equals the product over the dequantized rows") {
  tlm::thread_pool pool(2);
  for (tlm::thread_pool* p : {static_cast<tlm::thread_pool*>(nullptr), &pool}) {
    for (auto enc : {tlm::encoding::f32, tlm::encoding::f16, tlm::encoding::bf16, tlm::encoding::q8_0,
                     tlm::encoding::q4_0, tlm::encoding::q4_1, tlm::encoding::q5_0, tlm::encoding::q5_1}) {
      check_transposed_sizes<1, 32>(enc, p);
      check_transposed_sizes<7, 64>(enc, p);
      check_transposed_sizes<64, 96>(enc, p);    // exactly one tile
      check_transposed_sizes<65, 32>(enc, p);    // a tile and one row
      check_transposed_sizes<130, 160>(enc, p);  // three tiles, the last short
    }
    for (auto enc : {tlm::encoding::q4_k, tlm::encoding::q5_k, tlm::encoding::q6_k}) {
      check_transposed_sizes<3, 256>(enc, p);
      check_transposed_sizes<70, 512>(enc, p);
    }
  }
}

TEST_CASE("lora: AdamW steps change only the adapter, and lower the loss of a fixed batch over a mapped Q4_1 base") {
  using C = tlm::tiny_untied;
  using A = tlm::lora<C, 4>;
  constexpr std::size_t B = 2, T = 8;
  auto pf = random_params<C, float>(71);
  const mapped_base<C> mb(*pf, tlm::encoding::q4_1);
  const auto bytes_before = mb.bytes;
  auto ad = std::make_unique<A>(), grads = std::make_unique<A>(), init = std::make_unique<A>();
  tlm::init_lora(*ad, 72);
  tlm::init_lora(*init, 72);
  ad->alpha = init->alpha = 8;
  const auto data = random_batch(B, T, C::vocab, 73);
  tlm::training<C, float> run({.batch = B, .seq = T, .threads = 2});
  tlm::adamw<A> opt({.lr = 1e-2, .weight_decay = 0.0});
  static_assert(std::same_as<std::remove_cvref_t<decltype(opt.m())>, A>);

  // Step 1: B = 0 makes A's gradient zero (du = dY B), so only the B factors move.
  const double first = run.forward(mb.w, *ad, data.tokens, data.targets);
  tlm::zero(*grads);
  run.backward(mb.w, *ad, *grads);
  opt.step(*ad, *grads);
  std::size_t a_changed = 0, b_changed = 0, b_tensors_changed = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& now, const auto& was) {
        std::size_t changed = 0;
        for (std::size_t i = 0; i < now.values().size(); ++i) changed += now.data()[i] != was.data()[i];
        if (name.member.ends_with("_lora_b")) {
          b_changed += changed;
          b_tensors_changed += changed > 0;
        } else {
          a_changed += changed;
        }
      },
      *ad, *init);
  CHECK(a_changed == 0);
  CHECK(b_tensors_changed == tlm::tensor_count(*ad) / 2);
  CHECK(b_changed > 0);

  double last = first;
  for (int s = 0; s < 20; ++s) {
    last = run.forward(mb.w, *ad, data.tokens, data.targets);
    tlm::zero(*grads);
    run.backward(mb.w, *ad, *grads);
    opt.step(*ad, *grads);
  }
  a_changed = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& now, const auto& was) {
        if (name.member.ends_with("_lora_b")) return;
        for (std::size_t i = 0; i < now.values().size(); ++i) a_changed += now.data()[i] != was.data()[i];
      },
      *ad, *init);
  CHECK(a_changed > 0);  // once B is not zero, A trains too
  MESSAGE("21 AdamW steps on one batch over a mapped Q4_1 base: loss " << first << " -> " << last);
  CHECK(last < first - 0.5);
  // The base's bytes (what the mapped weights view) are exactly as they were.
  CHECK(mb.bytes == bytes_before);
}

namespace {

std::filesystem::path lora_dir(const std::string& name) {
  const auto dir = std::filesystem::path(TLM_BINARY_DIR) / "test_train_lora" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<std::byte> file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  const std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

}  // namespace

TEST_CASE("lora file: llama.cpp's adapter format, written and read back bit for bit") {
  using C = tlm::tiny_qwen2;
  using A = tlm::lora<C, 4, all_seven>;
  auto ad = random_adapter<A>(81);
  ad->alpha = 12;
  const auto path = lora_dir("roundtrip") / "adapter.gguf";
  tlm::write_lora(path, *ad);

  const tlm::gguf::file f(path);
  CHECK(f.get_string("general.type") == "adapter");
  CHECK(f.get_string("adapter.type") == "lora");
  CHECK(f.get_string("general.architecture") == "qwen2");
  REQUIRE(f.find("adapter.lora.alpha") != nullptr);
  CHECK(f.find("adapter.lora.alpha")->type == tlm::gguf::value_type::f32);  // llama.cpp reads it with gguf_get_val_f32
  CHECK(f.get_float("adapter.lora.alpha") == 12.0);
  CHECK(f.tensors().size() == tlm::tensor_count(*ad));
  // llama.cpp's shape checks: lora_a ne = [in, r], lora_b ne = [r, out].
  const auto* qa = f.find_tensor("blk.0.attn_q.weight.lora_a");
  const auto* kb = f.find_tensor("blk.1.attn_k.weight.lora_b");
  const auto* da = f.find_tensor("blk.1.ffn_down.weight.lora_a");
  REQUIRE(qa != nullptr);
  REQUIRE(kb != nullptr);
  REQUIRE(da != nullptr);
  CHECK((qa->n_dims == 2 && qa->dims[0] == tlm::dim<C> && qa->dims[1] == 4));
  CHECK((kb->n_dims == 2 && kb->dims[0] == 4 && kb->dims[1] == tlm::kv_dim<C>));
  CHECK((da->n_dims == 2 && da->dims[0] == C::ffn && da->dims[1] == 4));

  auto back = std::make_unique<A>();
  tlm::read_lora(path, *back);
  CHECK(back->alpha == 12.0);
  std::size_t differ = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, const auto& x, const auto& y) {
        differ += std::memcmp(x.data(), y.data(), x.values().size() * sizeof(float)) != 0;
      },
      *ad, *back);
  CHECK(differ == 0);
}

TEST_CASE("lora file: a damaged or mismatched adapter is rejected, naming its tensor") {
  using C = tlm::tiny_qwen2;
  using A = tlm::lora<C, 4, all_seven>;
  auto ad = random_adapter<A>(82);
  const auto dir = lora_dir("damaged");
  const auto path = dir / "adapter.gguf";
  tlm::write_lora(path, *ad);
  auto bytes = file_bytes(path);
  auto check_throws = [](auto&& read, const std::string& fragment) {
    std::string message;
    try {
      read();
    } catch (const tlm::format_error& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find(fragment) != std::string::npos);
  };

  SUBCASE("a flipped byte in one tensor's data: its checksum names it") {
    const auto probe = tlm::gguf::file::from_memory(bytes, "adapter.gguf");
    const auto* t = probe.find_tensor("blk.1.ffn_up.weight.lora_b");
    REQUIRE(t != nullptr);
    const std::size_t at = static_cast<std::size_t>(t->data.data() - bytes.data()) + 13;
    bytes[at] ^= std::byte{0x40};
    const auto damaged = tlm::gguf::file::from_memory(bytes, "adapter.gguf");
    auto into = std::make_unique<A>();
    check_throws([&] { tlm::read_lora(damaged, *into); }, "tensor 'blk.1.ffn_up.weight.lora_b' fails its checksum");
  }
  SUBCASE("a NaN written into a tensor") {
    ad->layers[0].attn_v_lora_a.data()[5] = std::nanf("");
    tlm::write_lora(dir / "nan.gguf", *ad);
    auto into = std::make_unique<A>();
    check_throws([&] { tlm::read_lora(dir / "nan.gguf", *into); },
                 "tensor 'blk.0.attn_v.weight.lora_a' holds a NaN at index 5");
  }
  SUBCASE("read into an adapter of another rank") {
    auto into = std::make_unique<tlm::lora<C, 2, all_seven>>();
    check_throws([&] { tlm::read_lora(path, *into); }, "tensor 'blk.0.attn_q.weight.lora_a' has dims [32, 4], expected [32, 2]");
  }
  SUBCASE("read into an adapter with fewer targets") {
    auto into = std::make_unique<tlm::lora<C, 4>>();
    check_throws([&] { tlm::read_lora(path, *into); }, "tensor 'blk.0.ffn_gate.weight.lora_a' is not one of this adapter type's");
  }
  SUBCASE("read into an adapter with more targets") {
    using Few = tlm::lora<C, 4>;
    auto few = random_adapter<Few>(83);
    tlm::write_lora(dir / "few.gguf", *few);
    auto into = std::make_unique<A>();
    check_throws([&] { tlm::read_lora(dir / "few.gguf", *into); }, "tensor 'blk.0.ffn_gate.weight.lora_a' is missing");
  }
  SUBCASE("an adapter of another architecture") {
    auto into = std::make_unique<tlm::lora<tlm::tiny_gqa, 4, all_seven>>();
    check_throws([&] { tlm::read_lora(path, *into); }, "an adapter for architecture \"qwen2\", not \"llama\"");
  }
}

}  // namespace test_train_lora
