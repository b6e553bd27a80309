// Matrix-vector and matrix-matrix kernel speed on the shapes of SmolLM2-135M.
//
//   kernels [--rounds N] [--quick] [--out FILE] [--filter TEXT]... [--batches N,N,...]
//           [--floor-file MODEL.gguf]
//
// --filter keeps only the measurements whose label contains every TEXT given.
// --batches sets the token counts of the matmul ("prefill") rows, 64,512 by default;
// a server's batched decode step is a matmul of one row per running sequence (2-32).
//
// Every measurement runs in each of N rounds, interleaved with all the others, and
// the median round is reported: the machine may be shared, and interleaving spreads
// any disturbance over all rows instead of spoiling one.
//
// "hot" repeats one matrix, so it is served from cache after the first pass; "cold"
// cycles through enough copies (>= 256 MiB, in 4 KiB pages as a mapped model file is:
// small_pages) that passes read from beyond the private caches, as decoding does. (A
// last-level cache as large as the 2-vCPU Xeon's can hold part of them, and SmolLM2's
// 91 MiB: the file floor, --floor-file, measures a model of another size.) The
// "decode sweep" runs every matrix product of one token of SmolLM2-135M on separate
// buffers laid out like the model. "read" is a plain streaming sum, the bandwidth
// ceiling the memory-bound kernels are compared with.
//
// The weight-streaming floor ("floor" rows of the sweep): the same 211 matrices,
// split among the threads exactly as the kernels split them (one parallel region per
// matrix), but each thread only reads its rows' bytes once (integer adds, nothing
// decoded). No decode kernel can beat it; every sweep row is also reported as a
// multiple of the floor at the same thread count. Kernels run in both precisions
// (exact: float32 activations; fast: int8 activations) at every level the CPU has.
//
// --floor-file adds the floor of one model file ("file floor" rows): its own tensors,
// mapped as tlm maps them, read the same way, every tensor a decoded token reads in full
// (all but the token embedding of an untied file, of which a token reads one row). The
// 211 synthetic matrices are no stand-in for another file: their 91 MiB stay in a large
// last-level cache (the 2-vCPU Xeon's reports 480 MiB: 91 MiB streamed at 31-33 GB/s
// against 21-22 GB/s for 846 MiB), so scaling their time by bytes understates the floor
// of a file that does not fit.
#include "machine.hpp"
#include <tlm/format/gguf.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/generation/sampler.hpp>
#include <tlm/kernels.hpp>
#include <tlm/thread_pool.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/mman.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace {

using tlm::encoding;
using clock_type = std::chrono::steady_clock;

using tlm_bench::cpu_model;
using tlm_bench::load_average;

std::vector<std::byte> random_matrix(encoding enc, std::size_t rows, std::size_t cols, std::mt19937& rng) {
  std::vector<float> row(cols);  // [cols]
  std::normal_distribution<float> normal(0.0f, 0.05f);
  const std::size_t rb = tlm::row_bytes(enc, cols);
  std::vector<std::byte> out(rows * rb);  // [rows, rb]
  // Quantizing a few distinct rows and repeating them keeps set-up fast; the data
  // values do not change the speed of these kernels.
  std::vector<std::byte> some(16 * rb);
  if (!tlm::writable(enc)) {
    // An encoding without a quantizer (none of the weight encodings today; the K-quants
    // had none before format/quant.hpp wrote them): random codes, finite halves of a realistic
    // size for the super-block scales (d and dmin first; Q6_K's d last).
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : some) b = static_cast<std::byte>(byte(rng));
    const auto t = tlm::traits(enc);
    const std::uint16_t half = tlm::f32_to_fp16(0.002f);
    for (std::size_t i = 0; i < some.size() / t.block_bytes; ++i) {
      std::byte* p = some.data() + i * t.block_bytes;
      if (enc == encoding::q6_k) {
        std::memcpy(p + 208, &half, 2);
      } else {
        std::memcpy(p, &half, 2);
        std::memcpy(p + 2, &half, 2);
      }
    }
  } else {
    for (std::size_t r = 0; r < 16; ++r) {
      for (auto& v : row) v = normal(rng);
      tlm::quantize_row(enc, row.data(), some.data() + r * rb, cols);
    }
  }
  for (std::size_t r = 0; r < rows; ++r) std::memcpy(out.data() + r * rb, some.data() + (r % 16) * rb, rb);
  return out;
}

struct measurement {
  std::string group, label;
  double bytes = 0, flops = 0;  // per call
  std::function<void()> run;    // one call
  std::size_t reps = 1;         // calls per timed sample
  std::vector<double> seconds;  // per call, one entry per round
  std::vector<double> cpu;      // calling thread's CPU time per call, one entry per round
  std::size_t threads = 1;
  double tokens = 0;            // tokens a call stands for (decode sweep: 1, prefill: the batch)
  bool floor = false;           // the weight-streaming floor of the sweep
  // Builds the inputs `run` reads, once --filter has kept the measurement (the cold
  // matrices are 256 MiB each: building every one before filtering took seconds and
  // gigabytes). Measurements that share inputs share the builder, which builds once.
  std::function<void()> prepare;
};

// Inputs built on first use (measurement::prepare), shared by the measurements that read them.
template <class T>
struct lazy_input {
  std::function<T()> make;
  std::optional<T> value;
  T& get() { return value ? *value : value.emplace(make()); }
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using tlm_bench::median;

double time_once(measurement& m, double* cpu = nullptr) {
  const double c0 = thread_cpu_seconds();
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < m.reps; ++i) m.run();
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count() / static_cast<double>(m.reps);
  if (cpu) *cpu = (thread_cpu_seconds() - c0) / static_cast<double>(m.reps);
  return wall;
}

// Enough calls per sample for ~25 ms, so timer resolution and one-off stalls are small.
void calibrate(measurement& m, double target) {
  m.run();  // warm-up: page faults, first-touch
  const double t = std::max(time_once(m), 1e-7);
  m.reps = std::max<std::size_t>(1, static_cast<std::size_t>(target / t));
}

double read_sum_scalar(const float* p, std::size_t n) {
  float s[8] = {};
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    for (std::size_t k = 0; k < 8; ++k) s[k] += p[i + k];
  }
  double t = 0;
  for (float f : s) t += f;
  return t;
}

#if defined(__x86_64__) || defined(__i386__)
[[gnu::target("avx2")]] double read_sum_avx2(const float* p, std::size_t n) {
  __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps(), c = _mm256_setzero_ps(), d = _mm256_setzero_ps();
  for (std::size_t i = 0; i + 32 <= n; i += 32) {
    a = _mm256_add_ps(a, _mm256_loadu_ps(p + i));
    b = _mm256_add_ps(b, _mm256_loadu_ps(p + i + 8));
    c = _mm256_add_ps(c, _mm256_loadu_ps(p + i + 16));
    d = _mm256_add_ps(d, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  double s = 0;
  for (float f : out) s += f;
  return s;
}
#endif

// The bench itself must not assume AVX2 either.
double read_sum(const float* p, std::size_t n) {
#if defined(__x86_64__) || defined(__i386__)
  static const bool avx2 = tlm::kernel_level_supported(tlm::kernel_level::avx2);
  if (avx2) return read_sum_avx2(p, n);
#endif
  return read_sum_scalar(p, n);
}

volatile double sink = 0;

std::uint64_t read_bytes_scalar(const std::byte* p, std::size_t n) {
  std::uint64_t s[4] = {};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (std::size_t k = 0; k < 4; ++k) {
      std::uint64_t v;
      std::memcpy(&v, p + i + 8 * k, 8);
      s[k] += v;
    }
  }
  for (; i < n; ++i) s[0] += static_cast<std::uint64_t>(p[i]);
  return s[0] + s[1] + s[2] + s[3];
}

#if defined(__x86_64__) || defined(__i386__)
// 128 bytes per step in four independent integer sums: one load per 32 bytes and no
// float work, so the time is the time to bring the bytes in.
[[gnu::target("avx2")]] std::uint64_t read_bytes_avx2(const std::byte* p, std::size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a = _mm256_add_epi64(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_add_epi64(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_add_epi64(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) std::uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  return out[0] + out[1] + out[2] + out[3] + read_bytes_scalar(p + i, n - i);
}
#endif

std::uint64_t read_bytes(const std::byte* p, std::size_t n) {
#if defined(__x86_64__) || defined(__i386__)
  static const bool avx2 = tlm::kernel_level_supported(tlm::kernel_level::avx2);
  if (avx2) return read_bytes_avx2(p, n);
#endif
  return read_bytes_scalar(p, n);
}

// Memory in 4 KiB pages, as a model's weights are: they are read through the file's
// mapping, and the page cache gives 4 KiB pages, where an anonymous buffer this large
// gets 2 MiB pages (transparent huge pages). The hardware prefetcher stops at every
// page boundary, so the page size changes a kernel's speed from memory (by a third for
// a fast Q4_1 matvec on the 2-vCPU Xeon, before its rows were read as 4 streams).
class small_pages {
 public:
  explicit small_pages(std::size_t bytes) : bytes_(std::max<std::size_t>(bytes, 1)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    ::madvise(p, bytes_, MADV_NOHUGEPAGE);  // best effort: a kernel without THP has small pages anyway
    data_ = static_cast<std::byte*>(p);
  }
  small_pages(const small_pages&) = delete;
  small_pages& operator=(const small_pages&) = delete;
  ~small_pages() { ::munmap(data_, bytes_); }
  std::byte* data() { return data_; }

 private:
  std::size_t bytes_;
  std::byte* data_ = nullptr;
};

const char* precision_name(tlm::kernels::precision p) { return p == tlm::kernels::precision::fast ? "fast" : "exact"; }

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  double target = 0.025;
  std::string out_path;
  std::vector<std::string> filters;
  std::vector<std::size_t> batches = {64, 512};
  std::string floor_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      rounds = 1;
      target = 0.002;
    } else if (a == "--filter" && i + 1 < argc) {
      filters.push_back(argv[++i]);
    } else if (a == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else if (a == "--floor-file" && i + 1 < argc) {
      floor_file = argv[++i];
    } else if (a == "--batches" && i + 1 < argc) {
      batches.clear();
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) {
        const long n = std::atol(item.c_str());
        if (n < 2 || n > 4096) {
          std::cerr << "kernels: --batches takes token counts from 2 to 4096, not '" << item << "'\n";
          return 2;
        }
        batches.push_back(static_cast<std::size_t>(n));
      }
    } else {
      std::cerr << "usage: kernels [--rounds N] [--quick] [--out FILE] [--filter TEXT]... [--batches N,N,...] "
                   "[--floor-file MODEL.gguf]\n";
      return 2;
    }
  }

  namespace k = tlm::kernels;
  const std::vector<tlm::kernel_level> levels = tlm::supported_kernel_levels();
  const k::precision precisions[] = {k::precision::exact, k::precision::fast};
  const std::size_t thread_counts[] = {1, 2};
  std::vector<std::unique_ptr<tlm::thread_pool>> pools;
  for (std::size_t t : thread_counts) pools.push_back(std::make_unique<tlm::thread_pool>(t));

  std::mt19937 rng(2024);
  std::vector<measurement> ms;
  const std::size_t cold_bytes = std::size_t{256} << 20;

  // Streaming read ceiling.
  auto big = std::make_shared<lazy_input<std::vector<float>>>();
  big->make = [] { return std::vector<float>(cold_bytes / sizeof(float), 1.0f); };
  for (std::size_t ti = 0; ti < pools.size(); ++ti) {
    tlm::thread_pool* pool = pools[ti].get();
    measurement m;
    m.group = "read";
    m.label = "stream read 256 MiB, " + std::to_string(pool->size()) + " thr";
    m.bytes = static_cast<double>(cold_bytes);
    m.threads = pool->size();
    m.prepare = [big] { big->get(); };
    m.run = [big, pool] {
      const std::vector<float>& data = big->get();
      const std::size_t pages = data.size() / 4096;
      std::atomic<double> total{0.0};
      pool->parallel_for(pages, 64, [&](std::size_t b, std::size_t e) {
        total.fetch_add(read_sum(data.data() + b * 4096, (e - b) * 4096));
      });
      sink = sink + total.load();
    };
    ms.push_back(std::move(m));
  }

  struct shape {
    encoding enc;
    std::size_t rows, cols;
    const char* what;
  };
  const shape shapes[] = {{encoding::q4_1, 576, 576, "attn_q/o"},
                          {encoding::q4_1, 1536, 576, "ffn_gate/up"},
                          {encoding::q4_1, 576, 1536, "ffn_down"},
                          {encoding::q8_0, 49152, 576, "output"},
                          // SmolLM2-135M as Q4_K_M: Q5_0 where rows are 576 wide, K-quants at 1536
                          {encoding::q5_0, 1536, 576, "Q4_K_M ffn_gate/up"},
                          {encoding::q5_1, 1536, 576, "ffn_gate/up"},
                          {encoding::q4_k, 576, 1536, "Q4_K_M ffn_down"},
                          {encoding::q5_k, 576, 1536, "ffn_down"},
                          {encoding::q6_k, 576, 1536, "Q4_K_M ffn_down"},
                          // Llama 3.2 1B shapes
                          {encoding::q4_k, 2048, 2048, "1B attn_q/o"},
                          {encoding::q5_k, 2048, 2048, "1B attn_q/o"},
                          {encoding::q6_k, 2048, 2048, "1B attn_q/o"}};

  for (const auto& s : shapes) {
    const std::size_t rb = tlm::row_bytes(s.enc, s.cols);
    const std::size_t mat_bytes = s.rows * rb;
    const std::size_t copies = std::max<std::size_t>(1, (cold_bytes + mat_bytes - 1) / mat_bytes);
    // [copies] of one random matrix, so that a cold call reads a copy no cache holds.
    auto cold = std::make_shared<lazy_input<std::shared_ptr<small_pages>>>();
    cold->make = [&rng, s, copies, mat_bytes] {
      const auto one = random_matrix(s.enc, s.rows, s.cols, rng);
      auto pages = std::make_shared<small_pages>(copies * mat_bytes);
      for (std::size_t c = 0; c < copies; ++c) std::memcpy(pages->data() + c * mat_bytes, one.data(), mat_bytes);
      return pages;
    };
    auto x = std::make_shared<std::vector<float>>(s.cols, 0.5f);
    auto y = std::make_shared<std::vector<float>>(s.rows);
    for (bool hot : {true, false}) {
      if (hot && s.rows == 49152) continue;  // 30 MB: never hot in practice
      for (auto level : levels) {
        for (auto prec : precisions) {
        for (std::size_t ti = 0; ti < pools.size(); ++ti) {
          tlm::thread_pool* pool = pools[ti].get();
          measurement m;
          m.group = "matvec";
          m.label = std::string(tlm::name(s.enc)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) + " (" +
                    s.what + "), " + (hot ? "hot" : "cold") + ", " + std::string(tlm::kernel_level_name(level)) + " " +
                    precision_name(prec) + ", " + std::to_string(pool->size()) + " thr";
          m.bytes = static_cast<double>(mat_bytes);
          m.threads = pool->size();
          m.flops = 2.0 * static_cast<double>(s.rows * s.cols);
          auto next = std::make_shared<std::size_t>(0);
          m.prepare = [cold] { cold->get(); };
          m.run = [=] {
            k::force_kernel_level(level);
            const std::size_t c = hot ? 0 : (*next = (*next + 1) % copies);
            k::matvec(s.enc, cold->get()->data() + c * mat_bytes, x->data(), y->data(), s.rows, s.cols, pool, prec);
          };
          ms.push_back(std::move(m));
        }
        }
      }
    }
  }

  // The floor of a model file: its own mapped tensors, in file order, one parallel region
  // per matrix as the kernels split it; vectors (norms, rope_freqs) on the calling thread.
  if (!floor_file.empty()) {
    std::shared_ptr<const tlm::gguf::file> file;
    try {
      file = std::make_shared<const tlm::gguf::file>(floor_file);
    } catch (const std::exception& e) {
      std::cerr << "kernels: --floor-file " << floor_file << ": " << e.what() << "\n";
      return 1;
    }
    const bool untied = file->find_tensor("output.weight") != nullptr;
    auto read = std::make_shared<std::vector<const tlm::gguf::tensor_info*>>();
    std::size_t total = 0;
    for (const auto& t : file->tensors()) {
      if (untied && t.name == "token_embd.weight") continue;  // a token reads one row of it
      read->push_back(&t);
      total += t.data.size();
    }
    const std::string name = std::filesystem::path(floor_file).filename().string();
    for (std::size_t ti = 0; ti < pools.size(); ++ti) {
      tlm::thread_pool* pool = pools[ti].get();
      measurement m;
      m.group = "file floor";
      m.label = "file floor: read " + name + "'s " + std::to_string(read->size()) + " tensors once (" +
                std::to_string(total >> 20) + " MiB), " + std::to_string(pool->size()) + " thr";
      m.bytes = static_cast<double>(total);
      m.threads = pool->size();
      m.tokens = 1;
      m.run = [=] {
        std::atomic<std::uint64_t> sum{0};
        for (const tlm::gguf::tensor_info* t : *read) {
          const std::byte* base = t->data.data();
          if (t->n_dims < 2 || t->rows() == 0) {
            sum.fetch_add(read_bytes(base, t->data.size()), std::memory_order_relaxed);
            continue;
          }
          const std::size_t rb = t->data.size() / t->rows();
          k::detail::split_rows(pool, t->rows(), t->row_length(), [&](std::size_t r0, std::size_t r1) {
            sum.fetch_add(read_bytes(base + r0 * rb, (r1 - r0) * rb), std::memory_order_relaxed);
          });
        }
        sink = sink + static_cast<double>(sum.load());
        (void)file;  // the mapping lives as long as the measurement
      };
      ms.push_back(std::move(m));
    }
  }

  // One token's matrix products, laid out as the model is: 30 layers of 7 Q4_1
  // matrices each, then the Q8_0 output matrix.
  {
    const shape layer[] = {{encoding::q4_1, 576, 576, "q"},    {encoding::q4_1, 192, 576, "k"},
                           {encoding::q4_1, 192, 576, "v"},    {encoding::q4_1, 576, 576, "o"},
                           {encoding::q4_1, 1536, 576, "gate"}, {encoding::q4_1, 1536, 576, "up"},
                           {encoding::q4_1, 576, 1536, "down"}};
    struct product {
      encoding enc;
      std::size_t rows, cols, offset;
    };
    auto plan = std::make_shared<std::vector<product>>();
    std::size_t total = 0;
    double flops = 0;
    for (int l = 0; l < 30; ++l) {
      for (const auto& s : layer) {
        plan->push_back({s.enc, s.rows, s.cols, total});
        total += s.rows * tlm::row_bytes(s.enc, s.cols);
        flops += 2.0 * static_cast<double>(s.rows * s.cols);
      }
    }
    plan->push_back({encoding::q8_0, 49152, 576, total});
    total += 49152 * tlm::row_bytes(encoding::q8_0, 576);
    flops += 2.0 * 49152 * 576;
    auto weights = std::make_shared<std::vector<std::byte>>(total);
    for (const auto& p : *plan) {
      auto m = random_matrix(p.enc, std::min<std::size_t>(p.rows, 64), p.cols, rng);
      const std::size_t rb = tlm::row_bytes(p.enc, p.cols);
      for (std::size_t r = 0; r < p.rows; ++r) std::memcpy(weights->data() + p.offset + r * rb, m.data() + (r % 64) * rb, rb);
    }
    auto x = std::make_shared<std::vector<float>>(1536, 0.25f);
    auto y = std::make_shared<std::vector<float>>(49152);
    for (std::size_t ti = 0; ti < pools.size(); ++ti) {
      tlm::thread_pool* pool = pools[ti].get();
      measurement m;
      m.group = "sweep";
      m.label = "floor: read the 211 matrices once (" + std::to_string(total >> 20) + " MiB), " +
                std::to_string(pool->size()) + " thr";
      m.bytes = static_cast<double>(total);
      m.threads = pool->size();
      m.tokens = 1;
      m.floor = true;
      m.run = [=] {
        std::atomic<std::uint64_t> sum{0};
        for (const auto& p : *plan) {
          const std::size_t rb = tlm::row_bytes(p.enc, p.cols);
          const std::byte* base = weights->data() + p.offset;
          k::detail::split_rows(pool, p.rows, p.cols, [&](std::size_t r0, std::size_t r1) {
            sum.fetch_add(read_bytes(base + r0 * rb, (r1 - r0) * rb), std::memory_order_relaxed);
          });
        }
        sink = sink + static_cast<double>(sum.load());
      };
      ms.push_back(std::move(m));
    }
    for (auto level : levels) {
      for (auto prec : precisions) {
      for (std::size_t ti = 0; ti < pools.size(); ++ti) {
        tlm::thread_pool* pool = pools[ti].get();
        measurement m;
        m.group = "sweep";
        m.label = "decode sweep, 211 matvecs (" + std::to_string(total >> 20) + " MiB), " +
                  std::string(tlm::kernel_level_name(level)) + " " + precision_name(prec) + ", " +
                  std::to_string(pool->size()) + " thr";
        m.bytes = static_cast<double>(total);
        m.threads = pool->size();
        m.tokens = 1;
        m.flops = flops;
        m.run = [=] {
          k::force_kernel_level(level);
          for (const auto& p : *plan)
            k::matvec(p.enc, weights->data() + p.offset, x->data(), y->data(), p.rows, p.cols, pool, prec);
        };
        ms.push_back(std::move(m));
      }
      }
    }
  }

  // Prefill: 64 and 512 tokens (--batches) through one matrix (matmul), each level and precision,
  // one matrix per encoding with an integer path.
  {
    for (const std::size_t batch : batches) {
      for (const auto& s : {shape{encoding::q4_1, 1536, 576, "ffn_gate/up"}, shape{encoding::q4_1, 576, 1536, "ffn_down"},
                            shape{encoding::q4_0, 1536, 576, "ffn_gate/up"}, shape{encoding::q8_0, 1536, 576, "ffn_gate/up"},
                            shape{encoding::q5_0, 1536, 576, "Q4_K_M ffn_gate/up"},
                            shape{encoding::q5_1, 1536, 576, "Q5_K_M ffn_gate/up"},
                            shape{encoding::q4_k, 576, 1536, "Q4_K_M ffn_down"},
                            shape{encoding::q5_k, 576, 1536, "Q5_K_M ffn_down"},
                            shape{encoding::q6_k, 576, 1536, "Q4_K_M ffn_down"},
                            shape{encoding::q4_k, 8192, 2048, "1B Q4_K_M ffn_gate/up"},
                            shape{encoding::q6_k, 2048, 8192, "1B Q4_K_M ffn_down"}}) {
        auto w = std::make_shared<std::vector<std::byte>>(random_matrix(s.enc, s.rows, s.cols, rng));
        auto x = std::make_shared<std::vector<float>>(batch * s.cols);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (auto& v : *x) v = normal(rng);
        auto y = std::make_shared<std::vector<float>>(batch * s.rows);
        for (auto level : levels) {
          if (level == tlm::kernel_level::scalar && batch > 64) continue;  // seconds per call: not worth the wait
          // fast in both paths: the integer kernels and the float32 GEMM that fast mode
          // takes where it is faster (kernels::integer_matmul: above a few rows).
          const std::pair<k::precision, k::prefill_path> paths[] = {{k::precision::exact, k::prefill_path::automatic},
                                                                    {k::precision::fast, k::prefill_path::integer},
                                                                    {k::precision::fast, k::prefill_path::float32}};
          for (const auto& [prec, path] : paths) {
            if (level == tlm::kernel_level::scalar && path == k::prefill_path::float32) continue;
            for (std::size_t ti = 0; ti < pools.size(); ++ti) {
              tlm::thread_pool* pool = pools[ti].get();
              measurement m;
              m.group = "prefill";
              m.label = std::string(tlm::name(s.enc)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                        " (" + s.what + ") x " + std::to_string(batch) + " tokens, " +
                        std::string(tlm::kernel_level_name(level)) + " " + precision_name(prec) +
                        (prec == k::precision::exact          ? ""
                         : path == k::prefill_path::integer ? " (integer)"
                                                            : " (float32 path)") +
                        ", " + std::to_string(pool->size()) + " thr";
              m.bytes = static_cast<double>(w->size());
              m.threads = pool->size();
              m.tokens = static_cast<double>(batch);
              m.flops = 2.0 * static_cast<double>(s.rows * s.cols * batch);
              m.run = [=, prec = prec, path = path] {
                k::force_kernel_level(level);
                const k::prefill_path saved = k::force_prefill_path(path);
                k::matmul(s.enc, w->data(), x->data(), y->data(), s.rows, s.cols, batch, pool, prec);
                k::force_prefill_path(saved);
              };
              ms.push_back(std::move(m));
            }
          }
        }
      }
    }
  }

  // The sampler on a vocabulary of logits shaped like a model's (a few strong
  // candidates over a normal tail): one call per token.
  {
    auto logits = std::make_shared<std::vector<float>>(49152);
    std::normal_distribution<float> tail(-2.0f, 2.0f);
    for (auto& v : *logits) v = tail(rng);
    for (std::size_t i = 0; i < 5; ++i) (*logits)[i * 9001] = 12.0f + static_cast<float>(i);
    const tlm::sampling settings[] = {{0.8f, 40, 0.95f, 1}, {0.8f, 0, 0.9f, 1}, {1.0f, 0, 1.0f, 1}};
    const char* names[] = {"T 0.8, top-k 40, top-p 0.95", "T 0.8, top-p 0.9", "T 1, no limit"};
    for (std::size_t i = 0; i < 3; ++i) {
      measurement m;
      m.group = "sampler";
      m.label = std::string("sample one of 49152 logits, ") + names[i];
      m.tokens = 1;
      auto smp = std::make_shared<tlm::sampler>(settings[i]);
      m.run = [=] { sink = sink + (*smp)(*logits); };
      ms.push_back(std::move(m));
    }
  }

  std::erase_if(ms, [&](const measurement& m) {
    for (const auto& f : filters)
      if (m.label.find(f) == std::string::npos) return true;
    return false;
  });
  const std::string load_before = load_average();
  for (auto& m : ms)
    if (m.prepare) m.prepare();
  for (auto& m : ms) calibrate(m, target);
  for (int r = 0; r < rounds; ++r) {
    for (auto& m : ms) {
      double cpu = 0;
      m.seconds.push_back(time_once(m, &cpu));
      m.cpu.push_back(cpu);
    }
    std::cerr << "round " << r + 1 << "/" << rounds << " done\n";
  }

  std::ostringstream md;
  md << "# Kernel benchmark\n\n";
  md << "- CPU: " << cpu_model() << " (" << tlm::cpu_feature_string() << ")\n";
  md << "- Threads: the pool size (1 = the calling thread only). Kernel level: " << tlm::kernel_level_names()
     << " (those this CPU runs); exact = float32 activations, fast = int8 activations (integer dot products).\n";
  md << "- Load average (1, 5, 15 min) before: " << load_before << "; after: " << load_average()
     << " (the machine has " << std::thread::hardware_concurrency() << " CPUs).\n";
  md << "- " << rounds << " interleaved rounds; the median round is shown, min..max in brackets (time per call).\n";
  md << "- GB/s counts weight bytes read per call (10^9 bytes/s); GFLOP/s counts 2 per multiply-add.\n";
  md << "- on-CPU columns (1-thread rows only): the same work over the calling thread's CPU time,\n"
        "  i.e. the speed while the thread actually held a core; on a shared machine wall time\n"
        "  also counts time spent waiting for a core.\n";
  md << "- tokens/s: decode sweep = one token's matrix products; prefill = the batch per call.\n";
  md << "- x floor (sweep): time per token over the weight-streaming floor's at the same thread count (1.00 = as fast"
        " as reading the weights once).\n";
  md << "- Produced by `bench/kernels.cpp` (`kernels --out bench/results/kernels.md`).\n";
  std::map<std::size_t, double> floor_time;  // threads -> median floor time
  for (auto& m : ms)
    if (m.floor) floor_time[m.threads] = median(m.seconds);
  std::string group;
  char buf[768];
  for (auto& m : ms) {
    if (m.group != group) {
      group = m.group;
      md << "\n| " << group
         << " | time per call (min..max) | GB/s | GFLOP/s | tokens/s | on-CPU GB/s | on-CPU GFLOP/s | x floor |\n"
            "|---|---|---|---|---|---|---|---|\n";
    }
    const double t = median(m.seconds);
    const double lo = *std::min_element(m.seconds.begin(), m.seconds.end());
    const double hi = *std::max_element(m.seconds.begin(), m.seconds.end());
    const double c = median(m.cpu);
    char flops[32] = "-", tokens[32] = "-", cpu_gb[32] = "-", cpu_flops[32] = "-";
    if (m.flops > 0) std::snprintf(flops, sizeof flops, "%.2f", m.flops / t * 1e-9);
    if (m.tokens > 0) std::snprintf(tokens, sizeof tokens, "%.1f", m.tokens / t);
    if (m.threads == 1 && c > 0) {
      std::snprintf(cpu_gb, sizeof cpu_gb, "%.2f", m.bytes / c * 1e-9);
      if (m.flops > 0) std::snprintf(cpu_flops, sizeof cpu_flops, "%.2f", m.flops / c * 1e-9);
    }
    char vs_floor[32] = "-";
    if (m.group == "sweep" && floor_time.count(m.threads)) std::snprintf(vs_floor, sizeof vs_floor, "%.2f", t / floor_time[m.threads]);
    std::snprintf(buf, sizeof buf, "| %s | %.1f us (%.1f..%.1f) | %.2f | %s | %s | %s | %s | %s |\n", m.label.c_str(),
                  t * 1e6, lo * 1e6, hi * 1e6, m.bytes / t * 1e-9, flops, tokens, cpu_gb, cpu_flops, vs_floor);
    md << buf;
  }
  return tlm_bench::publish(md.str(), out_path);
}
