#pragma once
// Chat prompts in the ChatML form SmolLM2-Instruct was trained on.
//
// tlm does not interpret Jinja. apply_chat_template recognises the two ChatML templates
// in circulation and renders exactly what Jinja renders for them:
//   - SmolLM2-Instruct's, which inserts a default system message when the first message
//     is not a system message (its text is taken from the template itself);
//   - the plain ChatML template without a default system message.
// Any other template is refused with tlm::error rather than rendered approximately.
// Message text is copied verbatim: a "<|im_end|>" inside a message stays in the prompt,
// as it does with Jinja (encode without parse_special to keep it from acting as a token).
#include <span>
#include <string>
#include <string_view>

#include "tlm/error.hpp"

namespace tlm {

struct chat_message {
  std::string role, content;
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

struct chatml_form {
  bool has_default_system = false;
  std::string default_system;
};

inline chatml_form recognise_chat_template(std::string_view template_text) {
  std::string t = decode_newline_escapes(template_text);
  // Jinja drops one trailing newline of a template by default; surrounding whitespace
  // outside the tags would otherwise be rendered, so only trailing "\n" is tolerated.
  while (!t.empty() && t.back() == '\n') t.pop_back();
  if (t == chatml_plain) return {};
  const auto& head = chatml_default_system_head;
  const auto& tail = chatml_default_system_tail;
  if (t.size() > head.size() + tail.size() && t.starts_with(head) && t.ends_with(tail)) {
    std::string prompt = t.substr(head.size(), t.size() - head.size() - tail.size());
    // A quote or backslash would be Jinja syntax inside the literal; refuse rather than guess.
    if (prompt.find_first_of("'\\{}") == std::string::npos) return {true, std::move(prompt)};
  }
  std::string shown(template_text.substr(0, 120));
  throw error("chat template not supported: tlm renders only ChatML templates (SmolLM2-Instruct's, with or "
              "without its default system message), and this one differs. It begins: \"" + shown +
              (template_text.size() > 120 ? "...\"" : "\"") +
              ". Render the prompt yourself and tokenize it with parse_special, or add the template to tlm/chat.hpp.");
}

}  // namespace detail

// Renders messages as the model's chat template does; add_generation_prompt appends the
// header of the assistant's turn so that generation continues as the assistant.
inline std::string apply_chat_template(std::string_view template_text, std::span<const chat_message> messages,
                                       bool add_generation_prompt) {
  const detail::chatml_form form = detail::recognise_chat_template(template_text);
  std::string out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    // The template tests loop.first and messages[0], so the default system message
    // appears only once, before the first message, and only if that is not "system".
    if (i == 0 && form.has_default_system && messages[0].role != "system")
      out += "<|im_start|>system\n" + form.default_system + "<|im_end|>\n";
    out += "<|im_start|>";
    out += messages[i].role;
    out += '\n';
    out += messages[i].content;
    out += "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace tlm
