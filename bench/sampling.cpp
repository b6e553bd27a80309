// The serial work between two decode steps that grows with the vocabulary: the check
// that every logit is finite (detail::require_finite_logits) and greedy sampling's
// argmax, on a row of random logits of SmolLM2's and Llama 3's vocabulary sizes, against
// the scalar loops they replaced on 2026-12-07 in the same run. One thread: the pool's
// other threads wait while the calling thread does this. The results must agree; the
// program exits 1 when they do not.
//
//   sampling [--reps N] [--out FILE]
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <tlm/cpu.hpp>
#include <tlm/generation/decode.hpp>
#include <tlm/generation/sampler.hpp>

#include "machine.hpp"

namespace {

// The loops before 2026-12-07.
std::int32_t argmax_plain(std::span<const float> l) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < l.size(); ++i)
    if (l[i] > l[best]) best = i;
  return static_cast<std::int32_t>(best);
}

bool finite_plain(std::span<const float> l) {
  for (const float v : l)
    if (!std::isfinite(v)) return false;
  return true;
}

// Keeps a result alive so the timed call is not optimized away.
volatile std::int64_t sink = 0;

}  // namespace

int main(int argc, char** argv) try {
  std::size_t reps = 201;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = tlm_bench::positive_number("sampling", "--reps", argv[++i]);
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: sampling [--reps N] [--out FILE]\n");
      return 2;
    }
  }
  const std::string load_before = tlm_bench::load_average();
  std::string table =
      "| vocabulary | finite check µs | plain µs | plain / check | argmax µs | plain µs | plain / argmax |\n"
      "|---|---|---|---|---|---|---|\n";
  bool agree = true;
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  for (const std::size_t vocab : {std::size_t{49152}, std::size_t{128256}}) {
    std::vector<float> l(vocab);
    for (float& v : l) v = logit(rng);
    double check = 0, check_plain = 0, best = 0, best_plain = 0;
    // Interleaved, so that a busy moment of the machine falls on both.
    for (int round = 0; round < 3; ++round) {
      check += tlm_bench::median_us(reps, [&] { tlm::detail::require_finite_logits(l, 0); });
      check_plain += tlm_bench::median_us(reps, [&] { sink = sink + finite_plain(l); });
      best += tlm_bench::median_us(reps, [&] { sink = sink + tlm::argmax(l); });
      best_plain += tlm_bench::median_us(reps, [&] { sink = sink + argmax_plain(l); });
    }
    if (tlm::argmax(l) != argmax_plain(l)) {
      agree = false;
      std::fprintf(stderr, "sampling bench: argmax differs from the plain loop at vocabulary %zu\n", vocab);
    }
    table += fmt::format("| {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n", vocab, check / 3, check_plain / 3,
                         check_plain / check, best / 3, best_plain / 3, best_plain / best);
  }
  const std::string doc = fmt::format(
      "# Per-token scans of the logits: the finite check and argmax\n\n- CPU: {} ({}); load average before: {}, after: {}\n"
      "- Random logits (normal, sd 4); median of {} calls, 3 interleaved rounds averaged; one thread.\n"
      "- Produced by `bench/sampling.cpp`.\n\n{}",
      tlm_bench::cpu_model(), tlm::cpu_feature_string(), load_before, tlm_bench::load_average(), reps, table);
  const int written = tlm_bench::publish(doc, out_path);
  return agree ? written : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sampling bench: %s\n", e.what());
  return 2;
}
