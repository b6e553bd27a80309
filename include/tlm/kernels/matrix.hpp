#pragma once
// Matrix kernels on raw tensor bytes with run-time sizes. The typed API (shape.hpp)
// checks shapes at compile time and calls these; the kernels check only what types
// cannot: the encoding and that a row is a whole number of blocks.
//
// Conventions: W is [rows, cols], row-major, each row row_bytes(enc, cols) bytes of
// encoding enc; a row is an output and a column an input. Nothing is assumed about
// alignment: GGUF tensors are 32-byte aligned at best, and 18/20/34-byte blocks put
// most blocks at odd addresses.
//
// Precision (kernels/scalar.hpp): `exact` computes in float32 from float32
// activations at every level; levels differ only in summation order. `fast`
// quantizes the activations to int8 for quantized weights (a scale per 32 values; for
// the K-quants a unit per 256 values times a small step per 32, so that a super-block
// sums in integers as with llama.cpp's Q8_K) and sums integer products; the integer
// sums are the same at every level, so levels again differ only in the order the float
// terms are added; a fast product of many rows may run exactly (integer_matmul).
//
// Dispatch: the function table of the active kernel level (kernels/levels.hpp), chosen
// at first use from the CPU and TLM_KERNELS; force_kernel_level() switches it for tests
// and benchmarks.
#include <tlm/error.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/kernels/levels.hpp>
#include <tlm/kernels/scalar.hpp>
#include <tlm/thread_pool.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace tlm::kernels {

namespace detail {

// Returns the table slot of `enc` after checking everything a kernel relies on.
inline std::size_t check_args(const char* what, encoding enc, const std::byte* w, const float* x, const float* y,
                              std::size_t rows, std::size_t cols) {
  const int s = slot(enc);
  if (s < 0) {
    std::string known;
    for (encoding e : table_encodings) known += (known.empty() ? "" : ", ") + std::string(name(e));
    throw shape_error(std::string(what) + ": no matrix kernel for encoding " + std::string(name(enc)) + " (ggml type " +
                      std::to_string(static_cast<std::uint32_t>(enc)) + "); convert the tensor to one of " + known);
  }
  const std::size_t bv = traits(enc).block_values;
  if (cols % bv != 0) {
    throw shape_error(std::string(what) + ": " + std::to_string(cols) + " columns is not a multiple of the " +
                      std::string(name(enc)) + " block size " + std::to_string(bv) +
                      "; a quantized row must be whole blocks (check the tensor's dims)");
  }
  if (rows != 0 && cols != 0 && (w == nullptr || x == nullptr || y == nullptr)) {
    throw error(std::string(what) + ": null weight, input or output pointer for a " + std::to_string(rows) + "x" +
                std::to_string(cols) + " product");
  }
  return static_cast<std::size_t>(s);
}

// Rows per chunk handed to a thread: about 32K weights, so a chunk outlasts the cost
// of claiming it (under a microsecond).
inline std::size_t row_grain(std::size_t cols) { return std::max<std::size_t>(1, 32768 / std::max<std::size_t>(cols, 1)); }

// Rows are handed to threads in whole groups of 16: 16 float outputs are one 64-byte
// cache line, so two threads never write the same line of y (no false sharing when y
// is 64-byte aligned, and at most one shared line per chunk boundary otherwise).
inline constexpr std::size_t row_group = 16;

// Runs fn(r0, r1) over [0, rows) on the pool. The split is one contiguous share per
// thread (each thread streams its own part of the matrix, the access pattern the
// hardware prefetcher follows best), unless that share would be below the grain.
// A descheduled worker's share is taken by whichever thread finishes first (the pool
// hands out chunks dynamically), so a busy core delays the product, never stalls it.
template <class F>
inline void split_rows(thread_pool* pool, std::size_t rows, std::size_t cols, F&& fn) {
  if (pool == nullptr || pool->size() == 1) {
    fn(std::size_t{0}, rows);
    return;
  }
  const std::size_t groups = (rows + row_group - 1) / row_group;
  const std::size_t share = (groups + pool->size() - 1) / pool->size();
  const std::size_t grain = std::max(share, (row_grain(cols) + row_group - 1) / row_group);
  pool->parallel_for(groups, grain, [&](std::size_t g0, std::size_t g1) {
    fn(g0 * row_group, std::min(rows, g1 * row_group));
  });
}

// The activations of the fast mode, quantized once per call before the rows are split;
// one buffer per grouping (32, 256) and calling thread, reused, so a decode step
// allocates nothing, and a group of products of both kinds quantizes x once for each.
inline q8_activations& quantized_x(std::size_t group) {
  thread_local q8_activations by_32, by_256;
  return group == 256 ? by_256 : by_32;
}

}  // namespace detail

// Whether matvec and matmul accept weights in `enc`: the one list of such encodings,
// which binding a file also consults.
constexpr bool has_matrix_kernel(encoding enc) { return detail::slot(enc) >= 0; }

// The precision of the matvec and matmul calls that do not name one: exact, unless the
// environment variable TLM_PRECISION=exact|fast (read once, at first use) says otherwise.
// It lets the whole engine be measured in fast mode before its options carry a
// precision; a precision passed explicitly always wins.
inline precision default_precision() {
  static const precision p = [] {
    const char* env = std::getenv("TLM_PRECISION");
    if (env == nullptr || *env == '\0' || std::string_view(env) == "exact") return precision::exact;
    if (std::string_view(env) == "fast") return precision::fast;
    throw error("TLM_PRECISION=" + std::string(env) + ": unknown precision; use exact or fast, or unset it");
  }();
  return p;
}

// Whether precision::fast changes the arithmetic for weights in `enc` (otherwise a
// fast product is the exact one).
constexpr bool has_fast_kernel(encoding enc) {
  for (encoding e : detail::fast_encodings)
    if (e == enc) return true;
  return false;
}

// Which kernels a fast matmul (batch > 1: prefill, a batched decode step) runs: the
// level's choice (`automatic`: the integer kernels up to the batch size where the
// float32 GEMM becomes faster, per encoding: set_integer_max_batch), or forced either way,
// which tests (the integer kernels at every size) and benchmarks (both paths side by
// side) do. Decode (matvec) is not affected.
enum class prefill_path { automatic, integer, float32 };

namespace detail {
inline std::atomic<prefill_path>& prefill_choice() {
  static std::atomic<prefill_path> p{prefill_path::automatic};
  return p;
}
}  // namespace detail

// Sets the fast matmul's path; returns the previous setting. Like force_kernel_level,
// not meant to race with running kernels.
inline prefill_path force_prefill_path(prefill_path p) {
  return detail::prefill_choice().exchange(p, std::memory_order_acq_rel);
}

// Whether a fast matmul of `batch` activation rows of weights in `enc` on the active level
// runs the integer kernels (otherwise it computes the exact product).
inline bool integer_matmul(encoding enc, std::size_t batch) {
  if (!has_fast_kernel(enc)) return false;
  const prefill_path p = detail::prefill_choice().load(std::memory_order_acquire);
  if (p != prefill_path::automatic) return p == prefill_path::integer;
  return batch <= detail::table().integer_max_batch[static_cast<std::size_t>(detail::slot(enc))];
}

// y[r] = sum_c W[r,c] * x[c].   W [rows, cols] in `enc`, x [cols], y [rows].
// y must not overlap x or W. Results do not depend on the pool or its size: each row is summed by one thread in
// a fixed order. precision::fast: see kernels/scalar.hpp (quantized weights; float weights compute exactly).
inline void matvec(encoding enc, const std::byte* w, const float* x, float* y, std::size_t rows, std::size_t cols,
                   thread_pool* pool = nullptr, precision p = default_precision()) {
  const std::size_t s = detail::check_args("matvec", enc, w, x, y, rows, cols);
  if (rows == 0) return;
  if (cols == 0) {
    std::fill(y, y + rows, 0.0f);
    return;
  }
  const auto& t = detail::table();
  const std::size_t rb = row_bytes(enc, cols);
  if (p == precision::fast && t.matvec_q8[s] != nullptr) {
    auto& qx = detail::quantized_x(activation_group(enc));
    t.quantize(x, 1, cols, activation_group(enc), qx);
    const auto fq = t.matvec_q8[s];
    detail::split_rows(pool, rows, cols, [&](std::size_t r0, std::size_t r1) { fq(enc, w, rb, qx, y, r0, r1, cols); });
    return;
  }
  const auto fn = t.matvec[s];
  // Reused across calls, so decoding a token allocates nothing here; one per thread
  // because callers on different threads may multiply at the same time.
  thread_local std::vector<float> prepared;
  if (t.prepare[s] != nullptr) {
    t.prepare[s](x, cols, prepared);
    x = prepared.data();
  }
  detail::split_rows(pool, rows, cols, [&](std::size_t r0, std::size_t r1) { fn(enc, w, rb, x, y, r0, r1, cols); });
}

// One product of a group that shares its input x: y [rows] = W [rows, cols] x.
struct shared_input_product {
  encoding enc;
  const std::byte* w;
  float* y;
  std::size_t rows;
};

// Every product of the group, each bit for bit what matvec computes, in one parallel
// region and with x prepared (or quantized) once per encoding instead of once per
// product. A decode step multiplies one input by q, k and v, and another by gate and
// up: grouped, that is 3 fork-joins per layer fewer, and 2-4 preparations of x.
// Rows are split over the pool in groups of 16 across the products' boundaries.
template <std::size_t N>
inline void matvec_group(const std::array<shared_input_product, N>& group, const float* x, std::size_t cols,
                         thread_pool* pool = nullptr, precision p = default_precision()) {
  std::array<std::size_t, N> slots{};
  for (std::size_t i = 0; i < N; ++i)
    slots[i] = detail::check_args("matvec_group", group[i].enc, group[i].w, x, group[i].y, group[i].rows, cols);
  if (cols == 0) {
    for (const auto& g : group) std::fill(g.y, g.y + g.rows, 0.0f);
    return;
  }
  const auto& t = detail::table();
  // What each product's kernel reads: the quantized x (fast), x prepared for its
  // encoding, or x itself. One buffer per encoding and calling thread, reused.
  thread_local std::array<std::vector<float>, detail::table_size> prepared;
  std::array<bool, detail::table_size> is_prepared{};
  // x quantized once for each grouping its integer products take (activation_group).
  std::array<bool, 2> quantized{};  // by 32, by 256
  std::array<const float*, N> inputs{};
  std::array<bool, N> integer{};
  for (std::size_t i = 0; i < N; ++i) {
    const std::size_t s = slots[i];
    if (p == precision::fast && t.matvec_q8[s] != nullptr) {
      const std::size_t q = activation_group(group[i].enc);
      if (!quantized[q == 256]) t.quantize(x, 1, cols, q, detail::quantized_x(q));
      quantized[q == 256] = integer[i] = true;
    } else if (t.prepare[s] != nullptr) {
      if (!is_prepared[s]) t.prepare[s](x, cols, prepared[s]);
      is_prepared[s] = true;
      inputs[i] = prepared[s].data();
    } else {
      inputs[i] = x;
    }
  }
  // The calling thread's buffers: the pool's threads have their own, empty.
  const q8_activations& by_32 = detail::quantized_x(32);
  const q8_activations& by_256 = detail::quantized_x(256);
  // Product i covers row groups [first[i], first[i + 1]).
  std::array<std::size_t, N + 1> first{};
  for (std::size_t i = 0; i < N; ++i) first[i + 1] = first[i] + (group[i].rows + detail::row_group - 1) / detail::row_group;
  auto run = [&](std::size_t g0, std::size_t g1) {
    for (std::size_t i = 0; i < N; ++i) {
      const std::size_t b = std::max(g0, first[i]), e = std::min(g1, first[i + 1]);
      if (b >= e) continue;
      const auto& g = group[i];
      const std::size_t r0 = (b - first[i]) * detail::row_group, r1 = std::min(g.rows, (e - first[i]) * detail::row_group);
      const std::size_t rb = row_bytes(g.enc, cols);
      if (integer[i]) t.matvec_q8[slots[i]](g.enc, g.w, rb, activation_group(g.enc) == 256 ? by_256 : by_32, g.y, r0, r1, cols);
      else t.matvec[slots[i]](g.enc, g.w, rb, inputs[i], g.y, r0, r1, cols);
    }
  };
  const std::size_t groups = first[N];
  if (pool == nullptr || pool->size() == 1 || groups == 0) {
    run(0, groups);
    return;
  }
  // As split_rows: one contiguous share per thread unless that is below the grain.
  const std::size_t share = (groups + pool->size() - 1) / pool->size();
  const std::size_t grain = std::max(share, (detail::row_grain(cols) + detail::row_group - 1) / detail::row_group);
  pool->parallel_for(groups, grain, run);
}

// Y[b, r] = sum_c W[r,c] * X[b,c] for b < batch (prompt prefill).
//   W [rows, cols] in `enc`, X [batch, cols], Y [batch, rows]; Y must not overlap X or W.
// Each decoded weight row is reused across the batch, so this is much faster than
// `batch` calls of matvec. Results do not depend on the pool or its size.
// precision::fast computes exactly where integer_matmul(enc, batch) is false (above 8
// or 16 rows at the AVX2 level; with AVX-512 VNNI only Q6_K, above 24): the float32 GEMM
// is the faster kernel there, so fast mode loses nothing by being exact.
inline void matmul(encoding enc, const std::byte* w, const float* x, float* y, std::size_t rows, std::size_t cols,
                   std::size_t batch, thread_pool* pool = nullptr, precision p = default_precision()) {
  const std::size_t s = detail::check_args("matmul", enc, w, x, y, rows, cols);
  if (rows == 0 || batch == 0) return;
  if (cols == 0) {
    std::fill(y, y + rows * batch, 0.0f);
    return;
  }
  if (batch == 1) {
    // One activation row: the decode-speed matvec kernels are the faster path.
    matvec(enc, w, x, y, rows, cols, pool, p);
    return;
  }
  const auto& t = detail::table();
  const std::size_t rb = row_bytes(enc, cols);
  if (p == precision::fast && t.matmul_q8[s] != nullptr && integer_matmul(enc, batch)) {
    auto& qx = detail::quantized_x(activation_group(enc));
    t.quantize(x, batch, cols, activation_group(enc), qx);
    const auto fq = t.matmul_q8[s];
    detail::split_rows(pool, rows, cols,
                       [&](std::size_t r0, std::size_t r1) { fq(enc, w, rb, qx, y, r0, r1, rows, cols); });
    return;
  }
  const auto fn = t.matmul_narrow[s] != nullptr && batch < t.matmul_min_batch[s] ? t.matmul_narrow[s] : t.matmul[s];
  detail::split_rows(pool, rows, cols,
                     [&](std::size_t r0, std::size_t r1) { fn(enc, w, rb, x, y, r0, r1, rows, cols, batch); });
}

// The definitions the fast kernels are tested against: dequantize the whole row with
// dequantize_row, then a plain loop summing in double. Single-threaded; `pool` is
// accepted so the signatures match and is ignored.
inline void matvec_reference(encoding enc, const std::byte* w, const float* x, float* y, std::size_t rows,
                             std::size_t cols, thread_pool* /*pool*/ = nullptr) {
  detail::check_args("matvec_reference", enc, w, x, y, rows, cols);
  const std::size_t rb = row_bytes(enc, cols);
  std::vector<float> row(cols);  // [cols]
  for (std::size_t r = 0; r < rows; ++r) {
    if (cols != 0) dequantize_row(enc, w + r * rb, row.data(), cols);
    double s = 0;
    for (std::size_t c = 0; c < cols; ++c) s += static_cast<double>(row[c]) * static_cast<double>(x[c]);
    y[r] = static_cast<float>(s);
  }
}

inline void matmul_reference(encoding enc, const std::byte* w, const float* x, float* y, std::size_t rows,
                             std::size_t cols, std::size_t batch, thread_pool* /*pool*/ = nullptr) {
  detail::check_args("matmul_reference", enc, w, x, y, rows, cols);
  const std::size_t rb = row_bytes(enc, cols);
  std::vector<float> row(cols);  // [cols]
  for (std::size_t r = 0; r < rows; ++r) {
    if (cols != 0) dequantize_row(enc, w + r * rb, row.data(), cols);
    for (std::size_t b = 0; b < batch; ++b) {
      const float* xb = x + b * cols;
      double s = 0;
      for (std::size_t c = 0; c < cols; ++c) s += static_cast<double>(row[c]) * static_cast<double>(xb[c]);
      y[b * rows + r] = static_cast<float>(s);
    }
  }
}

// The definitions the fast-mode kernels are tested against: the scalar quantizer and
// scalar integer block sums (kernels/scalar.hpp). Encodings without an integer path
// fall back to matvec_reference / matmul_reference, as matvec and matmul do.
inline void matvec_fast_reference(encoding enc, const std::byte* w, const float* x, float* y, std::size_t rows,
                                  std::size_t cols, thread_pool* pool = nullptr) {
  detail::check_args("matvec_fast_reference", enc, w, x, y, rows, cols);
  if (!has_fast_kernel(enc)) return matvec_reference(enc, w, x, y, rows, cols, pool);
  q8_activations qx;
  detail::quantize_scalar(x, 1, cols, activation_group(enc), qx);
  detail::matvec_q8_scalar(enc, w, row_bytes(enc, cols), qx, y, 0, rows, cols);
}

inline void matmul_fast_reference(encoding enc, const std::byte* w, const float* x, float* y, std::size_t rows,
                                  std::size_t cols, std::size_t batch, thread_pool* pool = nullptr) {
  detail::check_args("matmul_fast_reference", enc, w, x, y, rows, cols);
  if (!has_fast_kernel(enc)) return matmul_reference(enc, w, x, y, rows, cols, batch, pool);
  q8_activations qx;
  detail::quantize_scalar(x, batch, cols, activation_group(enc), qx);
  detail::matmul_q8_scalar(enc, w, row_bytes(enc, cols), qx, y, 0, rows, rows, cols);
}

// sum_i a[i] * b[i] in float32.
inline float dot(const float* a, const float* b, std::size_t n) { return detail::table().dot(a, b, n); }
inline float dot_reference(const float* a, const float* b, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return static_cast<float>(s);
}

// y += a * x.
inline void axpy(float a, const float* x, float* y, std::size_t n) { detail::table().axpy(a, x, y, n); }
inline void axpy_reference(float a, const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// sum_i a[i] * b[i] with int8 b, in float32: the int8 KV cache's key dot product.
inline float dot_i8(const float* a, const std::int8_t* b, std::size_t n) { return detail::table().dot_i8(a, b, n); }
inline float dot_i8_reference(const float* a, const std::int8_t* b, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return static_cast<float>(s);
}

// y += a * x with int8 x: the int8 KV cache's weighted sum of values.
inline void axpy_i8(float a, const std::int8_t* x, float* y, std::size_t n) { detail::table().axpy_i8(a, x, y, n); }
inline void axpy_i8_reference(float a, const std::int8_t* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += a * static_cast<float>(x[i]);
}

}  // namespace tlm::kernels
