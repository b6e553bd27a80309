// Checkpoints: a round trip restores weights, moments, step and state exactly; a pair
// that does not belong together is refused; the weights file is a model file that
// binds; exports in every --out-type bind and stay close to the f32 weights.
#include <doctest/doctest.h>

#include <tlm/train/checkpoint.hpp>

#include <algorithm>
#include <filesystem>
#include <cstdint>
#include <fstream>
#include <span>
#include <vector>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "train_common.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_checkpoint {

namespace {

using C = tlm::tiny_train;
using W = tlm::trainable<C, float>;

std::filesystem::path fresh_dir(const std::string& name) { return tlm_test::fresh_dir("test_train_checkpoint", name); }

// Weights and moments after two real AdamW steps, so m and v are not zero.
struct trained {
  std::unique_ptr<W> p = std::make_unique<W>();
  tlm::adamw<W> opt{{.lr = 1e-3, .weight_decay = 0.01, .clip = 1.0, .warmup = 2, .total_steps = 10}};
  trained() {
    tlm::init_weights(*p, 5);
    auto g = std::make_unique<W>();
    for (int s = 0; s < 2; ++s) {
      tlm::init_weights(*g, static_cast<std::uint64_t>(100 + s), 0.1);
      opt.step(*p, *g);
    }
  }
};

bool same(const W& a, const W& b) {
  bool eq = true;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, const auto& x, const auto& y) {
        for (std::size_t i = 0; i < x.values().size(); ++i) eq = eq && x.values()[i] == y.values()[i];
      },
      a, b);
  return eq;
}

}  // namespace

TEST_CASE("checkpoint round trip: weights, m, v, step and training state exactly") {
  const auto dir = fresh_dir("round_trip");
  trained t;
  tlm::train_state st{.step = 2, .seed = 9, .data_position = 8, .rng_state = 1234, .batch = 4, .seq = 16, .threads = 1,
                      .options = t.opt.options(), .config = "tiny_train", .data = "/x/data.txt", .chat = true,
                      .kernels = "avx2", .lora_base = {}, .lora_rank = 0, .lora_alpha = 0, .lora_targets = {}};
  tlm::save_checkpoint<C>(dir, *t.p, t.opt, st, nullptr);
  CHECK(tlm::latest_checkpoint(dir) == "checkpoint-2");
  CHECK(std::filesystem::exists(dir / "checkpoint-2.gguf"));
  CHECK(std::filesystem::exists(dir / "checkpoint-2.optim.gguf"));

  auto p = std::make_unique<W>();
  tlm::adamw<W> opt({.lr = 1});
  const tlm::train_state got = tlm::load_checkpoint<C>(dir, *p, opt);
  CHECK(same(*p, *t.p));
  CHECK(same(opt.m(), t.opt.m()));
  CHECK(same(opt.v(), t.opt.v()));
  CHECK(opt.steps() == 2);
  CHECK(got.step == 2);
  CHECK(got.seed == 9);
  CHECK(got.data_position == 8);
  CHECK(got.rng_state == 1234);
  CHECK(got.batch == 4);
  CHECK(got.seq == 16);
  CHECK(got.threads == 1);
  CHECK(got.config == "tiny_train");
  CHECK(got.data == "/x/data.txt");
  CHECK(got.chat);
  CHECK(got.kernels == "avx2");
  const auto& want = t.opt.options();
  CHECK(got.options.lr == want.lr);
  CHECK(got.options.beta1 == want.beta1);
  CHECK(got.options.beta2 == want.beta2);
  CHECK(got.options.eps == want.eps);
  CHECK(got.options.weight_decay == want.weight_decay);
  CHECK(got.options.min_lr == want.min_lr);
  CHECK(got.options.total_steps == 10);
  CHECK(got.options.warmup == 2);
  CHECK(got.options.clip == 1.0);

  // A newer checkpoint replaces the older pair.
  st.step = 3;
  tlm::save_checkpoint<C>(dir, *t.p, t.opt, st, nullptr);
  CHECK(tlm::latest_checkpoint(dir) == "checkpoint-3");
  CHECK(!std::filesystem::exists(dir / "checkpoint-2.gguf"));
  CHECK(!std::filesystem::exists(dir / "checkpoint-2.optim.gguf"));
}

TEST_CASE("checkpoint: a weights file and optimizer file of different steps are refused") {
  const auto dir = fresh_dir("mismatch");
  trained t;
  tlm::train_state st{.step = 4, .seed = 1, .data_position = 0, .rng_state = 0, .batch = 1, .seq = 4, .threads = 1,
                      .options = t.opt.options(), .config = "tiny_train", .data = "", .chat = false, .kernels = "", .lora_base = {}, .lora_rank = 0, .lora_alpha = 0, .lora_targets = {}};
  tlm::save_checkpoint<C>(dir, *t.p, t.opt, st, nullptr);
  std::filesystem::copy_file(dir / "checkpoint-4.gguf", dir / "keep.gguf");
  st.step = 5;
  tlm::save_checkpoint<C>(dir, *t.p, t.opt, st, nullptr);
  std::filesystem::rename(dir / "keep.gguf", dir / "checkpoint-5.gguf");  // step-4 weights beside step-5 moments
  auto p = std::make_unique<W>();
  tlm::adamw<W> opt({.lr = 1});
  CHECK_THROWS_WITH(tlm::load_checkpoint<C>(dir, *p, opt), doctest::Contains("do not belong together"));
}

TEST_CASE("optimizer state: a sidecar without a required key is refused by name; without the kernel level it loads") {
  const auto dir = fresh_dir("state_keys");
  tlm::train_state st{.step = 7, .seed = 1, .data_position = 3, .rng_state = 5, .batch = 2, .seq = 4, .threads = 2,
                      .options = {.lr = 0.5}, .config = "tiny_train", .data = "d.txt", .chat = false, .kernels = "scalar", .lora_base = {}, .lora_rank = 0, .lora_alpha = 0, .lora_targets = {}};
  // A sidecar written with every key but `skip`.
  const auto without = [&](std::string_view skip) {
    tlm::gguf::writer w;
    w.set("general.architecture", "tlm-optimizer");
    tlm::detail::walk_state(st, [&](std::string_view key, const auto& v, bool) {
      if (key == skip) return;
      using V = std::remove_cvref_t<decltype(v)>;
      if constexpr (std::is_same_v<V, std::string> || std::is_same_v<V, bool> || std::is_same_v<V, double>) w.set(key, v);
      else w.set(key, static_cast<std::uint64_t>(v));
    });
    const auto path = dir / ("without-" + std::string(skip) + ".gguf");
    w.write(path);
    return tlm::gguf::file(path);
  };
  CHECK_THROWS_WITH(tlm::detail::get_state(without("tlm.adamw.beta2")),
                    doctest::Contains("optimizer state lacks tlm.adamw.beta2"));
  CHECK_THROWS_WITH(tlm::detail::get_state(without("tlm.train.data_position")),
                    doctest::Contains("optimizer state lacks tlm.train.data_position"));
  const auto old = tlm::detail::get_state(without("tlm.train.kernels"));
  CHECK(old.kernels.empty());
  CHECK(old.step == 7);
  CHECK(old.threads == 2);
  CHECK(old.options.lr == 0.5);
  CHECK(tlm::detail::get_state(without("")).kernels == "scalar");
}

TEST_CASE("checkpoint round trip: every optimizer and schedule field at a value other than its default") {
  // A field the checkpoint forgets comes back as its default on resume, so each one is
  // set away from its default (and from the others' values) here.
  const tlm::adamw_options defaults{};
  const tlm::adamw_options want{.lr = 3.7e-3, .beta1 = 0.81, .beta2 = 0.987, .eps = 3e-7, .weight_decay = 0.023,
                                .clip = 2.5, .warmup = 7, .total_steps = 123, .min_lr = 4.1e-4};
  // Exactly nine fields: a new one does not compile here until it is added to this test.
  const auto& [lr, beta1, beta2, eps, weight_decay, clip, warmup, total_steps, min_lr] = want;
  CHECK(lr != defaults.lr);
  CHECK(beta1 != defaults.beta1);
  CHECK(beta2 != defaults.beta2);
  CHECK(eps != defaults.eps);
  CHECK(weight_decay != defaults.weight_decay);
  CHECK(clip != defaults.clip);
  CHECK(warmup != defaults.warmup);
  CHECK(total_steps != defaults.total_steps);
  CHECK(min_lr != defaults.min_lr);

  const auto dir = fresh_dir("every_option");
  trained t;
  const tlm::train_state st{.step = 2, .seed = 11, .data_position = 6, .rng_state = 77, .batch = 3, .seq = 8, .threads = 2,
                            .options = want, .config = "tiny_train", .data = "d.txt", .chat = true, .kernels = "avx2", .lora_base = {}, .lora_rank = 0, .lora_alpha = 0, .lora_targets = {}};
  tlm::save_checkpoint<C>(dir, *t.p, t.opt, st, nullptr);
  auto p = std::make_unique<W>();
  tlm::adamw<W> opt({.lr = 1});
  const auto got = tlm::load_checkpoint<C>(dir, *p, opt).options;
  CHECK(got.lr == want.lr);
  CHECK(got.beta1 == want.beta1);
  CHECK(got.beta2 == want.beta2);
  CHECK(got.eps == want.eps);
  CHECK(got.weight_decay == want.weight_decay);
  CHECK(got.clip == want.clip);
  CHECK(got.warmup == want.warmup);
  CHECK(got.total_steps == want.total_steps);
  CHECK(got.min_lr == want.min_lr);
  // The schedule the resumed run follows is the saved one, late in the cosine decay too.
  for (const std::size_t step : {1u, 7u, 60u, 123u, 200u})
    CHECK(tlm::learning_rate(got, step) == tlm::learning_rate(want, step));
}

TEST_CASE("optimizer state: each of the state keys is written, and each required one is refused when missing") {
  const auto dir = fresh_dir("every_key");
  const tlm::train_state st{.step = 7, .seed = 1, .data_position = 3, .rng_state = 5, .batch = 2, .seq = 4, .threads = 2,
                            .options = {.lr = 0.5, .min_lr = 0.25}, .config = "tiny_train", .data = "d.txt", .chat = false,
                            .kernels = "scalar", .lora_base = {}, .lora_rank = 0, .lora_alpha = 0, .lora_targets = {}};
  // The keys written out by hand, not taken from walk_state: a key dropped from the
  // walk is then both missing from the file and no longer required, and shows here.
  const std::vector<std::string> required = {
      "tlm.train.step",    "tlm.train.seed",    "tlm.train.data_position", "tlm.train.rng_state",
      "tlm.train.batch",   "tlm.train.seq",     "tlm.train.threads",       "tlm.train.config",
      "tlm.train.data",    "tlm.train.chat",    "tlm.adamw.lr",            "tlm.adamw.beta1",
      "tlm.adamw.beta2",   "tlm.adamw.eps",     "tlm.adamw.weight_decay",  "tlm.adamw.clip",
      "tlm.adamw.warmup",  "tlm.adamw.total_steps", "tlm.adamw.min_lr"};
  tlm::gguf::writer all;
  tlm::detail::put_state(all, st);
  all.write(dir / "all.gguf");
  const tlm::gguf::file full(dir / "all.gguf");
  for (const auto& key : required) CHECK_MESSAGE(full.has(key), key);
  CHECK(full.has("tlm.train.kernels"));
  CHECK(full.get_float("tlm.adamw.min_lr") == 0.25);
  // The walk visits these keys, the optional kernel level, micro-batch count and LoRA's
  // identity, nothing else.
  std::vector<std::string> walked;
  tlm::detail::walk_state(st, [&](std::string_view key, const auto&, bool) { walked.emplace_back(key); });
  std::vector<std::string> expected = required;
  for (const char* k : {"tlm.train.kernels", "tlm.train.accumulate", "tlm.train.pack", "tlm.lora.base", "tlm.lora.rank", "tlm.lora.alpha", "tlm.lora.targets"})
    expected.push_back(k);
  std::sort(walked.begin(), walked.end());
  std::sort(expected.begin(), expected.end());
  CHECK(walked == expected);
  // A sidecar without one required key, every other key written as put_state does.
  for (const auto& skip : required) {
    tlm::gguf::writer w;
    w.set("general.architecture", "tlm-optimizer");
    for (const auto& e : full.metadata())
      if (e.key != skip && e.key != "general.architecture" && e.key.starts_with("tlm.")) w.set_value(e.key, e.val);
    const auto path = dir / ("without-" + skip + ".gguf");
    w.write(path);
    const std::string message = "optimizer state lacks " + skip;
    CHECK_THROWS_WITH(tlm::detail::get_state(tlm::gguf::file(path)), doctest::Contains(message.c_str()));
  }
  // A sidecar written before --accumulate existed lacks its key: one micro-batch a step,
  // which is what that run took.
  CHECK(full.get_uint("tlm.train.accumulate") == 1);
  tlm::gguf::writer old;
  old.set("general.architecture", "tlm-optimizer");
  for (const auto& e : full.metadata())
    if (e.key != "tlm.train.accumulate" && e.key != "general.architecture" && e.key.starts_with("tlm.")) old.set_value(e.key, e.val);
  old.write(dir / "before-accumulate.gguf");
  CHECK(tlm::detail::get_state(tlm::gguf::file(dir / "before-accumulate.gguf")).accumulate == 1);
  // And before --pack: not packed, which is what that run did.
  CHECK(full.has("tlm.train.pack"));
  tlm::gguf::writer unpacked;
  unpacked.set("general.architecture", "tlm-optimizer");
  for (const auto& e : full.metadata())
    if (e.key != "tlm.train.pack" && e.key != "general.architecture" && e.key.starts_with("tlm.")) unpacked.set_value(e.key, e.val);
  unpacked.write(dir / "before-pack.gguf");
  CHECK(!tlm::detail::get_state(tlm::gguf::file(dir / "before-pack.gguf")).pack);
}

TEST_CASE("checkpoint: resuming from a folder without one says so") {
  const auto dir = fresh_dir("empty");
  auto p = std::make_unique<W>();
  tlm::adamw<W> opt({.lr = 1});
  CHECK_THROWS_WITH(tlm::load_checkpoint<C>(dir, *p, opt), doctest::Contains("no checkpoint to resume from"));
}

namespace {

tlm::train_state state_at(const trained& t, std::uint64_t step) {
  return {.step = step, .seed = 1, .data_position = 0, .rng_state = 0, .batch = 1, .seq = 4, .threads = 1,
          .options = t.opt.options(), .config = "tiny_train", .data = "", .chat = false, .kernels = "", .lora_base = {}, .lora_rank = 0, .lora_alpha = 0, .lora_targets = {}};
}

// Flips one bit of the first data byte of tensor `name` in the GGUF file at `path`.
void flip_byte_of(const std::filesystem::path& path, const std::string& name) {
  std::uint64_t at = 0;
  {
    const tlm::gguf::file f(path);
    const tlm::gguf::tensor_info* t = f.find_tensor(name);
    REQUIRE(t != nullptr);
    at = static_cast<std::uint64_t>(t->data.data() - f.bytes().data()) + 5;
  }
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  io.seekp(static_cast<std::streamoff>(at));
  io.write(&c, 1);
}

}  // namespace

TEST_CASE("checksum: any change of one byte, at any position, changes it") {
  std::vector<std::byte> b(77);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 37 + 11);
  const std::uint64_t base = tlm::detail::checksum(b);
  for (std::size_t i = 0; i < b.size(); ++i) {
    for (const unsigned bit : {0x01u, 0x80u}) {
      b[i] ^= static_cast<std::byte>(bit);
      CHECK(tlm::detail::checksum(b) != base);
      b[i] ^= static_cast<std::byte>(bit);
    }
  }
  CHECK(tlm::detail::checksum(b) == base);
  CHECK(tlm::detail::checksum(std::span(b).first(76)) != base);  // the length counts
}

TEST_CASE("checkpoint: a byte changed in a tensor of either file is an error naming the tensor") {
  for (const bool sidecar : {false, true}) {
    const auto dir = fresh_dir(sidecar ? "flip_optim" : "flip_model");
    trained t;
    tlm::save_checkpoint<C>(dir, *t.p, t.opt, state_at(t, 2), nullptr);
    const std::string name = sidecar ? "v.blk.1.ffn_down.weight" : "blk.1.ffn_down.weight";
    flip_byte_of(dir / (sidecar ? "checkpoint-2.optim.gguf" : "checkpoint-2.gguf"), name);
    auto p = std::make_unique<W>();
    tlm::adamw<W> opt({.lr = 1});
    CHECK_THROWS_WITH(tlm::load_checkpoint<C>(dir, *p, opt), doctest::Contains(("tensor '" + name + "' fails its checksum").c_str()));
  }
}

TEST_CASE("checkpoint: a NaN in a loaded checkpoint blames the checkpoint, not the learning rate") {
  const auto dir = fresh_dir("nan");
  trained t;
  t.p->layers[0].attn_norm.data()[3] = NAN;  // consistent with its checksum: only the value check finds it
  tlm::save_checkpoint<C>(dir, *t.p, t.opt, state_at(t, 2), nullptr);
  auto p = std::make_unique<W>();
  tlm::adamw<W> opt({.lr = 1});
  std::string what;
  try {
    tlm::load_checkpoint<C>(dir, *p, opt);
  } catch (const std::exception& e) {
    what = e.what();
  }
  CHECK(what.find("checkpoint-2.gguf: tensor 'blk.0.attn_norm.weight' holds a NaN at index 3; the checkpoint is damaged") != std::string::npos);
  CHECK(what.find("learning rate") == std::string::npos);
}

TEST_CASE("checkpoint: a file of the named pair missing is said plainly, without the model-download advice") {
  for (const std::string gone : {"checkpoint-2.gguf", "checkpoint-2.optim.gguf"}) {
    const auto dir = fresh_dir("missing");
    trained t;
    tlm::save_checkpoint<C>(dir, *t.p, t.opt, state_at(t, 2), nullptr);
    std::filesystem::remove(dir / gone);
    auto p = std::make_unique<W>();
    tlm::adamw<W> opt({.lr = 1});
    std::string what;
    try {
      tlm::load_checkpoint<C>(dir, *p, opt);
    } catch (const std::exception& e) {
      what = e.what();
    }
    CHECK(what.find(gone + ": missing, though") != std::string::npos);
    CHECK(what.find("fetch-model") == std::string::npos);
  }
}

TEST_CASE("checkpoint: the newest `keep` pairs stay, older ones go") {
  const auto dir = fresh_dir("keep");
  trained t;
  for (std::uint64_t step = 1; step <= 4; ++step) tlm::save_checkpoint<C>(dir, *t.p, t.opt, state_at(t, step), nullptr, 2);
  CHECK(tlm::latest_checkpoint(dir) == "checkpoint-4");
  for (std::uint64_t step = 1; step <= 4; ++step) {
    CHECK(std::filesystem::exists(dir / ("checkpoint-" + std::to_string(step) + ".gguf")) == (step >= 3));
    CHECK(std::filesystem::exists(dir / ("checkpoint-" + std::to_string(step) + ".optim.gguf")) == (step >= 3));
  }
}

TEST_CASE("prune: temporary files, uncommitted pairs and half pairs are removed; the committed pair stays") {
  const auto dir = fresh_dir("prune");
  trained t;
  for (std::uint64_t step = 1; step <= 3; ++step) tlm::save_checkpoint<C>(dir, *t.p, t.opt, state_at(t, step), nullptr, 3);
  // What kills leave: a half pair (its other file lost), a pair written after the last
  // commit, temporary files, and a file that is not the trainer's.
  std::filesystem::remove(dir / "checkpoint-1.optim.gguf");
  std::filesystem::copy_file(dir / "checkpoint-3.gguf", dir / "checkpoint-4.gguf");
  std::filesystem::copy_file(dir / "checkpoint-3.optim.gguf", dir / "checkpoint-4.optim.gguf");
  std::filesystem::copy_file(dir / "checkpoint-3.gguf", dir / "checkpoint-5.gguf.tmp-123");
  tlm::detail::write_file_atomic(dir / "notes.txt", "mine\n");
  const auto removed = tlm::prune_checkpoints(dir, 2);
  CHECK(removed.size() == 4);
  CHECK(!std::filesystem::exists(dir / "checkpoint-1.gguf"));
  CHECK(!std::filesystem::exists(dir / "checkpoint-4.gguf"));
  CHECK(!std::filesystem::exists(dir / "checkpoint-4.optim.gguf"));
  CHECK(!std::filesystem::exists(dir / "checkpoint-5.gguf.tmp-123"));
  CHECK(std::filesystem::exists(dir / "checkpoint-2.gguf"));
  CHECK(std::filesystem::exists(dir / "checkpoint-3.optim.gguf"));
  CHECK(std::filesystem::exists(dir / "notes.txt"));
  CHECK(tlm::latest_checkpoint(dir) == "checkpoint-3");
  // Without a pointer nothing is committed: every checkpoint file is an orphan.
  std::filesystem::remove(dir / "checkpoint");
  CHECK(tlm::prune_checkpoints(dir, 2).size() == 4);
  CHECK(std::filesystem::exists(dir / "notes.txt"));
}

TEST_CASE("checkpoint: a cancelled write leaves the previous checkpoint committed and intact, and no new files") {
  const auto dir = fresh_dir("cancel");
  trained t;
  int asks = 0;  // how often a whole save asks; the last time is just before the commit
  tlm::save_checkpoint<C>(dir, *t.p, t.opt, state_at(t, 2), nullptr, 1, [&] { return ++asks < 0; });
  REQUIRE(asks >= 3);
  for (const int cancel_at : {1, asks / 2, asks}) {  // in the sidecar, later, just before the commit
    int asked = 0;
    CHECK_THROWS_WITH(tlm::save_checkpoint<C>(dir, *t.p, t.opt, state_at(t, 3), nullptr, 1, [&] { return ++asked >= cancel_at; }),
                      doctest::Contains("cancel"));
    CHECK(tlm::latest_checkpoint(dir) == "checkpoint-2");
    std::size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.path().filename() != "checkpoint";
    CHECK(files == 2);
  }
  auto p = std::make_unique<W>();
  tlm::adamw<W> opt({.lr = 1});
  CHECK(tlm::load_checkpoint<C>(dir, *p, opt).step == 2);
  CHECK(same(*p, *t.p));
}

TEST_CASE("export: every --out-type writes a model file that binds, close to the f32 weights") {
  const auto dir = fresh_dir("export");
  trained t;
  struct kind {
    tlm::encoding enc;
    double tol;  // max |exported - f32| relative to the tensor's max |value|
  };
  for (const kind k : {kind{tlm::encoding::f32, 0.0}, kind{tlm::encoding::f16, 1e-3}, kind{tlm::encoding::bf16, 8e-3},
                       kind{tlm::encoding::q8_0, 1e-2}, kind{tlm::encoding::q4_1, 0.15},
                       kind{tlm::encoding::q4_k, 0.15}, kind{tlm::encoding::q6_k, 0.05}}) {
    const auto path = dir / (std::string(tlm::traits(k.enc).name) + ".gguf");
    tlm::write_model<C>(path, *t.p, k.enc, nullptr, 2);
    const tlm::gguf::file f(path);
    CHECK(f.get_string("general.architecture") == "llama");
    auto back = tlm::to_trainable<float>(tlm::bind<C>(f));
    double worst = 0;
    tlm::for_each_tensor(
        [&](const tlm::tensor_name&, const auto& a, const auto& b) {
          float mx = 0;
          for (const float v : a.values()) mx = std::max(mx, std::abs(v));
          for (std::size_t i = 0; i < a.values().size(); ++i)
            worst = std::max(worst, static_cast<double>(std::abs(a.values()[i] - b.values()[i]) / mx));
        },
        *t.p, *back);
    INFO(tlm::traits(k.enc).name, " worst relative error ", worst);
    CHECK(worst <= k.tol);
  }
}

}  // namespace test_train_checkpoint
