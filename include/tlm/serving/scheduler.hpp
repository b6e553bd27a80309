#pragma once
// Many generations through one model: continuous batching with a prefix cache.
//
// A server used to give each request a model of its own (its own workspace and cache),
// so every decode step read all the weights once per request. Here one thread advances
// every active sequence by one token per step in a single model::forward_batch call
// (each row with its own position and cache), so the weights are read once per step
// for all of them; a new request's prompt is run in chunks between those steps, so that
// a long prompt delays the others' next token by one chunk, not by the whole prompt.
//
// Each sequence keeps its cache after its request ends. A new request takes the idle
// sequence whose cached tokens share the longest prefix with its prompt (a system
// prompt, the earlier turns of a chat) and runs only the rest; the least recently used
// sequence otherwise. The reply is what a cold run gives, token for token, up to the
// summation order of the batched products. Requests that share a prompt and arrive
// together (a system prompt sent by many clients at once) find no idle sequence holding
// it yet: a new request then copies the prefix from a running sequence's cache, whose
// first positions are written and stay so while it runs.
//
// Example, given tlm::model<tlm::smollm2_135m>* model; const tlm::tokenizer* tokens; std::vector<std::int32_t> ids:
//   auto& m = *model;
//   const auto& tok = *tokens;
//   tlm::scheduler<tlm::smollm2_135m> s(m, tok, {.parallel = 4});
//   tlm::sequence_request r{.prompt = ids, .options = {.max_tokens = 32}};
//   r.stop_ids.assign(tok.end_of_generation().begin(), tok.end_of_generation().end());
//   r.on_done = [](tlm::sequence_outcome& o) { std::fputs(o.result.text.c_str(), stdout); };
//   if (s.submit(std::move(r)) != tlm::admission::accepted) std::fputs("busy\n", stderr);
//
// An embedding request (sequence_request::embed) takes a sequence like any other: its
// text runs in prefill chunks between the others' decode steps, the chunks' final hidden
// states are pooled, and on_done gets the embedding; nothing is generated. Its cache is
// then a prefix for later requests like any other, but it never starts from one, since a
// cached prefix keeps its keys and values, not the hidden states an embedding pools.
//
// on_token and on_done run on the scheduler's thread: they must be quick (hand the text
// to the thread that writes it) and must not call back into the scheduler.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <tlm/error.hpp>
#include <tlm/generation/decode.hpp>
#include <tlm/kv.hpp>
#include <tlm/model.hpp>
#include <tlm/text/tokenizer.hpp>

namespace tlm {

struct scheduler_options {
  std::size_t parallel = 4;        // sequences decoded together, each with its own cache
  std::size_t kv_budget = 0;       // bytes of KV cache over all sequences; 0: no limit
  kv_type kv = kv_type::f32;       // the caches' element type
  std::size_t prefill_chunk = 128;  // prompt tokens run per step for a new request
  std::size_t queue = 32;          // requests that may wait for a sequence; more are refused
  bool prefix_cache = true;        // reuse an idle sequence's cached prefix
};

// How a request ended. error: what stopped it, if it failed; cut: the scheduler was
// stopped while it ran or waited (then result holds what was generated).
struct sequence_outcome {
  generation_result result;
  std::exception_ptr error;
  bool cut = false;
  std::size_t reused_tokens = 0;  // prompt tokens found in the prefix cache, not run again
  std::vector<float> embedding;   // [D] an embedding request's result, unit length; empty otherwise
};

struct sequence_request {
  std::vector<std::int32_t> prompt;  // [n] token ids, n >= 1
  generation_options options{};
  std::vector<std::int32_t> stop_ids{};  // tokens that end the reply (tokenizer::end_of_generation, a chat's end of turn)
  token_callback on_token{};             // each token's text, as the generator gives it
  std::function<void(sequence_outcome&)> on_done{};  // once, when the request ends however it ends
  // Set (from any thread) to end the request at the next step: a client that left.
  std::shared_ptr<std::atomic<bool>> cancelled{};
  std::string tag{};  // the caller's name for the request, shown by status()
  // Set: the request wants the embedding of its prompt, pooled so, and generates nothing
  // (options, stop_ids and on_token are not used).
  std::optional<pooling> embed{};
};

enum class admission { accepted, queue_full, stopping };

// What status() reports of one sequence.
struct sequence_status {
  std::string state;  // idle, prefill, generating or embedding (queued work is not here)
  std::string tag;
  std::size_t prompt_tokens = 0, generated_tokens = 0, cached_tokens = 0, kv_bytes = 0;
  std::chrono::steady_clock::time_point started{};
};

struct scheduler_status {
  std::size_t queued = 0, active = 0, kv_bytes = 0;
  std::uint64_t prefix_hits = 0, reused_tokens = 0, steps = 0, batched_rows = 0;
  std::uint64_t running_donations = 0;  // prefix hits copied from a sequence that was still running
  std::vector<sequence_status> sequences;
};

template <LlamaConfig C>
class scheduler {
 public:
  scheduler(model<C>& m, const tokenizer& tok, scheduler_options o) : m_(&m), tok_(&tok), o_(o) {
    if (o_.parallel == 0) throw error("scheduler: parallel 0 runs nothing; give 1 or more sequences");
    if (o_.prefill_chunk == 0) throw error("scheduler: a prefill chunk of 0 tokens never finishes a prompt; give 1 or more");
    seqs_.resize(o_.parallel);
    thread_ = std::thread([this] { loop(); });
  }
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;
  ~scheduler() {
    stop();
    thread_.join();
  }

  // Queues a request. The prompt must fit a cache of the config's context with room for
  // max_tokens - 1 more positions, and, under a KV budget, alone within the budget.
  admission submit(sequence_request r) {
    if (r.prompt.empty()) throw error("scheduler: the prompt is empty; give at least one token");
    for (const auto t : r.prompt)
      if (t < 0 || static_cast<std::size_t>(t) >= C::vocab)
        throw error("scheduler: prompt token " + std::to_string(t) + " is outside the vocabulary of " +
                    std::to_string(C::vocab) + " tokens");
    const std::size_t need = positions_needed(r);
    if (need > C::context)
      throw capacity_error("scheduler: the prompt of " + std::to_string(r.prompt.size()) + " tokens and max_tokens " +
                           std::to_string(r.options.max_tokens) + " need " + std::to_string(need) +
                           " positions, more than the context of " + std::to_string(C::context));
    if (o_.kv_budget && kv_storage<C>::bytes_per_position(o_.kv) * need > o_.kv_budget)
      throw capacity_error("scheduler: the request needs " + std::to_string(need) + " cache positions (" +
                           std::to_string(kv_storage<C>::bytes_per_position(o_.kv) * need) +
                           " bytes), more than the whole KV budget of " + std::to_string(o_.kv_budget) +
                           " bytes; shorten it or raise the budget");
    if (!r.cancelled) r.cancelled = std::make_shared<std::atomic<bool>>(false);
    {
      std::lock_guard lock(mu_);
      if (stopping_) return admission::stopping;
      // Beyond the sequences, `queue` more may wait.
      if (queue_.size() + running_ >= o_.parallel + o_.queue) return admission::queue_full;
      queue_.push_back(std::make_unique<job>(job{std::move(r), std::chrono::steady_clock::now()}));
    }
    wake_.notify_one();
    return admission::accepted;
  }

  // Ends the running requests at their next step (cut) and the queued ones at once (cut,
  // nothing generated); later submits are refused. Returns at once.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_.notify_one();
  }

  scheduler_status status() const {
    std::lock_guard lock(mu_);
    scheduler_status s = stats_;
    s.queued = queue_.size();
    s.sequences = shown_;
    return s;
  }

  const scheduler_options& options() const { return o_; }

 private:
  struct job {
    sequence_request r;
    std::chrono::steady_clock::time_point arrived;
  };
  struct sequence {
    std::unique_ptr<job> j;                // null: idle
    std::optional<kv_cache<C>> cache;      // kept after a request, for the prefix cache
    std::vector<std::int32_t> cached;      // the ids whose keys and values the cache holds
    std::size_t prefilled = 0;             // prompt tokens in the cache
    std::size_t reused = 0;                // of which the prefix cache gave
    std::optional<decode_state> st;        // set once the prompt is in
    std::optional<embedding_pool<dim<C>>> pool;  // an embedding request's pooled states so far
    std::int32_t pending = -1;             // the token to run next
    std::chrono::steady_clock::time_point used{}, prefill_start{};
  };

  // Fewer shared tokens than this are run again rather than copied from a running sequence.
  static constexpr std::size_t min_donated = 16;

  static std::size_t positions_needed(const sequence_request& r) {
    if (r.embed) return r.prompt.size();
    // The last token chosen is never run.
    return r.prompt.size() + std::max<std::size_t>(r.options.max_tokens, 1) - 1;
  }
  static std::size_t common_prefix(std::span<const std::int32_t> a, std::span<const std::int32_t> b) {
    const std::size_t n = std::min(a.size(), b.size());
    std::size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
  }
  std::size_t kv_bytes() const {
    std::size_t b = 0;
    for (const auto& s : seqs_) b += s.cache ? s.cache->bytes() : 0;
    return b;
  }
  // Cache capacities are rounded up, so that a sequence's cache is remade only a few
  // times as its requests grow, and never past the context.
  static std::size_t rounded(std::size_t need) { return std::min<std::size_t>((need + 255) / 256 * 256, C::context); }

  // Takes the next queued request into an idle sequence, if one is idle and the budget
  // allows. Called with mu_ held.
  bool admit_locked() {
    if (queue_.empty()) return false;
    job& jb = *queue_.front();
    const auto& prompt = jb.r.prompt;
    // The idle sequence with the longest cached prefix; the least recently used among equals.
    sequence* best = nullptr;
    std::size_t best_common = 0;
    for (auto& s : seqs_) {
      if (s.j) continue;
      const std::size_t c = o_.prefix_cache && !jb.r.embed ? common_prefix(s.cached, prompt) : 0;
      if (!best || c > best_common || (c == best_common && s.used < best->used)) {
        best = &s;
        best_common = c;
      }
    }
    if (!best) return false;
    // A running sequence may hold a longer prefix (requests that share a system prompt
    // arrive together): its first positions are written and stay as they are while it
    // runs, so they are copied into the new request's cache instead of run again.
    sequence* donor = nullptr;
    std::size_t donor_common = 0;
    if (o_.prefix_cache && !jb.r.embed) {
      for (auto& s : seqs_) {
        if (!s.j || !s.cache) continue;
        const std::size_t c = common_prefix(s.cached, prompt);
        if (c > donor_common) {
          donor = &s;
          donor_common = c;
        }
      }
      // Worth a copy only for a good stretch more than the idle sequence holds.
      if (donor_common < best_common + min_donated) donor = nullptr;
    }
    if (donor) best_common = donor_common;
    // At least the prompt's last token runs, for its logits.
    const std::size_t common = std::min(best_common, prompt.size() - 1);
    const std::size_t need = positions_needed(jb.r);
    const std::size_t bpp = kv_storage<C>::bytes_per_position(o_.kv);
    const bool regrow = !best->cache || best->cache->capacity() < need;
    if (o_.kv_budget && regrow) {
      const std::size_t cap = rounded(need);
      // Idle sequences' caches go, least recently used first, until the new one fits.
      while (kv_bytes() - (best->cache ? best->cache->bytes() : 0) + cap * bpp > o_.kv_budget) {
        sequence* victim = nullptr;
        for (auto& s : seqs_)
          if (!s.j && &s != best && s.cache && (!victim || s.used < victim->used)) victim = &s;
        if (!victim) return false;  // waits for a running request to end
        victim->cache.reset();
        victim->cached.clear();
      }
    }
    sequence& s = *best;
    if (donor) {
      if (regrow) {
        s.cache.reset();
        s.cache.emplace(rounded(need), o_.kv);
      }
      s.cache->truncate(0);
      s.cache->storage().copy_positions(donor->cache->storage(), common);
      for (std::size_t i = 0; i < common; ++i) s.cache->push();
      s.cached.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(common));
      ++stats_.running_donations;
    } else if (regrow) {
      kv_cache<C> bigger(rounded(need), o_.kv);
      if (s.cache && common > 0) {
        bigger.storage().copy_positions(s.cache->storage(), common);
        for (std::size_t i = 0; i < common; ++i) bigger.push();
      }
      s.cache.reset();  // the old cache is freed before the next is made
      s.cache.emplace(std::move(bigger));
    } else {
      s.cache->truncate(common);
    }
    s.cached.resize(common);
    s.prefilled = s.reused = common;
    if (common > 0) {
      ++stats_.prefix_hits;
      stats_.reused_tokens += common;
    }
    s.j = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    s.st.reset();
    s.pool.reset();
    if (s.j->r.embed) s.pool.emplace(*s.j->r.embed);
    s.pending = -1;
    s.used = s.prefill_start = std::chrono::steady_clock::now();
    return true;
  }

  // Ends the request on s. cancelled: its client left (stop_reason::callback).
  void finish(sequence& s, std::exception_ptr err, bool cut, bool cancelled = false) {
    sequence_outcome out;
    if (s.st) {
      try {
        out.result = std::move(s.st->finish());
      } catch (...) {
        if (!err) err = std::current_exception();
      }
      const auto& ctx = s.st->context();
      // The cache holds the prompt and every chosen token but the last, which never ran.
      s.cached.assign(ctx.begin(), ctx.begin() + static_cast<std::ptrdiff_t>(std::min(ctx.size(), s.cache->length())));
    } else {
      out.result.prompt_tokens = s.prefilled - s.reused;
      out.result.reason = stop_reason::callback;
      if (s.pool && !err && !cut && !cancelled && s.prefilled == s.j->r.prompt.size()) {
        try {
          out.embedding = s.pool->finish();
          out.result.reason = stop_reason::max_tokens;  // it ran to its end
        } catch (...) {
          err = std::current_exception();
        }
      }
    }
    if (err) {
      // A failed step may have left positions it claimed unwritten: nothing of it is reused.
      s.cached.clear();
      s.cache->clear();
    }
    if (cancelled) out.result.reason = stop_reason::callback;
    out.error = err;
    out.cut = cut;
    out.reused_tokens = s.reused;
    auto done = std::move(s.j->r.on_done);
    s.j.reset();
    s.st.reset();
    s.pool.reset();
    s.used = std::chrono::steady_clock::now();
    {
      // Published before on_done: a client that has its answer finds the sequence idle.
      std::lock_guard lock(mu_);
      --running_;
      publish_locked();
    }
    call(done, out);
  }

  // A callback that throws must not end the scheduler's thread, and so every other
  // request with it: what it throws is dropped (on_done is the caller's own code).
  static void call(const std::function<void(sequence_outcome&)>& done, sequence_outcome& out) {
    if (!done) return;
    try {
      done(out);
    } catch (...) {
    }
  }

  void fail_queued(std::unique_lock<std::mutex>& lock) {
    while (!queue_.empty()) {
      auto jb = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      sequence_outcome out;
      out.cut = true;
      out.result.reason = stop_reason::callback;
      call(jb->r.on_done, out);
      lock.lock();
    }
  }

  // Runs up to prefill_chunk prompt tokens of the sequence that has waited longest.
  void prefill_step() {
    sequence* s = nullptr;
    for (auto& q : seqs_)
      if (q.j && !q.st && (!s || q.prefill_start < s->prefill_start)) s = &q;
    if (!s) return;
    const auto& prompt = s->j->r.prompt;
    const std::size_t n = std::min(o_.prefill_chunk, prompt.size() - s->prefilled);
    try {
      const auto chunk = std::span<const std::int32_t>(prompt).subspan(s->prefilled, n);
      if (s->pool) {
        s->pool->add(m_->hidden(chunk, *s->cache));
        s->cached.insert(s->cached.end(), chunk.begin(), chunk.end());
        s->prefilled += n;
        if (s->prefilled == prompt.size()) finish(*s, nullptr, false);
        return;
      }
      const auto logits = m_->prefill(chunk, *s->cache);
      s->cached.insert(s->cached.end(), chunk.begin(), chunk.end());
      s->prefilled += n;
      if (s->prefilled < prompt.size()) return;
      generation_result r;
      r.prompt_tokens = prompt.size() - s->reused;
      r.prefill_ms = detail::ms_since(s->prefill_start);
      auto& req = s->j->r;
      s->st.emplace(*tok_, req.options, req.stop_ids, req.on_token, prompt, std::move(r));
      advance(*s, logits);
    } catch (...) {
      finish(*s, std::current_exception(), false);
    }
  }

  // The decode state's choice from the newest logits: the next token to run, or the end.
  void advance(sequence& s, std::span<const float> logits) {
    const auto id = s.st->next(logits, s.cache->length() - 1, s.cache->room());
    if (id) s.pending = *id;
    else finish(s, nullptr, false);
  }

  // One token of every sequence that has one to run, in one batched forward pass.
  void decode_step() {
    rows_.clear();
    tokens_.clear();
    caches_.clear();
    for (auto& s : seqs_) {
      if (s.j && s.st && s.pending >= 0) {
        rows_.push_back(&s);
        tokens_.push_back(s.pending);
        caches_.push_back(&*s.cache);
      }
    }
    if (rows_.empty()) return;
    try {
      const auto& logits = m_->forward_batch(tokens_, caches_);
      for (std::size_t i = 0; i < rows_.size(); ++i) {
        sequence& s = *rows_[i];
        s.cached.push_back(s.pending);
        s.pending = -1;
        try {
          advance(s, logits.row(i));
        } catch (...) {
          finish(s, std::current_exception(), false);
        }
      }
    } catch (...) {
      const auto err = std::current_exception();
      for (auto* s : rows_) finish(*s, err, false);
    }
    std::lock_guard lock(mu_);
    ++stats_.steps;
    stats_.batched_rows += rows_.size();
  }

  void publish_locked() {
    stats_.active = 0;
    shown_.resize(seqs_.size());
    for (std::size_t i = 0; i < seqs_.size(); ++i) {
      const sequence& s = seqs_[i];
      sequence_status& v = shown_[i];
      v.kv_bytes = s.cache ? s.cache->bytes() : 0;
      v.cached_tokens = s.cache ? s.cache->length() : 0;
      if (!s.j) {
        v.state = "idle";
        v.tag.clear();
        v.prompt_tokens = v.generated_tokens = 0;
        continue;
      }
      ++stats_.active;
      v.state = s.pool ? "embedding" : s.st ? "generating" : "prefill";
      v.tag = s.j->r.tag;
      v.prompt_tokens = s.j->r.prompt.size();
      v.generated_tokens = s.st ? s.st->result().ids.size() : 0;
      v.started = s.j->arrived;
    }
    stats_.kv_bytes = kv_bytes();
  }

  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      while (!stopping_) {
        // A request that cannot be given a sequence (its cache cannot be made) fails
        // alone: the scheduler's thread, and every other request with it, goes on.
        std::exception_ptr err;
        try {
          if (!admit_locked()) break;
          continue;
        } catch (...) {
          err = std::current_exception();
        }
        auto jb = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        sequence_outcome out;
        out.error = err;
        call(jb->r.on_done, out);
        lock.lock();
      }
      publish_locked();
      const bool busy = std::any_of(seqs_.begin(), seqs_.end(), [](const sequence& s) { return s.j != nullptr; });
      if (stopping_) {
        lock.unlock();
        for (auto& s : seqs_)
          if (s.j) finish(s, nullptr, true);
        lock.lock();
        fail_queued(lock);
        publish_locked();
        return;
      }
      if (!busy) {
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        continue;
      }
      lock.unlock();
      for (auto& s : seqs_)
        if (s.j && s.j->r.cancelled->load(std::memory_order_relaxed)) finish(s, nullptr, false, true);
      // A prompt chunk, then everyone's next token: a new request joins the batch within
      // a few steps while the others keep decoding.
      prefill_step();
      decode_step();
      lock.lock();
    }
  }

  model<C>* m_;
  const tokenizer* tok_;
  scheduler_options o_;
  std::vector<sequence> seqs_;  // touched by the scheduler's thread only, but for admit under mu_
  std::deque<std::unique_ptr<job>> queue_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::size_t running_ = 0;  // sequences with a request
  scheduler_status stats_;
  std::vector<sequence_status> shown_;
  // The batch of one decode step: [rows]
  std::vector<sequence*> rows_;
  std::vector<std::int32_t> tokens_;
  std::vector<kv_cache<C>*> caches_;
  std::thread thread_;  // last: starts once everything it reads is made
};

}  // namespace tlm
