#pragma once
// Training data: plain text or chat JSONL turned into fixed windows of T inputs and
// T targets, a held-out split, and a seeded order over the training windows.
//
// Plain text is tokenized whole (with the model's tokenizer, or as bytes for a config
// trained from scratch) and cut at stride T into windows of T+1 tokens: inputs are the
// first T, targets the last T, so every next-token pair is trained on exactly once per
// epoch. Chat JSONL ({"messages": [{"role", "content"}, ...]} per line) is rendered
// with the model's chat template (tlm/text/chat.hpp), tokenized as chat_session tokenizes it;
// only the assistant's content and the marker that ends its turn (<|im_end|>,
// <|eot_id|>, </s>, ...) carry loss (targets elsewhere are ignore_target). Each
// conversation gets windows of its own, padded, so no window mixes two conversations.
// A conversation longer than a window is cut into pieces of T at stride T, each a
// window starting at position 0, as text is.
//
// Packed chat (--pack): the same pieces, but several share a window (window_packer:
// first fit in file order), each marked with where it starts (window_set::starts), so
// that training keeps them apart (training::forward's starts): no attention between
// them, positions from 0 in each. The rest of a window is padding, its own segment,
// with no loss. Short conversations then fill windows instead of padding them.
//
// Bad data is an error naming the file, the line and the problem; nothing is skipped.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <tlm/error.hpp>
#include <tlm/text/chat.hpp>
#include <tlm/text/unicode.hpp>
#include <tlm/train/step.hpp>
#include <tlm/train/weights.hpp>

namespace tlm {

// Text to token ids; `special` lets the text's special-token strings act as tokens.
using tokenize_fn = std::function<std::vector<std::int32_t>(std::string_view text, bool special)>;

// Bytes as tokens, for a config trained from scratch without a tokenizer.
inline std::vector<std::int32_t> byte_tokens(std::string_view text, bool) {
  std::vector<std::int32_t> out(text.size());  // [bytes]
  std::transform(text.begin(), text.end(), out.begin(), [](char c) { return static_cast<std::int32_t>(static_cast<unsigned char>(c)); });
  return out;
}

// Windows of T positions: inputs[i*T + t] predicts targets[i*T + t].
struct window_set {
  std::size_t seq = 0;                // T
  std::vector<std::int32_t> inputs;   // [windows, T]
  std::vector<std::int32_t> targets;  // [windows, T]; ignore_target carries no loss
  std::vector<std::uint32_t> starts;  // [windows, T] packed: where each position's example starts in its window; else empty
  std::size_t size() const { return seq ? inputs.size() / seq : 0; }
  bool packed() const { return !starts.empty(); }
  void add(std::span<const std::int32_t> in, std::span<const std::int32_t> tg) {
    inputs.insert(inputs.end(), in.begin(), in.end());
    targets.insert(targets.end(), tg.begin(), tg.end());
  }
};

// Packs examples of at most T tokens into windows of T, first fit in the order given:
// an example goes into the first window with room for it, or opens a new one. A max
// tree over the windows' free room finds that window in O(log windows).
class window_packer {
 public:
  window_packer(std::size_t seq, std::int32_t pad) : seq_(seq), pad_(pad) {
    if (seq == 0) throw error("window_packer: windows of 0 tokens hold nothing; give --seq 1 or more");
    w_.seq = seq;
  }

  // One example: inputs[t] predicts targets[t].   inputs, targets: [L], 1 <= L <= T
  void add(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets) {
    const std::size_t len = inputs.size();
    if (len == 0 || len > seq_ || targets.size() != len) {
      throw error("window_packer: an example of " + std::to_string(len) + " inputs and " + std::to_string(targets.size()) +
                  " targets for windows of " + std::to_string(seq_) + "; give 1 to " + std::to_string(seq_) +
                  " of each, the same number (cut longer examples first)");
    }
    std::size_t w = first_with_room(len);
    if (w == none) w = open();
    const std::size_t at = w * seq_ + used_[w];
    std::copy(inputs.begin(), inputs.end(), w_.inputs.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(targets.begin(), targets.end(), w_.targets.begin() + static_cast<std::ptrdiff_t>(at));
    std::fill_n(w_.starts.begin() + static_cast<std::ptrdiff_t>(at), len, static_cast<std::uint32_t>(used_[w]));
    used_[w] += len;
    set_room(w, seq_ - used_[w]);
  }

  std::size_t windows() const { return used_.size(); }

  // The windows, each one's unused end padding: `pad` inputs, no loss, a segment of its own.
  window_set finish() && {
    for (std::size_t w = 0; w < used_.size(); ++w)
      std::fill_n(w_.starts.begin() + static_cast<std::ptrdiff_t>(w * seq_ + used_[w]), seq_ - used_[w],
                  static_cast<std::uint32_t>(used_[w]));
    return std::move(w_);
  }

 private:
  static constexpr std::size_t none = ~std::size_t{0};

  std::size_t first_with_room(std::size_t len) const {
    if (tree_.empty() || tree_[1] < len) return none;
    std::size_t node = 1;
    while (node < leaves_) node = tree_[2 * node] >= len ? 2 * node : 2 * node + 1;
    return node - leaves_;
  }
  void set_room(std::size_t w, std::size_t room) {
    std::size_t node = leaves_ + w;
    tree_[node] = room;
    for (node /= 2; node >= 1; node /= 2) tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
  }
  // A new empty window, the tree doubled when it is full.
  std::size_t open() {
    const std::size_t w = used_.size();
    used_.push_back(0);
    w_.inputs.resize(w_.inputs.size() + seq_, pad_);
    w_.targets.resize(w_.targets.size() + seq_, ignore_target);
    w_.starts.resize(w_.starts.size() + seq_, 0);
    if (w >= leaves_) {
      leaves_ = std::max<std::size_t>(1, 2 * leaves_);
      tree_.assign(2 * leaves_, 0);
      for (std::size_t i = 0; i < w; ++i) tree_[leaves_ + i] = seq_ - used_[i];
      for (std::size_t node = leaves_; node-- > 1;) tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
    }
    set_room(w, seq_);
    return w;
  }

  std::size_t seq_;
  std::int32_t pad_;
  window_set w_;
  std::vector<std::size_t> used_;  // [windows] tokens placed in each
  std::size_t leaves_ = 0;         // the tree's leaf count, a power of two (or 0)
  std::vector<std::size_t> tree_;  // [2 * leaves] tree_[leaves + w]: window w's free room; a node: its children's max
};

struct dataset {
  window_set train, held_out;
  std::size_t tokens = 0;  // tokens read (text) or rendered (chat)
};

namespace detail {

[[noreturn]] inline void data_fail(const std::string& file, std::size_t line, const std::string& problem) {
  throw text_error(file + (line ? ":" + std::to_string(line) : std::string()) + ": " + problem);
}

// A folder opens as a stream and fails only at the first read, with the C++ library's
// words and no name ("basic_filebuf::underflow error reading the file"): refused first.
inline void require_not_folder(const std::string& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) throw error(file + ": is a folder, not a data file; give --data a text file (or a chat JSONL file with --chat)");
}

inline std::string read_all(const std::string& file) {
  require_not_folder(file);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw error(file + ": cannot open the data file; check the --data path");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void check_utf8(const std::string& file, std::string_view text, std::size_t first_line) {
  const std::size_t bad = utf8::first_invalid(text);
  if (bad == std::string_view::npos) return;
  const std::size_t line = first_line + static_cast<std::size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n'));
  data_fail(file, line, "invalid UTF-8 at byte " + std::to_string(bad) + "; convert the file to UTF-8 (iconv) or remove the bytes");
}

// Moves the last `fraction` of the windows (at least one when fraction > 0 and there
// are two or more) into the held-out set; the end of the data, so the two never overlap.
inline void split_held_out(dataset& d, double fraction) {
  const std::size_t n = d.train.size(), T = d.train.seq;
  d.held_out.seq = T;
  if (n == 0) return;  // nothing to split (k = n - 1 below would wrap)
  std::size_t k = static_cast<std::size_t>(std::floor(static_cast<double>(n) * fraction));
  if (fraction > 0 && k == 0 && n >= 2) k = 1;
  if (k >= n) k = n - 1;
  d.held_out.seq = T;
  const auto cut = static_cast<std::ptrdiff_t>((n - k) * T);
  d.held_out.inputs.assign(d.train.inputs.begin() + cut, d.train.inputs.end());
  d.held_out.targets.assign(d.train.targets.begin() + cut, d.train.targets.end());
  d.train.inputs.resize(static_cast<std::size_t>(cut));
  d.train.targets.resize(static_cast<std::size_t>(cut));
  if (d.train.packed()) {
    d.held_out.starts.assign(d.train.starts.begin() + cut, d.train.starts.end());
    d.train.starts.resize(static_cast<std::size_t>(cut));
  }
}

}  // namespace detail

// Plain text: tokenized whole, cut into windows of T+1 tokens at stride T.
inline dataset load_text(const std::string& file, const tokenize_fn& tokenize, std::size_t seq, double held_out_fraction) {
  const std::string text = detail::read_all(file);
  detail::check_utf8(file, text, 1);
  const std::vector<std::int32_t> ids = tokenize(text, false);  // [tokens]
  if (ids.size() < seq + 1) {
    detail::data_fail(file, 0, "the text is " + std::to_string(ids.size()) + " tokens, shorter than one window of " + std::to_string(seq + 1) +
                                   " (--seq " + std::to_string(seq) + " plus one); give more text or a smaller --seq");
  }
  dataset d;
  d.tokens = ids.size();
  d.train.seq = seq;
  for (std::size_t s = 0; s + seq + 1 <= ids.size(); s += seq)
    d.train.add(std::span(ids).subspan(s, seq), std::span(ids).subspan(s + 1, seq));
  detail::split_held_out(d, held_out_fraction);
  return d;
}

// Chat JSONL rendered with `form` (the model's chat template, given the vocabulary's
// BOS/EOS texts in `render`); loss on assistant tokens only. With `pack`, the pieces
// share windows (window_packer) instead of a window each.
inline dataset load_chat(const std::string& file, const tokenize_fn& tokenize, const chat_template& form, std::int32_t pad,
                         std::size_t seq, double held_out_fraction, const chat_render_options& render = {}, bool pack = false) {
  detail::require_not_folder(file);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw error(file + ": cannot open the data file; check the --data path");
  dataset d;
  d.train.seq = seq;
  std::string line;
  std::size_t line_no = 0, conversations = 0;
  std::vector<std::int32_t> toks;  // [conversation tokens]
  std::vector<char> counted;       // [conversation tokens]: 1 where the token is trained on
  std::vector<std::int32_t> in_w(seq), tg_w(seq);  // [T] each
  window_packer packer(std::max<std::size_t>(seq, 1), pad);
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    detail::check_utf8(file, line, line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      detail::data_fail(file, line_no, std::string("not valid JSON (") + e.what() + "); each line must be one JSON object");
    }
    if (!j.is_object() || !j.contains("messages")) detail::data_fail(file, line_no, "the record has no \"messages\"; write {\"messages\": [{\"role\": ..., \"content\": ...}]}");
    const auto& ms = j["messages"];
    if (!ms.is_array() || ms.empty()) detail::data_fail(file, line_no, "\"messages\" is not a non-empty array; give at least one user and one assistant message");
    std::vector<chat_message> msgs;
    bool has_assistant = false;
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const auto& m = ms[i];
      const std::string where = "message " + std::to_string(i + 1) + ": ";
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") || !m["content"].is_string())
        detail::data_fail(file, line_no, where + "needs a string \"role\" and a string \"content\"");
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant")
        detail::data_fail(file, line_no, where + "unknown role \"" + role + "\"; use system, user or assistant");
      has_assistant = has_assistant || role == "assistant";
      msgs.push_back({role, m["content"].get<std::string>()});
    }
    if (!has_assistant) detail::data_fail(file, line_no, "no assistant message, so nothing to train on; add the answer as {\"role\": \"assistant\", ...}");
    // Rendered message by message: each message's pieces are what its rendering adds
    // to the one before (with the template's default system turn), tokenized as
    // chat_session does: markers as special tokens, the text between them as text.
    toks.clear();
    counted.clear();
    std::string run;
    bool run_loss = false;
    const auto flush = [&] {
      if (run.empty()) return;
      const auto ids = tokenize(run, false);
      toks.insert(toks.end(), ids.begin(), ids.end());
      counted.insert(counted.end(), ids.size(), run_loss ? 1 : 0);
      run.clear();
    };
    const auto append = [&](const chat_piece& p, bool loss) {
      if (p.k == chat_piece::kind::marker || loss != run_loss) flush();
      run_loss = loss;
      if (p.k != chat_piece::kind::marker) {
        run += p.text;
        return;
      }
      const auto ids = tokenize(p.text, true);
      toks.insert(toks.end(), ids.begin(), ids.end());
      counted.insert(counted.end(), ids.size(), loss ? 1 : 0);
    };
    std::vector<chat_piece> before;
    try {
      for (std::size_t i = 0; i < msgs.size(); ++i) {
        auto upto = form.pieces(std::span(msgs).first(i + 1), chat_end::open, render);
        bool extends = upto.size() >= before.size();
        for (std::size_t k = 0; extends && k < before.size(); ++k) extends = upto[k].text == before[k].text;
        if (!extends)
          detail::data_fail(file, line_no, "the " + std::string(form.name()) + " chat template renders the earlier messages " +
                                               "differently once message " + std::to_string(i + 1) + " follows (Mistral Nemo's "
                                               "puts the system message into the last user message); leave out the system message");
        // The assistant's content and what follows it up to the end of its turn (the
        // marker) are learnt; its header is not.
        bool in_answer = false;
        for (std::size_t k = before.size(); k < upto.size(); ++k) {
          const chat_piece& p = upto[k];
          if (msgs[i].role == "assistant" && p.k == chat_piece::kind::content) in_answer = true;
          append(p, in_answer);
          if (in_answer && p.k == chat_piece::kind::marker && p.text == form.end_marker(render)) in_answer = false;
        }
        flush();
        before = std::move(upto);
      }
      // What the template puts after a finished conversation (Phi-3.5's EOS).
      const auto closed = form.pieces(msgs, chat_end::closed, render);
      for (std::size_t k = before.size(); k < closed.size(); ++k) append(closed[k], false);
      flush();
    } catch (const text_error&) {
      throw;  // already names the file and line
    } catch (const error& e) {
      detail::data_fail(file, line_no, e.what());  // the template refused the conversation
    }
    for (std::size_t s = 0; s + 1 < toks.size(); s += seq) {
      bool any = false;
      for (std::size_t t = 0; t < seq; ++t) {
        const std::size_t p = s + t;
        in_w[t] = p < toks.size() ? toks[p] : pad;
        const bool loss = p + 1 < toks.size() && counted[p + 1];
        tg_w[t] = loss ? toks[p + 1] : ignore_target;
        any = any || loss;
      }
      if (!any) continue;
      // Packed, the piece ends at its last target: the conversation's last token
      // predicts nothing, and padding is the packer's.
      const std::size_t len = std::min(seq, toks.size() - 1 - s);
      if (pack) packer.add(std::span(in_w).first(len), std::span(tg_w).first(len));
      else d.train.add(in_w, tg_w);
    }
    d.tokens += toks.size();
    ++conversations;
  }
  if (conversations == 0) detail::data_fail(file, 0, "no conversations; each line must be {\"messages\": [...]}");
  if (pack) d.train = std::move(packer).finish();
  detail::split_held_out(d, held_out_fraction);
  return d;
}

// The same with the model file's template text (empty: the file has none, plain ChatML).
inline dataset load_chat(const std::string& file, const tokenize_fn& tokenize, std::string_view chat_template_text, std::int32_t pad,
                         std::size_t seq, double held_out_fraction, bool pack = false) {
  return load_chat(file, tokenize, chat_template::of(chat_template_text), pad, seq, held_out_fraction, {}, pack);
}

// The order of training windows: a seeded Fisher-Yates shuffle per epoch, a pure function
// of (seed, position), so a resumed run needs only the position to continue exactly.
class window_order {
 public:
  window_order(std::size_t windows, std::uint64_t seed) : n_(windows), seed_(seed) {}
  std::size_t at(std::uint64_t position) {
    const std::uint64_t epoch = position / n_;
    if (epoch != epoch_ || perm_.empty()) shuffle(epoch);
    return perm_[static_cast<std::size_t>(position % n_)];
  }
  // The generator's state after shuffling the epoch of the last position asked for.
  std::uint64_t rng_state() const { return rng_state_; }
  std::size_t size() const { return n_; }

 private:
  void shuffle(std::uint64_t epoch) {
    normal_rng rng(seed_ ^ (0x9e3779b97f4a7c15ull * (epoch + 1)));
    perm_.resize(n_);  // [windows]
    for (std::size_t i = 0; i < n_; ++i) perm_[i] = i;
    for (std::size_t i = n_; i > 1; --i) std::swap(perm_[i - 1], perm_[static_cast<std::size_t>(rng.next_u64() % i)]);
    epoch_ = epoch;
    rng_state_ = rng.state();
  }
  std::size_t n_;
  std::uint64_t seed_, epoch_ = 0, rng_state_ = 0;
  std::vector<std::size_t> perm_;
};

}  // namespace tlm
