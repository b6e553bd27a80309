#pragma once
// One generation's decisions between forward passes, and the one decoding loop that
// drives them: the options that shape a generation, its result, the streaming callback,
// and decode_state (grammar mask, sampling, end tokens, stop strings, streamed text),
// which the generator, the chat session and the server's scheduler share.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <tlm/error.hpp>
#include <tlm/generation/grammar.hpp>
#include <tlm/generation/sampler.hpp>
#include <tlm/model.hpp>
#include <tlm/text/tokenizer.hpp>

namespace tlm {

// Everything that shapes one generation; every field has a default that works.
struct generation_options {
  std::size_t max_tokens = 256;  // the token limit: at most this many new tokens (0: none)
  sampling sample{};               // temperature 0 (greedy) by default; see sampler.hpp for the order
  std::vector<std::string> stop{};  // stop strings: generation ends at the first, which is not returned
  bool stop_at_eos = true;       // end at any of the tokenizer's end-of-generation tokens (and, in a chat, the template's end of turn)
  // Constrained output: only tokens that keep the text a prefix of a document of this
  // grammar are sampled, and the document is complete within max_tokens - 1 characters
  // (then end-of-sequence is the only choice, and ends it whatever stop_at_eos says).
  std::shared_ptr<const json_grammar> grammar{};
  // With a grammar: it binds only a reply that begins with this text, and a reply that
  // begins otherwise is free (a tool call's "<tool_call>": the model answers in words or
  // calls a tool, and a call always parses). Empty: the grammar binds every reply.
  std::string grammar_trigger{};
};

enum class stop_reason {
  eos,           // the model ended its text
  stop_string,   // one of options.stop appeared
  max_tokens,    // options.max_tokens tokens were generated
  callback,      // the on_token callback asked to stop
  context_full,  // the KV cache has no room for another position
};

inline std::string_view to_string(stop_reason r) {
  switch (r) {
    case stop_reason::eos: return "eos";
    case stop_reason::stop_string: return "stop string";
    case stop_reason::max_tokens: return "token limit";
    case stop_reason::callback: return "callback";
    case stop_reason::context_full: return "context full";
  }
  return "?";
}

struct generation_result {
  std::string text;                 // the visible continuation: no end-of-sequence token, no stop string
  std::vector<std::int32_t> ids;    // every sampled id, including a final end-of-sequence token
  stop_reason reason = stop_reason::max_tokens;
  std::size_t prompt_tokens = 0;    // tokens run through the model's prefill for this call
  double prefill_ms = 0.0;
  std::size_t decoded_tokens = 0;   // single-token forward passes after the prefill
  double decode_ms = 0.0;
  std::size_t dropped_tokens = 0;   // chat with context_shift: positions its shift freed before this reply
};

// What the streaming callback answers.
enum class step { go_on, stop };

// Called once per sampled token (except a stop token) with the text that token
// releases: whole UTF-8 characters, possibly empty while a character is incomplete or
// while the text might still be the start of a stop string. Text released only at the
// end (a held-back part of a stop string that did not complete) comes with id -1.
// The concatenated texts equal generation_result::text.
using token_callback = std::function<step(std::int32_t id, std::string_view text)>;

// Accepts callbacks that return step, bool (true: go on) or nothing.
template <class F>
token_callback make_token_callback(F&& f) {
  using R = std::invoke_result_t<F&, std::int32_t, std::string_view>;
  if constexpr (std::is_same_v<R, step>) {
    return token_callback(std::forward<F>(f));
  } else if constexpr (std::is_same_v<R, bool>) {
    return [g = std::forward<F>(f)](std::int32_t id, std::string_view t) mutable { return g(id, t) ? step::go_on : step::stop; };
  } else {
    static_assert(std::is_void_v<R>, "an on_token callback returns tlm::step, bool (true: go on) or nothing");
    return [g = std::forward<F>(f)](std::int32_t id, std::string_view t) mutable {
      g(id, t);
      return step::go_on;
    };
  }
}

// Hooks for tools that look inside the run; the CLI's --dump-logits and --trace use them.
template <LlamaConfig C>
struct generation_hooks {
  std::vector<float>* prompt_logits = nullptr;  // filled with the logits of every prompt position: [n, V]
  // Called after each single-token forward pass with its trace (slower: a traced forward).
  std::function<void(std::int32_t token, std::size_t position, const forward_trace<C>&)> on_trace{};
};

namespace detail {

// Releases streamed text while making sure no stop string is ever released: the
// longest tail that could still begin a stop string is held back until it either
// completes one (and is dropped) or cannot anymore.
class stop_filter {
 public:
  explicit stop_filter(std::span<const std::string> stops) : stops_(stops.begin(), stops.end()) {
    for (const auto& s : stops_)
      if (s.empty()) throw error("generation: an empty stop string would stop before the first token; remove it");
  }

  // Adds text; returns what may be released, and whether a stop string completed.
  std::pair<std::string, bool> push(std::string_view text) {
    held_ += text;
    std::size_t first = std::string::npos;
    for (const auto& s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
      std::string out = held_.substr(0, first);
      held_.clear();
      return {std::move(out), true};
    }
    std::size_t keep = 0;
    for (const auto& s : stops_) {
      for (std::size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
        if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
          keep = k;
          break;
        }
      }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return {std::move(out), false};
  }
  std::string flush() { return std::exchange(held_, {}); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

inline double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// A model's logits are finite unless its file is corrupt (a NaN or infinite weight or
// block scale) or its activations overflow float32; either way no token can be chosen
// from them, and sampling would silently pick one. Checking the row costs a pass over
// `vocab` floats per token, far below the forward pass.
inline void require_finite_logits(std::span<const float> logits, std::size_t position) {
  // Every step's values tested at once (see argmax): std::isfinite in a loop with an
  // early exit is not vectorized. The search that names the culprit runs only when
  // there is one.
  constexpr std::size_t w = scan_width;
  const float* l = logits.data();
  const std::size_t steps = logits.size() / w;
  i32x4 bad{};
  for (std::size_t s = 0; s < steps; ++s) {
    i32x4 v[4];
    std::memcpy(v, l + w * s, sizeof v);
    // The magnitude's bits above the largest finite float's: infinity or NaN.
    for (const i32x4& x : v) bad |= (x & 0x7fffffff) > 0x7f7fffff;
  }
  bool any = any_set(bad);
  for (std::size_t i = w * steps; i < logits.size(); ++i) any |= !std::isfinite(l[i]);
  if (!any) return;
  for (std::size_t v = 0; v < logits.size(); ++v) {
    if (!std::isfinite(logits[v])) {
      throw numeric_error("the model's logits at position " + std::to_string(position) + " are not finite (token " +
                          std::to_string(v) + ": " + std::to_string(logits[v]) +
                          "): the file's weights or block scales hold NaN or infinity, or the model overflows float32; "
                          "`examples/inspect FILE --verify` names the tensor");
    }
  }
}

}  // namespace detail

// One generation's decisions between forward passes: the grammar's mask, sampling, end
// tokens, stop strings and the streamed text. It never runs the model: the caller runs
// each token it returns, by itself (detail::decode, the one loop of the generator and
// the chat session) or together with other sequences' tokens in one batched step
// (model::forward_batch, as a server's scheduler does).
class decode_state {
 public:
  // context: the ids already in the cache (the penalties' window reads it); stop_ids:
  // the tokens that end the generation (with o.stop_at_eos, or under a grammar). `r`
  // carries what the prefill measured (prompt_tokens, prefill_ms) into the result.
  decode_state(const tokenizer& tok, const generation_options& o, std::vector<std::int32_t> stop_ids, token_callback on_token,
               std::vector<std::int32_t> context, generation_result r = {})
      : tok_(&tok), o_(o), stop_ids_(std::move(stop_ids)), on_token_(std::move(on_token)), pick_(o.sample), stream_(tok),
        filter_(o.stop), context_(std::move(context)), r_(std::move(r)), listening_(static_cast<bool>(on_token_)),
        t0_(std::chrono::steady_clock::now()) {
    r_.reason = stop_reason::max_tokens;
    if (o_.grammar && !o_.grammar_trigger.empty()) {
      mode_ = grammar_mode::undecided;
    } else if (o_.grammar) {
      mode_ = grammar_mode::bound;
      doc_ = o_.grammar->start();
      if (const std::size_t need = o_.grammar->min_to_finish(doc_); need > budget())
        throw error("constrained output: the shortest document of the grammar has " + std::to_string(need) +
                    " characters, more than max_tokens - 1 = " + std::to_string(budget()) + "; raise max_tokens to at least " +
                    std::to_string(need + 1));
    }
  }

  // Chooses the next token from the logits of the newest position (`position` in the
  // cache, which has `room` positions left). Returns it if the generation goes on, so
  // that the caller runs it through the model and calls next() with its logits; returns
  // nothing once the generation has ended (result().reason says why).
  std::optional<std::int32_t> next(std::span<const float> logits, std::size_t position, std::size_t room) {
    if (done_ || chosen_ >= o_.max_tokens) return end();
    detail::require_finite_logits(logits, position);
    if (mode_ == grammar_mode::undecided) {
      triggered_allowed();
      mask(logits);
      logits = masked_;
    } else if (mode_ == grammar_mode::bound) {
      o_.grammar->allowed(doc_, *tok_, budget(), allowed_);
      masked_.assign(logits.begin(), logits.end());
      bool any = false;
      for (std::size_t v = 0; v < masked_.size(); ++v) {
        if (v < allowed_.size() && allowed_[v]) any = true;
        else masked_[v] = -std::numeric_limits<float>::infinity();
      }
      if (!any)
        throw error("constrained output: no token of the vocabulary continues the document after '" + r_.text +
                    "'; the grammar admits nothing this tokenizer can write");
      logits = masked_;
    }
    const std::int32_t id = pick_(logits, context_);
    ++chosen_;
    r_.ids.push_back(id);
    if ((o_.stop_at_eos || mode_ == grammar_mode::bound) &&
        std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
      r_.reason = stop_reason::eos;
      return end();
    }
    context_.push_back(id);
    if (mode_ == grammar_mode::undecided) {
      written_ += tok_->token_bytes(id);
      const std::string& trigger = o_.grammar_trigger;
      if (written_.starts_with(trigger)) {
        mode_ = grammar_mode::bound;
        doc_ = o_.grammar->start();
        if (!o_.grammar->feed(doc_, written_))
          throw error("constrained output: sampled token " + std::to_string(id) + " outside the grammar (a bug in tlm)");
      } else if (!trigger.starts_with(written_)) {
        mode_ = grammar_mode::free;
      }
    } else if (mode_ == grammar_mode::bound && !o_.grammar->feed(doc_, tok_->token_bytes(id))) {
      throw error("constrained output: sampled token " + std::to_string(id) + " outside the grammar (a bug in tlm)");
    }
    auto [text, stopped] = filter_.push(stream_.push(id));
    const step s = emit(id, text);
    if (stopped) {
      r_.reason = stop_reason::stop_string;
      released_ = true;
      return end();
    }
    if (s == step::stop) {
      r_.reason = stop_reason::callback;
      return end();
    }
    if (chosen_ == o_.max_tokens) return end();
    if (room == 0) {
      r_.reason = stop_reason::context_full;
      return end();
    }
    ++r_.decoded_tokens;
    return id;
  }

  // Ends the generation (if next() has not) and releases what was held back: an
  // incomplete character at the end, and a tail held for a stop string that never
  // came. Returns the result; later calls return it again.
  generation_result& finish() {
    if (finished_) return r_;
    finished_ = done_ = true;
    if (!released_) {
      auto [text, stopped] = filter_.push(stream_.flush());
      if (stopped) r_.reason = stop_reason::stop_string;
      else text += filter_.flush();
      if (!text.empty()) (void)emit(-1, text);
    }
    r_.decode_ms = detail::ms_since(t0_);
    return r_;
  }

  bool done() const { return done_; }
  const generation_result& result() const { return r_; }
  // The ids in the cache and the ones chosen since, as the penalties see them.
  std::vector<std::int32_t>& context() { return context_; }

 private:
  std::optional<std::int32_t> end() {
    done_ = true;
    return std::nullopt;
  }
  // Keeps the logits of the allowed tokens; the others become -inf.
  void mask(std::span<const float> logits) {
    masked_.assign(logits.begin(), logits.end());
    for (std::size_t v = 0; v < masked_.size(); ++v)
      if (v >= allowed_.size() || !allowed_[v]) masked_[v] = -std::numeric_limits<float>::infinity();
  }
  // Before the reply has shown whether it begins with the trigger: a token that keeps it
  // a prefix of the trigger, or completes the trigger into a document the grammar can
  // still finish within the budget, or leaves the trigger behind (free text from then on).
  void triggered_allowed() {
    const std::string& trigger = o_.grammar_trigger;
    const std::size_t v = tok_->vocab_size();
    allowed_.assign(v, 0);
    for (std::size_t i = 0; i < v; ++i) {
      const auto id = static_cast<std::int32_t>(i);
      const std::string_view bytes = tok_->token_bytes(id);
      const std::string joined = written_ + std::string(bytes);
      const bool into = !bytes.empty() && (trigger.starts_with(joined) || joined.starts_with(trigger));
      if (!into) {
        allowed_[i] = 1;  // an end token, or text that is not the trigger: free from here
        continue;
      }
      json_grammar::state t = o_.grammar->start();
      if (o_.grammar->feed(t, joined) && t.chars + o_.grammar->min_to_finish(t) <= budget()) allowed_[i] = 1;
    }
  }
  // A token writes at least one character, so a grammar's document must be complete
  // within max_tokens - 1 of them, leaving the last token for the end.
  std::size_t budget() const { return o_.max_tokens > 0 ? o_.max_tokens - 1 : 0; }
  step emit(std::int32_t id, const std::string& text) {
    r_.text += text;
    // A callback that said stop hears nothing more.
    if (listening_ && on_token_(id, text) == step::stop) listening_ = false;
    return listening_ || !on_token_ ? step::go_on : step::stop;
  }

  const tokenizer* tok_;
  generation_options o_;
  std::vector<std::int32_t> stop_ids_;
  token_callback on_token_;
  sampler pick_;
  stream_decoder stream_;
  detail::stop_filter filter_;
  std::vector<std::int32_t> context_;
  generation_result r_;
  bool listening_;
  std::chrono::steady_clock::time_point t0_;
  // Whether the grammar binds the reply: always without a trigger; with one, undecided
  // until the reply begins with it (bound) or leaves it behind (free).
  enum class grammar_mode : std::uint8_t { none, undecided, bound, free };
  grammar_mode mode_ = grammar_mode::none;
  std::string written_;  // the reply's bytes while undecided
  json_grammar::state doc_{};
  std::vector<std::uint8_t> allowed_;
  std::vector<float> masked_;
  std::size_t chosen_ = 0;
  bool done_ = false, released_ = false, finished_ = false;
};

namespace detail {

// The one decoding loop of the generator and the chat session. `context` holds the ids
// already in the cache; the new ids are appended to it. `logits` are those of the last
// position in the cache.
template <LlamaConfig C>
void decode(model<C>& m, const tokenizer& tok, kv_cache<C>& cache, std::span<const float> logits,
            std::vector<std::int32_t>& context, const generation_options& o, std::span<const std::int32_t> stop_ids,
            const token_callback& on_token, const generation_hooks<C>& hooks, generation_result& r) {
  decode_state st(tok, o, std::vector<std::int32_t>(stop_ids.begin(), stop_ids.end()), on_token, std::move(context),
                  std::move(r));
  forward_trace<C> trace;
  for (auto id = st.next(logits, cache.length() - 1, cache.room()); id; id = st.next(logits, cache.length() - 1, cache.room())) {
    if (hooks.on_trace) {
      logits = m.forward_traced(*id, cache, trace);
      hooks.on_trace(*id, cache.length() - 1, trace);
    } else {
      logits = m.forward(*id, cache);
    }
  }
  r = std::move(st.finish());
  context = std::move(st.context());
}

inline void check_options(const generation_options& o) {
  if (const std::string p = sampling_problem(o.sample); !p.empty()) throw error("generation options: " + p);
  for (const auto& s : o.stop)
    if (s.empty()) throw error("generation options: an empty stop string would stop before the first token; remove it");
}

}  // namespace detail

}  // namespace tlm
