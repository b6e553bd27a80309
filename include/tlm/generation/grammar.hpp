#pragma once
// Constrained output: a JSON grammar (any value, or a schema subset) that restricts
// sampling to the tokens that keep the text a prefix of a valid document, and ends it
// within a character budget, so that a generation always parses.
//
// The recognizer reads bytes incrementally with a fixed-size stack (copying a state is
// a memcpy, and every token of the vocabulary is tried against a copy at every step).
// The JSON it admits is compact (no whitespace outside strings), with strings of
// printable ASCII (escapes allowed) of at most max_string characters, arrays of at
// most max_items items and nesting of at most max_depth containers. Schemas fix the
// order of an object's properties to the declared order and require them all.
//
// Besides JSON values, a grammar may hold fixed texts around values (sequence) and a
// choice between such sequences told apart by their first text (one_of): a tool call is
// `<tool_call>\n{"name": "NAME", "arguments": ` then the arguments' schema then
// `}\n</tool_call>`, one sequence per tool; and one such value several times with a fixed
// text between (repeat): several tool calls in one reply.
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tlm/error.hpp>
#include <tlm/text/tokenizer.hpp>

namespace tlm {

// A node of the grammar: what one JSON value may be.
struct json_node {
  enum class kind { any, string, number, integer, boolean, choice, array, object, sequence, one_of, repeat } k = kind::any;
  std::vector<std::string> choices{};                              // choice: the JSON texts allowed
  std::shared_ptr<const json_node> items{};                        // array, repeat: its items
  // object: in order, all required; sequence: each part's text, then its value
  std::vector<std::pair<std::string, json_node>> properties{};
  std::size_t min_items = 0;                                       // array, repeat
  std::string tail{};                                              // sequence: the text after the last value; repeat: between items
  std::vector<json_node> alternatives{};                           // one_of: sequences
  std::size_t max_items = 0;                                       // repeat
};

namespace json_schema {
inline json_node any() { return {}; }
inline json_node string() { return {.k = json_node::kind::string}; }
inline json_node number() { return {.k = json_node::kind::number}; }
inline json_node integer() { return {.k = json_node::kind::integer}; }
inline json_node boolean() { return {.k = json_node::kind::boolean, .choices = {"true", "false"}}; }
// Each choice is the JSON text of an allowed value, e.g. "\"red\"" or "3".
inline json_node enumeration(std::vector<std::string> json_texts) {
  if (json_texts.empty()) throw error("json schema: an enum with no values admits nothing; give at least one value");
  return {.k = json_node::kind::choice, .choices = std::move(json_texts)};
}
inline json_node array(json_node items, std::size_t min_items = 0) {
  return {.k = json_node::kind::array, .items = std::make_shared<const json_node>(std::move(items)), .min_items = min_items};
}
inline json_node object(std::vector<std::pair<std::string, json_node>> properties) {
  return {.k = json_node::kind::object, .properties = std::move(properties)};
}
// Text and values in turn, written exactly: parts[0].first, parts[0].second's value,
// parts[1].first, ..., then tail. Texts are bytes, not JSON: any text the tokenizer can write.
inline json_node sequence(std::vector<std::pair<std::string, json_node>> parts, std::string tail) {
  return {.k = json_node::kind::sequence, .properties = std::move(parts), .tail = std::move(tail)};
}
// One of several sequences, chosen by the first text written: no alternative's first text
// may be a prefix of another's (so the choice is known when one is complete).
inline json_node one_of(std::vector<json_node> sequences) {
  return {.k = json_node::kind::one_of, .alternatives = std::move(sequences)};
}
// `item` min_items to max_items times, `separator` between. The item is a sequence or a
// one_of of sequences, each ending in a text (so an item's end is known when it is
// written), and the separator is not empty: after an item the document either ends or
// goes on with the separator, never both.
inline json_node repeat(json_node item, std::string separator, std::size_t min_items, std::size_t max_items) {
  return {.k = json_node::kind::repeat, .items = std::make_shared<const json_node>(std::move(item)),
          .min_items = min_items, .tail = std::move(separator), .max_items = max_items};
}
}  // namespace json_schema

struct json_limits {
  std::size_t max_string = 48;  // characters between the quotes (an escape counts as one)
  std::size_t max_items = 8;    // items of an array, members of a free object
  std::size_t max_depth = 4;    // nested containers in a free value
};

class json_grammar {
 public:
  explicit json_grammar(json_node root = {}, json_limits limits = {})
      : root_(std::make_shared<const json_node>(std::move(root))), lim_(limits) {
    check(*root_, 0);
    auto mins = std::make_shared<std::unordered_map<const json_node*, std::size_t>>();
    min_ = mins;  // so that each node's minimum reads its children's entries, filled first
    note_min(*root_, *mins);
  }

  // The recognizer's state after some bytes.
  struct state {
    struct frame {
      const json_node* node;
      std::uint8_t type;   // frame_type
      std::uint8_t phase;
      std::uint16_t count;  // characters of a string, items of a container, position in a literal
      std::uint64_t viable;  // choice: which choices still match
    };
    std::array<frame, 24> stack{};
    std::uint8_t depth = 0;
    bool started = false;  // the root value's frame has been pushed
    std::size_t chars = 0;
  };

  state start() const { return {}; }

  // Feeds bytes; false when they leave the language (the state is then undefined).
  bool feed(state& s, std::string_view bytes) const {
    for (const char c : bytes)
      if (!feed(s, static_cast<unsigned char>(c))) return false;
    return true;
  }

  // The document may end here.
  bool can_end(const state& s) const {
    if (!s.started) return false;
    if (s.depth == 0) return true;
    return s.depth == 1 && top_can_end(s.stack[0]);
  }

  // The fewest characters that complete the document.
  std::size_t min_to_finish(const state& s) const {
    if (!s.started) return min_value(*root_);
    std::size_t n = 0;
    for (std::size_t i = 0; i < s.depth; ++i) n += frame_cost(s.stack[i]);
    return n;
  }

  // The allowed tokens after `s`, within a budget of characters: allowed[id] = 1.
  // eos is allowed exactly when the document may end.
  void allowed(const state& s, const tokenizer& tok, std::size_t budget, std::vector<std::uint8_t>& out) const {
    const std::size_t v = tok.vocab_size();
    out.assign(v, 0);
    // One trial per first byte rules out most of the vocabulary at once.
    std::array<std::int8_t, 256> first{};
    for (int b = 0; b < 256; ++b) {
      state t = s;
      first[static_cast<std::size_t>(b)] = feed(t, static_cast<unsigned char>(b)) ? 1 : 0;
    }
    // A token's bytes change the top of the stack and leave the frames below it as they
    // were; their fewest characters to finish are summed here once, and for each token
    // only the frames from the lowest one it changed are costed again. Inside a string
    // argument of a tool call that is one frame of five.
    std::array<std::size_t, std::tuple_size_v<decltype(s.stack)> + 1> below{};
    for (std::size_t d = 0; d < s.depth; ++d) below[d + 1] = below[d] + frame_cost(s.stack[d]);
    state next;  // one scratch state, of which each token copies only the live frames
    // Inside a string, a token of plain characters (printable ASCII, no quote or
    // backslash) only lengthens it, as feed would one byte at a time: it is admitted
    // while the string stays within max_string, and the rest still needs what `s` needs.
    // Most of a vocabulary is such text.
    const bool in_string = s.started && s.depth > 0 && s.stack[s.depth - 1].type == f_string &&
                           s.stack[s.depth - 1].phase == s_in;
    const std::size_t string_room = in_string ? lim_.max_string - s.stack[s.depth - 1].count : 0;
    for (std::size_t id = 0; id < v; ++id) {
      const auto i = static_cast<std::int32_t>(id);
      // User-defined tokens are text: Qwen2.5 writes <tool_call> and </tool_call> as one
      // added token each, and a model asked to spell them in pieces rarely does. Control
      // tokens are structure (ends, turn markers), the unknown and unused ones never text.
      if (const token_type t = tok.type(i); t == token_type::control || t == token_type::unknown || t == token_type::unused)
        continue;
      const std::string_view bytes = tok.token_bytes(i);
      if (bytes.empty() || !first[static_cast<unsigned char>(bytes[0])]) continue;
      if (s.chars + bytes.size() > budget) continue;
      if (in_string && std::all_of(bytes.begin(), bytes.end(),
                                   [](char ch) { return plain_string_byte(static_cast<unsigned char>(ch)); })) {
        if (bytes.size() <= string_room && s.chars + bytes.size() + below[s.depth] <= budget) out[id] = 1;
        continue;
      }
      copy_live(next, s);
      if (!feed(next, bytes)) continue;
      // Accepted bytes start the document, and before it starts `s` has no frames to keep.
      std::size_t kept = 0;
      while (kept < std::min(s.depth, next.depth) && same_frame(s.stack[kept], next.stack[kept])) ++kept;
      std::size_t need = below[kept];
      for (std::size_t d = kept; d < next.depth; ++d) need += frame_cost(next.stack[d]);
      if (next.chars + need <= budget) out[id] = 1;
    }
    if (can_end(s))
      for (const std::int32_t id : tok.end_of_generation()) out[static_cast<std::size_t>(id)] = 1;
  }

 private:
  // `to` = `from`, reading only the frames below the depth: feed writes a whole frame
  // when it pushes one, so the frames above are never read. Every member of state is
  // copied here; the assertion notices one added without it.
  static void copy_live(state& to, const state& from) {
    static_assert(sizeof(state) == sizeof(state::stack) + 2 * sizeof(std::size_t),
                  "json_grammar::state gained a member: copy it in copy_live");
    std::copy_n(from.stack.begin(), from.depth, to.stack.begin());
    to.depth = from.depth;
    to.started = from.started;
    to.chars = from.chars;
  }
  // A byte a string takes as itself (anything else ends it, escapes, or is refused).
  static constexpr bool plain_string_byte(unsigned char c) { return c >= 0x20 && c <= 0x7e && c != '"' && c != '\\'; }
  static bool same_frame(const state::frame& a, const state::frame& b) {
    return a.node == b.node && a.type == b.type && a.phase == b.phase && a.count == b.count && a.viable == b.viable;
  }

  enum frame_type : std::uint8_t { f_value, f_string, f_number, f_choice, f_array, f_object, f_free_object, f_sequence, f_one_of, f_repeat };

  void check(const json_node& n, std::size_t depth) const {
    if (depth > 8) throw error("json schema: nested deeper than 8 levels; flatten it");
    switch (n.k) {
      case json_node::kind::choice:
        if (n.choices.empty()) throw error("json schema: an enum with no values admits nothing; give at least one value");
        if (n.choices.size() > 64) throw error("json schema: an enum of more than 64 values; use a string instead");
        for (const auto& c : n.choices)
          if (c.empty()) throw error("json schema: an enum value with no JSON text admits nothing");
        break;
      case json_node::kind::array:
        if (!n.items) throw error("json schema: an array needs an items schema");
        if (n.min_items > lim_.max_items)
          throw error("json schema: minItems " + std::to_string(n.min_items) + " exceeds the limit of " +
                      std::to_string(lim_.max_items) + " items, so nothing is admitted; lower minItems or raise max_items");
        check(*n.items, depth + 1);
        break;
      case json_node::kind::sequence:
        if (n.properties.size() > 100) throw error("grammar: a sequence of more than 100 values; split it");
        for (const auto& part : n.properties) check(part.second, depth + 1);
        break;
      case json_node::kind::one_of:
        if (n.alternatives.empty() || n.alternatives.size() > 64)
          throw error("grammar: one_of takes 1 to 64 alternatives, not " + std::to_string(n.alternatives.size()));
        for (std::size_t i = 0; i < n.alternatives.size(); ++i) {
          const json_node& a = n.alternatives[i];
          if (a.k != json_node::kind::sequence || first_text(a).empty())
            throw error("grammar: each one_of alternative must be a sequence that starts with a text");
          for (std::size_t j = 0; j < n.alternatives.size(); ++j)
            if (i != j && first_text(n.alternatives[j]).starts_with(first_text(a)))
              throw error("grammar: one_of alternatives " + std::to_string(i) + " and " + std::to_string(j) +
                          " start alike ('" + first_text(a) + "'): the first text of one may not begin another's");
          check(a, depth);
        }
        break;
      case json_node::kind::repeat: {
        if (!n.items) throw error("grammar: a repeat needs an item");
        if (n.tail.empty()) throw error("grammar: a repeat needs a separator text between its items");
        if (n.min_items < 1 || n.max_items < n.min_items || n.max_items > 256)
          throw error("grammar: a repeat takes 1 <= min_items <= max_items <= 256, not " + std::to_string(n.min_items) +
                      " and " + std::to_string(n.max_items));
        const json_node& item = *n.items;
        const auto ends_in_text = [](const json_node& seq) { return seq.k == json_node::kind::sequence && !seq.tail.empty(); };
        const bool closed = item.k == json_node::kind::one_of
                                ? std::all_of(item.alternatives.begin(), item.alternatives.end(), ends_in_text)
                                : ends_in_text(item);
        if (!closed) throw error("grammar: a repeat's item must be a sequence, or a one_of of sequences, that ends in a text");
        check(item, depth);
        break;
      }
      case json_node::kind::object:
        if (n.properties.size() > 100) throw error("json schema: an object of more than 100 properties; split it");
        for (const auto& [key, value] : n.properties) {
          if (key.size() > lim_.max_string || key.find_first_of("\"\\") != std::string::npos)
            throw error("json schema: property name '" + key + "' is longer than max_string or holds a quote or backslash");
          check(value, depth + 1);
        }
        break;
      default: break;
    }
  }

  static const std::string& first_text(const json_node& seq) {
    return seq.properties.empty() ? seq.tail : seq.properties[0].first;
  }

  static bool top_can_end(const state::frame& f) {
    if (f.type == f_number) return number_final(f);
    if (f.type == f_choice) return choice_complete(f);
    // A sequence whose tail is empty ends with its last value.
    if (f.type == f_sequence) return f.phase / 2 == f.node->properties.size() && f.count == f.node->tail.size();
    // A repeat after a whole item (viable counts the items), no separator begun.
    if (f.type == f_repeat) return f.phase == 1 && f.count == 0 && f.viable >= f.node->min_items;
    return false;
  }
  static bool number_final(const state::frame& f) { return f.phase == n_zero || f.phase == n_int || f.phase == n_frac || f.phase == n_exp; }
  static bool choice_complete(const state::frame& f) {
    for (std::size_t i = 0; i < f.node->choices.size(); ++i)
      if ((f.viable >> i & 1) && f.node->choices[i].size() == f.count) return true;
    return false;
  }

  std::size_t min_value(const json_node& n) const {
    if (min_) {
      if (const auto it = min_->find(&n); it != min_->end()) return it->second;
    }
    return compute_min(n);
  }
  std::size_t compute_min(const json_node& n) const {
    switch (n.k) {
      case json_node::kind::any: return 1;
      case json_node::kind::string: return 2;
      case json_node::kind::number:
      case json_node::kind::integer: return 1;
      case json_node::kind::boolean:
      case json_node::kind::choice: {
        std::size_t m = std::numeric_limits<std::size_t>::max();
        for (const auto& c : n.choices) m = std::min(m, c.size());
        return m;
      }
      case json_node::kind::array: return 2 + (n.min_items ? n.min_items * (min_value(*n.items) + 1) - 1 : 0);
      case json_node::kind::object: return rest_of_object(n, 0);
      case json_node::kind::sequence: return rest_of_sequence(n, 0);
      case json_node::kind::one_of: {
        std::size_t m = std::numeric_limits<std::size_t>::max();
        for (const auto& a : n.alternatives) m = std::min(m, min_value(a));
        return m;
      }
      case json_node::kind::repeat:
        return n.min_items * min_value(*n.items) + (n.min_items - 1) * n.tail.size();
    }
    return 1;
  }
  // The fewest characters of a sequence from part i on, its text included, then the tail.
  std::size_t rest_of_sequence(const json_node& n, std::size_t i) const {
    std::size_t c = n.tail.size();
    for (std::size_t j = i; j < n.properties.size(); ++j)
      c += n.properties[j].first.size() + min_value(n.properties[j].second);
    return c;
  }
  // The fewest characters of an object from property i on, '}' included (and '{' when i == 0).
  std::size_t rest_of_object(const json_node& n, std::size_t i) const {
    std::size_t c = (i == 0 ? 1 : 0) + 1;
    for (std::size_t j = i; j < n.properties.size(); ++j)
      c += (j ? 1 : 0) + n.properties[j].first.size() + 3 + min_value(n.properties[j].second);
    return c;
  }

  // Number phases.
  enum : std::uint8_t { n_start, n_minus, n_zero, n_int, n_dot, n_frac, n_e, n_esign, n_exp };
  // String phases.
  enum : std::uint8_t { s_open, s_in, s_escape, s_hex1, s_hex2, s_hex3, s_hex4 };

  std::size_t frame_cost(const state::frame& f) const {
    switch (f.type) {
      case f_value: return 1;
      case f_string:
        switch (f.phase) {
          case s_open: return 2;
          case s_in: return 1;
          case s_escape: return 2;
          default: return static_cast<std::size_t>(s_hex4 - f.phase) + 2;
        }
      case f_number:
        return number_final(f) ? 0 : 1;
      case f_choice: {
        std::size_t m = std::numeric_limits<std::size_t>::max();
        for (std::size_t i = 0; i < f.node->choices.size(); ++i)
          if (f.viable >> i & 1) m = std::min(m, f.node->choices[i].size() - f.count);
        return m;
      }
      case f_array: {
        // phase 0: expect '['; 1: after '['; 2: an item pushed; 3: after ','.
        const json_node& item = f.node->items ? *f.node->items : *f.node;
        const std::size_t m = f.node->min_items > f.count ? f.node->min_items - f.count : 0;
        const std::size_t per = min_value(item) + 1;  // an item and the ',' or ']' after it
        switch (f.phase) {
          case 0: return 1 + std::max<std::size_t>(m * per, 1);
          case 1: return std::max<std::size_t>(m * per, 1);
          case 2: return m * per + 1;
          default: return std::max<std::size_t>(m, 1) * per;
        }
      }
      case f_object: {
        // phase 2i: writing the text before property i's value (count characters of it
        // written; i == size: the closing brace); 2i+1: property i's value pushed.
        const std::size_t i = f.phase / 2;
        if (f.phase % 2 == 1) return rest_of_object(*f.node, i + 1);
        return rest_of_object(*f.node, i) - f.count;
      }
      case f_sequence: {
        // phase 2i: writing part i's text (count characters of it written; i == size: the
        // tail); 2i+1: part i's value pushed.
        const std::size_t i = f.phase / 2;
        if (f.phase % 2 == 1) return rest_of_sequence(*f.node, i + 1);
        return rest_of_sequence(*f.node, i) - f.count;
      }
      case f_one_of: {
        std::size_t m = std::numeric_limits<std::size_t>::max();
        for (std::size_t i = 0; i < f.node->alternatives.size(); ++i)
          if (f.viable >> i & 1) m = std::min(m, min_value(f.node->alternatives[i]) - f.count);
        return m;
      }
      case f_repeat: {
        // phase 0: before item number viable + 1; 1: item number viable pushed or whole,
        // count characters of the separator after it written.
        const std::size_t item = min_value(*f.node->items), sep = f.node->tail.size();
        const std::size_t begun = f.viable + (f.phase == 0 || f.count > 0 ? 1 : 0);  // items once the one begun is whole
        const std::size_t more = f.node->min_items > begun ? (f.node->min_items - begun) * (sep + item) : 0;
        if (f.phase == 0) return item + more;
        return (f.count > 0 ? sep - f.count + item : 0) + more;
      }
      case f_free_object:
        // 0 expect '{'; 1 after '{'; 2 key pushed (expect ':'); 3 expect value; 4 value pushed; 5 after ','.
        switch (f.phase) {
          case 0: return 2;
          case 1: return 1;
          case 2: return 3;  // ":0}"
          case 3: return 2;  // "0}"
          case 4: return 1;
          default: return 5;  // "\"\":0}"
        }
    }
    return 0;
  }

  bool push(state& s, state::frame f) const {
    if (s.depth >= s.stack.size()) return false;
    s.stack[s.depth++] = f;
    return true;
  }
  std::size_t container_depth(const state& s) const {
    std::size_t d = 0;
    for (std::size_t i = 0; i < s.depth; ++i)
      if (s.stack[i].type == f_array || s.stack[i].type == f_object || s.stack[i].type == f_free_object) ++d;
    return d;
  }
  // A frame for a value of node n (its first character not yet read).
  static state::frame value_frame(const json_node& n) {
    using k = json_node::kind;
    switch (n.k) {
      case k::any: return {&n, f_value, 0, 0, 0};
      case k::string: return {&n, f_string, s_open, 0, 0};
      case k::number:
      case k::integer: return {&n, f_number, n_start, 0, 0};
      case k::boolean:
      case k::choice: return {&n, f_choice, 0, 0, n.choices.size() >= 64 ? ~0ULL : (1ULL << n.choices.size()) - 1};
      case k::array: return {&n, f_array, 0, 0, 0};
      case k::object: return {&n, f_object, 0, 0, 0};
      case k::sequence: return {&n, f_sequence, 0, 0, 0};
      case k::one_of:
        return {&n, f_one_of, 0, 0, n.alternatives.size() >= 64 ? ~0ULL : (1ULL << n.alternatives.size()) - 1};
      case k::repeat: return {&n, f_repeat, 0, 0, 0};
    }
    return {&n, f_value, 0, 0, 0};
  }

  bool feed(state& s, unsigned char c) const {
    if (!s.started) {
      s.started = true;
      if (!push(s, value_frame(*root_))) return false;
    }
    for (;;) {
      if (s.depth == 0) return false;  // the document is complete
      state::frame& f = s.stack[s.depth - 1];
      switch (f.type) {
        case f_value: {
          // Any value: its first character decides what it is.
          static const json_node str{.k = json_node::kind::string}, num{.k = json_node::kind::number},
              lit{.k = json_node::kind::choice, .choices = {"true", "false", "null"}};
          const json_node* any = f.node;
          --s.depth;
          if (c == '"') push(s, value_frame(str));
          else if (c == '-' || (c >= '0' && c <= '9')) push(s, value_frame(num));
          else if (c == 't' || c == 'f' || c == 'n') push(s, value_frame(lit));
          else if (c == '[' || c == '{') {
            if (container_depth(s) >= lim_.max_depth) return false;
            if (c == '[') push(s, {any, f_array, 0, 0, 0});
            else push(s, {any, f_free_object, 0, 0, 0});
          } else {
            return false;
          }
          continue;
        }
        case f_string:
          ++s.chars;
          switch (f.phase) {
            case s_open:
              if (c != '"') return false;
              f.phase = s_in;
              return true;
            case s_in:
              if (c == '"') {
                --s.depth;
                return true;
              }
              if (f.count >= lim_.max_string) return false;
              if (c == '\\') {
                f.phase = s_escape;
                return true;
              }
              if (!plain_string_byte(c)) return false;
              ++f.count;
              return true;
            case s_escape:
              if (c == 'u') {
                f.phase = s_hex1;
                return true;
              }
              if (std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) == std::string_view::npos) return false;
              f.phase = s_in;
              ++f.count;
              return true;
            default:
              if (!std::isxdigit(c)) return false;
              if (f.phase == s_hex4) {
                f.phase = s_in;
                ++f.count;
              } else {
                ++f.phase;
              }
              return true;
          }
        case f_number: {
          const bool digit = c >= '0' && c <= '9';
          const bool integer = f.node->k == json_node::kind::integer;
          std::uint8_t next = 255;
          switch (f.phase) {
            case n_start: next = c == '-' ? n_minus : c == '0' ? n_zero : digit ? n_int : 255; break;
            case n_minus: next = c == '0' ? n_zero : digit ? n_int : 255; break;
            case n_zero: next = (c == '.' && !integer) ? n_dot : ((c == 'e' || c == 'E') && !integer) ? n_e : 255; break;
            case n_int: next = digit ? n_int : (c == '.' && !integer) ? n_dot : ((c == 'e' || c == 'E') && !integer) ? n_e : 255; break;
            case n_dot: next = digit ? n_frac : 255; break;
            case n_frac: next = digit ? n_frac : (c == 'e' || c == 'E') ? n_e : 255; break;
            case n_e: next = (c == '+' || c == '-') ? n_esign : digit ? n_exp : 255; break;
            case n_esign: next = digit ? n_exp : 255; break;
            // Two exponent digits at most, so that every number fits a double.
            case n_exp: next = digit && f.viable < 2 ? n_exp : 255; break;
          }
          // Past 16 characters only the step that completes the number is allowed, so the
          // cap never leaves the number without a way to end.
          const bool completes = next != 255 && !number_final(f) &&
                                 (next == n_zero || next == n_int || next == n_frac || next == n_exp);
          if (next != 255 && (f.count < 16 || completes)) {
            if (next == n_exp) ++f.viable;  // exponent digits
            f.phase = next;
            ++f.count;
            ++s.chars;
            return true;
          }
          if (!number_final(f)) return false;
          --s.depth;  // the number ended; the character belongs to what follows
          continue;
        }
        case f_choice: {
          std::uint64_t still = 0;
          for (std::size_t i = 0; i < f.node->choices.size(); ++i) {
            const std::string& t = f.node->choices[i];
            if ((f.viable >> i & 1) && f.count < t.size() && static_cast<unsigned char>(t[f.count]) == c) still |= 1ULL << i;
          }
          if (still == 0) {
            if (!choice_complete(f)) return false;
            --s.depth;
            continue;
          }
          f.viable = still;
          ++f.count;
          ++s.chars;
          // Done when every remaining choice is complete.
          bool longer = false;
          for (std::size_t i = 0; i < f.node->choices.size(); ++i)
            if ((still >> i & 1) && f.node->choices[i].size() > f.count) longer = true;
          if (!longer) --s.depth;
          return true;
        }
        case f_array: {
          const json_node& item = f.node->k == json_node::kind::array ? *f.node->items : *f.node;  // a free array's items are free
          switch (f.phase) {
            case 0:
              if (c != '[') return false;
              f.phase = 1;
              ++s.chars;
              return true;
            case 1:
            case 2:
              if (c == ']' && f.count >= f.node->min_items) {
                --s.depth;
                ++s.chars;
                return true;
              }
              if (f.phase == 2) {
                if (c != ',' || f.count >= lim_.max_items) return false;
                f.phase = 3;
                ++s.chars;
                return true;
              }
              [[fallthrough]];
            case 3:
              if (f.count >= lim_.max_items) return false;
              f.phase = 2;
              ++f.count;
              if (!push(s, value_frame(item))) return false;
              continue;
          }
          return false;
        }
        case f_object: {
          const auto& props = f.node->properties;
          if (f.phase % 2 == 1) {  // property i's value is complete
            f.phase = static_cast<std::uint8_t>(f.phase + 1);
            f.count = 0;
            continue;
          }
          const std::size_t i = f.phase / 2;
          // The text before property i's value ({"key": or ,"key":), or the closing brace.
          const std::string lead = i < props.size() ? (i == 0 ? "{\"" : ",\"") + props[i].first + "\":"
                                                    : (props.empty() ? "{}" : "}");
          if (f.count >= lead.size() || static_cast<unsigned char>(lead[f.count]) != c) return false;
          ++f.count;
          ++s.chars;
          if (f.count == lead.size()) {
            if (i < props.size()) {
              f.phase = static_cast<std::uint8_t>(f.phase + 1);
              if (!push(s, value_frame(props[i].second))) return false;
            } else {
              --s.depth;
            }
          }
          return true;
        }
        case f_sequence: {
          const auto& parts = f.node->properties;
          if (f.phase % 2 == 1) {  // part i's value is complete
            f.phase = static_cast<std::uint8_t>(f.phase + 1);
            f.count = 0;
            continue;
          }
          const std::size_t i = f.phase / 2;
          const std::string& text = i < parts.size() ? parts[i].first : f.node->tail;
          if (f.count == text.size()) {  // an empty text: straight to the value, or past the end
            if (i == parts.size()) {
              --s.depth;
              continue;
            }
            f.phase = static_cast<std::uint8_t>(f.phase + 1);
            if (!push(s, value_frame(parts[i].second))) return false;
            continue;
          }
          if (static_cast<unsigned char>(text[f.count]) != c) return false;
          ++f.count;
          ++s.chars;
          if (f.count == text.size()) {
            if (i < parts.size()) {
              f.phase = static_cast<std::uint8_t>(f.phase + 1);
              if (!push(s, value_frame(parts[i].second))) return false;
            } else {
              --s.depth;
            }
          }
          return true;
        }
        case f_one_of: {
          const auto& alts = f.node->alternatives;
          std::uint64_t still = 0;
          for (std::size_t i = 0; i < alts.size(); ++i) {
            const std::string& t = first_text(alts[i]);
            if ((f.viable >> i & 1) && f.count < t.size() && static_cast<unsigned char>(t[f.count]) == c) still |= 1ULL << i;
          }
          if (still == 0) return false;
          f.viable = still;
          ++f.count;
          ++s.chars;
          for (std::size_t i = 0; i < alts.size(); ++i) {
            if (!(still >> i & 1) || first_text(alts[i]).size() != f.count) continue;
            // Its first text is whole, and no other starts with it: this frame becomes
            // that sequence's, past its first text.
            const std::uint16_t written = f.count;
            f = {&alts[i], f_sequence, 0, written, 0};
            if (!alts[i].properties.empty()) {
              f.phase = 1;
              if (!push(s, value_frame(alts[i].properties[0].second))) return false;
            } else {
              --s.depth;
            }
            break;
          }
          return true;
        }
        case f_repeat: {
          if (f.phase == 0) {  // the next item begins with this character
            f.phase = 1;
            f.count = 0;
            ++f.viable;
            if (!push(s, value_frame(*f.node->items))) return false;
            continue;
          }
          // An item is whole: the separator, unless the items are as many as allowed.
          const std::string& sep = f.node->tail;
          if (f.count == 0 && f.viable >= f.node->max_items) return false;
          if (static_cast<unsigned char>(sep[f.count]) != c) return false;
          ++f.count;
          ++s.chars;
          if (f.count == sep.size()) f.phase = 0;
          return true;
        }
        case f_free_object:
          switch (f.phase) {
            case 0:
              if (c != '{') return false;
              f.phase = 1;
              ++s.chars;
              return true;
            case 1:
              if (c == '}') {
                --s.depth;
                ++s.chars;
                return true;
              }
              [[fallthrough]];
            case 5: {
              if (c != '"' || f.count >= lim_.max_items) return false;
              static const json_node key{.k = json_node::kind::string};
              f.phase = 2;
              ++f.count;
              if (!push(s, value_frame(key))) return false;
              continue;
            }
            case 2:
              if (c != ':') return false;
              f.phase = 3;
              ++s.chars;
              return true;
            case 3:
              f.phase = 4;
              if (!push(s, {f.node, f_value, 0, 0, 0})) return false;
              continue;
            case 4:
              if (c == '}') {
                --s.depth;
                ++s.chars;
                return true;
              }
              if (c != ',' || f.count >= lim_.max_items) return false;
              f.phase = 5;
              ++s.chars;
              return true;
          }
          return false;
      }
      return false;
    }
  }

  // Every node's fewest characters, computed once: allowed() asks min_to_finish for each
  // token that continues the document, and a one_of or repeat frame would otherwise walk
  // its whole subtree each time. Keyed by address, so the tree is shared, never copied:
  // a copy of the grammar (and the states it made) point into the same nodes.
  void note_min(const json_node& n, std::unordered_map<const json_node*, std::size_t>& mins) const {
    if (mins.contains(&n)) return;
    if (n.items) note_min(*n.items, mins);
    for (const auto& part : n.properties) note_min(part.second, mins);
    for (const auto& a : n.alternatives) note_min(a, mins);
    mins.emplace(&n, compute_min(n));  // its children are in the table by now
  }

  std::shared_ptr<const json_node> root_;
  json_limits lim_;
  std::shared_ptr<const std::unordered_map<const json_node*, std::size_t>> min_;
};

}  // namespace tlm
