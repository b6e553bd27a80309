// tlm::trainer driven from C++, as a notebook or another front end would: steps lower
// the loss; a stopped run resumed from its checkpoint equals an uninterrupted one bit for
// bit; the stop flag ends the run after the step that sees it; a NaN is refused and the
// last checkpoint stays intact; an earlier run in the folder is refused, a changed option
// on resume is warned about through the hook.
#include <doctest/doctest.h>

#include <tlm/train/trainer.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/lora_file.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "train_common.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_trainer {

namespace {

using C = tlm::tiny_train;
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) { return tlm_test::fresh_dir("test_train_trainer", name); }

tlm::data_source data() { return tlm::data_source::from_text(tlm_test::cat_corpus("test_train_trainer"), tlm::byte_tokens, 16, 0.1); }

tlm::trainer_options options(const fs::path& out) {
  return {.steps = 12, .batch = 4, .seq = 16, .lr = 3e-3, .warmup = 2, .eval_every = 4, .save_every = 4, .out = out, .threads = 1, .seed = 3};
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("trainer: steps lower the training and the held-out loss; finish writes the checkpoint and the model") {
  const auto dir = fresh_dir("learns");
  tlm::trainer<C> t(options(dir), data());
  CHECK(t.total_steps() == 12);
  CHECK(t.data().train.size() > 0);
  const double held_before = t.held_out_loss();
  std::vector<double> losses;
  while (!t.done()) losses.push_back(t.step().loss);
  REQUIRE(losses.size() == 12);
  CHECK(losses.back() < losses.front() - 0.5);
  CHECK(t.held_out_loss() < held_before - 0.5);
  CHECK(tlm::latest_checkpoint(dir) == "checkpoint-8");  // the cadence's, below the total
  const tlm::finish_report f = t.finish();
  CHECK(f.saved);
  CHECK(f.exported);
  CHECK(tlm::latest_checkpoint(dir) == "checkpoint-12");
  CHECK(fs::exists(dir / "model.gguf"));
  CHECK(fs::exists(dir / "loss.csv"));
  CHECK(t.log().size() == 12);
  CHECK(!std::isnan(t.log()[3].held_out));  // step 4: the eval cadence
  CHECK(std::isnan(t.log()[4].held_out));
  CHECK_THROWS_WITH(t.step(), doctest::Contains("the run is at its last step (12)"));
}

TEST_CASE("trainer: a run stopped after 5 steps and resumed equals an uninterrupted one bit for bit") {
  const auto full_dir = fresh_dir("full"), split_dir = fresh_dir("split");
  tlm::trainer<C> full(options(full_dir), data());
  full.run();

  auto first = options(split_dir);
  first.stop_after = 5;
  {
    tlm::trainer<C> t(first, data());
    const tlm::finish_report f = t.run();
    CHECK(t.steps() == 5);
    CHECK(f.saved);
    CHECK(!f.exported);
  }
  auto second = options(split_dir);
  second.resume = true;
  std::vector<std::string> warnings;
  tlm::trainer<C> resumed(second, data(), nullptr, {.warn = [&](const std::string& w) { warnings.push_back(w); }});
  CHECK(resumed.steps() == 5);
  resumed.run();
  CHECK(warnings.empty());
  bool same_weights = true;
  tlm::for_each_tensor([&](const tlm::tensor_name&, const auto& x, const auto& y) { same_weights = same_weights && std::ranges::equal(x.values(), y.values()); },
                       resumed.parameters(), full.parameters());
  CHECK(same_weights);
  REQUIRE(resumed.log().size() == full.log().size());
  for (std::size_t i = 0; i < full.log().size(); ++i) {
    CHECK(resumed.log()[i].loss == full.log()[i].loss);
    CHECK((resumed.log()[i].held_out == full.log()[i].held_out || (std::isnan(resumed.log()[i].held_out) && std::isnan(full.log()[i].held_out))));
  }
  CHECK(bytes_of(split_dir / "model.gguf") == bytes_of(full_dir / "model.gguf"));
}

TEST_CASE("trainer: the stop flag ends the run after the step that sees it, with a checkpoint of that step") {
  const auto dir = fresh_dir("stop");
  std::atomic<bool> stop{false};
  tlm::trainer_hooks hooks{.stop = &stop};
  hooks.on_step = [&](const tlm::step_report& r) {
    CHECK(r.stopping == (r.step == 4));  // the flag set at step 3's report is read after step 4
    if (r.step == 3) stop = true;
  };
  tlm::trainer<C> t(options(dir), data(), nullptr, hooks);
  while (!t.done()) t.step();
  CHECK(t.steps() == 4);
  CHECK(tlm::latest_checkpoint(dir).empty());  // step 4's cadence save is left to finish()
  const tlm::finish_report f = t.finish();
  CHECK(f.saved);
  CHECK(!f.exported);
  CHECK(tlm::latest_checkpoint(dir) == "checkpoint-4");
}

TEST_CASE("trainer: a NaN in the weights is refused by the step; the last checkpoint stays intact and resumes") {
  const auto dir = fresh_dir("nan");
  auto o = options(dir);
  o.stop_after = 4;
  {
    tlm::trainer<C> t(o, data());
    t.run();  // checkpoint-4
  }
  const std::string weights_before = bytes_of(dir / "checkpoint-4.gguf"), optim_before = bytes_of(dir / "checkpoint-4.optim.gguf");
  o.stop_after = 0;
  o.resume = true;
  {
    tlm::trainer<C> t(o, data());
    t.parameters().layers[0].attn_q.values()[5] = NAN;
    CHECK_THROWS_AS(t.step(), tlm::numeric_error);
    CHECK(t.steps() == 4);  // nothing advanced
  }
  CHECK(tlm::latest_checkpoint(dir) == "checkpoint-4");
  CHECK(bytes_of(dir / "checkpoint-4.gguf") == weights_before);
  CHECK(bytes_of(dir / "checkpoint-4.optim.gguf") == optim_before);
  tlm::trainer<C> again(o, data());
  CHECK(again.steps() == 4);
  CHECK(std::isfinite(again.step().loss));
}

TEST_CASE("trainer: an earlier run is refused without resume or overwrite; a changed option on resume is a warning") {
  const auto dir = fresh_dir("policy");
  auto o = options(dir);
  o.steps = 2;
  tlm::trainer<C>(o, data()).run();
  CHECK_THROWS_WITH(tlm::trainer<C>(o, data()), doctest::Contains("holds an earlier run (checkpoint-2, model.gguf); continue it with --resume"));
  o.resume = true;
  o.steps = 3;
  o.lr = 1e-3;
  std::vector<std::string> warnings;
  tlm::trainer<C> t(o, data(), nullptr, {.warn = [&](const std::string& w) { warnings.push_back(w); }});
  REQUIRE(warnings.size() == 2);
  CHECK(warnings[0] == "warning: the checkpoint was made with --lr 0.003, this run uses 0.001; continuing with 0.001 from step 2");
  CHECK(warnings[1].starts_with("warning: the checkpoint was made with total steps (--steps/--epochs) 2, this run uses 3"));
  o.seed = 4;
  CHECK_THROWS_WITH(tlm::trainer<C>(o, data()), doctest::Contains("was made with --seed 3, this run has 4"));
  o.seed = 3;
  o.resume = false;
  o.overwrite = true;
  tlm::trainer<C> anew(o, data());
  CHECK(anew.steps() == 0);
  CHECK(tlm::latest_checkpoint(dir).empty());
}

namespace {

const tlm::gguf::file& q4_base() { return tlm_test::tiny_train_q4_base("test_train_trainer"); }

using adapter4 = tlm::lora<C, 4>;  // q, k, v, o

tlm::trainer_options lora_options(const fs::path& out) {
  auto o = options(out);
  o.lr = 1e-2;
  o.lora_alpha = 8;
  return o;
}

}  // namespace

TEST_CASE("trainer with LoRA: the base stays mapped, the adapter learns, a resume is bit-exact, another adapter is refused by name") {
  const auto full_dir = fresh_dir("lora-full"), split_dir = fresh_dir("lora-split");
  const tlm::gguf::file& base = q4_base();
  const std::string base_bytes(reinterpret_cast<const char*>(base.tensors()[0].data.data()), base.tensors()[0].data.size());

  tlm::trainer<C, adapter4> full(lora_options(full_dir), data(), &base);
  CHECK(full.parameters().alpha == 8);
  const double held_before = full.held_out_loss();
  full.run();
  CHECK(full.log().back().loss < full.log().front().loss - 0.2);
  CHECK(full.held_out_loss() < held_before - 0.2);
  CHECK(std::string(reinterpret_cast<const char*>(base.tensors()[0].data.data()), base.tensors()[0].data.size()) == base_bytes);
  CHECK(fs::exists(full_dir / "adapter.gguf"));
  CHECK(!fs::exists(full_dir / "model.gguf"));
  adapter4 back;
  tlm::read_lora(full_dir / "adapter.gguf", back);
  CHECK(back.alpha == 8);
  bool same = true;
  tlm::for_each_tensor([&](const tlm::tensor_name&, const auto& x, const auto& y) { same = same && std::ranges::equal(x.values(), y.values()); },
                       back, full.parameters());
  CHECK(same);
  tlm::read_lora(full_dir / "checkpoint-12.gguf", back);  // a checkpoint's parameter file is an adapter file too

  auto first = lora_options(split_dir);
  first.stop_after = 5;
  tlm::trainer<C, adapter4>(first, data(), &base).run();
  auto second = lora_options(split_dir);
  second.resume = true;
  // Another rank, targets, alpha or kind of run is refused, naming what differs.
  CHECK_THROWS_WITH((tlm::trainer<C, tlm::lora<C, 8>>(second, data(), &base)), doctest::Contains("was made with --lora 4, this run has 8"));
  CHECK_THROWS_WITH((tlm::trainer<C, tlm::lora<C, 4, tlm::lora_target::q | tlm::lora_target::v>>(second, data(), &base)),
                    doctest::Contains("was made with --lora-targets q,k,v,o, this run has q,v"));
  auto other_alpha = second;
  other_alpha.lora_alpha = 16;
  CHECK_THROWS_WITH((tlm::trainer<C, adapter4>(other_alpha, data(), &base)), doctest::Contains("was made with --lora-alpha 8, this run has 16"));
  CHECK_THROWS_WITH(tlm::trainer<C>(second, data()), doctest::Contains("was made with --lora 4, this run has off (full training)"));
  const tlm::gguf::file base_copy = [&] {
    fs::copy_file(TLM_BINARY_DIR "/test_train_trainer/base-q4_1.gguf", split_dir / "other-base.gguf");
    return tlm::gguf::file(split_dir / "other-base.gguf");
  }();
  CHECK_THROWS_WITH((tlm::trainer<C, adapter4>(second, data(), &base_copy)), doctest::Contains("was made with the base model (--model)"));
  CHECK_THROWS_WITH((tlm::trainer<C, adapter4>(options(fresh_dir("lora-none")), data())), doctest::Contains("give --model FILE.gguf"));

  tlm::trainer<C, adapter4> resumed(second, data(), &base);
  CHECK(resumed.steps() == 5);
  resumed.run();
  REQUIRE(resumed.log().size() == full.log().size());
  for (std::size_t i = 0; i < full.log().size(); ++i) CHECK(resumed.log()[i].loss == full.log()[i].loss);
  CHECK(bytes_of(split_dir / "adapter.gguf") == bytes_of(full_dir / "adapter.gguf"));
}

TEST_CASE("trainer with LoRA and merge: model.gguf alone computes what the base with the adapter computes") {
  const auto dir = fresh_dir("lora-merge");
  const tlm::gguf::file& base = q4_base();
  auto o = lora_options(dir);
  o.steps = 3;
  o.merge = true;
  tlm::trainer<C, adapter4> t(o, data(), &base);
  const tlm::finish_report f = t.run();
  REQUIRE(f.merged == dir / "model.gguf");
  const tlm::gguf::file merged_file(f.merged);
  const auto merged = tlm::to_trainable<float>(tlm::bind<C>(merged_file));
  const std::vector<std::int32_t> tokens = {5, 70, 101, 32, 99, 3, 44, 120}, targets = {70, 101, 32, 99, 3, 44, 120, 7};
  tlm::training<C, float> run({.batch = 1, .seq = tokens.size(), .threads = 1});
  const double loss_adapted = run.forward(tlm::bind<C>(base), t.parameters(), tokens, targets);
  const std::vector<float> adapted(run.logits().data(), run.logits().data() + tokens.size() * C::vocab);
  const double loss_merged = run.forward(*merged, tokens, targets);
  const auto zero = std::make_unique<adapter4>();
  run.forward(tlm::bind<C>(base), *zero, tokens, targets);
  const std::vector<float> base_logits(run.logits().data(), run.logits().data() + tokens.size() * C::vocab);
  run.forward(*merged, tokens, targets);
  double merged_vs_adapted = 0, base_vs_adapted = 0;
  for (std::size_t i = 0; i < adapted.size(); ++i) {
    merged_vs_adapted = std::max(merged_vs_adapted, std::abs(double(run.logits().data()[i]) - adapted[i]));
    base_vs_adapted = std::max(base_vs_adapted, std::abs(double(base_logits[i]) - adapted[i]));
  }
  MESSAGE("merged vs adapted ", merged_vs_adapted, ", base vs adapted ", base_vs_adapted, ", losses ", loss_merged, " ", loss_adapted);
  CHECK(base_vs_adapted > 0.05);  // the adapter changed the model
  CHECK(merged_vs_adapted < 1e-5);  // 2.4e-7 measured: the same products, the low-rank part summed first
  CHECK(std::abs(loss_merged - loss_adapted) < 1e-6);
  CHECK_THROWS_WITH(tlm::trainer<C>(o, data()), doctest::Contains("--merge merges a LoRA adapter into its base: it needs --lora"));
}

}  // namespace test_train_trainer
