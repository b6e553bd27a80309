// gemm (kernels/gemm.hpp) on every kernel level against gemm_reference<double>, across
// transposes, sizes, misalignments, strides, accumulation and thread counts.
//
// Tolerance, per element C[i, j]:
//   |C_fast - C_ref| <= (k + 2) * 2^-23 * (sum_p |op(A)[i,p] op(B)[p,j]| + |C_old[i,j]|)
// Why: the fast paths sum the k products in float32 in blocks of kc (FMA, or a rounded
// product then an add on the scalar level) and add each block's sum to C. A term then
// passes through at most 1 (product) + k (block sum) + ceil(k / kc) + 1 (adds into C)
// <= 2k + 2 roundings of relative size u = 2^-24, so the classic bound for recursive
// summation gives (2k + 2) u (1 + O(k u)) times the sum of absolute values; rounding
// the double reference to float adds u once more. 2 (k + 2) u = (k + 2) 2^-23 covers
// both. Typical errors are far smaller (about sqrt(k) u); the worst ratio seen is printed.
#include <doctest/doctest.h>

#include "kernel_levels.hpp"

#include <tlm/kernels/gemm.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_gemm {

namespace {

namespace k = tlm::kernels;
using k::transpose;

using tlm_test::level_guard;
using tlm_test::testable_levels;

const transpose both[] = {transpose::no, transpose::yes};

const char* name(transpose t) { return t == transpose::yes ? "T" : "N"; }

// A matrix stored [rows, cols] with row stride ld, at `offset` floats past a 64-byte
// aligned base, surrounded by guard values that must survive every call.
struct matrix {
  static constexpr float guard = -777.25f;
  std::size_t rows, cols, ld, offset;
  std::vector<float> storage;
  float* data;
  matrix(std::size_t r, std::size_t c, std::size_t ld_, std::size_t off)
      : rows(r), cols(c), ld(ld_), offset(off), storage(off + r * ld_ + 32, guard) {
    // std::vector's buffer is at least 16-byte aligned; move to a 64-byte boundary.
    storage.resize(storage.size() + 16, guard);
    const auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t shift = ((64 - addr % 64) % 64) / sizeof(float);
    data = storage.data() + shift + off;
  }
  float& at(std::size_t r, std::size_t c) { return data[r * ld + c]; }
  float at(std::size_t r, std::size_t c) const { return data[r * ld + c]; }
  void fill(std::mt19937& rng) {
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) at(r, c) = unit(rng);
  }
  // Every float outside the [rows, cols] window still holds the guard.
  bool guards_intact() const {
    const float* base = data - offset;
    const float* end = storage.data() + storage.size();
    for (const float* p = storage.data(); p < end; ++p) {
      const std::size_t i = static_cast<std::size_t>(p - data);
      const bool inside = p >= data && i / ld < rows && i % ld < cols;
      if (!inside && p >= base && !(*p == guard)) return false;
    }
    return true;
  }
  std::vector<double> to_double() const {
    std::vector<double> out(rows * ld, 0.0);  // [rows, ld]
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) out[r * ld + c] = at(r, c);
    return out;
  }
};

double gemm_worst_ratio = 0;

struct gemm_case {
  transpose ta, tb;
  std::size_t m, n, k;
  std::size_t pad = 0;     // extra floats per row of every operand
  std::size_t offset = 0;  // floats past a 64-byte boundary, for every operand
  bool accumulate = false;
};

std::string describe(const gemm_case& c, tlm::kernel_level level, std::size_t threads) {
  return std::string(tlm::kernel_level_name(level)) + " " + name(c.ta) + name(c.tb) + " m=" + std::to_string(c.m) +
         " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " pad=" + std::to_string(c.pad) +
         " offset=" + std::to_string(c.offset) + (c.accumulate ? " accumulate" : "") + " threads=" +
         std::to_string(threads);
}

// Runs one case on the active level and checks every element against the reference.
// Returns C so callers can compare runs bitwise.
std::vector<float> check_case(const gemm_case& c, std::mt19937& rng, tlm::thread_pool* pool = nullptr,
                              std::uint32_t seed = 0) {
  const bool ta = c.ta == transpose::yes, tb = c.tb == transpose::yes;
  const std::size_t ar = ta ? c.k : c.m, ac = ta ? c.m : c.k;
  const std::size_t br = tb ? c.n : c.k, bc = tb ? c.k : c.n;
  matrix a(ar, ac, ac + c.pad, c.offset), b(br, bc, bc + c.pad, c.offset), out(c.m, c.n, c.n + c.pad, c.offset);
  std::mt19937 local(seed);
  std::mt19937& g = seed != 0 ? local : rng;
  a.fill(g);
  b.fill(g);
  out.fill(g);
  const auto ad = a.to_double(), bd = b.to_double(), cd0 = out.to_double();
  auto cd = cd0;
  k::gemm_reference<double>(c.ta, c.tb, c.m, c.n, c.k, ad.data(), a.ld, bd.data(), b.ld, cd.data(), out.ld,
                            c.accumulate);
  k::gemm(c.ta, c.tb, c.m, c.n, c.k, a.data, a.ld, b.data, b.ld, out.data, out.ld, c.accumulate, pool);

  const double unit = std::ldexp(1.0, -23) * static_cast<double>(c.k + 2);
  int bad = 0;
  for (std::size_t i = 0; i < c.m; ++i) {
    for (std::size_t j = 0; j < c.n; ++j) {
      double s = c.accumulate ? std::fabs(cd0[i * out.ld + j]) : 0.0;
      for (std::size_t p = 0; p < c.k; ++p) {
        const double x = ta ? ad[p * a.ld + i] : ad[i * a.ld + p];
        const double y = tb ? bd[j * b.ld + p] : bd[p * b.ld + j];
        s += std::fabs(x * y);
      }
      const double err = std::fabs(static_cast<double>(out.at(i, j)) - cd[i * out.ld + j]);
      const double allowed = unit * s + 1e-37;
      gemm_worst_ratio = std::max(gemm_worst_ratio, err / allowed);
      if (!(err <= allowed)) {
        if (bad == 0) {
          INFO(describe(c, k::active_kernel_level(), pool ? pool->size() : 1));
          INFO("C[" << i << ", " << j << "] = " << out.at(i, j) << ", reference " << cd[i * out.ld + j]
                    << ", sum|ab| " << s);
          CHECK(err <= allowed);
        }
        ++bad;
      }
    }
  }
  if (!out.guards_intact() || !a.guards_intact() || !b.guards_intact()) {
    INFO(describe(c, k::active_kernel_level(), pool ? pool->size() : 1));
    FAIL_CHECK("gemm wrote outside C's [m, n] window, or into A or B");
  }
  std::vector<float> result(c.m * c.n);  // [m, n]
  for (std::size_t i = 0; i < c.m; ++i)
    for (std::size_t j = 0; j < c.n; ++j) result[i * c.n + j] = out.at(i, j);
  return result;
}

}  // namespace

TEST_CASE("gemm_reference on hand-computed 2x3 . 3x2 products, float and double, every transpose") {
  // A = [[1 2 3] [4 5 6]], B = [[7 8] [9 10] [11 12]], A B = [[58 64] [139 154]].
  auto run = [](auto zero) {
    using T = decltype(zero);
    const T a[] = {1, 2, 3, 4, 5, 6};      // [2, 3]
    const T at[] = {1, 4, 2, 5, 3, 6};     // [3, 2] = A^T
    const T b[] = {7, 8, 9, 10, 11, 12};   // [3, 2]
    const T bt[] = {7, 9, 11, 8, 10, 12};  // [2, 3] = B^T
    const T want[] = {58, 64, 139, 154};
    for (transpose ta : both) {
      for (transpose tb : both) {
        T c[4] = {100, 100, 100, 100};  // [2, 2]
        const T* pa = ta == transpose::yes ? at : a;
        const T* pb = tb == transpose::yes ? bt : b;
        const std::size_t lda = ta == transpose::yes ? 2 : 3, ldb = tb == transpose::yes ? 3 : 2;
        k::gemm_reference<T>(ta, tb, 2, 2, 3, pa, lda, pb, ldb, c, 2, false);
        for (int i = 0; i < 4; ++i) CHECK(c[i] == want[i]);
        k::gemm_reference<T>(ta, tb, 2, 2, 3, pa, lda, pb, ldb, c, 2, true);
        for (int i = 0; i < 4; ++i) CHECK(c[i] == 2 * want[i]);
      }
    }
    // Padded strides: A in a [2, 5] buffer, C in a [2, 4] buffer whose padding stays.
    const T ap[] = {1, 2, 3, -1, -1, 4, 5, 6, -1, -1};
    T cp[8] = {0, 0, 9, 9, 0, 0, 9, 9};
    k::gemm_reference<T>(transpose::no, transpose::no, 2, 2, 3, ap, 5, b, 2, cp, 4, false);
    const T want_p[] = {58, 64, 9, 9, 139, 154, 9, 9};
    for (int i = 0; i < 8; ++i) CHECK(cp[i] == want_p[i]);
  };
  run(0.0f);
  run(0.0);
}

TEST_CASE("gemm on every level: a hand-computed product is exact") {
  level_guard guard;
  const float a[] = {1, 2, 3, 4, 5, 6};     // [2, 3]
  const float b[] = {7, 8, 9, 10, 11, 12};  // [3, 2]
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    float c[4] = {1, 1, 1, 1};  // [2, 2]
    k::gemm(transpose::no, transpose::no, 2, 2, 3, a, 3, b, 2, c, 2, false);
    CHECK(c[0] == 58);
    CHECK(c[1] == 64);
    CHECK(c[2] == 139);
    CHECK(c[3] == 154);
    k::gemm(transpose::no, transpose::no, 2, 2, 3, a, 3, b, 2, c, 2, true);
    CHECK(c[3] == 308);
  }
}

TEST_CASE("gemm: every level and transpose against the reference, sizes 1..70 in each dimension") {
  level_guard guard;
  std::mt19937 rng(77);
  std::size_t cases = 0;
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (transpose ta : both) {
      for (transpose tb : both) {
        // Every value 1..70 occurs once for each of m, n and k (37 and 53 are coprime to 70),
        // in varied combinations, with every mix of padding, misalignment and accumulation.
        for (std::size_t i = 0; i < 70; ++i) {
          gemm_case c{ta, tb, i + 1, (i * 37) % 70 + 1, (i * 53) % 70 + 1};
          c.pad = i % 3 == 0 ? 0 : i % 3 == 1 ? 1 : 13;
          c.offset = (i / 3) % 2;
          c.accumulate = (i / 2) % 2 == 1;
          check_case(c, rng);
          ++cases;
        }
      }
    }
  }
  std::cout << "gemm sizes 1..70: " << cases << " cases, worst |err| / bound " << gemm_worst_ratio << "\n";
}

TEST_CASE("gemm: tile and k-block edges, and larger products") {
  level_guard guard;
  std::mt19937 rng(78);
  // Around every level's tile (4x8, 6x16, 12x32) and k block (192, 256).
  const std::size_t ms[] = {1, 5, 6, 7, 12, 13, 25};
  const std::size_t ns[] = {1, 15, 16, 17, 33};
  const std::size_t ks[] = {1, 191, 192, 193, 256, 257, 513};
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    for (transpose ta : both) {
      for (transpose tb : both) {
        std::size_t i = 0;
        for (std::size_t m : ms) {
          for (std::size_t n : ns) {
            const std::size_t kk = ks[i % std::size(ks)];
            gemm_case c{ta, tb, m, n, kk, i % 2, (i / 2) % 2, i % 3 == 0};
            check_case(c, rng);
            ++i;
          }
        }
        check_case({ta, tb, 257, 129, 300, 3, 1, true}, rng);
        check_case({ta, tb, 600, 70, 40, 0, 0, false}, rng);  // more than one row block
        check_case({ta, tb, 20, 1100, 30, 1, 1, true}, rng);  // more than one column block
      }
    }
  }
  std::cout << "gemm edges: worst |err| / bound " << gemm_worst_ratio << "\n";
}

TEST_CASE("gemm: pools of 1, 2 and 3 threads give bitwise the single-threaded result") {
  level_guard guard;
  std::mt19937 rng(79);
  tlm::thread_pool p1(1), p2(2), p3(3);
  const gemm_case cases[] = {
      {transpose::no, transpose::yes, 257, 129, 300, 0, 0, false},
      {transpose::no, transpose::no, 130, 300, 520, 1, 1, true},
      {transpose::yes, transpose::no, 1100, 40, 70, 0, 1, true},
      {transpose::yes, transpose::yes, 33, 700, 45, 2, 0, false},
  };
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    std::uint32_t seed = 1;
    for (const auto& c : cases) {
      const auto r0 = check_case(c, rng, nullptr, seed);
      for (tlm::thread_pool* p : {&p1, &p2, &p3}) {
        const auto r = check_case(c, rng, p, seed);
        INFO(describe(c, level, p->size()));
        CHECK(std::memcmp(r.data(), r0.data(), r.size() * sizeof(float)) == 0);
      }
      ++seed;
    }
  }
}

TEST_CASE("gemm: the three training products at SmolLM2-135M size, sampled against the reference") {
  // X [512, 576], W [1536, 576], dY [512, 1536]: forward Y = X W^T, input gradient
  // dX += dY W, weight gradient dW += dY^T X, on the start-up level with two threads.
  std::mt19937 rng(80);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const std::size_t n = 512, cin = 576, r = 1536;
  auto random = [&](std::size_t count) {
    std::vector<float> v(count);
    for (auto& f : v) f = unit(rng);
    return v;
  };
  const auto x = random(n * cin), w = random(r * cin), dy = random(n * r);
  auto y = random(n * r), dx = random(n * cin), dw = random(r * cin);
  const auto dx0 = dx, dw0 = dw;
  tlm::thread_pool pool(2);
  k::gemm(transpose::no, transpose::yes, n, r, cin, x.data(), cin, w.data(), cin, y.data(), r, false, &pool);
  k::gemm(transpose::no, transpose::no, n, cin, r, dy.data(), r, w.data(), cin, dx.data(), cin, true, &pool);
  k::gemm(transpose::yes, transpose::no, r, cin, n, dy.data(), r, x.data(), cin, dw.data(), cin, true, &pool);

  struct sample_check {
    const char* what;
    std::size_t rows, cols, depth;
  };
  std::uniform_int_distribution<std::size_t> any(0, 1u << 30);
  auto check = [&](const sample_check& s, auto&& term, const std::vector<float>& got,
                   const std::vector<float>* before) {
    for (int t = 0; t < 300; ++t) {
      const std::size_t i = any(rng) % s.rows, j = any(rng) % s.cols;
      double sum = before ? (*before)[i * s.cols + j] : 0.0, abs = before ? std::fabs((*before)[i * s.cols + j]) : 0.0;
      for (std::size_t p = 0; p < s.depth; ++p) {
        const double v = term(i, j, p);
        sum += v;
        abs += std::fabs(v);
      }
      const double err = std::fabs(static_cast<double>(got[i * s.cols + j]) - sum);
      const double allowed = std::ldexp(1.0, -23) * static_cast<double>(s.depth + 2) * abs;
      INFO(s.what << " [" << i << ", " << j << "]: " << got[i * s.cols + j] << " vs " << sum);
      REQUIRE(err <= allowed);
    }
  };
  check({"forward Y = X W^T", n, r, cin},
        [&](std::size_t i, std::size_t j, std::size_t p) { return double(x[i * cin + p]) * w[j * cin + p]; }, y, nullptr);
  check({"input gradient dX += dY W", n, cin, r},
        [&](std::size_t i, std::size_t j, std::size_t p) { return double(dy[i * r + p]) * w[p * cin + j]; }, dx, &dx0);
  check({"weight gradient dW += dY^T X", r, cin, n},
        [&](std::size_t i, std::size_t j, std::size_t p) { return double(dy[p * r + i]) * x[p * cin + j]; }, dw, &dw0);
}

TEST_CASE("gemm: empty products and k = 0") {
  level_guard guard;
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    std::vector<float> a(12, 1.0f), b(12, 1.0f), c(12, 5.0f);
    // m or n = 0: nothing is written.
    k::gemm(transpose::no, transpose::no, 0, 3, 4, a.data(), 4, b.data(), 3, c.data(), 3, false);
    k::gemm(transpose::no, transpose::no, 3, 0, 4, a.data(), 4, b.data(), 0, c.data(), 0, false);
    CHECK(std::all_of(c.begin(), c.end(), [](float v) { return v == 5.0f; }));
    // k = 0 accumulating: C is unchanged; not accumulating: C [3, 3] in a stride of 4 becomes zero.
    k::gemm(transpose::no, transpose::no, 3, 3, 0, a.data(), 0, b.data(), 3, c.data(), 4, true);
    CHECK(std::all_of(c.begin(), c.end(), [](float v) { return v == 5.0f; }));
    k::gemm(transpose::no, transpose::no, 3, 3, 0, nullptr, 0, nullptr, 3, c.data(), 4, false);
    for (std::size_t i = 0; i < 12; ++i) CHECK(c[i] == (i % 4 == 3 ? 5.0f : 0.0f));
  }
}

TEST_CASE("gemm: bad arguments are reported, not computed") {
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 0.0f);
  using tlm::shape_error;
  // A [4, 8] with lda 7 < k.
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::no, 4, 4, 8, a.data(), 7, b.data(), 4, c.data(), 4, false),
                  shape_error);
  // A^T stored [8, 4] with lda 3 < m.
  CHECK_THROWS_AS(k::gemm(transpose::yes, transpose::no, 4, 4, 8, a.data(), 3, b.data(), 4, c.data(), 4, false),
                  shape_error);
  // B [8, 4] with ldb 3 < n; B^T stored [4, 8] with ldb 7 < k.
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::no, 4, 4, 8, a.data(), 8, b.data(), 3, c.data(), 4, false),
                  shape_error);
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::yes, 4, 4, 8, a.data(), 8, b.data(), 7, c.data(), 4, false),
                  shape_error);
  // ldc < n.
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::no, 4, 4, 8, a.data(), 8, b.data(), 4, c.data(), 3, false),
                  shape_error);
  // Null pointers with nonzero sizes.
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::no, 4, 4, 8, nullptr, 8, b.data(), 4, c.data(), 4, false),
                  tlm::error);
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::no, 4, 4, 8, a.data(), 8, nullptr, 4, c.data(), 4, false),
                  tlm::error);
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::no, 4, 4, 8, a.data(), 8, b.data(), 4, nullptr, 4, false),
                  tlm::error);
  // C overlapping A.
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::no, 4, 4, 8, a.data(), 8, b.data(), 4, a.data() + 8, 4, false),
                  tlm::error);
  // C == A with another stride, and C as a shifted view of B with B's stride.
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::no, 4, 4, 8, a.data(), 8, b.data(), 4, a.data(), 5, false),
                  tlm::error);
  CHECK_THROWS_AS(k::gemm(transpose::no, transpose::no, 4, 4, 8, a.data(), 8, b.data(), 4, b.data() + 3, 4, false),
                  tlm::error);
  // The message says what to do.
  try {
    k::gemm(transpose::no, transpose::no, 4, 4, 8, a.data(), 7, b.data(), 4, c.data(), 4, false);
  } catch (const shape_error& e) {
    CHECK(std::string(e.what()).find("lda 7") != std::string::npos);
    CHECK(std::string(e.what()).find("row stride") != std::string::npos);
  }
  // Volatile, so the compiler cannot see the null and warn about the loop the check never reaches.
  double* volatile no_buffer = nullptr;
  CHECK_THROWS_AS(k::gemm_reference<double>(transpose::no, transpose::no, 4, 4, 8, no_buffer, 8, no_buffer, 4,
                                            no_buffer, 4, false),
                  tlm::error);
}

TEST_CASE("gemm: A and C as disjoint column slices of one buffer is not an overlap") {
  // One activation matrix [6, 12]: columns 0..4 hold the input X [6, 5], columns 5..11
  // receive Y [6, 7] = X W^T, W [7, 5].
  level_guard guard;
  std::mt19937 rng(81);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    std::vector<float> buf(6 * 12), w(7 * 5);  // [6, 12], [7, 5]
    for (auto& v : buf) v = unit(rng);
    for (auto& v : w) v = unit(rng);
    std::vector<double> xd(6 * 5), wd(w.begin(), w.end()), yd(6 * 7);  // [6, 5], [7, 5], [6, 7]
    for (std::size_t i = 0; i < 6; ++i)
      for (std::size_t p = 0; p < 5; ++p) xd[i * 5 + p] = buf[i * 12 + p];
    k::gemm_reference<double>(transpose::no, transpose::yes, 6, 7, 5, xd.data(), 5, wd.data(), 5, yd.data(), 7, false);
    const auto x_before = xd;
    k::gemm(transpose::no, transpose::yes, 6, 7, 5, buf.data(), 12, w.data(), 5, buf.data() + 5, 12, false);
    for (std::size_t i = 0; i < 6; ++i) {
      for (std::size_t p = 0; p < 5; ++p) CHECK(buf[i * 12 + p] == x_before[i * 5 + p]);
      for (std::size_t j = 0; j < 7; ++j) CHECK(buf[i * 12 + 5 + j] == doctest::Approx(yd[i * 7 + j]).epsilon(1e-5));
    }
  }
}

TEST_CASE("gemm: steady-state calls reuse the thread's packing buffers") {
  level_guard guard;
  std::vector<float> a(300 * 200, 0.5f), b(200 * 100, 0.25f), c(300 * 100);  // [300, 200], [200, 100], [300, 100]
  for (auto level : testable_levels()) {
    k::force_kernel_level(level);
    auto& s = k::gemm_detail::thread_scratch();
    k::gemm(transpose::no, transpose::no, 300, 100, 200, a.data(), 200, b.data(), 100, c.data(), 100, false);
    const float* pa = s.a(0);  // asking for 0 floats returns the current buffer without growing it
    const float* pb = s.b(0);
    for (int i = 0; i < 3; ++i) {
      k::gemm(transpose::no, transpose::no, 300, 100, 200, a.data(), 200, b.data(), 100, c.data(), 100, true);
      k::gemm(transpose::yes, transpose::yes, 100, 50, 150, a.data(), 100, b.data(), 150, c.data(), 100, false);
    }
    CHECK(s.a(0) == pa);
    CHECK(s.b(0) == pb);
  }
}

}  // namespace test_gemm
