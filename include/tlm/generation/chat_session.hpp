#pragma once
// chat_session: a conversation whose tokens stay in the KV cache, so each reply runs
// only what was added since the last one.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tlm/error.hpp>
#include <tlm/generation/decode.hpp>
#include <tlm/kv.hpp>
#include <tlm/model.hpp>
#include <tlm/text/chat.hpp>
#include <tlm/text/tokenizer.hpp>

namespace tlm {

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

// A conversation in the model's chat template (text/chat.hpp) whose tokens stay in the KV
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
                  "with its generation prompt; tlm/text/chat.hpp's form is inconsistent");
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
