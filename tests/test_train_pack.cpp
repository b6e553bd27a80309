// Packed examples (training::forward's starts, train --pack): several examples share a
// sequence, each attending only to itself with positions from 0. The packed batch must
// compute what the examples compute each in a row of its own: the same logits at each
// example's tokens, the same loss (the mean over all counted targets of the batch) and
// the same gradients, up to the order of the sums over rows (so to rounding, not bit for
// bit). Recompute stays bit-exact when packed, and no example sees another: changing one
// leaves the others' logits the same bit for bit. The data side (window_packer,
// load_chat's pack) is in test_train_data; the trainer's in test_train_accum.
#include <doctest/doctest.h>

#include <tlm/train/lora.hpp>
#include <tlm/train/step.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "train_common.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_pack {

namespace {

constexpr std::size_t T = 12;       // window length
constexpr std::int32_t pad = 1;     // the padding token

// One example: inputs[t] predicts targets[t] (some targets ignored).
struct example {
  std::vector<std::int32_t> inputs, targets;
};

// Five examples of 5, 4, 3, 7 and 2 tokens, random, with a few targets ignored.
std::vector<example> examples(std::size_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<example> out;
  for (const std::size_t len : {5u, 4u, 3u, 7u, 2u}) {
    example e;
    for (std::size_t t = 0; t < len; ++t) {
      e.inputs.push_back(tok(rng));
      e.targets.push_back(tok(rng));
    }
    out.push_back(std::move(e));
  }
  out[0].targets[1] = tlm::ignore_target;
  out[3].targets[0] = tlm::ignore_target;
  out[3].targets[4] = tlm::ignore_target;
  return out;
}

// Where each example goes in the packed batch of 2 rows of T: (row, first position).
// Row 0 is full (5 + 4 + 3); row 1 holds 7 + 2 and 3 positions of padding.
constexpr std::size_t where[5][2] = {{0, 0}, {0, 5}, {0, 9}, {1, 0}, {1, 7}};

struct layout {
  std::vector<std::int32_t> tokens, targets;  // [B * T]
  std::vector<std::uint32_t> starts;          // [B * T] packed only
};

// The examples packed 2 rows of T as `where` says; the padding its own segment.
layout packed(const std::vector<example>& ex) {
  layout l{std::vector<std::int32_t>(2 * T, pad), std::vector<std::int32_t>(2 * T, tlm::ignore_target), std::vector<std::uint32_t>(2 * T, 0)};
  for (std::size_t r = 0; r < 2; ++r)
    for (std::size_t t = 0; t < T; ++t) l.starts[r * T + t] = static_cast<std::uint32_t>(t);  // padding: overwritten below where used
  std::vector<std::size_t> used(2, 0);
  for (std::size_t k = 0; k < ex.size(); ++k) {
    const std::size_t at = where[k][0] * T + where[k][1];
    std::copy(ex[k].inputs.begin(), ex[k].inputs.end(), l.tokens.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(ex[k].targets.begin(), ex[k].targets.end(), l.targets.begin() + static_cast<std::ptrdiff_t>(at));
    std::fill_n(l.starts.begin() + static_cast<std::ptrdiff_t>(at), ex[k].inputs.size(), static_cast<std::uint32_t>(where[k][1]));
    used[where[k][0]] = where[k][1] + ex[k].inputs.size();
  }
  for (std::size_t r = 0; r < 2; ++r)
    for (std::size_t t = used[r]; t < T; ++t) l.starts[r * T + t] = static_cast<std::uint32_t>(used[r]);
  return l;
}

// The row of the examples one per row that example k takes: in reverse, so that the
// sums over rows (the weights' gradients, the loss) add the examples' terms in another
// order than the packed batch does, and the comparison is one to rounding. (In the same
// order it comes out exact: the padding rows add exact zeros.)
std::size_t alone_row(std::size_t k) { return 4 - k; }

// The examples one to a row of T (5 rows), padded after their end, no starts: the
// unpacked path.
layout one_per_row(const std::vector<example>& ex) {
  layout l{std::vector<std::int32_t>(ex.size() * T, pad), std::vector<std::int32_t>(ex.size() * T, tlm::ignore_target), {}};
  for (std::size_t k = 0; k < ex.size(); ++k) {
    const std::size_t at = alone_row(k) * T;
    std::copy(ex[k].inputs.begin(), ex[k].inputs.end(), l.tokens.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(ex[k].targets.begin(), ex[k].targets.end(), l.targets.begin() + static_cast<std::ptrdiff_t>(at));
  }
  return l;
}

using tlm_test::same_bits;
using tlm_test::worst_relative;

// The largest |value| of any tensor: a gradient that is not all zeros.
template <class A>
double largest(const A& a) {
  double m = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, const auto& x) {
        for (const auto v : x.values()) m = std::max(m, std::abs(static_cast<double>(v)));
      },
      a);
  return m;
}


// The worst difference of each example's logits packed and alone, measured against the
// largest logit.   packed_logits: [2 * T, V]   alone: [5 * T, V]
template <class R>
double worst_logits(const R& packed_logits, const R& alone, const std::vector<example>& ex) {
  double diff = 0, scale = 0;
  for (std::size_t k = 0; k < ex.size(); ++k)
    for (std::size_t t = 0; t < ex[k].inputs.size(); ++t) {
      const auto p = packed_logits.row(where[k][0] * T + where[k][1] + t);
      const auto a = alone.row(alone_row(k) * T + t);
      for (std::size_t v = 0; v < p.size(); ++v) {
        diff = std::max(diff, std::abs(static_cast<double>(p[v]) - static_cast<double>(a[v])));
        scale = std::max(scale, std::abs(static_cast<double>(a[v])));
      }
    }
  return diff / scale;
}

// Full training of config C in element type E: packed against one example per row.
template <tlm::LlamaConfig C, class E>
void check_full(double tolerance, const std::string& what) {
  const auto ex = examples(C::vocab, 31);
  const layout pk = packed(ex), rows = one_per_row(ex);
  const auto p = tlm_test::random_params<C, E>(32);
  tlm::training<C, E> packed_run({.batch = 2, .seq = T, .threads = 2}), alone_run({.batch = 5, .seq = T, .threads = 2});
  auto gp = std::make_unique<tlm::trainable<C, E>>(), ga = std::make_unique<tlm::trainable<C, E>>();
  const double lp = packed_run.forward(*p, pk.tokens, pk.targets, pk.starts);
  const double la = alone_run.forward(*p, rows.tokens, rows.targets);
  tlm::zero(*gp);
  tlm::zero(*ga);
  packed_run.backward(*p, *gp);
  alone_run.backward(*p, *ga);
  const double loss_err = std::abs(lp - la) / la;
  const double logit_err = worst_logits(packed_run.logits(), alone_run.logits(), ex);
  const double grad_err = worst_relative(*gp, *ga);
  MESSAGE(what, ": loss ", lp, " packed vs ", la, " one per row (relative ", loss_err, "); logits ", logit_err,
          "; worst gradient ", grad_err, " of the tensor's largest value");
  CHECK(loss_err <= tolerance);
  CHECK(logit_err <= tolerance);
  CHECK(grad_err <= tolerance);
  CHECK(largest(*ga) > 0);
  // The same batch without its starts lets the examples attend to each other and
  // rotates them by their places in the row: another loss.
  CHECK(packed_run.forward(*p, pk.tokens, pk.targets) != lp);
}

using adapter = tlm::lora<tlm::tiny_gqa, 4>;  // q, k, v, o

}  // namespace

TEST_CASE("pack: loss, logits and gradients of packed examples equal the examples one per row (full model, double and float)") {
  check_full<tlm::tiny_gqa, double>(1e-12, "tiny_gqa, double");
  check_full<tlm::tiny_qwen2, double>(1e-12, "tiny_qwen2 (biases, half-split RoPE), double");
  check_full<tlm::tiny_gqa, float>(1e-5, "tiny_gqa, float");
  check_full<tlm::tiny_qwen2, float>(1e-5, "tiny_qwen2, float");
}

TEST_CASE("pack: a LoRA adapter over a mapped Q4_1 base: packed equals one per row") {
  using C = tlm::tiny_gqa;
  const auto ex = examples(C::vocab, 41);
  const layout pk = packed(ex), rows = one_per_row(ex);
  const auto pf = tlm_test::random_params<C, float>(42);
  const tlm_test::mapped_base<C> mb(*pf, tlm::encoding::q4_1);
  const auto ad = tlm_test::lively_adapter<adapter>(43);
  tlm::training<C, float> packed_run({.batch = 2, .seq = T, .threads = 2}), alone_run({.batch = 5, .seq = T, .threads = 2});
  auto gp = std::make_unique<adapter>(), ga = std::make_unique<adapter>();
  const double lp = packed_run.forward(mb.w, *ad, pk.tokens, pk.targets, pk.starts);
  const double la = alone_run.forward(mb.w, *ad, rows.tokens, rows.targets);
  tlm::zero(*gp);
  tlm::zero(*ga);
  packed_run.backward(mb.w, *ad, *gp);
  alone_run.backward(mb.w, *ad, *ga);
  const double loss_err = std::abs(lp - la) / la, logit_err = worst_logits(packed_run.logits(), alone_run.logits(), ex);
  const double grad_err = worst_relative(*gp, *ga);
  MESSAGE("LoRA over Q4_1: loss ", lp, " packed vs ", la, " one per row (relative ", loss_err, "); logits ", logit_err,
          "; worst adapter gradient ", grad_err);
  CHECK(loss_err <= 1e-5);
  CHECK(logit_err <= 1e-5);
  CHECK(grad_err <= 1e-5);
  CHECK(largest(*ga) > 0);
  CHECK(packed_run.forward(mb.w, *ad, pk.tokens, pk.targets) != lp);
}

TEST_CASE("pack: with recompute the packed gradients are the same bit for bit (full training and LoRA, 2 threads)") {
  using C = tlm::tiny_gqa;
  const layout pk = packed(examples(C::vocab, 51));
  SUBCASE("full training") {
    const auto p = tlm_test::random_params<C, float>(52);
    tlm::training<C, float> saved({.batch = 2, .seq = T, .threads = 2}), rerun({.batch = 2, .seq = T, .threads = 2, .recompute = true});
    auto gs = std::make_unique<tlm::trainable<C, float>>(), gr = std::make_unique<tlm::trainable<C, float>>();
    CHECK(saved.forward(*p, pk.tokens, pk.targets, pk.starts) == rerun.forward(*p, pk.tokens, pk.targets, pk.starts));
    tlm::zero(*gs);
    tlm::zero(*gr);
    saved.backward(*p, *gs);
    rerun.backward(*p, *gr);
    CHECK(same_bits(*gs, *gr));
  }
  SUBCASE("LoRA over a mapped Q4_1 base") {
    const auto pf = tlm_test::random_params<C, float>(53);
    const tlm_test::mapped_base<C> mb(*pf, tlm::encoding::q4_1);
    const auto ad = tlm_test::lively_adapter<adapter>(54);
    tlm::training<C, float> saved({.batch = 2, .seq = T, .threads = 2}), rerun({.batch = 2, .seq = T, .threads = 2, .recompute = true});
    auto gs = std::make_unique<adapter>(), gr = std::make_unique<adapter>();
    CHECK(saved.forward(mb.w, *ad, pk.tokens, pk.targets, pk.starts) == rerun.forward(mb.w, *ad, pk.tokens, pk.targets, pk.starts));
    tlm::zero(*gs);
    tlm::zero(*gr);
    saved.backward(mb.w, *ad, *gs);
    rerun.backward(mb.w, *ad, *gr);
    CHECK(same_bits(*gs, *gr));
  }
}

TEST_CASE("pack: no example sees another: a token changed in one leaves the others' logits the same bit for bit") {
  using C = tlm::tiny_qwen2;
  auto ex = examples(C::vocab, 61);
  const auto p = tlm_test::random_params<C, float>(62);
  tlm::training<C, float> run({.batch = 2, .seq = T, .threads = 2});
  const layout before = packed(ex);
  run.forward(*p, before.tokens, before.targets, before.starts);
  const tlm::rows<C::vocab, float> logits_before = run.logits();
  // Example 1 (row 0, positions 5..8), its second token; example 2 follows it in the row.
  ex[1].inputs[1] = (ex[1].inputs[1] + 1) % static_cast<std::int32_t>(C::vocab);
  const layout after = packed(ex);
  run.forward(*p, after.tokens, after.targets, after.starts);
  const auto same_row = [&](std::size_t i) {
    return std::memcmp(logits_before.row(i).data(), run.logits().row(i).data(), C::vocab * sizeof(float)) == 0;
  };
  for (std::size_t i = 0; i < 2 * T; ++i) {
    const bool in_changed = i >= 5 + 1 && i < 5 + 4;  // example 1 from the changed token on
    INFO("row " << i / T << ", position " << i % T);
    if (in_changed) CHECK(!same_row(i));
    else CHECK(same_row(i));
  }
}

TEST_CASE("pack: starts of one segment per sequence compute exactly the unpacked path, bit for bit") {
  using C = tlm::tiny_gqa;
  const auto d = tlm_test::random_batch(2, T, C::vocab, 71);
  const std::vector<std::uint32_t> zeros(2 * T, 0);  // every token's example starts at 0: one per sequence
  const auto p = tlm_test::random_params<C, float>(72);
  tlm::training<C, float> run({.batch = 2, .seq = T, .threads = 2});
  auto g0 = std::make_unique<tlm::trainable<C, float>>(), g1 = std::make_unique<tlm::trainable<C, float>>();
  const double l0 = run.forward(*p, d.tokens, d.targets);
  const tlm::rows<C::vocab, float> logits0 = run.logits();
  tlm::zero(*g0);
  run.backward(*p, *g0);
  const double l1 = run.forward(*p, d.tokens, d.targets, zeros);
  tlm::zero(*g1);
  run.backward(*p, *g1);
  CHECK(l0 == l1);
  CHECK(std::memcmp(logits0.data(), run.logits().data(), 2 * T * C::vocab * sizeof(float)) == 0);
  CHECK(same_bits(*g0, *g1));
}

TEST_CASE("pack: starts that do not describe examples one after another are refused, naming the token") {
  using C = tlm::tiny_gqa;
  const auto d = tlm_test::random_batch(2, T, C::vocab, 81);
  const auto p = tlm_test::random_params<C, float>(82);
  tlm::training<C, float> run({.batch = 2, .seq = T, .threads = 1});
  const std::vector<std::uint32_t> short_starts(T, 0);
  CHECK_THROWS_WITH(run.forward(*p, d.tokens, d.targets, short_starts),
                    doctest::Contains("12 segment starts for a batch of 24 tokens; give one per token"));
  std::vector<std::uint32_t> bad(2 * T, 0);
  bad[T + 3] = 2;  // sequence 1, token 3: its example would start at 2, where token 2's does not
  CHECK_THROWS_WITH(run.forward(*p, d.tokens, d.targets, bad),
                    doctest::Contains("token 3 of sequence 1 starts its example at 2; a token's example starts at the token itself"));
  bad[T + 3] = 5;  // after the token itself
  CHECK_THROWS_WITH(run.forward(*p, d.tokens, d.targets, bad), doctest::Contains("token 3 of sequence 1 starts its example at 5"));
}

}  // namespace test_train_pack
