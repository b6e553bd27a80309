// The memory levers of training: gradient accumulation (trainer_options::accumulate,
// train --accumulate) and activation recompute (training_options::recompute, train
// --recompute).
//
// Accumulation: N micro-batches of B windows make one step whose loss and gradient are
// the mean over all N * B windows, as one batch of N * B computes them. The gradient's
// sums run in another order (N partial sums added into the gradient instead of one sum
// over all rows, and each micro-batch's 1/counted scaled by its share instead of
// 1/total), so the two agree to rounding, not bit for bit: the tests measure the worst
// difference and bound it tightly. A resume with accumulation is bit-exact.
//
// Recompute reruns each block's forward from its saved input just before the block's
// backward: the same arithmetic on the same inputs and threads, so every gradient is
// the same bit for bit (compared with memcmp).
#include <doctest/doctest.h>

#include <tlm/train/lora.hpp>
#include <tlm/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "train_common.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_accum {

namespace {

using C = tlm::tiny_train;
using adapter4 = tlm::lora<C, 4>;  // q, k, v, o
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) { return tlm_test::fresh_dir("test_train_accum", name); }

tlm::data_source data() { return tlm::data_source::from_text(tlm_test::cat_corpus("test_train_accum"), tlm::byte_tokens, 16, 0.1); }

tlm::trainer_options options(const fs::path& out, std::size_t batch, std::size_t accumulate) {
  return {.steps = 4, .batch = batch, .accumulate = accumulate, .seq = 16, .lr = 3e-3, .warmup = 1, .eval_every = 2, .save_every = 2,
          .out = out, .threads = 1, .seed = 3};
}

const tlm::gguf::file& q4_base() { return tlm_test::tiny_train_q4_base("test_train_accum"); }

using tlm_test::same_bits;
using tlm_test::worst_relative;

// The counted targets of tokens [b0 * T, b1 * T).
std::size_t counted(const tlm_test::batch& d, std::size_t b0, std::size_t b1, std::size_t t) {
  return static_cast<std::size_t>(std::count_if(d.targets.begin() + static_cast<std::ptrdiff_t>(b0 * t), d.targets.begin() + static_cast<std::ptrdiff_t>(b1 * t),
                                                [](std::int32_t y) { return y != tlm::ignore_target; }));
}

}  // namespace

TEST_CASE("accumulate: 4 micro-batches of 1 window, each weighed by its share of the counted targets, give the gradient of one batch of 4") {
  constexpr std::size_t B = 4, T = 8;
  const auto d = tlm_test::random_batch(B, T, C::vocab, 5);  // two targets ignored: the shares differ
  const std::size_t total = counted(d, 0, B, T);
  REQUIRE(total == B * T - 2);
  const auto micro = [&](std::size_t k) {
    return std::pair{std::span<const std::int32_t>(d.tokens).subspan(k * T, T), std::span<const std::int32_t>(d.targets).subspan(k * T, T)};
  };

  SUBCASE("full training") {
    const auto p = tlm_test::random_params<C, float>(6);
    auto whole = std::make_unique<tlm::trainable<C, float>>(), parts = std::make_unique<tlm::trainable<C, float>>();
    tlm::training<C, float> one({.batch = B, .seq = T, .threads = 1}), each({.batch = 1, .seq = T, .threads = 1});
    const double loss = one.forward(*p, d.tokens, d.targets);
    tlm::zero(*whole);
    one.backward(*p, *whole);
    tlm::zero(*parts);
    double acc = 0;
    for (std::size_t k = 0; k < B; ++k) {
      const double share = static_cast<double>(counted(d, k, k + 1, T)) / static_cast<double>(total);
      const auto [x, y] = micro(k);
      acc += each.forward(*p, x, y) * share;
      each.backward(*p, *parts, static_cast<float>(share));
    }
    const double worst = worst_relative(*parts, *whole);
    MESSAGE("full training: loss ", loss, " vs accumulated ", acc, "; worst gradient difference ", worst, " of the tensor's largest value");
    CHECK(std::abs(acc - loss) <= 1e-6 * loss);
    CHECK(worst < 1e-5);
  }
  SUBCASE("LoRA over a mapped Q4_1 base") {
    const auto pf = tlm_test::random_params<C, float>(7);
    const tlm_test::mapped_base<C> mb(*pf, tlm::encoding::q4_1);
    const auto ad = tlm_test::lively_adapter<adapter4>(8);
    auto whole = std::make_unique<adapter4>(), parts = std::make_unique<adapter4>();
    tlm::training<C, float> one({.batch = B, .seq = T, .threads = 1}), each({.batch = 1, .seq = T, .threads = 1});
    const double loss = one.forward(mb.w, *ad, d.tokens, d.targets);
    tlm::zero(*whole);
    one.backward(mb.w, *ad, *whole);
    tlm::zero(*parts);
    double acc = 0;
    for (std::size_t k = 0; k < B; ++k) {
      const double share = static_cast<double>(counted(d, k, k + 1, T)) / static_cast<double>(total);
      const auto [x, y] = micro(k);
      acc += each.forward(mb.w, *ad, x, y) * share;
      each.backward(mb.w, *ad, *parts, static_cast<float>(share));
    }
    const double worst = worst_relative(*parts, *whole);
    MESSAGE("LoRA: loss ", loss, " vs accumulated ", acc, "; worst gradient difference ", worst, " of the tensor's largest value");
    CHECK(std::abs(acc - loss) <= 1e-6 * loss);
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("trainer: --accumulate 4 of --batch 1 takes the steps --batch 4 takes: losses, held-out losses and parameters agree to rounding") {
  SUBCASE("full training") {
    tlm::trainer<C> big(options(fresh_dir("big"), 4, 1), data()), acc(options(fresh_dir("acc"), 1, 4), data());
    CHECK(std::abs(acc.held_out_loss() - big.held_out_loss()) <= 1e-6 * big.held_out_loss());
    big.run();
    acc.run();
    REQUIRE(acc.log().size() == 4);
    REQUIRE(big.log().size() == 4);
    double worst_loss = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      worst_loss = std::max(worst_loss, std::abs(acc.log()[i].loss - big.log()[i].loss) / big.log()[i].loss);
      CHECK(std::isnan(acc.log()[i].held_out) == std::isnan(big.log()[i].held_out));
      if (!std::isnan(big.log()[i].held_out)) CHECK(std::abs(acc.log()[i].held_out - big.log()[i].held_out) <= 1e-5 * big.log()[i].held_out);
    }
    const double worst = worst_relative(acc.parameters(), big.parameters());
    MESSAGE("full training, 4 steps: worst loss difference ", worst_loss, ", worst parameter difference ", worst, " of the tensor's largest value");
    CHECK(worst_loss < 1e-5);
    // AdamW divides each gradient entry by its own RMS, so an entry that is small by
    // cancellation, whose rounding is large next to it, moves its parameter a little
    // differently: measured 2.0e-4 (blk.1.ffn_down, 8.6e-6 on a tensor of 0.043; most
    // tensors 1e-6), a step's update being lr / scale = 7e-2 of it.
    CHECK(worst < 5e-4);
    CHECK(acc.state().data_position == 16);
    CHECK(big.state().data_position == 16);
  }
  SUBCASE("LoRA") {
    const tlm::gguf::file& base = q4_base();
    auto ob = options(fresh_dir("lora-big"), 4, 1), oa = options(fresh_dir("lora-acc"), 1, 4);
    ob.lr = oa.lr = 1e-2;
    ob.lora_alpha = oa.lora_alpha = 8;
    tlm::trainer<C, adapter4> big(ob, data(), &base), acc(oa, data(), &base);
    big.run();
    acc.run();
    double worst_loss = 0;
    for (std::size_t i = 0; i < 4; ++i) worst_loss = std::max(worst_loss, std::abs(acc.log()[i].loss - big.log()[i].loss) / big.log()[i].loss);
    const double worst = worst_relative(acc.parameters(), big.parameters());
    MESSAGE("LoRA, 4 steps: worst loss difference ", worst_loss, ", worst parameter difference ", worst, " of the tensor's largest value");
    CHECK(worst_loss < 1e-5);
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("trainer --accumulate: epochs count steps of accumulate * batch windows; a resume is bit-exact; another --accumulate is refused") {
  {
    // Refused before the output folder is made.
    const auto never = fs::path(TLM_BINARY_DIR) / "test_train_accum" / "never-made";
    fs::remove_all(never);
    CHECK_THROWS_WITH(tlm::trainer<C>(options(never, 2, 0), data()), doctest::Contains("--accumulate 0: a step needs at least one micro-batch"));
    CHECK(!fs::exists(never));
  }
  {
    auto o = options(fresh_dir("epochs"), 2, 3);
    o.steps = 0;
    o.epochs = 1;
    tlm::trainer<C> t(o, data());
    CHECK(t.total_steps() == (t.data().train.size() + 5) / 6);
  }
  const auto full_dir = fresh_dir("resume-full"), split_dir = fresh_dir("resume-split");
  auto o = options(full_dir, 2, 3);
  o.steps = 6;
  tlm::trainer<C> full(o, data());
  full.run();
  CHECK(full.state().data_position == 36);

  auto first = options(split_dir, 2, 3);
  first.steps = 6;
  first.stop_after = 3;
  tlm::trainer<C>(first, data()).run();
  auto second = first;
  second.stop_after = 0;
  second.resume = true;
  auto other = second;
  other.accumulate = 2;
  CHECK_THROWS_WITH(tlm::trainer<C>(other, data()), doctest::Contains("was made with --accumulate 3, this run has 2; use the same value to resume"));
  std::vector<std::string> warnings;
  tlm::trainer<C> resumed(second, data(), nullptr, {.warn = [&](const std::string& w) { warnings.push_back(w); }});
  CHECK(resumed.steps() == 3);
  CHECK(resumed.state().data_position == 18);
  CHECK(resumed.state().accumulate == 3);
  resumed.run();
  CHECK(warnings.empty());
  CHECK(same_bits(resumed.parameters(), full.parameters()));
  REQUIRE(resumed.log().size() == full.log().size());
  for (std::size_t i = 0; i < full.log().size(); ++i) {
    CHECK(resumed.log()[i].loss == full.log()[i].loss);
    CHECK((resumed.log()[i].held_out == full.log()[i].held_out || (std::isnan(resumed.log()[i].held_out) && std::isnan(full.log()[i].held_out))));
  }
  CHECK(resumed.state().data_position == 36);
}

TEST_CASE("recompute: every gradient equals the saved-activation path's bit for bit (full training and LoRA, 2 threads)") {
  constexpr std::size_t B = 3, T = 8;
  const auto d = tlm_test::random_batch(B, T, C::vocab, 21);
  SUBCASE("full training") {
    const auto p = tlm_test::random_params<C, float>(22);
    auto gs = std::make_unique<tlm::trainable<C, float>>(), gr = std::make_unique<tlm::trainable<C, float>>();
    tlm::training<C, float> saved({.batch = B, .seq = T, .threads = 2}), rerun({.batch = B, .seq = T, .threads = 2, .recompute = true});
    const double ls = saved.forward(*p, d.tokens, d.targets), lr = rerun.forward(*p, d.tokens, d.targets);
    CHECK(ls == lr);
    tlm::zero(*gs);
    tlm::zero(*gr);
    saved.backward(*p, *gs);
    rerun.backward(*p, *gr);
    CHECK(same_bits(*gs, *gr));
    // A second backward of the same forward reruns the last layer too: the same again.
    rerun.backward(*p, *gr);
    saved.backward(*p, *gs);
    CHECK(same_bits(*gs, *gr));
  }
  SUBCASE("LoRA over a mapped Q4_1 base") {
    const auto pf = tlm_test::random_params<C, float>(23);
    const tlm_test::mapped_base<C> mb(*pf, tlm::encoding::q4_1);
    const auto ad = tlm_test::lively_adapter<adapter4>(24);
    auto gs = std::make_unique<adapter4>(), gr = std::make_unique<adapter4>();
    tlm::training<C, float> saved({.batch = B, .seq = T, .threads = 2}), rerun({.batch = B, .seq = T, .threads = 2, .recompute = true});
    CHECK(saved.forward(mb.w, *ad, d.tokens, d.targets) == rerun.forward(mb.w, *ad, d.tokens, d.targets));
    tlm::zero(*gs);
    tlm::zero(*gr);
    saved.backward(mb.w, *ad, *gs);
    rerun.backward(mb.w, *ad, *gr);
    CHECK(same_bits(*gs, *gr));
  }
  SUBCASE("trainer with --recompute and --accumulate: the same parameters after 4 steps, bit for bit") {
    auto o = options(fresh_dir("plain"), 2, 2), r = options(fresh_dir("recompute"), 2, 2);
    r.recompute = true;
    tlm::trainer<C> plain(o, data()), rerun(r, data());
    plain.run();
    rerun.run();
    CHECK(same_bits(plain.parameters(), rerun.parameters()));
    for (std::size_t i = 0; i < 4; ++i) CHECK(plain.log()[i].loss == rerun.log()[i].loss);
  }
}

TEST_CASE("recompute: the activations kept, counted from the buffers, and the figure for smollm2_135m at seq 256") {
  constexpr std::size_t B = 2, T = 8;
  tlm::training<C, float> saved({.batch = B, .seq = T, .threads = 1}), rerun({.batch = B, .seq = T, .threads = 1, .recompute = true});
  using R = tlm::training<C, float>;
  CHECK(saved.activation_bytes() == R::kept_activation_bytes(B * T, false));
  CHECK(rerun.activation_bytes() == R::kept_activation_bytes(B * T, true));
  CHECK(rerun.activation_bytes() < saved.activation_bytes());

  // smollm2_135m (D 576, K 192, H 9, F 1536, 30 layers): a layer's set is 8457 values a
  // row; recompute keeps 30 inputs of 576 and one set without its x (7881).
  using S = tlm::training<tlm::smollm2_135m, float>;
  constexpr std::size_t rows = 256;  // one window of --seq 256
  static_assert(S::kept_activation_bytes(rows, false) == rows * 30 * 8457 * 4);
  static_assert(S::kept_activation_bytes(rows, true) == rows * (30 * 576 + 7881) * 4);
  const double saved_mib = static_cast<double>(S::kept_activation_bytes(rows, false) - S::kept_activation_bytes(rows, true)) / (1 << 20);
  MESSAGE("smollm2_135m, seq 256, per window: ", S::kept_activation_bytes(rows, false), " bytes kept without recompute, ",
          S::kept_activation_bytes(rows, true), " with; ", saved_mib, " MiB saved");
  CHECK(S::kept_activation_bytes(rows, false) == 259'799'040);
  CHECK(S::kept_activation_bytes(rows, true) == 25'764'864);
}

namespace {

// Chat JSONL for the packing runs: 9 short conversations (64 to 72 bytes as ChatML with
// byte tokens) and one of 463 bytes, cut into pieces of 256 and 206 at --seq 256.
// Unpacked that is 11 windows, packed 5 (test_train_data checks the windows).
std::string chat_file() {
  const auto dir = fs::path(TLM_BINARY_DIR) / "test_train_accum";
  fs::create_directories(dir);
  const auto path = dir / "chat.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < 9; ++i)
    out << R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A)" << std::string(static_cast<std::size_t>(i + 1), 'x')
        << "\"}]}\n";
  out << R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": ")" << std::string(400, 'z') << "\"}]}\n";
  return path.string();
}

tlm::data_source chat_data(bool pack, double held_out = 0.0) {
  return tlm::data_source::from_chat(chat_file(), tlm::byte_tokens, tlm::chat_template::of(""), 0, 256, held_out, {}, pack);
}

// One step over every window of the data (batch * accumulate of them): its loss is the
// mean over all the data's loss tokens, packed or not.
tlm::trainer_options whole_epoch(const fs::path& out, std::size_t batch, std::size_t accumulate, bool pack) {
  return {.steps = 1, .batch = batch, .accumulate = accumulate, .pack = pack, .seq = 256, .lr = 1e-3, .eval_every = 0,
          .save_every = 0, .out = out, .threads = 2, .seed = 5};
}

}  // namespace

TEST_CASE("trainer --pack: one step over all of a chat file, packed into 5 windows, takes the step of its 11 unpacked windows") {
  SUBCASE("full training, packed with --accumulate 5 of 1 window and --recompute") {
    auto po = whole_epoch(fresh_dir("pack-full"), 1, 5, true);
    po.recompute = true;
    tlm::trainer<C> packed(po, chat_data(true)), unpacked(whole_epoch(fresh_dir("unpack-full"), 11, 1, false), chat_data(false));
    REQUIRE(packed.data().train.size() == 5);
    REQUIRE(unpacked.data().train.size() == 11);
    packed.run();
    unpacked.run();
    const double loss_err = std::abs(packed.log()[0].loss - unpacked.log()[0].loss) / unpacked.log()[0].loss;
    const double worst = worst_relative(packed.parameters(), unpacked.parameters());
    MESSAGE("full training: 5 packed windows vs 11: loss ", packed.log()[0].loss, " vs ", unpacked.log()[0].loss, " (relative ", loss_err,
            "); worst parameter difference after the step ", worst, " of the tensor's largest value");
    CHECK(loss_err < 1e-5);
    CHECK(std::abs(packed.log()[0].grad_norm - unpacked.log()[0].grad_norm) <= 1e-5 * unpacked.log()[0].grad_norm);
    CHECK(worst < 1e-4);
  }
  SUBCASE("LoRA over a mapped Q4_1 base") {
    const tlm::gguf::file& base = q4_base();
    auto po = whole_epoch(fresh_dir("pack-lora"), 5, 1, true), uo = whole_epoch(fresh_dir("unpack-lora"), 11, 1, false);
    po.lora_alpha = uo.lora_alpha = 8;
    tlm::trainer<C, adapter4> packed(po, chat_data(true), &base), unpacked(uo, chat_data(false), &base);
    packed.run();
    unpacked.run();
    const double loss_err = std::abs(packed.log()[0].loss - unpacked.log()[0].loss) / unpacked.log()[0].loss;
    const double grad_err = std::abs(packed.log()[0].grad_norm - unpacked.log()[0].grad_norm) / unpacked.log()[0].grad_norm;
    MESSAGE("LoRA: 5 packed windows vs 11: loss ", packed.log()[0].loss, " vs ", unpacked.log()[0].loss, " (relative ", loss_err,
            "); gradient norm relative difference ", grad_err);
    CHECK(loss_err < 1e-5);
    CHECK(grad_err < 1e-5);
  }
}

TEST_CASE("trainer --pack: a resume is bit-exact; one with another --pack is refused; --pack needs chat data") {
  {
    const auto never = fs::path(TLM_BINARY_DIR) / "test_train_accum" / "never-made-pack";
    fs::remove_all(never);
    auto o = options(never, 2, 1);
    o.pack = true;
    CHECK_THROWS_WITH(tlm::trainer<C>(o, data()), doctest::Contains("--pack packs chat examples several to a window: it needs --chat"));
    CHECK_THROWS_WITH(tlm::trainer<C>(whole_epoch(never, 1, 1, false), chat_data(true)),
                      doctest::Contains("trainer_options::pack is off, but the data source's windows are packed"));
    CHECK(!fs::exists(never));
    // A source made by hand that says it packs and loads plain windows.
    auto liar = data();
    liar.pack = true;
    auto lo = options(fresh_dir("pack-liar"), 2, 1);
    lo.pack = true;
    CHECK_THROWS_WITH(tlm::trainer<C>(lo, liar), doctest::Contains("trainer_options::pack is on, but the data source"));
    CHECK_THROWS_WITH(tlm::trainer<C>(lo, liar), doctest::Contains("loaded windows without starts; set data_source::pack to what its load() gives"));
  }
  auto o = whole_epoch(fresh_dir("pack-resume-full"), 2, 1, true);
  o.steps = 4;
  o.save_every = 2;
  tlm::trainer<C> full(o, chat_data(true, 0.2));
  full.run();
  auto first = o;
  first.out = fresh_dir("pack-resume-split");
  first.stop_after = 2;
  tlm::trainer<C>(first, chat_data(true, 0.2)).run();
  auto second = first;
  second.stop_after = 0;
  second.resume = true;
  auto unpacked = second;
  unpacked.pack = false;
  CHECK_THROWS_WITH(tlm::trainer<C>(unpacked, chat_data(false, 0.2)),
                    doctest::Contains("was made with --pack on, this run has off; use the same value to resume"));
  tlm::trainer<C> resumed(second, chat_data(true, 0.2));
  CHECK(resumed.steps() == 2);
  CHECK(resumed.state().pack);
  resumed.run();
  CHECK(same_bits(resumed.parameters(), full.parameters()));
  REQUIRE(resumed.log().size() == full.log().size());
  for (std::size_t i = 0; i < full.log().size(); ++i) CHECK(resumed.log()[i].loss == full.log()[i].loss);
}

}  // namespace test_train_accum
