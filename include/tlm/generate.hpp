#pragma once
// The high-level API an application embeds: a generator for one prompt and a chat
// session that keeps the conversation in the KV cache. The examples are thin layers
// over these; the decoding loop exists once, here.
//
// Example, given std::string path:
//   auto m = tlm::model<tlm::smollm2_135m>::load(path);
//   auto tok = tlm::tokenizer::from_gguf(m.file());
//   tlm::generator gen(m, tok);
//   auto r = gen.generate("The capital of France is", {.max_tokens = 16},
//       tlm::make_token_callback([](std::int32_t, std::string_view text) { std::fputs(std::string(text).c_str(), stdout); }));
//
//   tlm::chat_session chat(m, tok);
//   chat.add("user", "What is the capital of France?");
//   auto answer = chat.reply({.max_tokens = 64});
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "chat.hpp"
#include "error.hpp"
#include "grammar.hpp"
#include "model.hpp"
#include "sampler.hpp"
#include "tokenizer.hpp"

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

// Generates continuations of one prompt at a time. Each call starts from an empty
// cache, sized to the prompt plus max_tokens (grown when a later call needs more).
template <LlamaConfig C>
class generator {
 public:
  // kv: the element type of the generator's cache (kv.hpp); q8 takes 3.76x less
  // memory per position at a small logit error (README, "Long conversations").
  generator(model<C>& m, const tokenizer& tok, kv_type kv = kv_type::f32) : m_(&m), tok_(&tok), cache_(1, kv) {}

  // The prompt is text, tokenized without special tokens (parse_special makes
  // "<|im_start|>" in it a token, for prompts rendered by hand), with BOS/EOS as the
  // file's add_bos_token / add_eos_token say, as llama.cpp does.
  generation_result generate(std::string_view prompt, const generation_options& o = {}, token_callback on_token = {},
                             bool parse_special = false) {
    const auto ids = tok_->encode(prompt, {.parse_special = parse_special});
    return generate(std::span<const std::int32_t>(ids), o, std::move(on_token));
  }

  generation_result generate(std::span<const std::int32_t> prompt, const generation_options& o = {},
                             token_callback on_token = {}, const generation_hooks<C>& hooks = {}) {
    detail::check_options(o);
    if (prompt.empty()) throw error("generate: the prompt is empty after tokenization; give some text");
    if (prompt.size() > C::context)
      throw capacity_error("generate: the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context of " +
                           std::to_string(C::context) + " positions; shorten it");
    // The last sampled token is never run, so the prompt plus max_tokens - 1 positions
    // suffice; past the context, generation ends with stop_reason::context_full.
    const std::size_t needed = std::min(prompt.size() + std::max<std::size_t>(o.max_tokens, 1) - 1, C::context);
    if (cache_.capacity() < needed) cache_ = kv_cache<C>(needed, cache_.type());
    cache_.clear();
    generation_result r;
    r.prompt_tokens = prompt.size();
    const auto t0 = std::chrono::steady_clock::now();
    const auto logits = m_->prefill(prompt, cache_, hooks.prompt_logits);
    r.prefill_ms = detail::ms_since(t0);
    std::vector<std::int32_t> context(prompt.begin(), prompt.end());
    detail::decode(*m_, *tok_, cache_, logits, context, o, tok_->end_of_generation(), on_token, hooks, r);
    return r;
  }

  const kv_cache<C>& cache() const { return cache_; }

 private:
  model<C>* m_;
  const tokenizer* tok_;
  kv_cache<C> cache_{1};
};

struct beam_options {
  std::size_t width = 4;         // beams kept at each step; 1 is greedy decoding
  std::size_t max_tokens = 64;   // the token limit of every beam
  float length_penalty = 1.0f;   // beams are ranked by log-prob / tokens^length_penalty; 0: raw log-prob
  bool stop_at_eos = true;       // a beam that samples end-of-sequence is finished (its log-prob counts)
  kv_type kv = kv_type::f32;     // the element type of every beam's cache
};

struct beam {
  std::vector<std::int32_t> ids;  // the continuation, with a final end-of-sequence token if it ended so
  std::string text;               // without that token
  double log_prob = 0.0;          // the sum of log p(id | everything before it) over ids
  double score = 0.0;             // log_prob / ids.size()^length_penalty: the ranking
  bool finished = false;          // ended at end-of-sequence (otherwise at the token limit)
};

namespace detail {

// log softmax of one position's logits, in double so that distinct logits keep their order.
inline void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double z = 0.0;
  for (const float l : logits) z += std::exp(static_cast<double>(l) - top);
  const double lse = top + std::log(z);
  out.resize(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

}  // namespace detail

// Beam search over one prompt: at every step each live beam is extended by its most
// likely tokens and the `width` best extensions over all beams survive (ties: the
// earlier beam, then the lower id, so width 1 is exactly greedy). Each beam owns a
// cache; a beam with one surviving child hands its cache on, and each further child
// gets a clone that copies only the written positions. Returns the finished and the
// live beams, best score first.
template <LlamaConfig C>
std::vector<beam> generate_beam(model<C>& m, const tokenizer& tok, std::span<const std::int32_t> prompt,
                                const beam_options& o = {}) {
  if (o.width == 0) throw error("beam search: width 0 keeps no beam; give 1 (greedy) or more");
  if (!std::isfinite(o.length_penalty) || o.length_penalty < 0.0f)
    throw error("beam search: length_penalty must be a finite number >= 0 (1 divides by the length, 0 ranks raw log-probs)");
  if (prompt.empty()) throw error("beam search: the prompt is empty; give at least one token");
  if (prompt.size() + o.max_tokens > C::context)
    throw capacity_error("beam search: the prompt (" + std::to_string(prompt.size()) + " tokens) plus " +
                         std::to_string(o.max_tokens) + " tokens exceed the context of " + std::to_string(C::context) +
                         "; lower max_tokens or shorten the prompt");
  struct live {
    kv_cache<C> cache;
    std::vector<float> logits;  // [V] of the last position
    beam b;
  };
  const auto score = [&](const beam& b) {
    if (b.ids.empty()) return 0.0;
    return o.length_penalty == 0.0f ? b.log_prob
                                    : b.log_prob / std::pow(static_cast<double>(b.ids.size()), static_cast<double>(o.length_penalty));
  };
  std::vector<beam> done;
  std::vector<live> beams;
  {
    kv_cache<C> cache(std::max<std::size_t>(prompt.size() + o.max_tokens, 1), o.kv);
    const auto l = m.prefill(prompt, cache);
    beams.push_back({std::move(cache), std::vector<float>(l.begin(), l.end()), {}});
  }
  struct candidate {
    double log_prob;
    std::size_t parent;
    std::int32_t id;
  };
  const auto better = [](const candidate& a, const candidate& b) {
    if (a.log_prob != b.log_prob) return a.log_prob > b.log_prob;
    if (a.parent != b.parent) return a.parent < b.parent;
    return a.id < b.id;
  };
  std::vector<double> lp;
  std::vector<candidate> cands, top;
  for (std::size_t step = 0; step < o.max_tokens && !beams.empty() && done.size() < o.width; ++step) {
    cands.clear();
    for (std::size_t p = 0; p < beams.size(); ++p) {
      detail::require_finite_logits(beams[p].logits, beams[p].cache.length() - 1);
      detail::log_softmax(beams[p].logits, lp);
      // This beam's `width` best tokens: no other token of it can be among the best `width` overall.
      top.clear();
      for (std::size_t i = 0; i < lp.size(); ++i) top.push_back({beams[p].b.log_prob + lp[i], p, static_cast<std::int32_t>(i)});
      const std::size_t k = std::min(o.width, top.size());
      std::partial_sort(top.begin(), top.begin() + static_cast<std::ptrdiff_t>(k), top.end(), better);
      cands.insert(cands.end(), top.begin(), top.begin() + static_cast<std::ptrdiff_t>(k));
    }
    std::sort(cands.begin(), cands.end(), better);
    cands.resize(std::min(cands.size(), o.width - done.size()));
    std::vector<std::size_t> children(beams.size(), 0);
    for (const auto& c : cands) ++children[c.parent];
    std::vector<live> next;
    for (const auto& c : cands) {
      live& parent = beams[c.parent];
      beam b = parent.b;
      b.ids.push_back(c.id);
      b.log_prob = c.log_prob;
      if (o.stop_at_eos && tok.is_end_of_generation(c.id)) {
        b.finished = true;
        b.score = score(b);
        --children[c.parent];
        done.push_back(std::move(b));
        continue;
      }
      if (step + 1 == o.max_tokens) {  // the last token is never run through the model
        b.score = score(b);
        --children[c.parent];
        done.push_back(std::move(b));
        continue;
      }
      // The last child of a parent takes its cache; the others get clones.
      kv_cache<C> cache = --children[c.parent] == 0 ? std::move(parent.cache) : parent.cache.clone();
      const auto l = m.forward(c.id, cache);
      next.push_back({std::move(cache), std::vector<float>(l.begin(), l.end()), std::move(b)});
    }
    beams = std::move(next);
  }
  for (auto& lv : beams) {
    lv.b.score = score(lv.b);
    done.push_back(std::move(lv.b));
  }
  for (auto& b : done) {
    std::vector<std::int32_t> visible = b.ids;
    if (b.finished) visible.pop_back();
    b.text = tok.decode(visible);
  }
  std::stable_sort(done.begin(), done.end(), [](const beam& a, const beam& b) { return a.score > b.score; });
  return done;
}

// How a chat_session keeps its conversation. Every field has a default that works.
struct chat_options {
  // The cache's positions; 0 takes min(4096, the model's context). Without
  // context_shift the whole conversation must fit.
  std::size_t capacity = 0;
  kv_type kv = kv_type::f32;  // the cache's element type (kv.hpp); q8 takes 3.76x less memory
  // Context shift. Off: a turn that does not fit throws capacity_error. On: before a
  // reply, if the conversation plus room for the reply (max_tokens, at most half the
  // capacity) does not fit, the oldest whole turns after the first n_keep tokens are
  // dropped, oldest first, until it does; an assistant turn left first after the kept
  // part goes too, so the history resumes at a user message. The turns being answered
  // are never dropped. The cache entries after the dropped ones move down and their
  // keys are re-rotated by RoPE for their new positions (kv_cache::shift), so nothing
  // is run through the model again: positions simply continue from the new length.
  bool context_shift = false;
  // Tokens at the start a shift never drops; a turn that begins before n_keep is kept
  // whole. keep_system: the first turn if it is a system message (the session's own
  // or the template's default), otherwise nothing.
  std::size_t n_keep = keep_system;
  static constexpr std::size_t keep_system = static_cast<std::size_t>(-1);
  // The chat template by name (chat_template_names()), instead of the one the model file
  // declares; for files whose template tlm does not recognise, or that have none.
  std::string chat_template = {};
};

// A conversation in the model's chat template (chat.hpp) whose tokens stay in the KV
// cache: each reply runs only the tokens added since the last one through the model
// (the new messages, the assistant header and the previous reply's last token and end
// marker), never the whole history.
//
// The cache always holds a prefix of tokens(). tokens() is the rendered conversation
// (the template's rendering of messages()) as the model saw it: the template's markers
// as special tokens, the text between them tokenized as text, and each reply as the
// tokens the model chose. So continuing from the cache is the same computation as a
// fresh prefill of tokens(). A message's tokens are fixed when it is added, so the
// template must render earlier turns the same however the conversation continues;
// add() refuses a conversation for which it does not (Mistral Nemo's template moves the
// system message into the last user message).
// A context shift (chat_options::context_shift) removes whole turns from tokens(),
// messages() and the cache together, so this stays true of what is left, up to
// float rounding of the re-rotated keys.
template <LlamaConfig C>
class chat_session {
 public:
  // capacity: the cache's positions; the whole conversation must fit (default 4096).
  chat_session(model<C>& m, const tokenizer& tok, std::size_t capacity = std::min<std::size_t>(4096, C::context))
      : chat_session(m, tok, chat_options{.capacity = capacity}) {}

  chat_session(model<C>& m, const tokenizer& tok, const chat_options& opt)
      : m_(&m), tok_(&tok), opt_(opt), cache_(opt.capacity ? opt.capacity : std::min<std::size_t>(4096, C::context), opt.kv),
        template_(chat_template::of(m.file().has("tokenizer.chat_template") ? m.file().get_string("tokenizer.chat_template")
                                                                             : std::string_view(),
                                    opt.chat_template)) {
    // The template's BOS/EOS texts are this vocabulary's, as Jinja gets them.
    if (tok.bos() >= 0) render_.bos_token = tok.decode(std::vector<std::int32_t>{tok.bos()});
    if (tok.eos() >= 0) render_.eos_token = tok.decode(std::vector<std::int32_t>{tok.eos()});
    end_ = special_id(template_.end_marker(render_));
  }

  // Adds a message; nothing runs through the model until reply().
  void add(std::string_view role, std::string_view text) {
    if (role.empty() || role.find_first_of("\n") != std::string_view::npos || role.find("<|") != std::string_view::npos)
      throw error("chat: the role '" + std::string(role) + "' is not a single line of plain text; use system, user or assistant");
    history_.push_back({std::string(role), std::string(text)});
    std::vector<chat_piece> rendered;
    try {
      rendered = render(history_, chat_end::open);
    } catch (...) {
      history_.pop_back();
      throw;
    }
    const std::span<const chat_piece> fresh = std::span(rendered).subspan(rendered_.size());
    // The template's own opening (a default system turn) is a turn of its own, so that
    // n_keep keeps it and a context shift can drop the first message without it.
    std::size_t i = 0;
    while (i < fresh.size() && fresh[i].message == chat_piece::no_message) ++i;
    if (i > 0) {
      turns_.push_back({ids_.size(), no_message, true, false});
      append(pieces_ids(fresh.first(i)));
    }
    turns_.push_back({ids_.size(), messages_.size(), role == "system", role == "assistant"});
    append(pieces_ids(fresh.subspan(i)));
    messages_.push_back(history_.back());
    rendered_ = std::move(rendered);
  }

  // Generates the assistant's reply to the conversation so far and adds it as a message.
  generation_result reply(const generation_options& o = {}, token_callback on_token = {}, const generation_hooks<C>& hooks = {}) {
    detail::check_options(o);
    if (messages_.empty()) throw error("chat: reply() with no message; add() a user message first");
    // A template that would render the earlier turns differently once an answer follows
    // them is refused before anything runs (render() throws).
    {
      std::vector<chat_message> answered = history_;
      answered.push_back({"assistant", ""});
      (void)render(answered, chat_end::open);
    }
    std::size_t turn_start = ids_.size();
    const auto header = header_pieces(history_);
    append(pieces_ids(header));
    generation_result r;
    if (opt_.context_shift) {
      const std::size_t room = std::min(o.max_tokens == 0 ? cache_.capacity() : o.max_tokens, cache_.capacity() / 2);
      if (ids_.size() + room > cache_.capacity()) r.dropped_tokens = make_room(ids_.size() + room);
      turn_start -= r.dropped_tokens;
      dropped_ += r.dropped_tokens;
    }
    const std::size_t header_end = ids_.size();
    r.prompt_tokens = ids_.size() - cache_.length();
    if (ids_.size() > cache_.capacity()) {
      ids_.resize(turn_start);
      const std::size_t kept = std::min(keep_end(), header_end);
      if (opt_.context_shift)
        throw capacity_error("chat: the newest messages and the reply's header need " + std::to_string(header_end - kept) +
                             " positions after the " + std::to_string(kept) + " kept ones (n_keep), but the cache holds " +
                             std::to_string(cache_.capacity()) + " even with every older turn dropped; shorten the message, " +
                             "keep fewer tokens (n_keep) or create the session with a larger capacity");
      throw capacity_error("chat: the conversation needs " + std::to_string(header_end) + " positions but the cache holds " +
                           std::to_string(cache_.capacity()) + "; reset() it, create the session with a larger capacity, " +
                           "or turn on chat_options::context_shift (generate --context-shift) to drop the oldest turns");
    }
    const auto t0 = std::chrono::steady_clock::now();
    const auto fresh = std::span<const std::int32_t>(ids_).subspan(cache_.length());
    const auto logits = m_->prefill(fresh, cache_, hooks.prompt_logits);
    r.prefill_ms = detail::ms_since(t0);
    last_prefill_ = r.prompt_tokens;
    std::vector<std::int32_t> context = ids_;
    detail::decode(*m_, *tok_, cache_, logits, context, o, stop_ids(), on_token, hooks, r);
    // The reply's tokens, without a final end marker.
    std::vector<std::int32_t> reply_ids(context.begin() + static_cast<std::ptrdiff_t>(header_end), context.end());
    turns_.push_back({turn_start, messages_.size(), false, true});
    // The reply as the template renders it: what precedes its content beyond the header
    // (Llama 2's space), the content (Llama 3 trims it) and what ends the turn.
    history_.push_back({"assistant", r.text});
    auto rendered = render(history_, chat_end::open);
    const std::span<const chat_piece> answer = std::span(rendered).subspan(rendered_.size());
    std::size_t c = 0;
    while (c < answer.size() && answer[c].k != chat_piece::kind::content) ++c;
    std::string before, header_text;
    for (std::size_t i = 0; i < c; ++i) before += answer[i].text;
    for (const auto& h : header) header_text += h.text;
    if (c == answer.size() || !before.starts_with(header_text))
      throw error("chat: the " + std::string(template_.name()) + " template renders an assistant turn that does not begin " +
                  "with its generation prompt; tlm/chat.hpp's form is inconsistent");
    const std::string expected = before.substr(header_text.size()) + answer[c].text;
    if (tok_->decode(reply_ids) == expected) {
      // The common case: the cache already holds all of the reply but its last token.
      ids_.insert(ids_.end(), reply_ids.begin(), reply_ids.end());
    } else {
      // Cut by a stop string (or an incomplete character, or trimmed by the template):
      // the conversation keeps the rendered text, so the cache forgets the reply and the
      // next turn re-reads it.
      cache_.truncate(std::min(cache_.length(), header_end));
      append(text_ids(expected));
    }
    append(pieces_ids(answer.subspan(c + 1)));
    messages_.push_back(history_.back());
    rendered_ = std::move(rendered);
    answered_ = turns_.size();
    return r;
  }

  // The positions reply() would need before its first token, were `more` add()ed: the
  // conversation so far, those messages (with the template's default system turn if
  // add() would put it first) and the assistant's header, tokenized as add() and
  // reply() do. So a caller can size a session, or refuse a conversation, before
  // running anything: a "<|im_end|>" typed in a message counts as the text it stays.
  std::size_t positions_for(std::span<const chat_message> more) const { return prompt_for(more).size(); }

  // The tokens reply() would run through the model were `more` add()ed: the
  // conversation so far, those messages and the assistant's header, as positions_for
  // counts them. A server that schedules the model itself generates from these with the
  // session's stop_ids(), without add() or reply().
  std::vector<std::int32_t> prompt_for(std::span<const chat_message> more) const {
    std::vector<chat_message> all = history_;
    std::size_t before = rendered_.size();
    std::vector<std::int32_t> ids = ids_;
    const auto put = [&](const std::vector<std::int32_t>& more_ids) { ids.insert(ids.end(), more_ids.begin(), more_ids.end()); };
    // One message at a time, grouped as add() groups the tokens.
    for (const auto& m : more) {
      all.push_back(m);
      const auto rendered = render(all, chat_end::open);
      const std::span<const chat_piece> fresh = std::span(rendered).subspan(before);
      std::size_t i = 0;
      while (i < fresh.size() && fresh[i].message == chat_piece::no_message) ++i;
      put(pieces_ids(fresh.first(i)));
      put(pieces_ids(fresh.subspan(i)));
      before = rendered.size();
    }
    // The template must also keep these turns once the reply follows (as reply() checks).
    std::vector<chat_message> answered = all;
    answered.push_back({"assistant", ""});
    (void)render(answered, chat_end::open);
    put(pieces_ids(header_pieces(all)));
    return ids;
  }

  // The tokens that end a reply: the tokenizer's end-of-generation tokens and the
  // template's end of turn.
  std::vector<std::int32_t> stop_ids() const {
    std::vector<std::int32_t> stops(tok_->end_of_generation().begin(), tok_->end_of_generation().end());
    if (end_ >= 0 && !tok_->is_end_of_generation(end_)) stops.push_back(end_);
    return stops;
  }

  // The chat template the session renders (the file's, or chat_options::chat_template).
  const chat_template& format() const { return template_; }
  // Forgets the conversation (the cache is kept, empty).
  void reset() {
    messages_.clear();
    history_.clear();
    rendered_.clear();
    ids_.clear();
    turns_.clear();
    cache_.clear();
    last_prefill_ = 0;
    answered_ = 0;
    dropped_ = 0;
  }

  const std::vector<chat_message>& messages() const { return messages_; }
  // The conversation's tokens; the cache holds the first cache().length() of them.
  const std::vector<std::int32_t>& tokens() const { return ids_; }
  const kv_cache<C>& cache() const { return cache_; }
  const chat_options& options() const { return opt_; }
  // How many tokens the last reply() ran through the prefill.
  std::size_t last_prefill_tokens() const { return last_prefill_; }
  // Tokens context shifts have dropped since the session began (or was reset).
  std::size_t dropped_tokens() const { return dropped_; }

 private:
  static constexpr std::size_t no_message = static_cast<std::size_t>(-1);
  struct turn {
    std::size_t start;    // index of its first token in ids_
    std::size_t message;  // its index in messages_, or no_message for the template's default system turn
    bool system;
    bool assistant;
  };

  // The first token a shift may drop: turns that begin before it are kept.
  std::size_t keep_end() const {
    if (opt_.n_keep != chat_options::keep_system) return opt_.n_keep;
    if (turns_.empty() || !turns_[0].system) return 0;
    return turns_.size() > 1 ? turns_[1].start : ids_.size();
  }

  // Drops the oldest whole answered turns after keep_end() until `wanted` positions
  // fit the cache (or no answered turn is left). Returns the tokens dropped.
  std::size_t make_room(std::size_t wanted) {
    const std::size_t keep = keep_end();
    const auto end_of = [&](std::size_t t) { return t + 1 < turns_.size() ? turns_[t + 1].start : ids_.size(); };
    std::size_t first = 0;
    while (first < answered_ && turns_[first].start < keep) ++first;
    std::size_t last = first, freed = 0;  // turns [first, last) are dropped, freeing `freed` positions
    while (last < answered_ && wanted - freed > cache_.capacity()) freed = end_of(last++) - turns_[first].start;
    // So that the history resumes at a user message, an assistant turn left first goes too.
    while (last > first && last < answered_ && turns_[last].assistant) ++last;
    if (last == first) return 0;
    const std::size_t a = turns_[first].start, b = end_of(last - 1), drop = b - a;
    if (cache_.length() >= b) m_->shift(cache_, a, drop);
    else cache_.truncate(std::min(cache_.length(), a));
    ids_.erase(ids_.begin() + static_cast<std::ptrdiff_t>(a), ids_.begin() + static_cast<std::ptrdiff_t>(b));
    // The dropped turns' messages leave messages() too, and later indices move down.
    std::vector<std::size_t> gone;
    for (std::size_t t = first; t < last; ++t)
      if (turns_[t].message != no_message) gone.push_back(turns_[t].message);
    for (auto it = gone.rbegin(); it != gone.rend(); ++it) messages_.erase(messages_.begin() + static_cast<std::ptrdiff_t>(*it));
    turns_.erase(turns_.begin() + static_cast<std::ptrdiff_t>(first), turns_.begin() + static_cast<std::ptrdiff_t>(last));
    for (std::size_t t = first; t < turns_.size(); ++t) {
      turns_[t].start -= drop;
      if (turns_[t].message != no_message) turns_[t].message -= gone.size();
    }
    answered_ -= last - first;
    return drop;
  }

  std::int32_t special_id(std::string_view marker) const {
    const auto ids = tok_->encode(marker, {.add_bos = false, .parse_special = true});
    if (ids.size() != 1)
      throw error("chat: the tokenizer has no single token for " + std::string(marker) + ", which ends a turn in the " +
                  std::string(template_.name()) + " chat template; if the model uses another template, pass its name " +
                  "(chat_options::chat_template, --chat-template NAME): " + chat_template_names());
    return ids[0];
  }
  // Text between markers is tokenized on its own, as a whole-conversation encoding with
  // parse_special splits there too; and a "<|im_end|>" typed in a message stays text.
  std::vector<std::int32_t> text_ids(std::string_view text) const {
    if (text.empty()) return {};
    return tok_->encode(text, {.add_bos = false, .parse_special = false});
  }
  // Pieces as tokens: each marker as its special token, each run of text between
  // markers as one text.
  std::vector<std::int32_t> pieces_ids(std::span<const chat_piece> ps) const {
    std::vector<std::int32_t> ids;
    std::string run;
    const auto flush = [&] {
      const auto t = text_ids(run);
      ids.insert(ids.end(), t.begin(), t.end());
      run.clear();
    };
    for (const auto& p : ps) {
      if (p.k != chat_piece::kind::marker) {
        run += p.text;
        continue;
      }
      flush();
      const auto t = tok_->encode(p.text, {.add_bos = false, .parse_special = true});
      ids.insert(ids.end(), t.begin(), t.end());
    }
    flush();
    return ids;
  }
  void append(const std::vector<std::int32_t>& ids) { ids_.insert(ids_.end(), ids.begin(), ids.end()); }

  // The template's rendering of `ms`, checked to extend what the session already holds.
  std::vector<chat_piece> render(std::span<const chat_message> ms, chat_end end) const {
    auto rendered = template_.pieces(ms, end, render_);
    bool extends = rendered.size() >= rendered_.size();
    for (std::size_t i = 0; extends && i < rendered_.size(); ++i)
      extends = rendered[i].k == rendered_[i].k && rendered[i].text == rendered_[i].text;
    if (!extends)
      throw error("chat: the " + std::string(template_.name()) + " chat template renders the earlier messages differently " +
                  "once this one follows them, so their tokens cannot stay in the cache (Mistral Nemo's puts the system " +
                  "message into the last user message); put the instructions into the first user message instead, or " +
                  "render whole prompts with apply_chat_template and a generator");
    return rendered;
  }
  // The generation prompt after `ms` (the assistant's header; empty for templates whose
  // user turn ends with it).
  std::vector<chat_piece> header_pieces(std::span<const chat_message> ms) const {
    const auto open = render(ms, chat_end::open);
    auto with = render(ms, chat_end::generation_prompt);
    with.erase(with.begin(), with.begin() + static_cast<std::ptrdiff_t>(open.size()));
    return with;
  }
  model<C>* m_;
  const tokenizer* tok_;
  chat_options opt_;
  kv_cache<C> cache_;
  chat_template template_;
  chat_render_options render_;   // the vocabulary's BOS/EOS texts
  std::int32_t end_ = -1;        // the token that ends the model's turn
  std::vector<chat_message> messages_;
  // Every message since the start (or reset), including those a context shift dropped,
  // and its rendering: the base each new message's pieces are rendered against.
  std::vector<chat_message> history_;
  std::vector<chat_piece> rendered_;
  std::vector<std::int32_t> ids_;
  std::vector<turn> turns_;      // every turn of ids_, in order
  std::size_t answered_ = 0;     // turns_[0, answered_) precede the last reply's end: the ones a shift may drop
  std::size_t last_prefill_ = 0;
  std::size_t dropped_ = 0;
};

}  // namespace tlm
