#pragma once
// The blocked GEMM of gemm.hpp (its design is described there), generic over a level's
// micro-kernel K: scalar_kernel here, gemm_avx2::kernel and gemm_avx512::kernel in
// their headers. Each level's row (kernels/levels.hpp) names run<K> and
// reserve_scratch<K> for its K; gemm() and reserve_gemm_scratch() call the active row's.
#include <tlm/kernels/aligned_buffer.hpp>
#include <tlm/kernels/gemm_pack.hpp>
#include <tlm/thread_pool.hpp>

#include <algorithm>
#include <cstddef>

namespace tlm::kernels::gemm_detail {

constexpr std::size_t round_up(std::size_t x, std::size_t to) { return (x + to - 1) / to * to; }
constexpr std::size_t ceil_div(std::size_t x, std::size_t d) { return (x + d - 1) / d; }

// The portable level: an mr x nr tile of plain float loops. The compiler keeps the
// tile in (baseline SSE) registers and vectorizes across columns; each element is
// still a chain acc = acc + a*b in p order, the same whatever the vector width.
struct scalar_kernel {
  static constexpr std::size_t mr = 4;
  static constexpr std::size_t nr = 8;
  static constexpr std::size_t kc = 256;
  static constexpr std::size_t mc_max = 512;
  static constexpr std::size_t nc_max = 1024;

  // C[rows, cols] (stride ldc) = (overwrite ? 0 : C) + a [kc, mr] . b [kc, nr], top-left tile.
  static void micro(std::size_t kc_, const float* a, const float* b, float* c, std::size_t ldc, std::size_t rows,
                    std::size_t cols, bool overwrite) {
    float acc[mr][nr] = {};
    for (std::size_t p = 0; p < kc_; ++p, a += mr, b += nr) {
      for (std::size_t r = 0; r < mr; ++r) {
        const float ar = a[r];
        for (std::size_t j = 0; j < nr; ++j) acc[r][j] += ar * b[j];
      }
    }
    for (std::size_t r = 0; r < rows; ++r) {
      float* cr = c + r * ldc;
      if (overwrite) {
        for (std::size_t j = 0; j < cols; ++j) cr[j] = acc[r][j];
      } else {
        for (std::size_t j = 0; j < cols; ++j) cr[j] += acc[r][j];
      }
    }
  }

  template <std::size_t W>
  static void pack_c(const float* src, std::size_t ld, std::size_t count, std::size_t kc_, float* dst) {
    pack_contiguous<W>(src, ld, count, kc_, dst);
  }
  template <std::size_t W>
  static void pack_t(const float* src, std::size_t ld, std::size_t count, std::size_t kc_, float* dst) {
    pack_transposed<W>(src, ld, count, kc_, dst);
  }
};

// Packing buffers, one set per thread, kept for the thread's life and grown only when
// a call needs more, so steady-state calls allocate nothing.
class scratch {
 public:
  float* a(std::size_t n) { return a_.get(n); }
  float* b(std::size_t n) { return b_.get(n); }

 private:
  aligned_buffer<float> a_, b_;
};

inline scratch& thread_scratch() {
  thread_local scratch s;
  return s;
}

// The panels of the largest unit kernel K ever packs (make_plan keeps mc <= mc_max
// and nc <= nc_max, rounded up to whole micro-panels). Every unit asks for these
// sizes, not for its own, so a thread's buffers take their final size the first
// time it runs any unit: which thread claims which unit (a race) then never decides
// whether a later call allocates. See reserve_gemm_scratch.
template <class K>
constexpr std::size_t a_capacity = round_up(K::mc_max, K::mr) * K::kc;  // floats: [mc_max / mr, kc, mr]
template <class K>
constexpr std::size_t b_capacity = round_up(K::nc_max, K::nr) * K::kc;  // floats: [nc_max / nr, kc, nr]

template <class K>
void reserve_scratch() {
  scratch& s = thread_scratch();
  s.a(a_capacity<K>);
  s.b(b_capacity<K>);
}

struct problem {
  bool ta, tb;
  std::size_t m, n, k;
  const float* a;
  std::size_t lda;
  const float* b;
  std::size_t ldb;
  float* c;
  std::size_t ldc;
  bool accumulate;
};

// How C is cut into units: row blocks of mc rows and column blocks of nc columns.
struct plan {
  std::size_t mc, nc, row_blocks, col_blocks;
};

// Every unit packs its own panels, so cutting rows into rb blocks packs op(B) rb
// times and cutting columns into cb blocks packs op(A) cb times. A single thread
// wants one unit (as few as the A buffer allows); a pool wants at least two units
// per thread so that a descheduled thread costs less. Among the cuts with enough
// units, take the one that packs the fewest elements, weighting transposing packs
// (a gather) three times a contiguous copy.
template <class K>
plan make_plan(const problem& g, std::size_t threads) {
  const std::size_t rb_min = ceil_div(g.m, K::mc_max);
  const std::size_t cb_min = ceil_div(g.n, K::nc_max);
  const std::size_t rb_max = ceil_div(g.m, K::mr);
  const std::size_t cb_max = ceil_div(g.n, K::nr);
  const std::size_t want = threads <= 1 ? 1 : 2 * threads;
  const double cost_a = g.ta ? 1.0 : 3.0;  // per element of op(A), per column block
  const double cost_b = g.tb ? 3.0 : 1.0;  // per element of op(B), per row block
  std::size_t best_rb = rb_min, best_cb = 1;
  double best = -1;
  for (std::size_t rb = rb_min; rb <= rb_max && rb <= rb_min + 64; ++rb) {
    const std::size_t cb = std::min(cb_max, std::max(cb_min, ceil_div(want, rb)));
    const double cost = static_cast<double>(rb) * static_cast<double>(g.n) * cost_b +
                        static_cast<double>(cb) * static_cast<double>(g.m) * cost_a;
    const bool enough = rb * cb >= want;
    const bool best_enough = best_rb * best_cb >= want;
    if (best < 0 || (enough && !best_enough) || (enough == best_enough && cost < best)) {
      best = cost;
      best_rb = rb;
      best_cb = cb;
    }
    if (rb * cb >= want && cb == cb_min) break;  // more row blocks only add packing
  }
  plan pl{};
  pl.mc = round_up(ceil_div(g.m, best_rb), K::mr);
  pl.nc = round_up(ceil_div(g.n, best_cb), K::nr);
  pl.row_blocks = ceil_div(g.m, pl.mc);
  pl.col_blocks = ceil_div(g.n, pl.nc);
  return pl;
}

// Packs op(A)[i0 .. i1, p0 .. p0+kc) (or op(B)[p0 .. p0+kc, j0 .. j1) with x = j) into
// panels of W: dst [ceil((x1 - x0) / W), kc, W]. `trans` says the source is laid out
// [x, p] (each vector contiguous in p), so the pack must transpose.
template <class K, std::size_t W>
void pack_block(const float* src, std::size_t ld, bool trans, std::size_t x0, std::size_t x1, std::size_t p0,
                std::size_t kc, float* dst) {
  if (trans) {
    K::template pack_t<W>(src + x0 * ld + p0, ld, x1 - x0, kc, dst);
  } else {
    K::template pack_c<W>(src + p0 * ld + x0, ld, x1 - x0, kc, dst);
  }
}

// One unit: C[i0 .. i1, j0 .. j1). For each k block the unit packs its rows of op(A)
// (kept in L2, read once per B panel) and its columns of op(B); each B micro-panel
// stays in L1 while every A micro-panel of the block passes by.
template <class K>
void run_unit(const problem& g, std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
  scratch& s = thread_scratch();
  const std::size_t a_panels = ceil_div(i1 - i0, K::mr), b_panels = ceil_div(j1 - j0, K::nr);
  float* abuf = s.a(std::max(a_capacity<K>, a_panels * K::mr * K::kc));  // [a_panels, kc, mr]
  float* bbuf = s.b(std::max(b_capacity<K>, b_panels * K::nr * K::kc));  // [b_panels, kc, nr]
  for (std::size_t p0 = 0; p0 < g.k; p0 += K::kc) {
    const std::size_t kc = std::min(K::kc, g.k - p0);
    const bool overwrite = p0 == 0 && !g.accumulate;
    // op(A) is transposed storage when A is not: A [m, k] holds each row contiguous in p.
    pack_block<K, K::mr>(g.a, g.lda, !g.ta, i0, i1, p0, kc, abuf);
    pack_block<K, K::nr>(g.b, g.ldb, g.tb, j0, j1, p0, kc, bbuf);
    for (std::size_t jp = 0; jp < b_panels; ++jp) {
      const std::size_t j = j0 + jp * K::nr;
      const std::size_t cols = std::min(K::nr, j1 - j);
      for (std::size_t ip = 0; ip < a_panels; ++ip) {
        const std::size_t i = i0 + ip * K::mr;
        K::micro(kc, abuf + ip * K::mr * kc, bbuf + jp * K::nr * kc, g.c + i * g.ldc + j, g.ldc,
                 std::min(K::mr, i1 - i), cols, overwrite);
      }
    }
  }
}

template <class K>
void run(const problem& g, thread_pool* pool) {
  const std::size_t threads = pool == nullptr ? 1 : pool->size();
  const plan pl = make_plan<K>(g, threads);
  const std::size_t units = pl.row_blocks * pl.col_blocks;
  auto unit = [&](std::size_t u) {
    const std::size_t rb = u / pl.col_blocks, cb = u % pl.col_blocks;
    const std::size_t i0 = rb * pl.mc, j0 = cb * pl.nc;
    run_unit<K>(g, i0, std::min(g.m, i0 + pl.mc), j0, std::min(g.n, j0 + pl.nc));
  };
  if (pool == nullptr || units == 1) {
    for (std::size_t u = 0; u < units; ++u) unit(u);
    return;
  }
  pool->parallel_for(units, 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t u = begin; u < end; ++u) unit(u);
  });
}

}  // namespace tlm::kernels::gemm_detail
