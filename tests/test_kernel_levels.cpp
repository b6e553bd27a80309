// One row per kernel level (kernels/levels.hpp): the table has a row for every level,
// its names are unique, its CPU test is the one the levels always had, its targets are
// the macros the kernels are compiled with, and every function table it names is full.
#include <doctest/doctest.h>

#include "kernel_levels.hpp"

#include <tlm/kernels.hpp>

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace test_kernel_levels {

namespace k = tlm::kernels;
using tlm::kernel_level;

// Every enumerator of kernel_level: a new level is added here, and must then have a row.
constexpr kernel_level all_levels[] = {kernel_level::scalar, kernel_level::avx2, kernel_level::avx512, kernel_level::amx};

// Whether a table entry holds a function (doctest cannot print function pointers).
template <class F>
bool is_set(F f) {
  return f != nullptr;
}

std::vector<std::string_view> features_of(std::string_view target) {
  std::vector<std::string_view> out;
  while (!target.empty()) {
    const std::size_t comma = target.find(',');
    out.push_back(target.substr(0, comma));
    target = comma == std::string_view::npos ? std::string_view{} : target.substr(comma + 1);
  }
  return out;
}

TEST_CASE("kernel_level_rows: one row per level, at its index, names unique and parsed back") {
  CHECK(tlm::kernel_level_count == std::size(all_levels));
  std::set<std::string_view> names;
  for (const kernel_level l : all_levels) {
    const auto& r = tlm::kernel_level_row_of(l);
    INFO("level " << static_cast<int>(l) << " row " << r.name);
    CHECK(r.level == l);
    CHECK_FALSE(r.name.empty());
    CHECK(names.insert(r.name).second);
    CHECK(tlm::kernel_level_name(l) == r.name);
    CHECK(tlm::parse_kernel_level(r.name) == l);
  }
  CHECK(names.size() == tlm::kernel_level_count);
  CHECK_THROWS_WITH_AS(tlm::parse_kernel_level("avx1024"), doctest::Contains("use scalar, avx2, avx512 or amx"),
                       tlm::error);
}

TEST_CASE("each row's CPU test is what the levels need, and its target is the macro its kernels use") {
  const auto& f = tlm::cpu();
  // The CPU tests as cpu.hpp wrote them before the rows: AVX2, FMA and F16C; the avx512
  // level AVX-512 F, BW, VL and DQ on top; the amx level the tiles, their bf16 products
  // and AVX-512's bf16 conversions on top of that.
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  const bool amx = avx512 && f.amx_tile && f.amx_bf16 && f.avx512bf16;
  CHECK(tlm::kernel_level_supported(kernel_level::scalar));
  CHECK(tlm::kernel_level_supported(kernel_level::avx2) == avx2);
  CHECK(tlm::kernel_level_supported(kernel_level::avx512) == avx512);
  CHECK(tlm::kernel_level_supported(kernel_level::amx) == amx);

  CHECK(tlm::kernel_level_row_of(kernel_level::scalar).target.empty());
  CHECK(tlm::kernel_level_row_of(kernel_level::avx2).target == TLM_TARGET_AVX2);
  CHECK(tlm::kernel_level_row_of(kernel_level::avx512).target == TLM_TARGET_AVX512);
  CHECK(tlm::kernel_level_row_of(kernel_level::amx).target == TLM_TARGET_AMX);

  const std::string detected = " " + tlm::cpu_feature_string() + " ";
  for (std::size_t i = 0; i < tlm::kernel_level_count; ++i) {
    const auto& r = tlm::kernel_level_rows[i];
    INFO("row " << r.name << " target " << r.target);
    for (const std::string_view feature : features_of(r.target)) {
      INFO("feature " << feature);
      // A name the CPU test does not know would make the level never run.
      CHECK(tlm::known_cpu_feature(feature));
      if (tlm::kernel_level_supported(r.level)) CHECK(detected.find(" " + std::string(feature) + " ") != std::string::npos);
    }
    // Levels nest: a level's target names every feature of the level below, so the
    // avx512 level may call avx2 kernels (it does, for short batches and on AMD).
    if (i > 0) {
      const auto here = features_of(r.target);
      for (const std::string_view feature : features_of(tlm::kernel_level_rows[i - 1].target)) {
        INFO("feature of the level below " << feature);
        CHECK(std::find(here.begin(), here.end(), feature) != here.end());
      }
    }
  }
  MESSAGE("cpu features: " << tlm::cpu_feature_string() << "; levels run here: " << [] {
    std::string s;
    for (const auto l : tlm::supported_kernel_levels()) s += (s.empty() ? "" : ", ") + std::string(tlm::kernel_level_name(l));
    return s;
  }());
}

TEST_CASE("every row's function table, GEMM and AdamW entries are set for each encoding the level claims") {
  for (const auto& r : tlm::kernel_level_rows) {
    INFO("row " << r.name);
#if defined(__x86_64__) || defined(__i386__)
    // On x86 every level has its kernels; elsewhere only the portable row does.
    REQUIRE(is_set(r.table));
#endif
    if (r.table == nullptr) continue;
    CHECK(is_set(r.gemm));
    CHECK(is_set(r.reserve_gemm_scratch));
    CHECK(is_set(r.adamw));
    // Building a table only takes function addresses, so it is checked even for a
    // level this CPU cannot run.
    const auto& t = r.table();
    CHECK(t.level == r.level);
    for (const tlm::encoding e : k::detail::table_encodings) {
      INFO("encoding " << tlm::name(e));
      CHECK(k::has_matrix_kernel(e));
      const auto s = static_cast<std::size_t>(k::detail::slot(e));
      CHECK(is_set(t.matvec[s]));
      CHECK(is_set(t.matmul[s]));
      if (t.matmul_narrow[s] != nullptr) CHECK(t.matmul_min_batch[s] > 1);
    }
    for (const tlm::encoding e : k::detail::fast_encodings) {
      INFO("fast encoding " << tlm::name(e));
      CHECK(k::has_fast_kernel(e));
      const auto s = static_cast<std::size_t>(k::detail::slot(e));
      CHECK(is_set(t.matvec_q8[s]));
      CHECK(is_set(t.matmul_q8[s]));
    }
    CHECK(is_set(t.quantize));
    CHECK(is_set(t.dot));
    CHECK(is_set(t.axpy));
    CHECK(is_set(t.dot_i8));
    CHECK(is_set(t.axpy_i8));
    CHECK(is_set(t.attention.scores));
    CHECK(is_set(t.attention.scores_q8));
    CHECK(is_set(t.attention.exp));
    CHECK(is_set(t.attention.accumulate));
    CHECK(is_set(t.attention.accumulate_q8));
  }
}

TEST_CASE("dispatch reads the active level's row; a level the CPU cannot run is refused, naming what it lacks") {
  tlm_test::level_guard guard;
  for (const kernel_level l : tlm_test::testable_levels()) {
    INFO("level " << tlm::kernel_level_name(l));
    k::force_kernel_level(l);
    CHECK(k::active_kernel_level() == l);
    CHECK(&k::active_kernel_row() == &tlm::kernel_level_row_of(l));
    CHECK(&k::detail::table() == &tlm::kernel_level_row_of(l).table());
    CHECK(k::kernel_level_name() == tlm::kernel_level_row_of(l).name);
  }
  CHECK(tlm::best_kernel_level() == tlm::supported_kernel_levels().back());
  for (const kernel_level l : all_levels) {
    if (tlm::kernel_level_supported(l)) continue;
    const std::string missing = tlm::missing_cpu_features(tlm::cpu(), tlm::kernel_level_row_of(l).target);
    CHECK_FALSE(missing.empty());
    CHECK_THROWS_WITH_AS(k::force_kernel_level(l), doctest::Contains(("lacks " + missing).c_str()), tlm::error);
  }
  // missing_cpu_features against a CPU with nothing: every feature, in order.
  CHECK(tlm::missing_cpu_features(tlm::cpu_features{}, "avx2,fma,f16c") == "avx2,fma,f16c");
  CHECK(tlm::missing_cpu_features(tlm::cpu_features{}, "").empty());
  CHECK(tlm::missing_cpu_features(tlm::cpu(), "no_such_feature") == "no_such_feature");
  // has_cpu_features, the allocation-free test the dispatch uses, agrees with it.
  for (const kernel_level l : all_levels) {
    const auto target = tlm::kernel_level_row_of(l).target;
    CHECK(tlm::has_cpu_features(tlm::cpu(), target) == tlm::missing_cpu_features(tlm::cpu(), target).empty());
    CHECK(tlm::has_cpu_features(tlm::cpu_features{}, target) == std::string_view(target).empty());
  }
  CHECK_FALSE(tlm::has_cpu_features(tlm::cpu(), "no_such_feature"));
  CHECK_FALSE(tlm::has_cpu_features(tlm::cpu_features{}, "avx2,fma,f16c"));
}

}  // namespace test_kernel_levels
