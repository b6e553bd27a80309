#pragma once
// model<C>: a Llama model of config C over a memory-mapped GGUF file.
//
//   auto m = tlm::model<tlm::smollm2_135m>::load("SmolLM2-135M-Instruct.Q4_1.gguf");
//   tlm::kv_cache<tlm::smollm2_135m> cache(256);
//   auto logits = m.prefill(prompt_ids, cache);      // [V] of the last prompt token
//   logits = m.forward(next_id, cache);              // [V] of the next position
//
// Shapes (glossary in config.hpp): x [D] residual stream, q [D] = H heads of [E],
// k and v [K] = G heads of [E], MLP hidden [F], logits [V].
#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config.hpp"
#include "error.hpp"
#include "gguf.hpp"
#include "heads.hpp"
#include "kv.hpp"
#include "linalg.hpp"
#include "load.hpp"
#include "ops.hpp"
#include "quant.hpp"
#include "thread_pool.hpp"
#include "weights.hpp"

namespace tlm {

struct model_options {
  // Threads for the matrix kernels, the calling thread included; 0 takes every core.
  std::size_t threads = 0;
  // RoPE pairing of the q and k rows: adjacent for GGUF files converted by
  // llama.cpp's tools, half_split for weights in the Hugging Face layout.
  rope_pairing pairing = rope_pairing::adjacent;
};

// What a traced forward records, for debugging a model that misbehaves.
template <LlamaConfig C>
struct forward_trace {
  std::array<float, C::layers> attn_residual_rms{};          // RMS of x after each attention block
  std::array<float, C::layers> mlp_residual_rms{};           // RMS of x after each MLP block
  std::array<std::array<float, heads<C>>, C::layers> attention_entropy{};  // nats, per layer and query head: [L][H]
  float logit_max = 0.0f;
  double logit_entropy = 0.0;  // nats, of softmax(logits)
};

template <LlamaConfig C>
class model {
  static constexpr std::size_t D = dim<C>, K = kv_dim<C>, F = C::ffn, V = C::vocab, E = head_dim<C>, H = heads<C>;

 public:
  using config = C;

  // Maps the file and binds it to C; throws format_error or bind_error.
  static model load(const std::filesystem::path& path, model_options opt = {}) {
    return model(gguf::file(path), opt);
  }

  model(gguf::file f, model_options opt = {})
      : file_(std::move(f)), weights_(bind<C>(file_)), opt_(opt), pool_(std::make_unique<thread_pool>(thread_count(opt))) {}

  const model_weights<C>& weights() const { return weights_; }
  const gguf::file& file() const { return file_; }
  std::size_t threads() const { return pool_->size(); }

  // One token at the cache's next position. Returns the logits [V], valid until the
  // next call. A full cache throws capacity_error and is left as it was.
  std::span<const float, V> forward(std::int32_t token, kv_cache<C>& cache) {
    check_token(token);
    cache.push();
    step<false>(token, cache.length() - 1, cache.storage(), nullptr);
    return logits_;
  }

  // The same, recording per-layer statistics into `trace`.
  std::span<const float, V> forward_traced(std::int32_t token, kv_cache<C>& cache, forward_trace<C>& trace) {
    check_token(token);
    cache.push();
    step<true>(token, cache.length() - 1, cache.storage(), &trace);
    return logits_;
  }

  // The typed form: position T of a kv<C, Cap, T> that has room, returning the
  // cache that now holds T+1 positions alongside the logits.
  template <std::size_t Cap, std::size_t T>
    requires cache_has_room<Cap, T>
  std::pair<std::span<const float, V>, kv<C, Cap, T + 1>> forward(std::int32_t token, kv<C, Cap, T>&& cache) {
    check_token(token);
    auto next = std::move(cache).push();
    step<false>(token, T, next.storage(), nullptr);
    return {std::span<const float, V>(logits_), std::move(next)};
  }

  // Runs the prompt through the model in one batch: every weight is read once per
  // layer for all tokens. Returns the logits of the last token. With `all_logits`,
  // also fills it with the logits of every prompt position: [n, V].
  std::span<const float, V> prefill(std::span<const std::int32_t> tokens, kv_cache<C>& cache,
                                    std::vector<float>* all_logits = nullptr) {
    const std::size_t n = tokens.size();
    if (n == 0) throw error("prefill: the prompt is empty; give at least one token");
    for (auto t : tokens) check_token(t);
    if (n > cache.room()) {
      throw capacity_error("prompt of " + std::to_string(n) + " tokens does not fit the KV cache: " +
                           std::to_string(cache.length()) + " of " + std::to_string(cache.capacity()) +
                           " positions are used; use a larger cache capacity (at most " + std::to_string(C::context) +
                           ") or a shorter prompt");
    }
    const std::size_t pos0 = cache.length();
    for (std::size_t i = 0; i < n; ++i) cache.push();
    run_batch(tokens, pos0, cache.storage(), all_logits);
    return logits_;
  }

 private:
  static std::size_t thread_count(const model_options& o) {
    if (o.threads != 0) return o.threads;
    return std::max<unsigned>(1, std::thread::hardware_concurrency());
  }

  void check_token(std::int32_t token) const {
    if (token < 0 || static_cast<std::size_t>(token) >= V) {
      throw error("token id " + std::to_string(token) + " is outside the vocabulary of " + std::to_string(V) +
                  " tokens; ids come from this model's tokenizer");
    }
  }

  void embed(std::int32_t token, float* out) const {
    const auto& e = weights_.token_embd;
    const std::size_t rb = row_bytes(e.enc(), D);
    dequantize_row(e.enc(), e.bytes().data() + static_cast<std::size_t>(token) * rb, out, D);
  }

  const auto& output_matrix() const {
    if constexpr (C::tied_embeddings) return weights_.token_embd;
    else return weights_.output;
  }

  static float rms(std::span<const float, D> x) {
    return static_cast<float>(std::sqrt(static_cast<double>(sum_squares(x.data(), D)) / D));
  }

  // One token at position pos; the cache already holds the slot for pos.
  template <bool Traced>
  void step(std::int32_t token, std::size_t pos, kv_storage<C>& store, forward_trace<C>* trace) {
    thread_pool* pool = pool_.get();
    embed(token, x_.data());
    const rope_angles<C> angles(pos);
    if (scores_.size() < pos + 1) scores_.resize(std::max<std::size_t>(pos + 1, 2 * scores_.size()));
    for (std::size_t l = 0; l < C::layers; ++l) {
      const auto& w = weights_.layers[l];
      rmsnorm<D>(x_, w.attn_norm.f32(), C::rms_eps, norm_);
      matvec(w.attn_q, std::span<const float, D>(norm_), std::span<float, D>(q_), pool);
      matvec(w.attn_k, std::span<const float, D>(norm_), std::span<float, K>(k_), pool);
      matvec(w.attn_v, std::span<const float, D>(norm_), std::span<float, K>(v_), pool);
      rope<C, D>(q_, angles, opt_.pairing);
      rope<C, K>(k_, angles, opt_.pairing);
      for (std::size_t g = 0; g < C::kv_heads; ++g) {
        std::copy_n(k_.data() + g * E, E, store.key(l, g, pos));
        std::copy_n(v_.data() + g * E, E, store.value(l, g, pos));
      }
      for (std::size_t h = 0; h < H; ++h) {
        const std::size_t g = kv_head_of<C>(h);
        const std::span<float> scores(scores_.data(), pos + 1);
        attend<C>(std::span<const float, E>(q_.data() + h * E, E), store.keys(l, g, pos + 1), store.values(l, g, pos + 1),
                  scores, std::span<float, E>(att_.data() + h * E, E));
        if constexpr (Traced) trace->attention_entropy[l][h] = static_cast<float>(entropy(scores));
      }
      matvec(w.attn_output, std::span<const float, D>(att_), std::span<float, D>(tmp_), pool);
      add_to<D>(x_, tmp_);
      if constexpr (Traced) trace->attn_residual_rms[l] = rms(x_);
      rmsnorm<D>(x_, w.ffn_norm.f32(), C::rms_eps, norm_);
      matvec(w.ffn_gate, std::span<const float, D>(norm_), std::span<float, F>(gate_), pool);
      matvec(w.ffn_up, std::span<const float, D>(norm_), std::span<float, F>(up_), pool);
      swiglu<F>(gate_, up_, hidden_);
      matvec(w.ffn_down, std::span<const float, F>(hidden_), std::span<float, D>(tmp_), pool);
      add_to<D>(x_, tmp_);
      if constexpr (Traced) trace->mlp_residual_rms[l] = rms(x_);
    }
    rmsnorm<D>(x_, weights_.output_norm.f32(), C::rms_eps, norm_);
    matvec(output_matrix(), std::span<const float, D>(norm_), std::span<float, V>(logits_), pool);
    if constexpr (Traced) {
      const auto [h, top] = logit_entropy(std::span<const float, V>(logits_));
      trace->logit_entropy = h;
      trace->logit_max = top;
    }
  }

  // A batch of n tokens at positions pos0 .. pos0+n-1, whose cache slots are claimed.
  void run_batch(std::span<const std::int32_t> tokens, std::size_t pos0, kv_storage<C>& store,
                 std::vector<float>* all_logits) {
    thread_pool* pool = pool_.get();
    const std::size_t n = tokens.size();
    bx_.resize(n * D);     // [n, D] residual stream
    bn_.resize(n * D);     // [n, D] normed
    bq_.resize(n * D);     // [n, D] queries
    bk_.resize(n * K);     // [n, K] keys
    bv_.resize(n * K);     // [n, K] values
    ba_.resize(n * D);     // [n, D] attention outputs
    bt_.resize(n * D);     // [n, D] block outputs
    bg_.resize(n * F);     // [n, F] gate
    bu_.resize(n * F);     // [n, F] up, then hidden
    if (scores_.size() < pos0 + n) scores_.resize(pos0 + n);
    for (std::size_t i = 0; i < n; ++i) embed(tokens[i], bx_.data() + i * D);
    std::vector<rope_angles<C>> angles;
    angles.reserve(n);
    for (std::size_t i = 0; i < n; ++i) angles.emplace_back(pos0 + i);
    auto row = [](std::vector<float>& b, std::size_t i, auto width) {
      return std::span<float, decltype(width)::value>(b.data() + i * decltype(width)::value, decltype(width)::value);
    };
    using d_t = std::integral_constant<std::size_t, D>;
    using k_t = std::integral_constant<std::size_t, K>;
    using f_t = std::integral_constant<std::size_t, F>;
    for (std::size_t l = 0; l < C::layers; ++l) {
      const auto& w = weights_.layers[l];
      for (std::size_t i = 0; i < n; ++i) rmsnorm<D>(row(bx_, i, d_t{}), w.attn_norm.f32(), C::rms_eps, row(bn_, i, d_t{}));
      matmul(w.attn_q, bn_, bq_, n, pool);
      matmul(w.attn_k, bn_, bk_, n, pool);
      matmul(w.attn_v, bn_, bv_, n, pool);
      for (std::size_t i = 0; i < n; ++i) {
        rope<C, D>(row(bq_, i, d_t{}), angles[i], opt_.pairing);
        rope<C, K>(row(bk_, i, k_t{}), angles[i], opt_.pairing);
        for (std::size_t g = 0; g < C::kv_heads; ++g) {
          std::copy_n(bk_.data() + i * K + g * E, E, store.key(l, g, pos0 + i));
          std::copy_n(bv_.data() + i * K + g * E, E, store.value(l, g, pos0 + i));
        }
      }
      // Causal: token i attends to positions 0 .. pos0 + i.
      pool->parallel_for(n * H, 1, [&](std::size_t b, std::size_t e) {
        std::vector<float> scores(pos0 + n);
        for (std::size_t j = b; j < e; ++j) {
          const std::size_t i = j / H, h = j % H, g = kv_head_of<C>(h), len = pos0 + i + 1;
          attend<C>(std::span<const float, E>(bq_.data() + i * D + h * E, E), store.keys(l, g, len),
                    store.values(l, g, len), std::span<float>(scores.data(), len),
                    std::span<float, E>(ba_.data() + i * D + h * E, E));
        }
      });
      matmul(w.attn_output, ba_, bt_, n, pool);
      for (std::size_t i = 0; i < n; ++i) add_to<D>(row(bx_, i, d_t{}), row(bt_, i, d_t{}));
      for (std::size_t i = 0; i < n; ++i) rmsnorm<D>(row(bx_, i, d_t{}), w.ffn_norm.f32(), C::rms_eps, row(bn_, i, d_t{}));
      matmul(w.ffn_gate, bn_, bg_, n, pool);
      matmul(w.ffn_up, bn_, bu_, n, pool);
      for (std::size_t i = 0; i < n; ++i) swiglu<F>(row(bg_, i, f_t{}), row(bu_, i, f_t{}), row(bu_, i, f_t{}));
      matmul(w.ffn_down, bu_, bt_, n, pool);
      for (std::size_t i = 0; i < n; ++i) add_to<D>(row(bx_, i, d_t{}), row(bt_, i, d_t{}));
    }
    const std::size_t first = all_logits ? 0 : n - 1;
    for (std::size_t i = first; i < n; ++i)
      rmsnorm<D>(row(bx_, i, d_t{}), weights_.output_norm.f32(), C::rms_eps, row(bn_, i, d_t{}));
    if (all_logits) {
      all_logits->resize(n * V);
      matmul(output_matrix(), bn_, *all_logits, n, pool);
      std::copy_n(all_logits->data() + (n - 1) * V, V, logits_.data());
    } else {
      matvec(output_matrix(), std::span<const float, D>(bn_.data() + (n - 1) * D, D), std::span<float, V>(logits_), pool);
    }
  }

  gguf::file file_;
  model_weights<C> weights_;
  model_options opt_;
  std::unique_ptr<thread_pool> pool_;

  // Workspace, allocated once: decoding a token allocates nothing.
  vec<D> x_, norm_, q_, att_, tmp_;  // [D]
  vec<K> k_, v_;                     // [K]
  vec<F> gate_, up_, hidden_;        // [F]
  vec<V> logits_;                    // [V]
  std::vector<float> scores_;        // [positions] attention weights of one head
  std::vector<float> bx_, bn_, bq_, bk_, bv_, ba_, bt_, bg_, bu_;  // prefill batch buffers, see run_batch
};

}  // namespace tlm
