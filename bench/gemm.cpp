// Training GEMM speed (kernels/gemm.hpp) on the shapes of SmolLM2-135M, next to the
// machine's measured FMA peak.
//
//   gemm [--rounds N] [--quick] [--out FILE]
//
// n = 512 rows (a batch of B x T tokens), C = 576 inputs, R outputs in {576 (attn q/o),
// 192 (attn k/v), 1536 (ffn gate/up), 49152 (output projection)}; for each R the
// three calls a linear layer makes in training:
//   forward          Y[n, R]  = X[n, C] . W^T     gemm(no, yes, n, R, C)
//   input gradient   dX[n, C] += dY[n, R] . W     gemm(no, no,  n, C, R)
//   weight gradient  dW[R, C] += dY^T . X         gemm(yes, no, R, C, n)
//
// Peak: a loop of independent FMAs on registers only (12 accumulators, no memory),
// per level: scalar = SSE mul + add (the baseline the portable path compiles to),
// avx2 = 256-bit FMA, avx512 = 512-bit FMA; at 2 threads both threads run the loop.
// The portable path is not timed on the output projection (seconds per call).
// Every measurement runs once per round, rounds interleaved, median reported: the
// machine is shared, and interleaving spreads a disturbance over all rows.
#include "machine.hpp"
#include <tlm/kernels/gemm.hpp>
#include <tlm/thread_pool.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace {

namespace k = tlm::kernels;
using k::transpose;
using clock_type = std::chrono::steady_clock;

using tlm_bench::cpu_model;
using tlm_bench::load_average;
using tlm_bench::median;

// CPU time of every thread of the process: with 2 threads, flops over it is the speed
// per core while the cores were held (spinning while waiting for a thread counts).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

volatile float sink = 0;

// Register-only FMA loops: `iters` steps of 12 independent chains. Returns flops done.
#if defined(__x86_64__) || defined(__i386__)
double peak_loop_sse(std::size_t iters) {
  __m128 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m128 x = _mm_set1_ps(0.999999f), y = _mm_set1_ps(1e-7f);
  for (std::size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], x), y);
  }
  __m128 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm_add_ps(s, acc[i]);
  sink = sink + _mm_cvtss_f32(s);
  return static_cast<double>(iters) * 12 * 4 * 2;
}

[[gnu::target("avx2,fma")]] double peak_loop_avx2(std::size_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (std::size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  sink = sink + _mm256_cvtss_f32(s);
  return static_cast<double>(iters) * 12 * 8 * 2;
}

[[gnu::target("avx512f")]] double peak_loop_avx512(std::size_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (std::size_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: GCC 12 warns inside it
  _mm512_store_ps(lanes, s);
  sink = sink + lanes[0] + lanes[15];
  return static_cast<double>(iters) * 12 * 16 * 2;
}
#endif

// The loop of the widest vectors the level's row names in its target (levels.hpp), so a
// new level needs no change here: amx's target includes avx512's, whose GEMM it trains with.
double peak_loop(tlm::kernel_level level, std::size_t iters) {
#if defined(__x86_64__) || defined(__i386__)
  const std::string_view target = tlm::kernel_level_row_of(level).target;
  if (target.find("avx512f") != std::string_view::npos) return peak_loop_avx512(iters);
  if (target.find("fma") != std::string_view::npos) return peak_loop_avx2(iters);
  return peak_loop_sse(iters);
#else
  (void)level;
  (void)iters;
  return 0;
#endif
}

struct measurement {
  std::string call, shape;
  tlm::kernel_level level = tlm::kernel_level::scalar;
  std::size_t threads = 1;
  double flops = 0;                       // per call
  std::function<double()> run;            // one call; returns flops if it counts them itself
  std::size_t reps = 1;
  std::vector<double> seconds, cpu;       // per call, one entry per round
};

double time_once(measurement& m, double* cpu) {
  const double c0 = process_cpu_seconds();
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < m.reps; ++i) m.run();
  const double reps = static_cast<double>(m.reps);
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count() / reps;
  *cpu = (process_cpu_seconds() - c0) / reps;
  return wall;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  double target = 0.2;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      rounds = 1;
      target = 0.01;
    } else if (a == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else {
      std::cerr << "usage: gemm [--rounds N] [--quick] [--out FILE]\n";
      return 2;
    }
  }

  const auto levels = tlm::supported_kernel_levels();
  const std::size_t thread_counts[] = {1, 2};
  std::vector<std::unique_ptr<tlm::thread_pool>> pools;
  for (std::size_t t : thread_counts) pools.push_back(std::make_unique<tlm::thread_pool>(t));

  std::vector<measurement> ms;
  constexpr std::size_t peak_iters = 2'000'000;
  for (auto level : levels) {
    for (auto& pool_ptr : pools) {
      tlm::thread_pool* pool = pool_ptr.get();
      measurement m;
      m.call = "FMA peak";
      m.shape = "registers only";
      m.level = level;
      m.threads = pool->size();
      m.flops = peak_loop(level, 1) * static_cast<double>(peak_iters) * static_cast<double>(pool->size());
      m.run = [level, pool] {
        pool->parallel_for(pool->size(), 1, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) peak_loop(level, peak_iters);
        });
        return 0.0;
      };
      ms.push_back(std::move(m));
    }
  }

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  auto random = [&](std::size_t count) {
    auto v = std::make_shared<std::vector<float>>(count);
    for (auto& f : *v) f = unit(rng);
    return v;
  };
  const std::size_t n = 512, cin = 576;
  struct layer {
    std::size_t r;
    const char* what;
  };
  const layer layers[] = {{576, "attn q/o"}, {192, "attn k/v"}, {1536, "ffn gate/up"}, {49152, "output"}};
  for (const auto& l : layers) {
    const std::size_t r = l.r;
    auto x = random(n * cin), w = random(r * cin), dy = random(n * r);
    auto y = std::make_shared<std::vector<float>>(n * r), dx = random(n * cin), dw = random(r * cin);
    struct call {
      const char* name;
      std::string shape;
      std::function<void(tlm::thread_pool*)> f;
    };
    const std::string dims = std::to_string(r) + "x" + std::to_string(cin);
    const call calls[] = {
        {"forward Y = X W^T", "512x" + std::to_string(r) + "x576",
         [=](tlm::thread_pool* p) {
           k::gemm(transpose::no, transpose::yes, n, r, cin, x->data(), cin, w->data(), cin, y->data(), r, false, p);
         }},
        {"input grad dX += dY W", "512x576x" + std::to_string(r),
         [=](tlm::thread_pool* p) {
           k::gemm(transpose::no, transpose::no, n, cin, r, dy->data(), r, w->data(), cin, dx->data(), cin, true, p);
         }},
        {"weight grad dW += dY^T X", std::to_string(r) + "x576x512",
         [=](tlm::thread_pool* p) {
           k::gemm(transpose::yes, transpose::no, r, cin, n, dy->data(), r, x->data(), cin, dw->data(), cin, true, p);
         }},
    };
    for (const auto& c : calls) {
      for (auto level : levels) {
        // The portable path takes seconds per output-projection call; its speed is
        // known from the smaller shapes.
        if (level == tlm::kernel_level::scalar && r == 49152) continue;
        for (auto& pool_ptr : pools) {
          tlm::thread_pool* pool = pool_ptr.get();
          measurement m;
          m.call = c.name;
          m.shape = c.shape + " (" + l.what + ")";
          m.level = level;
          m.threads = pool->size();
          m.flops = 2.0 * static_cast<double>(n) * static_cast<double>(r) * static_cast<double>(cin);
          auto f = c.f;
          m.run = [f, level, pool] {
            k::force_kernel_level(level);
            f(pool->size() == 1 ? nullptr : pool);
            return 0.0;
          };
          ms.push_back(std::move(m));
        }
      }
    }
  }

  const std::string load_before = load_average();
  for (auto& m : ms) {
    m.run();  // warm-up: page faults, scratch buffers
    double cpu = 0;
    const double t = std::max(time_once(m, &cpu), 1e-7);
    m.reps = std::max<std::size_t>(1, static_cast<std::size_t>(target / t));
  }
  for (int round = 0; round < rounds; ++round) {
    for (auto& m : ms) {
      double cpu = 0;
      m.seconds.push_back(time_once(m, &cpu));
      m.cpu.push_back(cpu);
    }
    std::cerr << "round " << round + 1 << "/" << rounds << " done\n";
  }

  // Peak per (level, threads): wall GFLOP/s, and GFLOP per CPU-second (one core's peak).
  auto peak_of = [&](tlm::kernel_level level, std::size_t threads, bool on_cpu) {
    for (const auto& m : ms) {
      if (m.call == "FMA peak" && m.level == level && m.threads == threads)
        return m.flops / median(on_cpu ? m.cpu : m.seconds) * 1e-9;
    }
    return 0.0;
  };

  std::ostringstream md;
  md << "# Training GEMM benchmark\n\n";
  md << "- CPU: " << cpu_model() << " (" << tlm::cpu_feature_string() << "), "
     << std::thread::hardware_concurrency() << " CPUs\n";
  {
    const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    md << "- Date: " << date << "\n";
  }
  md << "- Load average (1, 5, 15 min) before: " << load_before << "; after: " << load_average() << "\n";
  md << "- " << rounds << " interleaved rounds; median round shown. GFLOP/s counts 2 flops per multiply-add.\n";
  md << "- wall: flops over elapsed time, and % of the FMA peak row of the same level and thread count.\n";
  md << "- per core: flops over the CPU time of all the process's threads, i.e. the speed while the cores\n"
        "  were actually held, and % of one core's FMA peak at that level. The machine is shared: wall\n"
        "  figures also count time spent waiting for a core, per-core figures do not.\n";
  md << "- Produced by `bench/gemm.cpp`:\n\n"
        "      cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release\n"
        "      cmake --build build -j2 --target bench_gemm\n"
        "      build/bench/gemm --rounds " << rounds << " --out bench/results/gemm.md\n\n";
  md << "| call | m x n x k | level | threads | time per call | wall GFLOP/s | wall % peak | per-core GFLOP/s | "
        "per-core % peak |\n";
  md << "|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (const auto& m : ms) {
    const double t = median(m.seconds), c = median(m.cpu);
    const double gf = m.flops / t * 1e-9;
    const double cg = c > 0 ? m.flops / c * 1e-9 : 0.0;
    const double core_peak = peak_of(m.level, 1, true);
    std::snprintf(buf, sizeof buf, "| %s | %s | %s | %zu | %.3f ms | %.1f | %.0f %% | %.1f | %.0f %% |\n",
                  m.call.c_str(), m.shape.c_str(), std::string(tlm::kernel_level_name(m.level)).c_str(), m.threads,
                  t * 1e3, gf, 100.0 * gf / peak_of(m.level, m.threads, false), cg,
                  core_peak > 0 ? 100.0 * cg / core_peak : 0.0);
    md << buf;
  }
  return tlm_bench::publish(md.str(), out_path);
}
