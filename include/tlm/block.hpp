#pragma once
// The Llama block, written once over typed batches of rows. It serves decode (one
// row), prefill (the prompt's rows) and training (B sequences of T rows), over
// mapped (file) or owned (trainable, float or double) weights.
//
//   x_mid = x + W_o · attention(rope(W_q · n1), rope(W_k · n1), W_v · n1),  n1 = rmsnorm(x)
//   out   = x_mid + W_down · (silu(W_gate · n2) ⊙ W_up · n2),              n2 = rmsnorm(x_mid)
//
// The forward saves what the backward needs in block_activations (one per layer in
// training; one reused workspace in inference), and block_backward walks it in
// reverse. Shapes (glossary in config.hpp): rows of the batch n; D, K, F, H, E.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <tlm/config.hpp>
#include <tlm/heads.hpp>
#include <tlm/kv.hpp>
#include <tlm/linalg.hpp>
#include <tlm/ops.hpp>
#include <tlm/shape.hpp>
#include <tlm/thread_pool.hpp>
#include <tlm/weights.hpp>

namespace tlm {

// What one block saves for its backward pass, for a batch of n rows.
template <LlamaConfig C, Element T = float>
struct block_activations {
  rows<dim<C>, T> x;          // [n, D] residual stream entering the block
  rows<dim<C>, T> xn1;        // [n, D] attn_norm(x)
  rows<dim<C>, T> q;          // [n, D] queries after RoPE: H heads of [E]
  rows<kv_dim<C>, T> k;       // [n, K] keys after RoPE: G heads of [E]
  rows<kv_dim<C>, T> v;       // [n, K] values
  rows<dim<C>, T> o;          // [n, D] attention output, heads joined
  rows<heads<C>, T> lse;      // [n, H] log-sum-exp of each row's scores, per query head
  rows<dim<C>, T> x_mid;      // [n, D] residual stream after attention
  rows<dim<C>, T> xn2;        // [n, D] ffn_norm(x_mid)
  rows<C::ffn, T> gate;       // [n, F]
  rows<C::ffn, T> up;         // [n, F]
  rows<C::ffn, T> h;          // [n, F] silu(gate) ⊙ up

  void reserve(std::size_t n) {
    for (auto* r : {&x, &xn1, &q, &o, &x_mid, &xn2}) r->reserve(n);
    k.reserve(n);
    v.reserve(n);
    lse.reserve(n);
    for (auto* r : {&gate, &up, &h}) r->reserve(n);
  }
};

// Gradients of the block's intermediate values: scratch for block_backward, reused
// across layers.
template <LlamaConfig C, Element T = float>
struct block_scratch {
  rows<C::ffn, T> dh, dgate, dup;  // [n, F]
  rows<dim<C>, T> dxn, d_o, dq;    // [n, D]
  rows<kv_dim<C>, T> dk, dv;       // [n, K]
  std::vector<T> rms;              // [n] each row's 1 / rms, for the norms' gain gradients

  void reserve(std::size_t n) {
    for (auto* r : {&dh, &dgate, &dup}) r->reserve(n);
    for (auto* r : {&dxn, &d_o, &dq}) r->reserve(n);
    dk.reserve(n);
    dv.reserve(n);
    rms.reserve(n);
  }
};

// How the rows of a batch map onto sequences and positions: n = sequences * length;
// row i is position start(s) + i % length of sequence s = i / length. Every sequence
// starts at pos0, unless `starts` gives each its own first position ([sequences]): a
// batched decode step over caches of different lengths.
struct batch_layout {
  std::size_t sequences = 1;
  std::size_t length = 1;
  std::size_t pos0 = 0;
  const std::size_t* starts = nullptr;

  std::size_t rows() const { return sequences * length; }
  std::size_t start(std::size_t seq) const { return starts ? starts[seq] : pos0; }
};

namespace detail {

// f(group, tile, unit) for every tile of every group and every unit of a tile (a query
// or kv head), on the pool if there is one. A tile's cost grows with its index (it reads
// every key before it) and the pool hands out tasks in order, so each group's last tile
// goes first: no thread is left finishing the costliest tile alone.
template <class F>
void for_tiles_costliest_first(std::size_t groups, std::size_t tiles, std::size_t units, thread_pool* pool, F&& f) {
  auto run = [&](std::size_t t0, std::size_t t1) {
    for (std::size_t t = t0; t < t1; ++t) f(t / (tiles * units), tiles - 1 - t / units % tiles, t % units);
  };
  const std::size_t tasks = groups * tiles * units;
  if (pool) pool->parallel_for(tasks, 1, run);
  else run(0, tasks);
}

}  // namespace detail

// Where attention finds keys and values.
//
// kv_from_cache: inference. The block's new keys and values are written into the
// cache at positions pos0.., and row i attends to positions 0..pos0+i of the cache
// (one sequence).
template <LlamaConfig C>
struct kv_from_cache {
  // One sequence of one conversation: no packed segments (block_context::segment_start).
  static constexpr bool takes_segments = false;
  kv_storage<C>* store;
  std::size_t layer;

  void write(const rows<kv_dim<C>, float>& k, const rows<kv_dim<C>, float>& v, const batch_layout& b) const {
    constexpr std::size_t E = head_dim<C>, K = kv_dim<C>;
    for (std::size_t i = 0; i < k.count(); ++i)
      for (std::size_t g = 0; g < C::kv_heads; ++g)
        store->store(layer, g, b.pos0 + i, k.data() + i * K + g * E, v.data() + i * K + g * E);
  }
  // `nq` consecutive query heads of one row, all of kv head g, over positions [from,
  // len), in the cache's own element type.   q, out: [nq, E]  lse: [nq]
  // entropy: null or [nq]. `first` is always 0 here (takes_segments).
  void attend(const block_activations<C, float>&, std::size_t /*seq*/, std::size_t /*first*/, std::size_t g, const float* q,
              std::size_t nq, std::size_t from, std::size_t len, float scale, float* out, float* lse, float* entropy) const {
    attend_cached(*store, layer, g, q, nq, from, len, scale, out, lse, entropy);
  }

  // Prefill of n >= tiled_from rows at positions pos0.. into an f32 cache, untraced: the
  // rows attend a tile of attention_tile at a time (attention_forward: the scores and the
  // weighted sum as matrix products), not one row at a time through the dot-product and
  // axpy kernels, which were 37% of SmolLM2-135M's fast prefill of 530 tokens. One task
  // per (tile, query head), the costliest first. Returns false where it does not apply
  // (an int8 cache, a single row: decode), for the per-row path.
  static constexpr std::size_t tiled_from = attention_tile;
  bool attend_tiles(block_activations<C, float>& a, std::size_t pos0, float scale, thread_pool* pool) const {
    constexpr std::size_t D = dim<C>, H = heads<C>, E = head_dim<C>;
    const std::size_t n = a.q.count();
    if (store->type() != kv_type::f32 || n < tiled_from) return false;
    const kv_storage<C>& s = *store;
    detail::for_tiles_costliest_first(1, (n + attention_tile - 1) / attention_tile, H, pool,
                                      [&](std::size_t, std::size_t tile, std::size_t h) {
                                        const std::size_t g = kv_head_of<C>(h), r = tile * attention_tile;
                                        attention_forward<float>(pos0 + r, std::min(attention_tile, n - r), E, 1, scale,
                                                                 a.q.data() + r * D + h * E, a.o.data() + r * D + h * E, D,
                                                                 s.key(layer, g, 0), s.value(layer, g, 0), E,
                                                                 a.lse.data() + r * H + h, H);
                                      });
    return true;
  }

  static void attend_cached(const kv_storage<C>& store, std::size_t layer, std::size_t g, const float* q, std::size_t nq,
                            std::size_t from, std::size_t len, float scale, float* out, float* lse, float* entropy) {
    constexpr std::size_t E = head_dim<C>;
    if (store.type() == kv_type::q8)
      return attention_heads(detail::q8_rows{store.key_codes(layer, g, from), store.key_scales(layer, g, from),
                                             store.value_codes(layer, g, from), store.value_scales(layer, g, from)},
                             q, nq, len - from, E, scale, out, lse, entropy);
    attention_heads(detail::float_rows<float>{store.key(layer, g, from), store.value(layer, g, from), E}, q, nq, len - from,
                    E, scale, out, lse, entropy);
  }
};

// kv_from_caches: a batch of sequences, each with its own cache (stores[s]) and first
// position (batch_layout::starts): many conversations advanced by one block call, so
// that every weight is read once for all of them. Sequence s's rows are written into
// and attend to its own cache only.
template <LlamaConfig C>
struct kv_from_caches {
  static constexpr bool takes_segments = false;
  kv_storage<C>* const* stores;  // [sequences]
  std::size_t layer;

  void write(const rows<kv_dim<C>, float>& k, const rows<kv_dim<C>, float>& v, const batch_layout& b) const {
    constexpr std::size_t E = head_dim<C>, K = kv_dim<C>;
    for (std::size_t i = 0; i < k.count(); ++i) {
      const std::size_t s = i / b.length;
      for (std::size_t g = 0; g < C::kv_heads; ++g)
        stores[s]->store(layer, g, b.start(s) + i % b.length, k.data() + i * K + g * E, v.data() + i * K + g * E);
    }
  }
  void attend(const block_activations<C, float>&, std::size_t seq, std::size_t /*first*/, std::size_t g, const float* q,
              std::size_t nq, std::size_t from, std::size_t len, float scale, float* out, float* lse, float* entropy) const {
    kv_from_cache<C>::attend_cached(*stores[seq], layer, g, q, nq, from, len, scale, out, lse, entropy);
  }
};

// kv_in_batch: training. Each sequence of the batch attends to its own rows, read
// straight from the activations (row stride K); nothing is copied. A packed sequence's
// row reads `len` rows from its segment's first row, `first`.
template <LlamaConfig C, Element T>
struct kv_in_batch {
  static constexpr bool takes_segments = true;
  template <class R>
  void write(const R&, const R&, const batch_layout&) const {}
  void attend(const block_activations<C, T>& a, std::size_t seq, std::size_t first, std::size_t g, const T* q,
              std::size_t nq, std::size_t from, std::size_t len, T scale, T* out, T* lse, T* entropy) const {
    constexpr std::size_t E = head_dim<C>, K = kv_dim<C>;
    const std::size_t at = (seq * length + first + from) * K + g * E;
    attention_heads(detail::float_rows<T>{a.k.data() + at, a.v.data() + at, K}, q, nq, len - from, E, scale, out, lse,
                    entropy);
  }
  std::size_t length;
};

// Per-call inputs of the block besides weights and activations.
template <LlamaConfig C, Element T>
struct block_context {
  batch_layout layout;
  // Angles of each row: row i uses angles[i % period] (period = layout.length).
  const rope_angles<C, T>* angles = nullptr;
  rope_pairing pairing = rope_pairing::adjacent;
  // If set: [n, H] entropy (nats) of every row's attention weights, for tracing.
  rows<heads<C>, T>* entropy = nullptr;
  // Products with quantized (mapped) weights: activations at float32 precision, or int8 (kernels.hpp).
  kernels::precision precision = kernels::precision::exact;
  // Packed training sequences: [n] where row i's segment (one example) starts, as a
  // position in its sequence. Row i attends to the rows of its segment only, keys
  // [start, i], and takes the angles of its position in the segment, i - start, so an
  // example packed after others computes what it computes alone at the start of a
  // sequence. Null: each sequence is one segment, the path inference always takes.
  const std::uint32_t* segment_start = nullptr;

  // Which entry of `angles` row i takes: its position in its sequence, or in its
  // segment. Sequences with starts of their own have one entry per row.
  std::size_t angle_index(std::size_t i) const {
    if (layout.starts) return i;
    const std::size_t t = i % layout.length;
    return segment_start ? t - segment_start[i] : t;
  }
};

namespace detail {

// The f32 gain of a mapped norm, or the values of an owned one: [N]
template <std::size_t N, Storage S>
auto gain_values(const vec<N, S>& g) {
  if constexpr (is_owned_v<S>) return g.values();
  else return g.f32();
}

// Runs f(i) for every row, split over the pool when there is more than one row.
template <class F>
void for_rows(thread_pool* pool, std::size_t n, F&& f) {
  auto body = [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) f(i);
  };
  if (pool && n > 1) pool->parallel_for(n, 1, body);
  else body(0, n);
}

// x[i] += b for every row: an attention bias (mapped f32 or owned values).   x: [n, N]  b: [N]
template <std::size_t N, class T, Storage S>
void add_bias(rows<N, T>& x, const vec<N, S>& b, thread_pool* pool) {
  const auto bv = gain_values(b);
  for_rows(pool, x.count(), [&](std::size_t i) {
    const std::span<T, N> r = x.row(i);
    for (std::size_t j = 0; j < N; ++j) r[j] += static_cast<T>(bv[j]);
  });
}

// The backward of add_bias: db += the sum of d's rows, on one thread in row order
// so the sum does not depend on the thread count.   d: [n, N]  db: [N]
template <std::size_t N, class T, class G>
void add_bias_backward(const rows<N, T>& d, G& db) {
  T* g = db.data();
  for (std::size_t i = 0; i < d.count(); ++i) {
    const auto r = d.row(i);
    for (std::size_t j = 0; j < N; ++j) g[j] += r[j];
  }
}

template <std::size_t N, class T>
void add_rows(rows<N, T>& x, const rows<N, T>& d, thread_pool* pool) {
  for_rows(pool, x.count(), [&](std::size_t i) { add_to<N, T>(x.row(i), d.row(i)); });
}

// Sets the counted rows to zero on the pool's threads (the backward's scratch before
// its products accumulate: 15 MB a layer at SmolLM2-135M's batch of 512 rows).
template <std::size_t N, class T>
void zero_rows(rows<N, T>& x, thread_pool* pool) {
  for_rows(pool, x.count(), [&](std::size_t i) {
    const std::span<T, N> r = x.row(i);
    std::fill(r.begin(), r.end(), T(0));
  });
}

// rmsnorm_backward over every row on the pool: dx row by row in parallel, then the
// gain's gradient (a sum over the rows) a run of columns per task, each column adding
// its rows' terms in row order as one thread walking the rows in order does, so the
// sums are the same bits for every thread count. dgain null: the gain is frozen.
//   x, dy, dx: [n, D]   gain, dgain: [D]   rms: scratch, [n] after the call
template <std::size_t D, class T, class G>
void rmsnorm_backward_rows(const rows<D, T>& x, std::span<const G, D> gain, float eps, const rows<D, T>& dy,
                           rows<D, T>& dx, T* dgain, std::vector<T>& rms, thread_pool* pool) {
  const std::size_t n = x.count();
  rms.resize(n);
  for_rows(pool, n, [&](std::size_t i) { rms[i] = rmsnorm_backward<D, T, G>(x.row(i), gain, eps, dy.row(i), dx.row(i), nullptr); });
  if (dgain == nullptr) return;
  constexpr std::size_t run = 64;  // columns per task
  for_rows(pool, (D + run - 1) / run, [&](std::size_t c) {
    const std::size_t j0 = c * run, j1 = std::min(D, j0 + run);
    for (std::size_t i = 0; i < n; ++i) {
      const T* xi = x.row(i).data();
      const T* gi = dy.row(i).data();
      for (std::size_t j = j0; j < j1; ++j) dgain[j] += gi[j] * xi[j] * rms[i];
    }
  });
}

}  // namespace detail

// No low-rank adapter: the block as inference and full training run it. The hooks
// of an adapter (train/lora.hpp: lora_block_forward) add to a product's output.
struct no_adapter {
  template <lora_target, std::size_t N, std::size_t M, class T>
  void add(const rows<N, T>&, rows<M, T>&) const {}
};

namespace detail {

// Training's forward attention (kv_in_batch, block_forward): one task per (sequence,
// tile of attention_tile rows, kv head), each writing its rows' o and lse for the kv
// head's query heads, a sequence's last tiles (the costliest) first, as in
// kv_from_cache::attend_tiles. A tile that spans packed segments is cut at their edges,
// each part attending within its own segment.
template <LlamaConfig C, Element T>
void attend_in_batch(block_activations<C, T>& a, const batch_layout& b, const std::uint32_t* segment_start, T scale,
                     thread_pool* pool) {
  constexpr std::size_t D = dim<C>, H = heads<C>, E = head_dim<C>, K = kv_dim<C>, G = C::kv_heads;
  const std::size_t tiles = (b.length + attention_tile - 1) / attention_tile;
  auto segment_of = [&](std::size_t seq, std::size_t r) -> std::size_t {
    return segment_start ? segment_start[seq * b.length + r] : 0;
  };
  for_tiles_costliest_first(b.sequences, tiles, G, pool, [&](std::size_t seq, std::size_t tile, std::size_t g) {
    const std::size_t h0 = first_query_of<C>(g), end = std::min(b.length, (tile + 1) * attention_tile);
    for (std::size_t r = tile * attention_tile; r < end;) {
      const std::size_t s0 = segment_of(seq, r);  // rows [r, r1) lie in the segment starting at row s0
      std::size_t r1 = r + 1;
      while (r1 < end && segment_of(seq, r1) == s0) ++r1;
      const std::size_t base = seq * b.length + s0, row = seq * b.length + r;  // the segment's first row, the run's
      attention_forward<T>(r - s0, r1 - r, E, C::group, scale, a.q.data() + row * D + h0 * E,
                           a.o.data() + row * D + h0 * E, D, a.k.data() + base * K + g * E,
                           a.v.data() + base * K + g * E, K, a.lse.data() + row * H + h0, H);
      r = r1;
    }
  });
}

}  // namespace detail

// The forward pass of one block. a.x holds the n input rows; `out` receives the
// block's output rows (it may be a.x itself). Every other member
// of `a` is written. `ad.add<t>(x, y)` adds an adapter's low-rank path to the
// product y = W_t x of target t (no_adapter adds nothing); it reads only inputs that
// `a` keeps, so the backward can recompute it.
template <LlamaConfig C, Storage S, Element T, class KV, class Adapter = no_adapter>
  requires multiplies<S, T>
void block_forward(const layer_weights<C, S>& w, block_activations<C, T>& a, rows<dim<C>, T>& out,
                   const block_context<C, T>& ctx, const KV& kv, thread_pool* pool, const Adapter& ad = {}) {
  constexpr std::size_t D = dim<C>, F = C::ffn, H = heads<C>, E = head_dim<C>;
  const std::size_t n = a.x.count();
  if (n != ctx.layout.rows()) {
    throw shape_error("block_forward: " + std::to_string(n) + " rows for a layout of " +
                      std::to_string(ctx.layout.sequences) + " x " + std::to_string(ctx.layout.length));
  }
  if (ctx.segment_start && !KV::takes_segments)
    throw shape_error("block_forward: packed segments over a KV cache; only a training batch (kv_in_batch) packs examples");
  const auto g1 = detail::gain_values(w.attn_norm);
  a.xn1.resize(n);
  detail::for_rows(pool, n, [&](std::size_t i) {
    rmsnorm<D, T, typename decltype(g1)::value_type>(a.x.row(i), g1, C::rms_eps, a.xn1.row(i));
  });
  matmul_shared(a.xn1, pool, ctx.precision, into(w.attn_q, a.q), into(w.attn_k, a.k), into(w.attn_v, a.v));
  ad.template add<lora_target::q>(a.xn1, a.q);
  ad.template add<lora_target::k>(a.xn1, a.k);
  ad.template add<lora_target::v>(a.xn1, a.v);
  if constexpr (attention_bias_v<C>) {
    // Qwen2: the biases add to the projections, before RoPE rotates q and k.
    detail::add_bias(a.q, w.attn_q_bias, pool);
    detail::add_bias(a.k, w.attn_k_bias, pool);
    detail::add_bias(a.v, w.attn_v_bias, pool);
  }
  const std::size_t period = ctx.layout.length;
  detail::for_rows(pool, n, [&](std::size_t i) {
    const rope_angles<C, T>& angles = ctx.angles[ctx.angle_index(i)];
    rope<C, D, T>(a.q.row(i), angles, ctx.pairing);
    rope<C, kv_dim<C>, T>(a.k.row(i), angles, ctx.pairing);
  });
  kv.write(a.k, a.v, ctx.layout);

  // Row i of sequence s attends to positions 0 .. pos0 + i % length of s (packed: from
  // its segment's start).
  a.o.resize(n);
  a.lse.resize(n);
  if (ctx.entropy) ctx.entropy->resize(n);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(E)));
  // A training batch or a prefill, untraced: every row's keys are at hand, so the rows
  // attend a tile at a time (attention_forward), not one row at a time.
  bool tiled = false;
  if constexpr (KV::takes_segments) {
    tiled = ctx.entropy == nullptr && ctx.layout.starts == nullptr && ctx.layout.pos0 == 0;
    if (tiled) detail::attend_in_batch<C, T>(a, ctx.layout, ctx.segment_start, scale, pool);
  } else if constexpr (requires { kv.attend_tiles(a, ctx.layout.pos0, scale, pool); }) {
    tiled = ctx.entropy == nullptr && kv.attend_tiles(a, ctx.layout.pos0, scale, pool);
  }
  if (!tiled) {
    // The query heads of one kv head attend together, reading each block of keys and
    // values once for all of them (attention_heads). A decode step's row has only
    // kv_heads such units, too few to share out evenly (SmolLM2: 3 on 2 threads), so
    // each row of a decode step cuts its positions into segments (decode_segments),
    // attended apart and merged by their log-sum-exp. The cut depends on the row's
    // positions and the step's row count only, never on the threads.
    const std::size_t G = C::kv_heads, nq = C::group;
    const bool step = ctx.layout.length == 1 && !ctx.entropy;
    auto visible_of = [&](std::size_t i, std::size_t& seq, std::size_t& first) {
      first = ctx.segment_start ? ctx.segment_start[i] : 0;
      seq = i / period;
      return ctx.layout.start(seq) + i % period + 1 - first;
    };
    // Row i's units are [unit_at[i], unit_at[i + 1]): G times its segments; a row of
    // several segments keeps each segment's o and lse in `parts`, at its units' places.
    // (References: the pool's threads must reach the calling thread's buffers, not their own.)
    thread_local std::vector<std::size_t> unit_at_buffer;
    thread_local std::vector<T> parts_buffer;
    std::vector<std::size_t>& unit_at = unit_at_buffer;
    std::vector<T>& parts = parts_buffer;  // [units, nq * E + nq]: o, then lse
    constexpr std::size_t part = nq * E + nq;
    unit_at.resize(n + 1);
    unit_at[0] = 0;
    const std::size_t most = step ? detail::decode_segments(std::size_t(-1) / 2, n * G) : 1;
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t seq, first;
      unit_at[i + 1] = unit_at[i] + G * (step ? detail::decode_segments(visible_of(i, seq, first), n * G) : 1);
    }
    if (most > 1) {
      // Sized for the most segments a row of this step can have, so that decoding
      // allocates only on its first step.
      parts.reserve(n * G * most * part);
      parts.resize(unit_at[n] * part);
    }
    auto attend_units = [&](std::size_t b, std::size_t e) {
      std::size_t i = static_cast<std::size_t>(std::upper_bound(unit_at.begin(), unit_at.end(), b) - unit_at.begin()) - 1;
      for (std::size_t u = b; u < e; ++u) {
        while (u >= unit_at[i + 1]) ++i;
        std::size_t seq, first;
        const std::size_t visible = visible_of(i, seq, first);
        const std::size_t segs = (unit_at[i + 1] - unit_at[i]) / G, g = (u - unit_at[i]) / segs, sg = (u - unit_at[i]) % segs;
        const std::size_t h = first_query_of<C>(g);
        const T* q = a.q.data() + i * D + h * E;
        if (segs == 1) {
          kv.attend(a, seq, first, g, q, nq, 0, visible, scale, a.o.data() + i * D + h * E, a.lse.data() + i * H + h,
                    ctx.entropy ? ctx.entropy->data() + i * H + h : nullptr);
        } else {
          T* segment = parts.data() + u * part;
          kv.attend(a, seq, first, g, q, nq, detail::segment_start(visible, segs, sg),
                    detail::segment_start(visible, segs, sg + 1), scale, segment, segment + nq * E, nullptr);
        }
      }
    };
    if (pool) pool->parallel_for(unit_at[n], 1, attend_units);
    else attend_units(0, unit_at[n]);
    if (most > 1) {
      detail::for_rows(pool, n, [&](std::size_t i) {
        const std::size_t segs = (unit_at[i + 1] - unit_at[i]) / G;
        if (segs == 1) return;
        for (std::size_t g = 0; g < G; ++g) {
          const std::size_t h = first_query_of<C>(g);
          merge_segments<T>(parts.data() + (unit_at[i] + g * segs) * part, segs, part, nq, E,
                            a.o.data() + i * D + h * E, a.lse.data() + i * H + h);
        }
      });
    }
  }

  matmul(w.attn_output, a.o, a.x_mid, pool, ctx.precision);
  ad.template add<lora_target::o>(a.o, a.x_mid);
  detail::add_rows(a.x_mid, a.x, pool);
  const auto g2 = detail::gain_values(w.ffn_norm);
  a.xn2.resize(n);
  detail::for_rows(pool, n, [&](std::size_t i) {
    rmsnorm<D, T, typename decltype(g2)::value_type>(a.x_mid.row(i), g2, C::rms_eps, a.xn2.row(i));
  });
  matmul_shared(a.xn2, pool, ctx.precision, into(w.ffn_gate, a.gate), into(w.ffn_up, a.up));
  ad.template add<lora_target::gate>(a.xn2, a.gate);
  ad.template add<lora_target::up>(a.xn2, a.up);
  a.h.resize(n);
  detail::for_rows(pool, n, [&](std::size_t i) { swiglu<F, T>(a.gate.row(i), a.up.row(i), a.h.row(i)); });
  matmul(w.ffn_down, a.h, out, pool, ctx.precision);
  ad.template add<lora_target::down>(a.h, out);
  detail::add_rows(out, a.x_mid, pool);
}

namespace detail {

// Where the backward's gradients go in full training: every parameter of the layer.
template <class G>
struct full_gradients {
  G& dw;
  thread_pool* pool;

  template <lora_target t, class W, std::size_t N, std::size_t M, class T>
  void product(const W& w, const rows<N, T>& x, const rows<M, T>& dy, rows<N, T>& dx) const {
    matmul_backward(W::template matrix<t>(w), x, dy, G::template matrix<t>(dw), dx, pool);
  }
  auto* attn_norm_gradient() const { return dw.attn_norm.data(); }
  auto* ffn_norm_gradient() const { return dw.ffn_norm.data(); }
  template <class R1, class R2, class R3>
  void biases(const R1& dq, const R2& dk, const R3& dv) const {
    add_bias_backward(dq, dw.attn_q_bias);
    add_bias_backward(dk, dw.attn_k_bias);
    add_bias_backward(dv, dw.attn_v_bias);
  }
};

// The backward of one block, once for both uses. `g` says where gradients go:
// g.product<t>(w, x, dy, dx) is the backward of the product of target t (dx += and
// the weight's or the adapter's gradient +=), g.*_norm_gradient() the gains'
// gradient (null: frozen), g.biases(dq, dk, dv) the biases'.
template <LlamaConfig C, Storage S, Element T, class Grads>
void block_backward(const layer_weights<C, S>& w, const block_activations<C, T>& a, const block_context<C, T>& ctx,
                    rows<dim<C>, T>& dx, block_scratch<C, T>& s, thread_pool* pool, const Grads& g) {
  constexpr std::size_t D = dim<C>, K = kv_dim<C>, F = C::ffn, H = heads<C>, E = head_dim<C>;
  const std::size_t n = a.x.count();
  if (dx.count() != n) throw shape_error("block_backward: the output gradient has another row count than the forward");
  for (auto* r : {&s.dh, &s.dgate, &s.dup}) {
    r->resize(n);
    zero_rows(*r, pool);
  }
  for (auto* r : {&s.dxn, &s.d_o, &s.dq}) {
    r->resize(n);
    zero_rows(*r, pool);
  }
  for (auto* r : {&s.dk, &s.dv}) {
    r->resize(n);
    zero_rows(*r, pool);
  }
  const auto g1 = gain_values(w.attn_norm);
  const auto g2 = gain_values(w.ffn_norm);
  using G1 = typename decltype(g1)::value_type;
  using G2 = typename decltype(g2)::value_type;

  // out = x_mid + W_down h: dx passes on to x_mid unchanged (the residual).
  g.template product<lora_target::down>(w, a.h, dx, s.dh);
  for_rows(pool, n, [&](std::size_t i) {
    swiglu_backward<F, T>(a.gate.row(i), a.up.row(i), s.dh.row(i), s.dgate.row(i), s.dup.row(i));
  });
  g.template product<lora_target::gate>(w, a.xn2, s.dgate, s.dxn);
  g.template product<lora_target::up>(w, a.xn2, s.dup, s.dxn);
  rmsnorm_backward_rows<D, T, G2>(a.x_mid, g2, C::rms_eps, s.dxn, dx, g.ffn_norm_gradient(), s.rms, pool);

  // x_mid = x + W_o o.
  g.template product<lora_target::o>(w, a.o, dx, s.d_o);
  const batch_layout& b = ctx.layout;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(E)));
  // One task per (sequence, kv head): it owns that kv head's dk and dv. A packed
  // sequence is its segments one after another, each a causal sequence of its own: the
  // segments' keys see no query of another, so their gradients do not mix.
  auto attend_back = [&](std::size_t t0, std::size_t t1) {
    for (std::size_t t = t0; t < t1; ++t) {
      const std::size_t seq = t / C::kv_heads, kg = t % C::kv_heads;
      const std::size_t h0 = first_query_of<C>(kg);
      for (std::size_t s0 = 0; s0 < b.length;) {
        std::size_t s1 = b.length;  // the segment is rows [s0, s1) of the sequence
        if (ctx.segment_start) {
          s1 = s0 + 1;
          while (s1 < b.length && ctx.segment_start[seq * b.length + s1] == s0) ++s1;
        }
        const std::size_t r0 = seq * b.length + s0;
        attention_backward<T>(s1 - s0, E, C::group, scale, a.q.data() + r0 * D + h0 * E, a.o.data() + r0 * D + h0 * E,
                              s.d_o.data() + r0 * D + h0 * E, s.dq.data() + r0 * D + h0 * E, D,
                              a.k.data() + r0 * K + kg * E, a.v.data() + r0 * K + kg * E, s.dk.data() + r0 * K + kg * E,
                              s.dv.data() + r0 * K + kg * E, K, a.lse.data() + r0 * H + h0, H);
        s0 = s1;
      }
    }
  };
  if (pool) pool->parallel_for(b.sequences * C::kv_heads, 1, attend_back);
  else attend_back(0, b.sequences * C::kv_heads);
  for_rows(pool, n, [&](std::size_t i) {
    const rope_angles<C, T>& angles = ctx.angles[ctx.angle_index(i)];
    rope_backward<C, D, T>(s.dq.row(i), angles, ctx.pairing);
    rope_backward<C, K, T>(s.dk.row(i), angles, ctx.pairing);
  });
  // dq, dk are now gradients of the projections before RoPE, where the biases add.
  if constexpr (attention_bias_v<C>) g.biases(s.dq, s.dk, s.dv);
  zero_rows(s.dxn, pool);
  g.template product<lora_target::q>(w, a.xn1, s.dq, s.dxn);
  g.template product<lora_target::k>(w, a.xn1, s.dk, s.dxn);
  g.template product<lora_target::v>(w, a.xn1, s.dv, s.dxn);
  rmsnorm_backward_rows<D, T, G1>(a.x, g1, C::rms_eps, s.dxn, dx, g.attn_norm_gradient(), s.rms, pool);
}

}  // namespace detail

// The backward pass of one training block (attention within each sequence of the
// batch). The forward's weights and saved activations, then the output's
// gradient, then the gradients: on entry dx holds d(loss)/d(out); on return it
// holds d(loss)/d(x). Weight gradients are accumulated into dw with +=.
template <class W, class G, LlamaConfig C = typename W::config, Element T = storage_value_t<typename W::storage>>
  requires trainable_weights<W> && gradient_of<G, W>
void block_backward(const W& w, const block_activations<C, T>& a, const block_context<C, T>& ctx, rows<dim<C>, T>& dx,
                    G& dw, block_scratch<C, T>& s, thread_pool* pool) {
  detail::block_backward(w, a, ctx, dx, s, pool, detail::full_gradients<G>{dw, pool});
}

// The same backward over a frozen base (mapped or owned weights, no gradient) under
// an adapter: `ad` is the adapter's sink (train/lora.hpp, lora_block_backward), which
// takes the gradients of its factors; dx flows through W and the low-rank path.
template <LlamaConfig C, Storage S, Element T, class AdapterGrads>
  requires multiplies<S, T>
void block_backward(const layer_weights<C, S>& w, const block_activations<C, T>& a, const block_context<C, T>& ctx,
                    rows<dim<C>, T>& dx, block_scratch<C, T>& s, thread_pool* pool, const AdapterGrads& ad) {
  detail::block_backward(w, a, ctx, dx, s, pool, ad);
}

}  // namespace tlm
