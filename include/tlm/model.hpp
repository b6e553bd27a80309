#pragma once
// model<C>: a Llama model of config C over a memory-mapped GGUF file.
//
// Example, given std::vector<std::int32_t> prompt_ids; std::int32_t next_id:
//   auto m = tlm::model<tlm::smollm2_135m>::load("SmolLM2-135M-Instruct.Q4_1.gguf");
//   tlm::kv_cache<tlm::smollm2_135m> cache(256);
//   auto logits = m.prefill(prompt_ids, cache);      // [V] of the last prompt token
//   logits = m.forward(next_id, cache);              // [V] of the next position
//   std::vector<float> e = m.embed(prompt_ids);      // [D] the prompt's embedding, unit length
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

#include <tlm/block.hpp>
#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/heads.hpp>
#include <tlm/kv.hpp>
#include <tlm/linalg.hpp>
#include <tlm/load.hpp>
#include <tlm/lora_adapter.hpp>
#include <tlm/ops.hpp>
#include <tlm/thread_pool.hpp>
#include <tlm/weights.hpp>

namespace tlm {

struct model_options {
  // Threads for the matrix kernels, the calling thread included; 0 takes every core.
  std::size_t threads = 0;
  // RoPE pairing of the q and k rows: adjacent for `llama` GGUF files converted by
  // llama.cpp's tools, half_split for weights in the Hugging Face layout. A config
  // whose architecture fixes the pairing (qwen2: half_split) overrides this.
  rope_pairing pairing = rope_pairing::adjacent;
  // exact: activations at float32 precision times the decoded weights (logits within
  // 3.5e-6 of float64; some decode kernels hold them as 24-bit integers, an exponent per
  // 4 values: kernels/avx512.hpp, prepare_q5_digits). fast: activations quantized to int8 (kernels/scalar.hpp) and integer
  // dot products, as llama.cpp computes (logits within 0.125 of the largest logit;
  // a product of more than a few rows, as a prefill, runs exact, which is faster
  // there: kernels::integer_matmul). The default is exact unless TLM_PRECISION=fast
  // is set.
  kernels::precision precision = kernels::default_precision();
};

// How an embedding pools a text's final hidden states: their mean over the positions
// (what sentence-embedding models trained with mean pooling expect), or the last
// position's, the one that has attended to the whole text (llama.cpp's `last`).
enum class pooling { mean, last };

inline const char* pooling_name(pooling p) { return p == pooling::mean ? "mean" : "last"; }

// Pools final hidden states chunk by chunk, so that a long text can run in pieces
// between other work (the scheduler does), and gives the pooled vector at unit L2 length,
// as OpenAI's embeddings and llama.cpp's (embd_normalize 2) are. Sums in double: a mean
// over thousands of positions in float would lose the low bits the 1e-5 check needs.
template <std::size_t D>
class embedding_pool {
 public:
  explicit embedding_pool(pooling p) : p_(p) {}

  // h: [n, D] the final hidden states of the next n positions.
  void add(const rows<D>& h) {
    const std::size_t n = h.count();
    if (n == 0) return;
    if (p_ == pooling::last) {
      const auto r = h.row(n - 1);
      std::copy(r.begin(), r.end(), sum_.begin());
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const auto r = h.row(i);
        for (std::size_t j = 0; j < D; ++j) sum_[j] += r[j];
      }
    }
    count_ += n;
  }

  std::size_t positions() const { return count_; }

  // [D] the pooled states scaled to length 1. Throws if nothing was added, or if the
  // states are all zero or not finite (a model that produced NaN).
  std::vector<float> finish() const {
    if (count_ == 0) throw error("embedding: no position was pooled; give at least one token");
    double norm = 0.0;
    for (const double v : sum_) norm += v * v;
    norm = std::sqrt(norm);
    if (!std::isfinite(norm) || norm == 0.0)
      throw error("embedding: the pooled hidden state has " + std::string(norm == 0.0 ? "zero length" : "a NaN or infinity") +
                  "; the model's weights or input produce no usable embedding");
    std::vector<float> out(D);
    for (std::size_t j = 0; j < D; ++j) out[j] = static_cast<float>(sum_[j] / norm);  // the mean's 1/n cancels
    return out;
  }

 private:
  pooling p_;
  std::array<double, D> sum_{};  // [D]
  std::size_t count_ = 0;
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
  static constexpr std::size_t D = dim<C>, V = C::vocab, H = heads<C>;

 public:
  using config = C;

  // Maps the file and binds it to C; throws format_error or bind_error.
  static model load(const std::filesystem::path& path, model_options opt = {}) {
    return model(gguf::file(path), opt);
  }

  model(gguf::file f, model_options opt = {})
      : file_(std::move(f)), weights_(bind<C>(file_)), opt_(with_pairing_of_architecture(opt)), pool_(std::make_unique<thread_pool>(threads_or_every_core(opt.threads))) {
    reserve(1);
  }

  const model_weights<C>& weights() const { return weights_; }

  // qwen2 files keep Hugging Face's q/k row order (llama.cpp rotates them with its
  // NEOX rope), so the architecture, not the caller, decides their pairing.
  static model_options with_pairing_of_architecture(model_options o) {
    if constexpr (file_pairing_v<C> != rope_pairing::adjacent) o.pairing = file_pairing_v<C>;
    return o;
  }
  const gguf::file& file() const { return file_; }
  const model_options& options() const { return opt_; }
  std::size_t threads() const { return pool_->size(); }

  // One token at the cache's next position. Returns the logits [V], valid until the
  // next call. A full cache throws capacity_error and is left as it was.
  std::span<const float, V> forward(std::int32_t token, kv_cache<C>& cache) {
    check_token(token);
    cache.push();
    return run(std::span<const std::int32_t>(&token, 1), cache.length() - 1, cache.storage(), nullptr, nullptr);
  }

  // The same, recording per-layer statistics into `trace`.
  std::span<const float, V> forward_traced(std::int32_t token, kv_cache<C>& cache, forward_trace<C>& trace) {
    check_token(token);
    cache.push();
    return run(std::span<const std::int32_t>(&token, 1), cache.length() - 1, cache.storage(), nullptr, &trace);
  }

  // The typed form: position T of a kv<C, Cap, T> that has room, returning the
  // cache that now holds T+1 positions alongside the logits.
  template <std::size_t Cap, std::size_t T>
    requires cache_has_room<Cap, T>
  std::pair<std::span<const float, V>, kv<C, Cap, T + 1>> forward(std::int32_t token, kv<C, Cap, T>&& cache) {
    check_token(token);
    auto next = std::move(cache).push();
    auto logits = run(std::span<const std::int32_t>(&token, 1), T, next.storage(), nullptr, nullptr);
    return {logits, std::move(next)};
  }

  // Runs the prompt through the model in one batch: every weight is read once per
  // layer for all tokens. Returns the logits of the last token. With `all_logits`,
  // also fills it with the logits of every prompt position: [n, V].
  std::span<const float, V> prefill(std::span<const std::int32_t> tokens, kv_cache<C>& cache,
                                    std::vector<float>* all_logits = nullptr) {
    const std::size_t pos0 = claim(tokens, cache);
    return run(tokens, pos0, cache.storage(), all_logits, nullptr);
  }

  // Runs the tokens at the cache's next positions, as prefill does, and returns their
  // final hidden states (after the output norm, before the output matrix): [n, D],
  // valid until the next call. What embeddings pool (embedding_pool).
  const rows<D>& hidden(std::span<const std::int32_t> tokens, kv_cache<C>& cache) {
    const std::size_t pos0 = claim(tokens, cache);
    run_blocks(tokens, pos0, cache.storage(), nullptr);
    final_norm(0);
    return final_;
  }

  // The embedding of a text given as token ids, run alone from position 0: its final
  // hidden states pooled and scaled to unit length. Returns [D]. The cache it needs is
  // made for the call; a text longer than the context throws capacity_error.
  std::vector<float> embed(std::span<const std::int32_t> tokens, pooling p = pooling::mean) {
    if (tokens.empty()) throw error("embed: the text is empty; give at least one token");
    if (tokens.size() > C::context)
      throw capacity_error("embed: the text has " + std::to_string(tokens.size()) + " tokens, more than the context of " +
                           std::to_string(C::context) + "; shorten it or embed it in pieces");
    kv_cache<C> cache(tokens.size());
    embedding_pool<D> pool(p);
    pool.add(hidden(tokens, cache));
    return pool.finish();
  }

  // One token for each of several sequences, each at the next position of its own
  // cache, in one pass over the weights: a batched decode step, as a server advances
  // its conversations. Each sequence computes what forward(tokens[s], *caches[s]) would,
  // up to the summation order of the batched products. tokens: [N]; caches: [N], all
  // different. Returns the logits [N, V], row s for sequence s, valid until the next
  // call. A full cache throws capacity_error naming the sequence, and no cache changes.
  const rows<V>& forward_batch(std::span<const std::int32_t> tokens, std::span<kv_cache<C>* const> caches) {
    const std::size_t n = tokens.size();
    if (n == 0) throw error("forward_batch: no sequence; give one token per sequence");
    if (caches.size() != n)
      throw shape_error("forward_batch: " + std::to_string(n) + " tokens for " + std::to_string(caches.size()) +
                        " caches; give one token per sequence");
    for (std::size_t s = 0; s < n; ++s) {
      check_token(tokens[s]);
      if (caches[s] == nullptr) throw error("forward_batch: the cache of sequence " + std::to_string(s) + " is null");
      if (caches[s]->room() == 0)
        throw capacity_error("forward_batch: the KV cache of sequence " + std::to_string(s) + " is full (all " +
                             std::to_string(caches[s]->capacity()) +
                             " positions are written); end that sequence or give it a larger cache");
      for (std::size_t t = 0; t < s; ++t)
        if (caches[t] == caches[s])
          throw error("forward_batch: sequences " + std::to_string(t) + " and " + std::to_string(s) +
                      " share one cache; each sequence needs its own");
    }
    reserve(n);
    ws_.x.resize(n);
    for (std::size_t s = 0; s < n; ++s) {
      starts_[s] = caches[s]->length();
      caches[s]->push();
      stores_[s] = &caches[s]->storage();
      tlm::embed(weights_.token_embd, tokens[s], ws_.x.row(s));
      angles_[s] = rope_angles<C>(starts_[s]);
    }
    const block_context<C, float> ctx{{n, 1, 0, starts_.data()}, angles_.data(), opt_.pairing, nullptr, opt_.precision};
    run_layers(ctx, [&](std::size_t l) { return kv_from_caches<C>{stores_.data(), l}; }, nullptr);
    head(0, nullptr, nullptr);
    return logits_;
  }

  // Forgets cache positions keep .. keep+drop-1 and moves the later ones down with
  // their keys re-rotated for their new positions (kv_cache::shift), in this model's
  // RoPE pairing. The next forward continues at position length() - drop; no token
  // is run through the model again.
  void shift(kv_cache<C>& cache, std::size_t keep, std::size_t drop) const { cache.shift(keep, drop, opt_.pairing); }

  // Low-rank adapters (lora_adapter.hpp): each adds scale · alpha / r · B (A x) to
  // the products it targets, at decode and prefill alike; the base is untouched.
  // add_lora reads and checks the file (a format_error names the tensor at fault) and
  // returns the adapter's index. Adapters added after a cache was filled apply from
  // the next token on; the cached positions keep what they were computed with.
  std::size_t add_lora(const std::filesystem::path& path, float scale = 1.0f) {
    return add_lora(lora_adapter<C>::load(path, scale));
  }
  std::size_t add_lora(lora_adapter<C> ad) {
    if (!std::isfinite(ad.scale)) throw error(ad.file + ": the LoRA scale must be a finite number");
    adapters_.push_back(std::move(ad));
    reserve(ws_.x.capacity());
    // The adapters' products are GEMMs whose chunks threads claim dynamically: every
    // thread takes its packing buffers now, so no decode allocates later.
    pool_->run_on_each_thread([] { kernels::reserve_gemm_scratch(); });
    return adapters_.size() - 1;
  }
  void set_lora_scale(std::size_t i, float scale) {
    if (i >= adapters_.size())
      throw error("set_lora_scale: adapter " + std::to_string(i) + " of " + std::to_string(adapters_.size()));
    if (!std::isfinite(scale)) throw error(adapters_[i].file + ": the LoRA scale must be a finite number");
    adapters_[i].scale = scale;
  }
  void clear_loras() { adapters_.clear(); }
  std::span<const lora_adapter<C>> loras() const { return adapters_; }

 private:
  void check_token(std::int32_t token) const {
    if (token < 0 || static_cast<std::size_t>(token) >= V) {
      throw error("token id " + std::to_string(token) + " is outside the vocabulary of " + std::to_string(V) +
                  " tokens; ids come from this model's tokenizer");
    }
  }

  // Checks a prompt and takes its positions in the cache; returns the first one.
  std::size_t claim(std::span<const std::int32_t> tokens, kv_cache<C>& cache) const {
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
    return pos0;
  }

  static float rms(std::span<const float, D> x) {
    return static_cast<float>(std::sqrt(static_cast<double>(sum_squares(x.data(), D)) / D));
  }

  // Grows the workspace to n rows. Only a batch longer than any before allocates;
  // decoding a token after the first allocates nothing.
  void reserve(std::size_t n) {
    ws_.reserve(n);
    final_.reserve(n);
    entropy_.reserve(1);
    if (angles_.size() < n) angles_.resize(n);
    if (starts_.size() < n) starts_.resize(n);
    if (stores_.size() < n) stores_.resize(n);
    std::size_t rank = 0;
    for (const auto& a : adapters_) rank = std::max(rank, a.max_rank);
    if (lora_u_.size() < n * rank) lora_u_.resize(n * rank);
  }

  // The n tokens at positions pos0 .. pos0+n-1 through every block, with the cache
  // slots already claimed. Returns the logits of the last token.
  std::span<const float, V> run(std::span<const std::int32_t> tokens, std::size_t pos0, kv_storage<C>& store,
                                std::vector<float>* all_logits, forward_trace<C>* trace) {
    run_blocks(tokens, pos0, store, trace);
    return head(all_logits ? 0 : tokens.size() - 1, all_logits, trace);
  }

  // The n tokens through every block, leaving the last block's output in ws_.x: [n, D].
  void run_blocks(std::span<const std::int32_t> tokens, std::size_t pos0, kv_storage<C>& store, forward_trace<C>* trace) {
    const std::size_t n = tokens.size();
    reserve(n);
    ws_.x.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      tlm::embed(weights_.token_embd, tokens[i], ws_.x.row(i));
      angles_[i] = rope_angles<C>(pos0 + i);
    }
    const block_context<C, float> ctx{{1, n, pos0}, angles_.data(), opt_.pairing, trace ? &entropy_ : nullptr, opt_.precision};
    run_layers(ctx, [&](std::size_t l) { return kv_from_cache<C>{&store, l}; }, trace);
  }

  // ws_.x (embedded, angles set) through every layer; kv_of(l) is layer l's cache access.
  template <class KvOf>
  void run_layers(const block_context<C, float>& ctx, const KvOf& kv_of, forward_trace<C>* trace) {
    thread_pool* pool = pool_.get();
    const std::size_t n = ws_.x.count();
    for (std::size_t l = 0; l < C::layers; ++l) {
      if (adapters_.empty()) block_forward(weights_.layers[l], ws_, ws_.x, ctx, kv_of(l), pool);
      else block_forward(weights_.layers[l], ws_, ws_.x, ctx, kv_of(l), pool, lora_adapters_forward<C>{adapters_, l, lora_u_, pool});
      if (trace) {
        trace->attn_residual_rms[l] = rms(ws_.x_mid.row(n - 1));
        trace->mlp_residual_rms[l] = rms(ws_.x.row(n - 1));
        for (std::size_t h = 0; h < H; ++h) trace->attention_entropy[l][h] = entropy_.data()[(n - 1) * H + h];
      }
    }
  }

  // Rows first .. n-1 of ws_.x through the final norm and the output matrix (only the
  // rows whose logits are wanted: it is the largest matrix of the model). Returns the
  // logits of the last row; with `all_logits`, fills it with all of them: [n - first, V].
  std::span<const float, V> head(std::size_t first, std::vector<float>* all_logits, forward_trace<C>* trace) {
    final_norm(first);
    matmul(logits_matrix(weights_), final_, logits_, pool_.get(), opt_.precision);
    if (all_logits) all_logits->assign(logits_.data(), logits_.data() + logits_.count() * V);
    const std::span<const float, V> last = logits_.row(logits_.count() - 1);
    if (trace) {
      const auto [h, top] = logit_entropy(last);
      trace->logit_entropy = h;
      trace->logit_max = top;
    }
    return last;
  }

  // Rows first .. n-1 of ws_.x through the final norm into final_: [n - first, D].
  void final_norm(std::size_t first) {
    const std::size_t n = ws_.x.count();
    final_.resize(n - first);
    const auto gain = weights_.output_norm.f32();
    for (std::size_t i = first; i < n; ++i) rmsnorm<D>(ws_.x.row(i), gain, C::rms_eps, final_.row(i - first));
  }

  gguf::file file_;
  model_weights<C> weights_;
  model_options opt_;
  std::unique_ptr<thread_pool> pool_;

  // Workspace, sized by the longest batch so far (see reserve).
  block_activations<C, float> ws_;   // one layer's activations, reused by every layer; ws_.x is the stream
  rows<D> final_;                    // [n, D] final-normed rows whose logits are wanted
  rows<V> logits_;                   // [n, V] logits of those rows
  rows<H> entropy_;                  // [n, H] attention entropy, traced forward only
  std::vector<rope_angles<C>> angles_;  // [n] rotation angles of each row's position
  std::vector<std::size_t> starts_;     // [n] forward_batch: each sequence's position
  std::vector<kv_storage<C>*> stores_;  // [n] forward_batch: each sequence's cache
  std::vector<lora_adapter<C>> adapters_;
  std::vector<float> lora_u_;           // [n, largest rank] the adapters' A x
};

}  // namespace tlm
