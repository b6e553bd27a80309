#pragma once
// Chat prompts: the model's chat template, rendered byte for byte as Jinja renders it.
//
// tlm does not interpret Jinja. It knows a fixed set of template *forms*, each a row of
// one table (chat_forms below): a name, a test that recognises the form from the file's
// `tokenizer.chat_template` by substrings that only that form's template contains, and a
// renderer written in C++. Why not a Jinja subset: the templates in circulation use
// namespaces, filters (trim, tojson, selectattr), slicing, raise_exception and Python
// string methods; an interpreter complete enough for them is a project of its own, and
// one that is "nearly" complete renders some template slightly wrong without noticing.
// A form either renders exactly what Jinja renders (tests/reference/check_chat_templates.py
// compares the two on every form) or the template is refused with a tlm::error that
// names the supported forms and the override (`--chat-template NAME` in generate and
// serve, chat_options::chat_template in C++, chat_template= in Python).
//
// Forms (chat_template_names() lists them):
//   chatml       plain ChatML, any role
//   smollm2      ChatML with a default system message when the first message is not a
//                system one; recognised from the template, its default text is the
//                template's own (SmolLM2-Instruct's, Qwen2-Instruct's "You are a helpful
//                assistant"); by name it is SmolLM2's
//   qwen2.5      Qwen2.5-Instruct: ChatML with "You are Qwen, created by Alibaba Cloud..."
//   llama3       Llama 3.1 / 3.2 Instruct: a system turn always, with the lines
//                "Cutting Knowledge Date: December 2023" and "Today Date: DATE"
//   llama3.0     Llama 3.0 Instruct: every message stripped, no date lines, BOS before
//                the first message; the template's first release adds the generation
//                prompt even when not asked, and tlm renders that one the same
//   phi3         Phi-3-mini (the first releases): no system turn, the assistant's header
//                follows every user message
//   phi3.5       Phi-3.5-mini-instruct: <|system|>/<|user|>/<|assistant|> ... <|end|>
//   mistral      Mistral 7B Instruct v0.1/v0.2, the first template: "[INST] ... [/INST]"
//                as text, roles alternate from user, no system message
//   mistral-v1   the same models' later ("v1") template: " [INST] ... [/INST]" and " answer";
//                the system message goes into the first user message
//   mistral-v3   Mistral 7B Instruct v0.3, Mistral Large 2407: "[INST] ...[/INST]" with
//                control tokens, answers stripped; the system message goes into the last
//                user message
//   mistral-nemo Mistral Nemo Instruct: [INST]...[/INST] with control tokens; the system
//                message goes into the last user message
//   llama2       Llama 2 chat: <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s>
//   zephyr       Zephyr / TinyLlama-Chat: <|role|>\n...</s>\n
// The Mistral 7B and Large and the Llama 3.0 templates are llama.cpp's test copies
// (tests/test-chat-template.cpp, extracted by scripts/fetch-vocab).
// The Llama 2 and Zephyr template texts are not among the fetched files: those two forms
// follow the published formats and are checked against templates the reference script
// writes from them, and are recognised by their markers (<<SYS>> with a BOS before each
// [INST] and stripped texts; <|user|> with eos_token and no <|end|>), so a real file of
// theirs may still differ in whitespace. llama.cpp's tests carry neither real text.
//
// The date in Llama 3's "Today Date" line: the 3.2 template calls strftime_now when the
// renderer defines it, and otherwise (like 3.1's) uses its default "26 Jul 2024". tlm
// renders the default unless chat_render_options::date_string gives a date: a prompt that
// changes with the calendar would make renderings, tests and cached prompts differ from
// day to day. The reference check renders without strftime_now, so Jinja takes the same
// default, and once more with an explicit date_string.
//
// Tool calls and tool results are out of scope: a "tool" or "ipython" message is refused
// (except by chatml, smollm2 and llama3.0, whose templates render any role as text). Message text is copied
// verbatim: a "<|im_end|>" inside a message stays in the prompt, as it does with Jinja
// (chat_session tokenizes message text without parse_special so it stays text).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tlm/error.hpp>
#include <tlm/text/strings.hpp>

namespace tlm {

struct chat_message {
  std::string role, content;
};

// One stretch of a rendering. chat_session and train --chat tokenize a rendering piece
// by piece: a marker as a special token, the rest as text, so that a marker typed inside
// a message stays text; and training finds the assistant's content by its piece.
struct chat_piece {
  enum class kind : std::uint8_t {
    marker,   // a special token's text (<|im_start|>, <|eot_id|>, the BOS/EOS text)
    text,     // the template's own text (role names, newlines, default system text)
    content,  // an assistant message's content, as the template renders it (maybe trimmed)
  };
  static constexpr std::size_t no_message = static_cast<std::size_t>(-1);
  kind k;
  std::string text;
  // The message this piece renders (index into the messages), or no_message for the
  // template's own opening (BOS, a default system turn) and the generation prompt.
  std::size_t message;
};

// Where a rendering stops: after the last message (`open`: what later turns extend), with
// the assistant's header for generation, or as the template ends a finished conversation
// (`closed`, add_generation_prompt false: Phi-3.5 adds its EOS there).
enum class chat_end : std::uint8_t { open, generation_prompt, closed };

// Values a template takes from its caller. Empty: the form's default (the BOS/EOS text of
// the models that use the form; Llama 3's date "26 Jul 2024", see above).
struct chat_render_options {
  std::string bos_token = {}, eos_token = {}, date_string = {};
};

namespace detail {

// The templates with their string literals' "\n" escapes decoded: the same template is
// stored either way (a JSON "\n" decodes to a newline inside the Jinja literal; some
// copies keep the two-character Jinja escape), and both render a newline.
inline std::string decode_newline_escapes(std::string_view t) {
  std::string out;
  out.reserve(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '\\' && i + 1 < t.size() && t[i + 1] == 'n') {
      out.push_back('\n');
      ++i;
    } else {
      out.push_back(t[i]);
    }
  }
  return out;
}

// Python's str.isspace() for one code point: what Jinja's `trim` filter and str.strip()
// remove (Unicode White_Space plus the four information separators U+001C..U+001F).
inline bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point starting at s[i] and its length; an invalid sequence reads as one
// non-space unit, so malformed bytes are never trimmed.
inline std::pair<char32_t, std::size_t> code_point_at(std::string_view s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const std::size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return {0xFFFD, 1};
  char32_t c = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (std::size_t k = 1; k < n; ++k) {
    const auto cb = static_cast<unsigned char>(s[i + k]);
    if ((cb >> 6) != 2) return {0xFFFD, 1};
    c = (c << 6) | (cb & 0x3F);
  }
  return {c, n};
}

// Jinja's `trim` (Python's str.strip() without arguments).
inline std::string python_strip(std::string_view s) {
  std::size_t a = 0;
  while (a < s.size()) {
    const auto [c, n] = code_point_at(s, a);
    if (!python_space(c)) break;
    a += n;
  }
  std::size_t b = s.size();
  while (b > a) {
    std::size_t start = b - 1;  // back to the lead byte of the last code point
    while (start > a && (static_cast<unsigned char>(s[start]) >> 6) == 2 && b - start < 4) --start;
    const auto [c, n] = code_point_at(s, start);
    if (start + n != b || !python_space(c)) break;
    b = start;
  }
  return std::string(s.substr(a, b - a));
}

// What a renderer reads besides the messages.
struct form_context {
  std::string_view default_system;  // ChatML forms with a default system message
  std::string_view bos, eos, date;
  bool prompt_always = false;  // the template prints the generation prompt unasked (Llama 3.0's first one)
};

using pieces = std::vector<chat_piece>;

inline void marker(pieces& out, std::string_view t, std::size_t m) { out.push_back({chat_piece::kind::marker, std::string(t), m}); }
inline void text(pieces& out, std::string_view t, std::size_t m) {
  if (!t.empty()) out.push_back({chat_piece::kind::text, std::string(t), m});
}
inline void content(pieces& out, std::string_view t, std::size_t m) { out.push_back({chat_piece::kind::content, std::string(t), m}); }

[[noreturn]] inline void refuse(std::string_view form, const std::string& why) {
  throw error("chat template " + std::string(form) + ": " + why);
}

inline void require_messages(std::string_view form, std::span<const chat_message> ms) {
  if (ms.empty()) refuse(form, "the conversation is empty, and the template reads its first message; add a message");
}

// The roles a form renders; tool messages get their own reason.
inline void require_roles(std::string_view form, std::span<const chat_message> ms, std::initializer_list<std::string_view> roles) {
  for (const auto& m : ms) {
    bool ok = false;
    for (const auto r : roles) ok = ok || m.role == r;
    if (ok) continue;
    if (m.role == "tool" || m.role == "ipython" || m.role == "tool_results")
      refuse(form, "a \"" + m.role + "\" message: tool calls are not supported by tlm's chat templates");
    std::string list;
    for (const auto r : roles) list += (list.empty() ? "" : ", ") + std::string(r);
    refuse(form, "the role \"" + m.role + "\" is not rendered by this template; use " + list);
  }
}

// ---- ChatML and its variants ----

inline void chatml_turn(pieces& out, std::string_view role, std::string_view body, std::size_t m, bool is_content) {
  marker(out, "<|im_start|>", m);
  text(out, std::string(role) + "\n", m);
  if (is_content) content(out, body, m);
  else text(out, body, m);
  marker(out, "<|im_end|>", m);
  text(out, "\n", m);
}

inline void chatml_end(pieces& out, chat_end end) {
  if (end != chat_end::generation_prompt) return;
  marker(out, "<|im_start|>", chat_piece::no_message);
  text(out, "assistant\n", chat_piece::no_message);
}

// A message's text: content pieces for the assistant (what training learns), text otherwise.
inline void chatml_messages(pieces& out, std::span<const chat_message> ms, std::size_t from) {
  for (std::size_t i = from; i < ms.size(); ++i) chatml_turn(out, ms[i].role, ms[i].content, i, ms[i].role == "assistant");
}

inline void render_chatml(const form_context&, std::span<const chat_message> ms, chat_end end, pieces& out) {
  chatml_messages(out, ms, 0);
  chatml_end(out, end);
}

// The template tests loop.first and messages[0], so the default system message appears
// only once, before the first message, and only if that is not "system".
inline void render_chatml_default_system(const form_context& c, std::span<const chat_message> ms, chat_end end, pieces& out) {
  if (!ms.empty() && ms[0].role != "system") chatml_turn(out, "system", c.default_system, chat_piece::no_message, false);
  chatml_messages(out, ms, 0);
  chatml_end(out, end);
}

// Qwen2.5's template: the same shape, but it reads messages[0] (so an empty conversation
// is an error) and renders only these roles (others print nothing, or are tool calls).
inline void render_qwen25(const form_context& c, std::span<const chat_message> ms, chat_end end, pieces& out) {
  require_messages("qwen2.5", ms);
  require_roles("qwen2.5", ms, {"system", "user", "assistant"});
  render_chatml_default_system(c, ms, end, out);
}

// ---- Llama 3 ----

inline void llama3_header(pieces& out, std::string_view role, std::size_t m) {
  marker(out, "<|start_header_id|>", m);
  text(out, role, m);
  marker(out, "<|end_header_id|>", m);
  text(out, "\n\n", m);
}

// Every Llama 3 template renders a message the same way: its header, the stripped text, <|eot_id|>.
inline void llama3_message(pieces& out, const chat_message& msg, std::size_t m) {
  llama3_header(out, msg.role, m);
  const std::string body = python_strip(msg.content);
  if (msg.role == "assistant") content(out, body, m);
  else text(out, body, m);
  marker(out, "<|eot_id|>", m);
}

inline void render_llama3(const form_context& c, std::span<const chat_message> ms, chat_end end, pieces& out) {
  require_messages("llama3", ms);
  for (const auto& m : ms)
    if (m.role == "tool" || m.role == "ipython")
      refuse("llama3", "a \"" + m.role + "\" message: tool calls are not supported by tlm's chat templates");
  const bool has_system = ms[0].role == "system";
  const std::size_t sys = has_system ? 0 : chat_piece::no_message;
  marker(out, c.bos, sys);
  // The system turn is always there; the dates come before the system message's text.
  llama3_header(out, "system", sys);
  text(out, "Cutting Knowledge Date: December 2023\nToday Date: " + std::string(c.date) + "\n\n", sys);
  if (has_system) text(out, python_strip(ms[0].content), sys);
  marker(out, "<|eot_id|>", sys);
  for (std::size_t i = has_system ? 1 : 0; i < ms.size(); ++i) llama3_message(out, ms[i], i);
  if (end == chat_end::generation_prompt) llama3_header(out, "assistant", chat_piece::no_message);
}

// Llama 3.0 Instruct: no system turn of its own and no dates; any role is a header (the
// template checks none), and BOS comes with the first message, so an empty conversation
// has none. The first release of the template prints the generation prompt whatever
// add_generation_prompt says (c.prompt_always), the later one only when asked.
inline void render_llama30(const form_context& c, std::span<const chat_message> ms, chat_end end, pieces& out) {
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (i == 0) marker(out, c.bos, i);
    llama3_message(out, ms[i], i);
  }
  if (end == chat_end::generation_prompt || (end == chat_end::closed && c.prompt_always))
    llama3_header(out, "assistant", chat_piece::no_message);
}

// ---- Phi-3 ----

// The first Phi-3-mini releases: the assistant's header follows each user message, so
// there is no separate generation prompt; system messages are dropped by that template,
// which tlm refuses rather than silently lose the instructions.
inline void render_phi3(const form_context& c, std::span<const chat_message> ms, chat_end, pieces& out) {
  require_roles("phi3", ms, {"user", "assistant"});
  marker(out, c.bos, chat_piece::no_message);
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (ms[i].role == "user") {
      marker(out, "<|user|>", i);
      text(out, "\n" + ms[i].content, i);
      marker(out, "<|end|>", i);
      text(out, "\n", i);
      marker(out, "<|assistant|>", i);
      text(out, "\n", i);
    } else {
      content(out, ms[i].content, i);
      marker(out, "<|end|>", i);
      text(out, "\n", i);
    }
  }
}

// Phi-3.5-mini-instruct: a system message with empty content prints nothing.
inline void render_phi35(const form_context& c, std::span<const chat_message> ms, chat_end end, pieces& out) {
  require_roles("phi3.5", ms, {"system", "user", "assistant"});
  for (std::size_t i = 0; i < ms.size(); ++i) {
    if (ms[i].role == "system" && ms[i].content.empty()) continue;
    marker(out, "<|" + ms[i].role + "|>", i);
    text(out, "\n", i);
    if (ms[i].role == "assistant") content(out, ms[i].content, i);
    else text(out, ms[i].content, i);
    marker(out, "<|end|>", i);
    text(out, "\n", i);
  }
  if (end == chat_end::generation_prompt) {
    marker(out, "<|assistant|>", chat_piece::no_message);
    text(out, "\n", chat_piece::no_message);
  } else if (end == chat_end::closed) {
    marker(out, c.eos, chat_piece::no_message);
  }
}

// ---- [INST] forms ----

// After an optional system message, user and assistant alternate, starting with user;
// the templates raise these errors (the texts are theirs) before printing anything.
inline void require_alternation(std::string_view form, std::span<const chat_message> loop, std::string_view message) {
  for (std::size_t i = 0; i < loop.size(); ++i)
    if ((loop[i].role == "user") != (i % 2 == 0)) refuse(form, std::string(message));
}

// Mistral's templates that put the system message into the *last* user message, so the
// rendering of earlier turns changes as the conversation grows (chat_session refuses that;
// apply_chat_template renders it). [INST] and [/INST] are control tokens in their
// vocabularies. Nemo's ("v3-tekken") writes "[INST]text" and the answer as it is; v3's
// (Mistral 7B v0.3, Large 2407) "[INST] text" and the answer stripped after a space.
inline void render_mistral_last_system(std::string_view form, bool v3, const form_context& c, std::span<const chat_message> ms,
                                       pieces& out) {
  require_messages(form, ms);
  const bool has_system = ms[0].role == "system";
  const auto loop = ms.subspan(has_system ? 1 : 0);
  for (const auto& m : loop)
    if (m.role == "tool" || m.role == "tool_results")
      refuse(form, "a \"" + m.role + "\" message: tool calls are not supported by tlm's chat templates");
  require_alternation(form, loop, "After the optional system message, conversation roles must alternate user/assistant/user/assistant/...");
  const std::size_t base = has_system ? 1 : 0;
  marker(out, c.bos, chat_piece::no_message);
  for (std::size_t j = 0; j < loop.size(); ++j) {
    const std::size_t i = base + j;
    if (loop[j].role == "user") {
      marker(out, "[INST]", i);
      if (v3) text(out, " ", i);
      if (j + 1 == loop.size() && has_system) text(out, ms[0].content + "\n\n", i);
      text(out, loop[j].content, i);
      marker(out, "[/INST]", i);
    } else if (loop[j].role == "assistant") {
      if (v3) text(out, " ", i);
      content(out, v3 ? python_strip(loop[j].content) : loop[j].content, i);
      marker(out, c.eos, i);
    } else {
      refuse(form, "Only user and assistant roles are supported, with the exception of an initial optional system message!");
    }
  }
}

inline void render_mistral_nemo(const form_context& c, std::span<const chat_message> ms, chat_end, pieces& out) {
  render_mistral_last_system("mistral-nemo", false, c, ms, out);
}
inline void render_mistral_v3(const form_context& c, std::span<const chat_message> ms, chat_end, pieces& out) {
  render_mistral_last_system("mistral-v3", true, c, ms, out);
}

// Mistral 7B Instruct v0.1/v0.2's templates, where [INST] is text: the first ("mistral")
// has no system message, the later "v1" one puts it into the *first* user message. They
// check each message as they reach it, the alternation first and then the role, and raise
// these texts; tlm checks in the same order so the first bad message names the same fault.
inline void render_mistral_first_system(std::string_view form, bool v1, const form_context& c, std::span<const chat_message> ms,
                                        pieces& out) {
  if (v1) require_messages(form, ms);  // v1 reads messages[0]
  const bool has_system = v1 && ms[0].role == "system";
  const auto loop = ms.subspan(has_system ? 1 : 0);
  for (std::size_t j = 0; j < loop.size(); ++j) {
    const std::string& role = loop[j].role;
    if ((role == "user") != (j % 2 == 0)) {
      if (v1) refuse(form, "After the optional system message, conversation roles must alternate user/assistant/user/assistant/...");
      refuse(form, std::string("Conversation roles must alternate user/assistant/user/assistant/...") +
                       (role == "system" ? " (this template has no system message: leave it out, or put it into the first user message)"
                                         : ""));
    }
    if (role != "user" && role != "assistant")
      refuse(form, v1 ? "Only user and assistant roles are supported, with the exception of an initial optional system message!"
                      : "Only user and assistant roles are supported!");
  }
  const std::size_t base = has_system ? 1 : 0;
  marker(out, c.bos, chat_piece::no_message);
  for (std::size_t j = 0; j < loop.size(); ++j) {
    const std::size_t i = base + j;
    if (loop[j].role == "user") {
      const std::string system = j == 0 && has_system ? ms[0].content + "\n\n" : "";
      text(out, (v1 ? " [INST] " : "[INST] ") + system + loop[j].content + " [/INST]", i);
    } else {
      if (v1) text(out, " ", i);
      content(out, loop[j].content, i);
      marker(out, c.eos, i);
    }
  }
}

inline void render_mistral(const form_context& c, std::span<const chat_message> ms, chat_end, pieces& out) {
  render_mistral_first_system("mistral", false, c, ms, out);
}
inline void render_mistral_v1(const form_context& c, std::span<const chat_message> ms, chat_end, pieces& out) {
  render_mistral_first_system("mistral-v1", true, c, ms, out);
}

// Llama 2 chat, as Meta published the format: every user message is "<s>[INST] ... [/INST]"
// with the system message wrapped in <<SYS>> at the start of the first one, every answer
// " ... </s>"; message texts are stripped (the combined first message as a whole).
inline void render_llama2(const form_context& c, std::span<const chat_message> ms, chat_end, pieces& out) {
  require_messages("llama2", ms);
  const bool has_system = ms[0].role == "system";
  const auto loop = ms.subspan(has_system ? 1 : 0);
  require_alternation("llama2", loop, "Conversation roles must alternate user/assistant/user/assistant/...");
  const std::size_t base = has_system ? 1 : 0;
  for (std::size_t j = 0; j < loop.size(); ++j) {
    const std::size_t i = base + j;
    std::string body = loop[j].content;
    if (j == 0 && has_system) body = "<<SYS>>\n" + ms[0].content + "\n<</SYS>>\n\n" + body;
    if (loop[j].role == "user") {
      marker(out, c.bos, i);
      text(out, "[INST] " + python_strip(body) + " [/INST]", i);
    } else if (loop[j].role == "assistant") {
      text(out, " ", i);
      content(out, python_strip(body), i);
      text(out, " ", i);
      marker(out, c.eos, i);
    } else {
      refuse("llama2", "Only user and assistant roles are supported, with the exception of an initial optional system message!");
    }
  }
}

// ---- Zephyr ----

inline void render_zephyr(const form_context& c, std::span<const chat_message> ms, chat_end end, pieces& out) {
  require_roles("zephyr", ms, {"system", "user", "assistant"});
  for (std::size_t i = 0; i < ms.size(); ++i) {
    // The role tags are plain text in the Llama 2 vocabulary TinyLlama uses.
    text(out, "<|" + ms[i].role + "|>\n", i);
    if (ms[i].role == "assistant") content(out, ms[i].content, i);
    else text(out, ms[i].content, i);
    marker(out, c.eos, i);
    text(out, "\n", i);
  }
  // The template prints the generation prompt inside its loop (after the last message).
  if (end == chat_end::generation_prompt && !ms.empty()) text(out, "<|assistant|>\n", chat_piece::no_message);
}

// ---- recognition ----

inline constexpr std::string_view chatml_default_system_head =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n";
inline constexpr std::string_view chatml_default_system_tail =
    "<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
inline constexpr std::string_view chatml_plain =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

inline constexpr std::string_view smollm2_default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
inline constexpr std::string_view qwen25_default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// Jinja drops one trailing newline of a template by default; surrounding whitespace
// outside the tags would otherwise be rendered, so only trailing "\n" is tolerated.
inline std::string trimmed_template(std::string_view t) {
  std::string d = decode_newline_escapes(t);
  while (!d.empty() && d.back() == '\n') d.pop_back();
  return d;
}

// The default system text of a SmolLM2-style template, or false if it is not one.
inline bool chatml_default_system_of(const std::string& t, std::string* prompt) {
  const auto& head = chatml_default_system_head;
  const auto& tail = chatml_default_system_tail;
  if (t.size() <= head.size() + tail.size() || !t.starts_with(head) || !t.ends_with(tail)) return false;
  std::string p = t.substr(head.size(), t.size() - head.size() - tail.size());
  // A quote or backslash would be Jinja syntax inside the literal; refuse rather than guess.
  if (p.find_first_of("'\\{}") != std::string::npos) return false;
  if (prompt) *prompt = std::move(p);
  return true;
}

// Each test looks for text that renders the form's distinctive parts, so that no known
// template matches two forms (test_chat checks every fetched template against all rows).
inline bool is_chatml(const std::string& t) { return t == chatml_plain; }
inline bool is_smollm2(const std::string& t) { return chatml_default_system_of(t, nullptr); }
inline bool is_qwen25(const std::string& t) {
  return contains(t, "'<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n'") &&
         contains(t, "(message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
                     "(message.role == \"assistant\" and not message.tool_calls)") &&
         contains(t, "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}");
}
inline bool is_llama3(const std::string& t) {
  return contains(t, "{{- \"Cutting Knowledge Date: December 2023\n\" }}") &&
         contains(t, "{{- \"Today Date: \" + date_string + \"\n\n\" }}") &&
         contains(t, "{%- set system_message = messages[0]['content']|trim %}") &&
         contains(t, "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>'") &&
         contains(t, "{%- set date_string = \"26 Jul 2024\" %}");
}
// Llama 3.0 Instruct's template, whole: its first release ends with the generation prompt
// unconditionally, the later one inside {% if add_generation_prompt %}.
inline constexpr std::string_view llama30_messages =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}";
inline constexpr std::string_view llama30_prompt = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";
inline bool llama30_prompt_always(const std::string& t) {
  return t.size() == llama30_messages.size() + llama30_prompt.size() && t.starts_with(llama30_messages) && t.ends_with(llama30_prompt);
}
inline bool is_llama30(const std::string& t) {
  return llama30_prompt_always(t) ||
         t == std::string(llama30_messages) + "{% if add_generation_prompt %}" + std::string(llama30_prompt) + "{% endif %}";
}
inline bool is_phi3(const std::string& t) {
  return t.starts_with("{{ bos_token }}") &&
         contains(t, "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}") &&
         contains(t, "{{message['content'] + '<|end|>' + '\n'}}") && !contains(t, "system");
}
inline bool is_phi35(const std::string& t) {
  return contains(t, "{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}") &&
         contains(t, "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}") &&
         contains(t, "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}") &&
         contains(t, "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}");
}
inline bool is_mistral_nemo(const std::string& t) {
  return contains(t, "{{- \"[INST]\" + system_message + \"\n\n\" + message[\"content\"] + \"[/INST]\" }}") &&
         contains(t, "{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}") &&
         contains(t, "{%- if loop.last and system_message is defined %}") && contains(t, "{{- message[\"content\"] + eos_token}}");
}
inline bool is_mistral_v3(const std::string& t) {
  return contains(t, "{{- \"[INST] \" + system_message + \"\n\n\" + message[\"content\"] + \"[/INST]\" }}") &&
         contains(t, "{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}") &&
         contains(t, "{%- if loop.last and system_message is defined %}") && contains(t, "{{- \" \" + message[\"content\"]|trim + eos_token}}");
}
// Mistral 7B Instruct v0.1/v0.2: the first template begins with the loop (no system
// message); the v1 one puts the system message into the first user message.
inline bool is_mistral(const std::string& t) {
  return t.starts_with("{{ bos_token }}{% for message in messages %}") &&
         contains(t, "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}") &&
         contains(t, "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}") &&
         contains(t, "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}") &&
         contains(t, "raise_exception('Only user and assistant roles are supported!')") && !contains(t, "system");
}
inline bool is_mistral_v1(const std::string& t) {
  return contains(t, "{{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}") &&
         contains(t, "{{- ' [INST] ' + message['content'] + ' [/INST]' }}") &&
         contains(t, "{%- if loop.first and system_message is defined %}") && contains(t, "{{- ' ' + message['content'] + eos_token}}");
}
// Llama 2 and Zephyr: their distinctive markers (the template texts are not among the
// fetched ones, so these are kept to what the published formats require: for Llama 2 a
// BOS before every [INST] and stripped texts, which two Llama-2-like templates in
// llama.cpp's tests, FusionNet's and Vigogne's, lack; test_chat checks they are refused).
inline bool is_llama2(const std::string& t) {
  return contains(t, "<<SYS>>\n") && contains(t, "\n<</SYS>>\n\n") && contains(t, "bos_token + '[INST] '") && contains(t, " [/INST]") &&
         (contains(t, ".strip()") || contains(t, "trim")) && contains(t, "eos_token") && !contains(t, "[INST]\" + system_message");
}
inline bool is_zephyr(const std::string& t) {
  return contains(t, "<|user|>\n") && contains(t, "<|assistant|>\n") && contains(t, "<|system|>\n") &&
         contains(t, "eos_token") && !contains(t, "<|end|>") && !contains(t, "<|im_start|>");
}

struct chat_form {
  std::string_view name;
  std::string_view end_marker;  // the marker that ends the model's turn; empty: the EOS text
  std::string_view bos, eos;    // the BOS/EOS text of the models using the form
  std::string_view default_system;
  bool (*recognise)(const std::string& decoded_template);
  void (*render)(const form_context&, std::span<const chat_message>, chat_end, pieces&);
};

// The one table of forms.
inline constexpr chat_form chat_forms[] = {
    {"chatml", "<|im_end|>", "", "", "", is_chatml, render_chatml},
    {"smollm2", "<|im_end|>", "", "", smollm2_default_system, is_smollm2, render_chatml_default_system},
    {"qwen2.5", "<|im_end|>", "", "", qwen25_default_system, is_qwen25, render_qwen25},
    {"llama3", "<|eot_id|>", "<|begin_of_text|>", "<|end_of_text|>", "", is_llama3, render_llama3},
    {"llama3.0", "<|eot_id|>", "<|begin_of_text|>", "<|end_of_text|>", "", is_llama30, render_llama30},
    {"phi3", "<|end|>", "<s>", "<|endoftext|>", "", is_phi3, render_phi3},
    {"phi3.5", "<|end|>", "<s>", "<|endoftext|>", "", is_phi35, render_phi35},
    {"mistral", "", "<s>", "</s>", "", is_mistral, render_mistral},
    {"mistral-v1", "", "<s>", "</s>", "", is_mistral_v1, render_mistral_v1},
    {"mistral-v3", "", "<s>", "</s>", "", is_mistral_v3, render_mistral_v3},
    {"mistral-nemo", "", "<s>", "</s>", "", is_mistral_nemo, render_mistral_nemo},
    {"llama2", "", "<s>", "</s>", "", is_llama2, render_llama2},
    {"zephyr", "", "<s>", "</s>", "", is_zephyr, render_zephyr},
};

}  // namespace detail

// The names --chat-template accepts, comma-separated.
inline std::string chat_template_names() {
  std::string s;
  for (const auto& f : detail::chat_forms) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

// A recognised chat template: its form, and what it took from the template text.
class chat_template {
 public:
  // The form of a template text; tlm::error if no form matches it.
  static chat_template recognise(std::string_view template_text) {
    const std::string t = detail::trimmed_template(template_text);
    for (const auto& f : detail::chat_forms) {
      if (!f.recognise(t)) continue;
      chat_template c(f);
      // A SmolLM2-style template carries its own default system text.
      if (f.render == detail::render_chatml_default_system) detail::chatml_default_system_of(t, &c.default_system_);
      // Llama 3.0's first template prints the generation prompt unasked; by name it is the later one.
      c.prompt_always_ = f.render == detail::render_llama30 && detail::llama30_prompt_always(t);
      return c;
    }
    // Cut at a character's start: the message goes into JSON (serve, chat_render), which
    // takes only whole UTF-8 characters.
    std::size_t cut = std::min<std::size_t>(template_text.size(), 120);
    while (cut > 0 && cut < template_text.size() && (static_cast<unsigned char>(template_text[cut]) >> 6) == 2) --cut;
    const std::string shown(template_text.substr(0, cut));
    throw error("chat template not supported: tlm renders the forms " + chat_template_names() +
                " (tlm/text/chat.hpp), and this template is none of them. It begins: \"" + shown +
                (cut < template_text.size() ? "...\"" : "\"") +
                ". If the model uses one of those formats, pass its name (generate/serve --chat-template NAME, "
                "chat_options::chat_template, chat_template= in Python); otherwise render the prompt yourself "
                "and tokenize it with parse_special.");
  }

  // A form by name; tlm::error listing the names if there is none.
  static chat_template named(std::string_view name) {
    for (const auto& f : detail::chat_forms)
      if (f.name == name) return chat_template(f);
    throw error("--chat-template " + std::string(name) + ": no such chat template; the names are " + chat_template_names());
  }

  // The template a model file declares (its text, empty when the file has none), unless
  // `name` overrides it. A file without a template is treated as plain ChatML.
  static chat_template of(std::string_view file_template, std::string_view name = {}) {
    if (!name.empty()) return named(name);
    if (file_template.empty()) return chat_template(detail::chat_forms[0]);
    return recognise(file_template);
  }

  std::string_view name() const { return form_->name; }
  // The text of the marker that ends an assistant turn (a special token's text).
  std::string_view end_marker(const chat_render_options& o = {}) const {
    if (!form_->end_marker.empty()) return form_->end_marker;
    return o.eos_token.empty() ? form_->eos : std::string_view(o.eos_token);
  }
  std::string_view default_system() const { return default_system_; }

  std::vector<chat_piece> pieces(std::span<const chat_message> messages, chat_end end, const chat_render_options& o = {}) const {
    const detail::form_context c{default_system_, o.bos_token.empty() ? form_->bos : std::string_view(o.bos_token),
                                 o.eos_token.empty() ? form_->eos : std::string_view(o.eos_token),
                                 o.date_string.empty() ? std::string_view("26 Jul 2024") : std::string_view(o.date_string),
                                 prompt_always_};
    std::vector<chat_piece> out;
    form_->render(c, messages, end, out);
    return out;
  }

  std::string render(std::span<const chat_message> messages, bool add_generation_prompt, const chat_render_options& o = {}) const {
    std::string s;
    for (const auto& p : pieces(messages, add_generation_prompt ? chat_end::generation_prompt : chat_end::closed, o)) s += p.text;
    return s;
  }

 private:
  explicit chat_template(const detail::chat_form& f) : form_(&f), default_system_(f.default_system) {}
  const detail::chat_form* form_;
  std::string default_system_;
  bool prompt_always_ = false;
};

// Renders messages as the model's chat template does; add_generation_prompt appends the
// header of the assistant's turn so that generation continues as the assistant.
inline std::string apply_chat_template(std::string_view template_text, std::span<const chat_message> messages,
                                       bool add_generation_prompt, const chat_render_options& o = {}) {
  return chat_template::recognise(template_text).render(messages, add_generation_prompt, o);
}

}  // namespace tlm
