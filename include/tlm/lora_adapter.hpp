#pragma once
// Low-rank adapters at inference: a model<C> carries any number of adapter files,
// each with its own scale, and every targeted product of the decode (one row) and
// prefill (many rows) paths becomes
//
//   y = W x + Σ_adapters s · B (A x),    s = lora_scale · alpha / r
//
// as llama.cpp applies them (src/llama-adapter.cpp, llama_adapter_lora: alpha 0 or
// absent means no alpha / r factor). The base stays mapped and in its encoding.
//
// Example:
//   #include <tlm/model.hpp>
//   auto m = tlm::model<tlm::smollm2_135m>::load("base.gguf");
//   m.add_lora("adapter.gguf", 0.5f);              // scale 0.5 · alpha / r
//
// Why a run-time shape here, and not the typed lora<C, Rank, Targets> of training:
// an adapter's rank and targets are known only once its file is read. Reading into
// the typed adapter would need one instantiation of the whole forward per (rank,
// targets) pair a user might bring: 7 ranks x 127 target sets x every config, or a
// fixed list that rejects a legal file. The typed spine still guards what it can:
// the config fixes each target's [out, in], and loading checks every factor against
// it (naming the tensor), so after loading only the rank is run-time, and the
// products are the kernels' run-time-sized GEMMs, as the design has kernels take
// run-time sizes below the typed API. Training keeps the typed lora<> (train/lora.hpp),
// whose files this reads.
#include <array>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <string_view>
#include <vector>

#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/kernels/gemm.hpp>
#include <tlm/shape.hpp>
#include <tlm/thread_pool.hpp>
#include <tlm/train/checkpoint.hpp>
#include <tlm/weights.hpp>

namespace tlm {

// Index i of a lora_layer_factors is entry i of lora_targets_table (weights.hpp).

// [out, in] of target i's base matrix in config C.
template <LlamaConfig C>
constexpr std::array<std::size_t, 2> lora_target_shape(std::size_t i) {
  constexpr std::size_t D = dim<C>, K = kv_dim<C>, F = C::ffn;
  constexpr std::array<std::array<std::size_t, 2>, 7> s{{{D, D}, {K, D}, {K, D}, {D, D}, {F, D}, {F, D}, {D, F}}};
  return s[i];
}

// One targeted matrix's factors; rank 0 when the adapter does not target it.
struct lora_factors {
  std::size_t rank = 0;
  float scale = 0.0f;    // alpha / rank (1 without alpha), before the user's scale
  std::vector<float> a;  // [r, in]
  std::vector<float> b;  // [out, r]
};

// An adapter read from a file for config C, with the user's scale.
template <LlamaConfig C>
struct lora_adapter {
  std::string file;
  float scale = 1.0f;  // lora_scale; the effective one of each matrix is scale · alpha / r
  double alpha = 0.0;  // adapter.lora.alpha; 0: no alpha / r factor (llama.cpp's rule)
  std::size_t max_rank = 0;
  std::array<std::array<lora_factors, 7>, C::layers> layers{};

  // Reads and checks `path` against C: general.type "adapter", adapter.type "lora",
  // the base's architecture, one lora_a [r, in] and lora_b [out, r] per targeted
  // matrix of C (GGUF dims [in, r] and [r, out]), F32/F16/BF16 values, finite, the
  // checksums tlm writes. Anything else is a format_error naming file and tensor.
  static lora_adapter load(const std::filesystem::path& path, float scale = 1.0f) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      throw format_error(path.string() + ": cannot open the LoRA adapter: " +
                         (std::filesystem::exists(path, ec) ? "not a regular file" : "no such file") +
                         "; give the path of an adapter GGUF (train --lora writes adapter.gguf)");
    }
    const gguf::file f(path);
    lora_adapter ad;
    ad.file = f.name();
    ad.scale = scale;
    ad.read(f);
    return ad;
  }

 private:
  void read(const gguf::file& f) {
    auto fail = [&](const std::string& what) -> format_error { return format_error(file + ": " + what); };
    auto text = [&](std::string_view key) -> std::string {
      if (!f.has(key)) throw fail(std::string(key) + " is missing; this is not a LoRA adapter file");
      return std::string(f.get_string(key));
    };
    if (const auto t = text("general.type"); t != "adapter")
      throw fail("general.type is \"" + t + "\", not \"adapter\"; give an adapter file, not a model");
    if (const auto t = text("adapter.type"); t != "lora")
      throw fail("adapter.type is \"" + t + "\"; only \"lora\" adapters are supported");
    if (const auto a = text("general.architecture"); a != architecture_name_v<C>) {
      throw fail("an adapter for architecture \"" + a + "\", not \"" + std::string(architecture_name_v<C>) + "\" (" +
                 std::string(config_name<C>()) + "); use an adapter trained on this base");
    }
    alpha = f.has("adapter.lora.alpha") ? f.get_float("adapter.lora.alpha") : 0.0;
    if (!std::isfinite(alpha) || alpha < 0)
      throw fail("adapter.lora.alpha is " + std::to_string(alpha) + "; it must be a finite number, not negative");
    detail::verify_checksums(f);

    // Every tensor must be blk.N.<matrix>.weight.lora_{a,b} of a layer and matrix of C.
    for (const gguf::tensor_info& t : f.tensors()) {
      const std::string& n = t.name;
      std::size_t layer = 0, target = 7;
      bool is_a = false, known = false;
      if (n.starts_with("blk.")) {
        const std::size_t dot = n.find('.', 4);
        if (dot != std::string::npos && dot > 4 && n.find_first_not_of("0123456789", 4) == dot && dot - 4 < 6) {
          layer = std::stoul(n.substr(4, dot - 4));
          const std::string rest = n.substr(dot + 1);
          for (std::size_t i = 0; i < 7; ++i) {
            const std::string base = std::string(lora_targets_table[i].tensor) + ".weight.lora_";
            if (rest == base + "a" || rest == base + "b") {
              target = i;
              is_a = rest.back() == 'a';
              known = layer < C::layers;
            }
          }
        }
      }
      if (!known) {
        throw fail("tensor '" + n + "' is not the lora_a or lora_b of a layer matrix of " + std::string(config_name<C>()) +
                   " (" + std::to_string(C::layers) + " layers); the adapter is for another model");
      }
      const auto [out, in] = lora_target_shape<C>(target);
      // GGUF dims, fastest first: lora_a [in, r], lora_b [r, out].
      const std::size_t r = is_a ? t.dims[1] : t.dims[0];
      const std::size_t want0 = is_a ? in : r, want1 = is_a ? r : out;
      if (t.n_dims != 2 || t.dims[0] != want0 || t.dims[1] != want1 || r == 0) {
        throw fail("tensor '" + n + "' has dims [" + std::to_string(t.dims[0]) + ", " + std::to_string(t.dims[1]) +
                   "], expected " + (is_a ? "[" + std::to_string(in) + ", rank]" : "[rank, " + std::to_string(out) + "]") +
                   " (GGUF order) for " + std::string(config_name<C>()) + "; the adapter is for another model");
      }
      if (t.enc != encoding::f32 && t.enc != encoding::f16 && t.enc != encoding::bf16)
        throw fail("tensor '" + n + "' is " + std::string(tlm::name(t.enc)) + "; adapter factors are read as F32, F16 or BF16");
      lora_factors& m = layers[layer][target];
      std::vector<float>& dst = is_a ? m.a : m.b;
      if (!dst.empty()) throw fail("tensor '" + n + "' appears twice; the file is damaged");
      const std::size_t cols = t.dims[0], rows_ = t.dims[1];
      dst.resize(cols * rows_);
      const std::size_t rb = row_bytes(t.enc, cols);
      for (std::size_t i = 0; i < rows_; ++i) dequantize_row(t.enc, t.data.data() + i * rb, dst.data() + i * cols, cols);
      for (std::size_t i = 0; i < dst.size(); ++i) {
        if (!std::isfinite(dst[i])) {
          throw fail("tensor '" + n + "' holds " + (std::isnan(dst[i]) ? "a NaN" : "an infinity") + " at index " +
                     std::to_string(i) + "; the adapter is damaged");
        }
      }
      if (m.rank != 0 && m.rank != r) {
        throw fail("tensor '" + n + "' has rank " + std::to_string(r) + " but its partner has rank " +
                   std::to_string(m.rank) + "; lora_a's rows and lora_b's columns must agree");
      }
      m.rank = r;
    }
    std::size_t matrices = 0;
    for (std::size_t l = 0; l < C::layers; ++l) {
      for (std::size_t i = 0; i < 7; ++i) {
        lora_factors& m = layers[l][i];
        if (m.a.empty() != m.b.empty()) {
          throw fail("tensor 'blk." + std::to_string(l) + "." + std::string(lora_targets_table[i].tensor) + ".weight.lora_" +
                     (m.a.empty() ? "a" : "b") + "' is missing; its partner is present");
        }
        if (m.a.empty()) continue;
        ++matrices;
        m.scale = alpha != 0.0 ? static_cast<float>(alpha / static_cast<double>(m.rank)) : 1.0f;
        max_rank = std::max(max_rank, m.rank);
      }
    }
    if (matrices == 0) throw fail("holds no lora_a / lora_b tensors; the adapter is empty");
  }
};

// The block's forward hook (block.hpp, block_forward) for layer `layer` of every
// adapter of a model: adds s · B (A x) of each adapter that targets the product.
// u is scratch of at least rows x the largest rank; nothing is allocated.
template <LlamaConfig C>
struct lora_adapters_forward {
  std::span<const lora_adapter<C>> adapters;
  std::size_t layer;
  std::span<float> u;
  thread_pool* pool;

  template <lora_target t, std::size_t N, std::size_t M>
  void add(const rows<N, float>& x, rows<M, float>& y) const {
    using kernels::transpose;
    constexpr std::size_t i = lora_target_index(t);
    constexpr std::size_t out = lora_target_shape<C>(i)[0], in = lora_target_shape<C>(i)[1];
    static_assert(in == N && out == M, "tlm lora rule: a target's [out, in] is the product's");
    const std::size_t n = x.count();
    for (const lora_adapter<C>& ad : adapters) {
      const lora_factors& f = ad.layers[layer][i];
      const float s = ad.scale * f.scale;
      if (f.rank == 0 || s == 0.0f || n == 0) continue;  // scale 0: the base, bit for bit
      const std::size_t r = f.rank;
      if (u.size() < n * r) throw shape_error("lora_adapters_forward: scratch smaller than rows x rank");
      kernels::gemm(transpose::no, transpose::yes, n, r, in, x.data(), in, f.a.data(), in, u.data(), r, false, pool);
      for (std::size_t j = 0; j < n * r; ++j) u[j] *= s;
      kernels::gemm(transpose::no, transpose::yes, n, out, r, u.data(), r, f.b.data(), r, y.data(), out, true, pool);
    }
  }
};

}  // namespace tlm
