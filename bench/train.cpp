// Training step time: forward, cross-entropy, backward and AdamW on random tokens,
// as bench/train_vs_torch.py runs it next to PyTorch. Prints one JSON line.
//
//   train --config tiny_train|smollm2_135m [--batch B] [--seq T] [--threads N] [--steps S]
//         [--model FILE.gguf]   (start from a real model's weights instead of the N(0, 0.02) init)

#include <fmt/core.h>
#include <tlm/load.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/step.hpp>
#include <tlm/train/weights.hpp>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "machine.hpp"

namespace {

struct options {
  std::string config = "tiny_train", model;
  std::size_t batch = 4, seq = 16, threads = 1, steps = 20;
};

template <tlm::LlamaConfig C>
int run(const options& o) {
  auto p = std::make_unique<tlm::trainable<C, float>>();
  if (!o.model.empty()) {
    const tlm::gguf::file f(o.model);
    p = tlm::to_trainable<float>(tlm::bind<C>(f));
  } else {
    tlm::init_weights(*p, 42);
  }
  auto g = std::make_unique<tlm::trainable<C, float>>();
  tlm::training<C, float> tr({.batch = o.batch, .seq = o.seq, .threads = o.threads});
  tlm::adamw<tlm::trainable<C, float>> opt({.lr = 1e-4, .weight_decay = 0.01, .clip = 1.0});
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(C::vocab) - 1);
  std::vector<std::int32_t> tokens(o.batch * (o.seq + 1));
  std::vector<std::int32_t> x(o.batch * o.seq), y(o.batch * o.seq);
  std::vector<double> ms, fwd_ms, bwd_ms, opt_ms;
  double loss = 0;
  const std::size_t warmup = 2;
  for (std::size_t s = 0; s < o.steps + warmup; ++s) {
    for (auto& t : tokens) t = tok(rng);
    for (std::size_t b = 0; b < o.batch; ++b)
      for (std::size_t t = 0; t < o.seq; ++t) {
        x[b * o.seq + t] = tokens[b * (o.seq + 1) + t];
        y[b * o.seq + t] = tokens[b * (o.seq + 1) + t + 1];
      }
    using clock = std::chrono::steady_clock;
    auto elapsed = [](clock::time_point a, clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    const auto t0 = clock::now();
    loss = tr.forward(*p, x, y);
    const auto t1 = clock::now();
    tlm::zero(*g, &tr.pool());
    tr.backward(*p, *g);
    const auto t2 = clock::now();
    opt.step(*p, *g, &tr.pool());
    const auto t3 = clock::now();
    if (s >= warmup) {
      ms.push_back(elapsed(t0, t3));
      fwd_ms.push_back(elapsed(t0, t1));
      bwd_ms.push_back(elapsed(t1, t2));
      opt_ms.push_back(elapsed(t2, t3));
    }
  }
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  fmt::print("{{\"config\": \"{}\", \"batch\": {}, \"seq\": {}, \"threads\": {}, \"steps\": {}, \"ms_per_step\": {:.3f}, "
             "\"ms_min\": {:.3f}, \"tokens_per_s\": {:.1f}, \"peak_rss_mb\": {:.1f}, \"final_loss\": {:.4f}, \"forward_ms\": {:.3f}, \"backward_ms\": {:.3f}, "
             "\"adamw_ms\": {:.3f}, \"kernel_level\": \"{}\"}}\n",
             o.config, o.batch, o.seq, o.threads, ms.size(), median, ms.front(),
             1000.0 * static_cast<double>(o.batch * o.seq) / median, tlm_bench::peak_rss_mb(), loss, median_of(fwd_ms), median_of(bwd_ms),
             median_of(opt_ms), tlm::kernels::kernel_level_name());
  return 0;
}

std::size_t number(const std::string& flag, const char* v) { return tlm_bench::positive_number("train", flag, v); }

}  // namespace

int main(int argc, char** argv) {
  try {
    options o;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (i + 1 >= argc) throw tlm::error("train: " + a + " needs a value");
      const char* v = argv[++i];
      if (a == "--config") o.config = v;
      else if (a == "--model") o.model = v;
      else if (a == "--batch") o.batch = number(a, v);
      else if (a == "--seq") o.seq = number(a, v);
      else if (a == "--threads") o.threads = number(a, v);
      else if (a == "--steps") o.steps = number(a, v);
      else throw tlm::error("train: unknown option '" + a + "'");
    }
    if (o.config == "tiny_train") return run<tlm::tiny_train>(o);
    if (o.config == "smollm2_135m") return run<tlm::smollm2_135m>(o);
    throw tlm::error("train: --config is tiny_train or smollm2_135m, not '" + o.config + "'");
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
