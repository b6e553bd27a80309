// LoRA fine-tuning step time and peak RSS: a rank-16 adapter on q, k, v, o over a frozen
// base read from a GGUF file, as bench/lora_vs_torch.py runs it (next to PyTorch at 135M,
// alone at the 1B-class shapes). Prints one JSON line.
//
//   lora --config smollm2_135m|smollm2_1_7b|llama32_1b --model FILE.gguf [--base mapped|f32]
//        [--batch B] [--seq T] [--threads N] [--steps S] [--recompute]
//
// --base mapped (default): the file's tensors multiply in their own encoding, mapped
// read-only, as `train --lora` runs. --base f32: the base dequantized into owned f32
// weights first, the same arithmetic PyTorch does (it has no Q4 matrix product on CPU).
#include <fmt/core.h>
#include <tlm/load.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/step.hpp>
#include <tlm/train/weights.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "machine.hpp"

namespace {

using tlm_bench::peak_rss_mb;

struct options {
  std::string config = "smollm2_135m", model, base = "mapped";
  std::size_t batch = 4, seq = 512, threads = 1, steps = 3;
  bool recompute = false;
};

template <tlm::LlamaConfig C, class Base>
int run_over(const options& o, const Base& base, double load_s, double rss_after_load) {
  using A = tlm::lora<C, 16>;  // q, k, v, o
  auto ad = std::make_unique<A>(), g = std::make_unique<A>();
  tlm::init_lora(*ad, 5);
  ad->alpha = 32;
  tlm::training<C, float> tr({.batch = o.batch, .seq = o.seq, .threads = o.threads, .recompute = o.recompute});
  tlm::adamw<A> opt({.lr = 1e-4, .weight_decay = 0.0, .clip = 1.0});
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(C::vocab) - 1);
  std::vector<std::int32_t> x(o.batch * o.seq), y(o.batch * o.seq);  // [B, T]
  std::vector<double> ms, fwd_ms, bwd_ms;
  double loss = 0;
  const std::size_t warmup = 1;
  using clock = std::chrono::steady_clock;
  auto elapsed = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  for (std::size_t s = 0; s < o.steps + warmup; ++s) {
    for (auto& t : x) t = tok(rng);
    for (auto& t : y) t = tok(rng);
    const auto t0 = clock::now();
    loss = tr.forward(base, *ad, x, y);
    const auto t1 = clock::now();
    tlm::zero(*g, &tr.pool());
    tr.backward(base, *ad, *g);
    opt.step(*ad, *g, &tr.pool());
    const auto t2 = clock::now();
    if (s >= warmup) {
      ms.push_back(elapsed(t0, t2));
      fwd_ms.push_back(elapsed(t0, t1));
      bwd_ms.push_back(elapsed(t1, t2));
    }
  }
  using tlm_bench::median;
  const double step_ms = median(ms);
  fmt::print("{{\"config\": \"{}\", \"base\": \"{}\", \"batch\": {}, \"seq\": {}, \"threads\": {}, \"recompute\": {}, "
             "\"steps\": {}, \"ms_per_step\": {:.1f}, \"forward_ms\": {:.1f}, \"backward_adamw_ms\": {:.1f}, "
             "\"tokens_per_s\": {:.1f}, \"adapter_values\": {}, \"activation_mb\": {:.1f}, \"load_s\": {:.2f}, "
             "\"rss_after_load_mb\": {:.1f}, \"peak_rss_mb\": {:.1f}, \"final_loss\": {:.4f}, \"kernel_level\": \"{}\"}}\n",
             o.config, o.base, o.batch, o.seq, o.threads, o.recompute ? "true" : "false", ms.size(), step_ms,
             median(fwd_ms), median(bwd_ms), 1000.0 * static_cast<double>(o.batch * o.seq) / step_ms,
             tlm::parameter_count(*ad), static_cast<double>(tr.activation_bytes()) / (1024.0 * 1024.0), load_s,
             rss_after_load, peak_rss_mb(), loss, tlm::kernels::kernel_level_name());
  return 0;
}

template <tlm::LlamaConfig C>
int run(const options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const tlm::gguf::file f(o.model);
  const auto mapped = tlm::bind<C>(f);
  if (o.base == "mapped") {
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return run_over<C>(o, mapped, load_s, peak_rss_mb());
  }
  const auto owned = tlm::to_trainable<float>(mapped);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return run_over<C>(o, *owned, load_s, peak_rss_mb());
}

std::size_t number(const std::string& flag, const char* v) { return tlm_bench::positive_number("lora", flag, v); }

}  // namespace

int main(int argc, char** argv) {
  try {
    options o;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--recompute") {
        o.recompute = true;
        continue;
      }
      if (i + 1 >= argc) throw tlm::error("lora: " + a + " needs a value");
      const char* v = argv[++i];
      if (a == "--config") o.config = v;
      else if (a == "--model") o.model = v;
      else if (a == "--base") o.base = v;
      else if (a == "--batch") o.batch = number(a, v);
      else if (a == "--seq") o.seq = number(a, v);
      else if (a == "--threads") o.threads = number(a, v);
      else if (a == "--steps") o.steps = number(a, v);
      else throw tlm::error("lora: unknown option '" + a + "'");
    }
    if (o.model.empty()) throw tlm::error("lora: give --model FILE.gguf (the frozen base)");
    if (o.base != "mapped" && o.base != "f32") throw tlm::error("lora: --base is mapped or f32, not '" + o.base + "'");
    if (o.config == "smollm2_135m") return run<tlm::smollm2_135m>(o);
    if (o.config == "smollm2_1_7b") return run<tlm::smollm2_1_7b>(o);
    if (o.config == "llama32_1b") return run<tlm::llama32_1b>(o);
    throw tlm::error("lora: --config is smollm2_135m, smollm2_1_7b or llama32_1b, not '" + o.config + "'");
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
