// The block's attention (online softmax over key blocks, per row for inference and a
// tile of rows at a time for training; backward from the saved log-sum-exp) against the
// plain T x T definition, forward and backward.
#include <doctest/doctest.h>

#include <tlm/ops.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "counting_allocator.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_attention {

namespace {

// Shannon entropy (nats) of the probabilities attend() leaves in its scores: the
// reference for the entropy the block's kernel reports for the traced forward.
double shannon_entropy(std::span<const float> p) {
  double h = 0.0;
  for (float v : p)
    if (v > 0.0f) h -= static_cast<double>(v) * std::log(static_cast<double>(v));
  return h;
}

struct case_data {
  std::size_t len, E, group;
  std::vector<double> q, k, v, d_o;  // q, d_o: [len, group * E]; k, v: [len, E]
};

case_data make(std::size_t len, std::size_t E, std::size_t group, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  case_data c{len, E, group, {}, {}, {}, {}};
  for (auto* x : {&c.q, &c.d_o}) x->resize(len * group * E);
  for (auto* x : {&c.k, &c.v}) x->resize(len * E);
  for (auto* x : {&c.q, &c.k, &c.v, &c.d_o})
    for (auto& y : *x) y = 2.0 * n(rng);  // scores of a few units: a peaked softmax
  return c;
}

// The plain definition in double: the whole probability matrix of each head.
//   dV = Pᵀ dO;  dP = dO Vᵀ;  dS = P ⊙ (dP − rowsum(P ⊙ dP));  dQ = s dS K;  dK = s dSᵀ Q
void plain(const case_data& c, std::vector<double>& o, std::vector<double>& dq, std::vector<double>& dk,
           std::vector<double>& dv) {
  const std::size_t L = c.len, E = c.E, W = c.group * E;
  const double s = 1.0 / std::sqrt(static_cast<double>(E));
  o.assign(L * W, 0.0);
  dq.assign(L * W, 0.0);
  dk.assign(L * E, 0.0);
  dv.assign(L * E, 0.0);
  for (std::size_t hh = 0; hh < c.group; ++hh) {
    std::vector<double> P(L * L, 0.0), dP(L * L, 0.0);
    for (std::size_t i = 0; i < L; ++i) {
      double top = -INFINITY;
      for (std::size_t j = 0; j <= i; ++j) {
        double d = 0;
        for (std::size_t e = 0; e < E; ++e) d += c.q[i * W + hh * E + e] * c.k[j * E + e];
        P[i * L + j] = d * s;
        top = std::max(top, d * s);
      }
      double z = 0;
      for (std::size_t j = 0; j <= i; ++j) z += (P[i * L + j] = std::exp(P[i * L + j] - top));
      for (std::size_t j = 0; j <= i; ++j) P[i * L + j] /= z;
      for (std::size_t j = 0; j <= i; ++j)
        for (std::size_t e = 0; e < E; ++e) o[i * W + hh * E + e] += P[i * L + j] * c.v[j * E + e];
    }
    for (std::size_t i = 0; i < L; ++i) {
      double rowsum = 0;
      for (std::size_t j = 0; j <= i; ++j) {
        double d = 0;
        for (std::size_t e = 0; e < E; ++e) d += c.d_o[i * W + hh * E + e] * c.v[j * E + e];
        dP[i * L + j] = d;
        rowsum += P[i * L + j] * d;
      }
      for (std::size_t j = 0; j <= i; ++j) {
        const double dS = P[i * L + j] * (dP[i * L + j] - rowsum);
        for (std::size_t e = 0; e < E; ++e) {
          dq[i * W + hh * E + e] += s * dS * c.k[j * E + e];
          dk[j * E + e] += s * dS * c.q[i * W + hh * E + e];
          dv[j * E + e] += P[i * L + j] * c.d_o[i * W + hh * E + e];
        }
      }
    }
  }
}

double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0, e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(b[i]));
    e = std::max(e, std::abs(a[i] - b[i]));
  }
  return m > 0 ? e / m : e;
}

template <class T>
double blockwise_error(const case_data& c) {
  const std::size_t L = c.len, E = c.E, W = c.group * E;
  const T s = static_cast<T>(1.0 / std::sqrt(static_cast<double>(E)));
  auto cast = [](const std::vector<double>& x) { return std::vector<T>(x.begin(), x.end()); };
  const auto q = cast(c.q), k = cast(c.k), v = cast(c.v), d_o = cast(c.d_o);
  std::vector<T> o(L * W), lse(L * c.group), dq(L * W, T(0)), dk(L * E, T(0)), dv(L * E, T(0));
  std::vector<T> o2(L * W), lse2(L * c.group);  // the tiled forward's
  // The backward's products use the GEMM's per-thread packing buffers, which a
  // training step reserves up front on each thread (reserve_gemm_scratch); so here.
  tlm::kernels::reserve_gemm_scratch();
  const std::size_t before = tlm_test::allocations.load();
  for (std::size_t i = 0; i < L; ++i)
    for (std::size_t hh = 0; hh < c.group; ++hh)
      lse[i * c.group + hh] = tlm::attention_row<T>(q.data() + i * W + hh * E, k.data(), v.data(), E, i + 1, E, s,
                                                     o.data() + i * W + hh * E);
  tlm::attention_backward<T>(L, E, c.group, s, q.data(), o.data(), d_o.data(), dq.data(), W, k.data(), v.data(),
                             dk.data(), dv.data(), E, lse.data(), c.group);
  // Training's tiled forward (attention_forward), its rows cut into runs of 1 to
  // attention_tile rows that start anywhere in a tile, as packed segments cut them.
  const std::size_t runs[] = {1, 17, tlm::attention_tile, 30, 2, tlm::attention_tile - 1, 45};
  for (std::size_t i0 = 0, u = 0; i0 < L; ++u) {
    const std::size_t ni = std::min(runs[u % std::size(runs)], L - i0);
    tlm::attention_forward<T>(i0, ni, E, c.group, s, q.data() + i0 * W, o2.data() + i0 * W, W, k.data(), v.data(), E,
                              lse2.data() + i0 * c.group, c.group);
    i0 += ni;
  }
  // No heap memory beyond that: the forwards keep one block of scores on the stack and
  // the backward one tile of probabilities, recomputed from the saved log-sum-exp.
  CHECK(tlm_test::allocations.load() == before);
  CHECK_THROWS_AS(tlm::attention_forward<T>(0, tlm::attention_tile + 1, E, c.group, s, q.data(), o2.data(), W,
                                            k.data(), v.data(), E, lse2.data(), c.group),
                  tlm::shape_error);
  std::vector<double> po, pdq, pdk, pdv;
  plain(c, po, pdq, pdk, pdv);
  auto widen = [](const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); };
  return std::max({rel(widen(o), po), rel(widen(o2), po), rel(widen(lse2), widen(lse)), rel(widen(dq), pdq),
                   rel(widen(dk), pdk), rel(widen(dv), pdv)});
}

}  // namespace

TEST_CASE("blockwise attention equals the plain T x T computation for T = 1..300, forward and backward") {
  double worst_double = 0, worst_float = 0;
  for (std::size_t len = 1; len <= 300; len += (len < 70 ? 1 : 23)) {
    const auto c = make(len, 16, 2, static_cast<unsigned>(len));
    const double ed = blockwise_error<double>(c), ef = blockwise_error<float>(c);
    INFO("T = " << len);
    CHECK(ed <= 1e-12);
    CHECK(ef <= 2e-5);
    worst_double = std::max(worst_double, ed);
    worst_float = std::max(worst_float, ef);
  }
  const auto c = make(300, 64, 3, 300);
  CHECK(blockwise_error<double>(c) <= 1e-12);
  MESSAGE("worst relative error: double " << worst_double << ", float " << worst_float);
}

TEST_CASE("the block's forward attention equals the reference attend() of the inference path") {
  using C = tlm::tiny_untied;  // head_dim 32
  constexpr std::size_t E = tlm::head_dim<C>;
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (std::size_t len : {1, 2, 63, 64, 65, 128, 200}) {
    std::vector<float> q(E), keys(len * E), values(len * E), scores(len), a(E), b(E);
    for (auto* x : {&q, &keys, &values})
      for (auto& y : *x) y = n(rng);
    tlm::attend<C>(std::span<const float, E>(q.data(), E), keys, values, scores, std::span<float, E>(a.data(), E));
    float entropy = 0;
    tlm::attention_row<float>(q.data(), keys.data(), values.data(), E, len, E, 1.0f / std::sqrt(float(E)), b.data(),
                              &entropy);
    for (std::size_t e = 0; e < E; ++e) CHECK(b[e] == doctest::Approx(a[e]).epsilon(1e-5));
    CHECK(entropy == doctest::Approx(shannon_entropy(scores)).epsilon(1e-4));
  }
}

TEST_CASE("a decode row's positions: segments of whole blocks that cover them, fewer as the step has more units") {
  for (std::size_t visible = 1; visible <= 2000; ++visible) {
    for (const std::size_t units : {1, 2, 3, 5, 8, 15, 16, 17, 64}) {
      const std::size_t segs = tlm::detail::decode_segments(visible, units);
      CHECK(segs >= 1);
      CHECK(segs <= std::max<std::size_t>(1, visible / tlm::attention_block));
      CHECK(segs <= std::max<std::size_t>(1, (tlm::detail::decode_units + units - 1) / units));
      if (units >= tlm::detail::decode_units) CHECK(segs == 1);
      CHECK(tlm::detail::segment_start(visible, segs, 0) == 0);
      CHECK(tlm::detail::segment_start(visible, segs, segs) == visible);
      for (std::size_t s = 1; s < segs; ++s) {
        const std::size_t at = tlm::detail::segment_start(visible, segs, s);
        CHECK(at % tlm::attention_block == 0);
        CHECK(at > tlm::detail::segment_start(visible, segs, s - 1));
      }
      if (segs > 1) CHECK(tlm::detail::segment_start(visible, segs, segs - 1) < visible);
    }
  }
  // SmolLM2's decode step (3 kv heads): 2 segments at 130 positions, 6 from 384 on.
  CHECK(tlm::detail::decode_segments(130, 3) == 2);
  CHECK(tlm::detail::decode_segments(384, 3) == 6);
  CHECK(tlm::detail::decode_segments(4096, 3) == 6);
  CHECK(tlm::detail::decode_segments(63, 3) == 1);
}

// attention_heads over each segment of the positions, then merge_segments, against one
// attention_heads over them all: float to rounding, double to 1e-12.
template <class T>
void check_segments_merge(double tol) {
  constexpr std::size_t E = 64, nq = 3;
  std::mt19937 rng(17);
  std::normal_distribution<double> n(0.0, 1.0);
  for (std::size_t visible : {64, 65, 127, 128, 130, 300, 384, 700}) {
    std::vector<T> q(nq * E), keys(visible * E), values(visible * E);
    for (auto* x : {&q, &keys, &values})
      for (auto& y : *x) y = static_cast<T>(2.0 * n(rng));
    keys[3 * E] = static_cast<T>(40.0);  // one position's scores far above the rest
    const T scale = static_cast<T>(1.0 / std::sqrt(double(E)));
    std::vector<T> whole(nq * E), whole_lse(nq);
    tlm::attention_heads(tlm::detail::float_rows<T>{keys.data(), values.data(), E}, q.data(), nq, visible, E, scale,
                         whole.data(), whole_lse.data());
    for (std::size_t segs = 2; segs <= visible / tlm::attention_block; ++segs) {
      constexpr std::size_t part = nq * E + nq;
      std::vector<T> parts(segs * part), got(nq * E), got_lse(nq);
      for (std::size_t s = 0; s < segs; ++s) {
        const std::size_t from = tlm::detail::segment_start(visible, segs, s), to = tlm::detail::segment_start(visible, segs, s + 1);
        tlm::attention_heads(tlm::detail::float_rows<T>{keys.data() + from * E, values.data() + from * E, E}, q.data(), nq,
                             to - from, E, scale, parts.data() + s * part, parts.data() + s * part + nq * E);
      }
      tlm::merge_segments<T>(parts.data(), segs, part, nq, E, got.data(), got_lse.data());
      INFO("visible " << visible << ", segments " << segs);
      double worst = 0, largest = 0;
      for (std::size_t i = 0; i < nq * E; ++i) {
        worst = std::max(worst, std::abs(double(got[i]) - double(whole[i])));
        largest = std::max(largest, std::abs(double(whole[i])));
      }
      CHECK(worst <= tol * largest);
      for (std::size_t h = 0; h < nq; ++h) CHECK(std::abs(double(got_lse[h]) - double(whole_lse[h])) <= tol * std::abs(double(whole_lse[h])) + tol);
    }
  }
}

TEST_CASE("a decode row's segments, attended apart and merged, equal one pass over its positions") {
  check_segments_merge<float>(2e-6);
  check_segments_merge<double>(1e-12);
  // A NaN in one segment's keys makes the merged row NaN, as it makes the one pass's.
  constexpr std::size_t E = 64, nq = 1, part = nq * E + nq;
  std::vector<float> parts(2 * part, 0.5f);
  parts[part + E] = std::numeric_limits<float>::quiet_NaN();  // the second segment's lse
  std::vector<float> out(E), lse(1);
  tlm::merge_segments<float>(parts.data(), 2, part, nq, E, out.data(), lse.data());
  CHECK(std::isnan(out[0]));
  CHECK(std::isnan(lse[0]));
}

}  // namespace test_attention
