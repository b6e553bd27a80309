// Decode-time attention on the shapes of SmolLM2-135M: one token's attention over a
// cache of `len` positions, 30 layers x 9 query heads (3 kv heads, group 3, head 64).
//
//   attention [--rounds N] [--out FILE]
//
// Rows, per cache type (f32, q8) and kernel level:
//   per key    the former attention_row: a dot product and an axpy per key through
//              the dispatch table, std::exp per key (kept here as the baseline)
//   per head   attention_row once per query head: a block of keys per kernel call
//   per group  attention_heads over the 3 query heads of a kv head: each block of
//              keys and values read once for the 3 heads (what the block runs)
// The 30 layers have separate buffers, so at long contexts the cache comes from DRAM
// as in decoding (94 MB of f32 cache at 2048 positions). Each measurement runs in each
// of N rounds, interleaved with the others; the median round is reported.
#include "machine.hpp"
#include <tlm/kernels.hpp>
#include <tlm/kv.hpp>
#include <tlm/ops/attention.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr std::size_t layers = 30, kv_heads = 3, group = 3, E = 64;

// The attention_row of before this benchmark existed, for the "per key" rows.
float per_key_row(const float* q, const float* keys, const float* values, std::size_t len, float scale, float* out) {
  namespace k = tlm::kernels;
  float m = -std::numeric_limits<float>::infinity(), l = 0;
  std::fill(out, out + E, 0.0f);
  float s[tlm::attention_block];
  for (std::size_t j0 = 0; j0 < len; j0 += tlm::attention_block) {
    const std::size_t nb = std::min(tlm::attention_block, len - j0);
    float block_max = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < nb; ++j) {
      s[j] = k::dot(q, keys + (j0 + j) * E, E) * scale;
      block_max = std::max(block_max, s[j]);
    }
    const float m_new = std::max(m, block_max);
    const float c = std::exp(m - m_new);
    l *= c;
    for (std::size_t e = 0; e < E; ++e) out[e] *= c;
    for (std::size_t j = 0; j < nb; ++j) {
      const float p = std::exp(s[j] - m_new);
      l += p;
      k::axpy(p, values + (j0 + j) * E, out, E);
    }
    m = m_new;
  }
  for (std::size_t e = 0; e < E; ++e) out[e] /= l;
  return m + std::log(l);
}

float per_key_row_q8(const float* q, const std::int8_t* kc, const float* ks, const std::int8_t* vc, const float* vs,
                     std::size_t len, float scale, float* out) {
  namespace k = tlm::kernels;
  float m = -std::numeric_limits<float>::infinity(), l = 0;
  std::fill(out, out + E, 0.0f);
  float s[tlm::attention_block];
  for (std::size_t j0 = 0; j0 < len; j0 += tlm::attention_block) {
    const std::size_t nb = std::min(tlm::attention_block, len - j0);
    float block_max = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < nb; ++j) {
      s[j] = k::dot_i8(q, kc + (j0 + j) * E, E) * (ks[j0 + j] * scale);
      block_max = std::max(block_max, s[j]);
    }
    const float m_new = std::max(m, block_max);
    const float c = std::exp(m - m_new);
    l *= c;
    for (std::size_t e = 0; e < E; ++e) out[e] *= c;
    for (std::size_t j = 0; j < nb; ++j) {
      const float p = std::exp(s[j] - m_new);
      l += p;
      k::axpy_i8(p * vs[j0 + j], vc + (j0 + j) * E, out, E);
    }
    m = m_new;
  }
  for (std::size_t e = 0; e < E; ++e) out[e] /= l;
  return m + std::log(l);
}

struct cache {
  std::vector<float> k, v;           // [layers, kv_heads, len, E]
  std::vector<std::int8_t> kc, vc;   // [layers, kv_heads, len, E]
  std::vector<float> ks, vs;         // [layers, kv_heads, len]
  std::vector<float> q, o;           // [layers, heads, E]
  std::size_t len;
};

cache make(std::size_t len, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  cache c;
  c.len = len;
  const std::size_t rows = layers * kv_heads * len;
  c.k.resize(rows * E);
  c.v.resize(rows * E);
  for (auto& x : c.k) x = n(rng);
  for (auto& x : c.v) x = n(rng);
  c.kc.resize(rows * E);
  c.vc.resize(rows * E);
  c.ks.resize(rows);
  c.vs.resize(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    c.ks[r] = tlm::quantize_q8_row(c.k.data() + r * E, E, c.kc.data() + r * E);
    c.vs[r] = tlm::quantize_q8_row(c.v.data() + r * E, E, c.vc.data() + r * E);
  }
  c.q.resize(layers * kv_heads * group * E);
  c.o.resize(c.q.size());
  for (auto& x : c.q) x = 2.0f * n(rng);
  return c;
}

enum class form { per_key, per_head, per_group };

// One token's attention: every layer, every query head.
void run(cache& c, bool q8, form f) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(E));
  const std::size_t len = c.len;
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::size_t g = 0; g < kv_heads; ++g) {
      const std::size_t at = (l * kv_heads + g) * len;
      const std::size_t qh = (l * kv_heads + g) * group;
      float* q = c.q.data() + qh * E;
      float* o = c.o.data() + qh * E;
      float lse[group];
      if (f == form::per_group) {
        if (q8)
          tlm::attention_heads(tlm::detail::q8_rows{c.kc.data() + at * E, c.ks.data() + at, c.vc.data() + at * E,
                                                    c.vs.data() + at},
                               q, group, len, E, scale, o, lse);
        else
          tlm::attention_heads(tlm::detail::float_rows<float>{c.k.data() + at * E, c.v.data() + at * E, E}, q, group,
                               len, E, scale, o, lse);
        continue;
      }
      for (std::size_t h = 0; h < group; ++h) {
        if (q8 && f == form::per_key)
          per_key_row_q8(q + h * E, c.kc.data() + at * E, c.ks.data() + at, c.vc.data() + at * E, c.vs.data() + at,
                         len, scale, o + h * E);
        else if (q8)
          tlm::attention_row_q8(q + h * E, c.kc.data() + at * E, c.ks.data() + at, c.vc.data() + at * E,
                                c.vs.data() + at, len, E, scale, o + h * E);
        else if (f == form::per_key)
          per_key_row(q + h * E, c.k.data() + at * E, c.v.data() + at * E, len, scale, o + h * E);
        else
          tlm::attention_row<float>(q + h * E, c.k.data() + at * E, c.v.data() + at * E, E, len, E, scale, o + h * E);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t rounds = 5;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::stoul(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: attention [--rounds N] [--out FILE]\n");
      return 2;
    }
  }
  std::mt19937 rng(1);
  std::vector<tlm::kernel_level> levels{tlm::kernel_level::scalar};
  for (auto l : {tlm::kernel_level::avx2, tlm::kernel_level::avx512})
    if (tlm::kernel_level_supported(l)) levels.push_back(l);

  struct row {
    std::string label;
    std::function<void()> fn;
    std::vector<double> ms;
  };
  std::vector<cache> caches;
  for (std::size_t len : {256u, 1024u, 2048u, 4096u}) caches.push_back(make(len, rng));
  std::vector<row> rows;
  for (auto& c : caches)
    for (bool q8 : {false, true})
      for (auto level : levels)
        for (form f : {form::per_key, form::per_head, form::per_group}) {
          const char* fname = f == form::per_key ? "per key" : f == form::per_head ? "per head" : "per group";
          std::ostringstream label;
          label << "| " << c.len << " | " << (q8 ? "q8" : "f32") << " | " << tlm::kernel_level_name(level) << " | "
                << fname << " |";
          rows.push_back({label.str(), [&c, q8, f, level] {
                            tlm::kernels::force_kernel_level(level);
                            run(c, q8, f);
                          },
                          {}});
        }
  for (std::size_t r = 0; r < rounds; ++r)
    for (auto& w : rows) {
      w.fn();  // warm-up: the level switch and the first touch of the buffers
      const int reps = 3;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) w.fn();
      const auto t1 = std::chrono::steady_clock::now();
      w.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / reps);
    }
  std::ostringstream md;
  md << "# Decode attention, SmolLM2-135M shapes (30 layers x 9 heads, head 64)\n\n"
     << "CPU: " << tlm_bench::cpu_model() << "; load average " << tlm_bench::load_average() << "; median of "
     << rounds << " rounds, 1 thread.\n\n"
     << "| positions | cache | level | form | ms per token |\n|---:|---|---|---|---:|\n";
  for (auto& w : rows) {
    std::sort(w.ms.begin(), w.ms.end());
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.3f |", w.ms[w.ms.size() / 2]);
    md << w.label << buf << "\n";
  }
  return tlm_bench::publish(md.str(), out_path);
}
