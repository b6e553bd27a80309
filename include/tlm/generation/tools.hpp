#pragma once
// Tool calls in the form Qwen2.5's chat template writes them (the Hermes form), for
// every template:
// - the tools' signatures go in a "# Tools" section of the system message;
// - a call is <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>;
// - a tool's result is a user turn of <tool_response>\n...\n</tool_response> blocks.
// Qwen2.5's own template renders exactly this (tests/serve/check_tools.py compares it
// with the Jinja rendering token for token); for the other templates it is tlm's
// documented fallback. A reply is held to a call by a grammar of one `call_node` per tool
// (json_schema::one_of), with grammar_trigger = tools::trigger when the model may
// also answer in words. examples/serve reads OpenAI's tools, tool_choice and tool
// messages into these.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <tlm/error.hpp>
#include <tlm/generation/json_schema.hpp>
#include <tlm/text/chat.hpp>

namespace tlm::tools {

// Ordered: a tool's properties are listed, and its calls written, in the order given.
using json = nlohmann::ordered_json;

inline constexpr std::string_view call_open = "<tool_call>\n";
inline constexpr std::string_view call_close = "\n</tool_call>";
inline constexpr std::string_view trigger = "<tool_call>";  // a reply that begins so is a call
inline constexpr std::size_t max_tools = 64;                // json_schema::one_of's limit

// JSON as Python's json.dumps writes it by default (", " and ": "), which is what the
// templates' `tojson` gives and so what the models saw in training. Non-ASCII text stays
// as it is (tojson's ensure_ascii=False); invalid UTF-8 becomes U+FFFD.
inline std::string dump_spaced(const json& v) {
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      out += (first ? "" : ", ") + json(k).dump(-1, ' ', false, json::error_handler_t::replace) +
             ": " + dump_spaced(x);
      first = false;
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + dump_spaced(v[i]);
    return out + "]";
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

// A call's text up to its arguments, and after them.
inline std::string call_head(std::string_view name) {
  return std::string(call_open) + "{\"name\": " + dump_spaced(json(std::string(name))) + ", \"arguments\": ";
}
inline std::string call_tail() { return "}" + std::string(call_close); }

// One call as the model writes it.
inline std::string call_text(std::string_view name, const json& arguments) {
  return call_head(name) + dump_spaced(arguments) + call_tail();
}

// A tool's result as the template writes it inside a user turn.
inline std::string response_block(std::string_view content) {
  return "<tool_response>\n" + std::string(content) + "\n</tool_response>";
}

// The system message's section listing the tools: an array of them, each as given
// ({"type": "function", "function": {"name", "description", "parameters"}}).
inline std::string system_section(const json& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
      "signatures within <tools></tools> XML tags:\n<tools>";
  for (const auto& t : tools) out += "\n" + dump_spaced(t);
  return out +
         "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call>";
}

// Puts the section at the end of the system message, or in a new first system message
// after the template's default system text (as Qwen2.5's template does when the
// conversation has none).
inline void add_section(std::vector<chat_message>& messages, std::string_view section, std::string_view default_system) {
  if (!messages.empty() && messages[0].role == "system") {
    messages[0].content += "\n\n" + std::string(section);
  } else {
    messages.insert(messages.begin(), {"system", default_system.empty() ? std::string(section)
                                                                         : std::string(default_system) + "\n\n" +
                                                                               std::string(section)});
  }
}

// A tool that cannot be called as given. `field` says where (tools[1].function.name);
// the message reads "'tools[1].function.name' must be ...".
struct tool_error : error {
  tool_error(std::string field_, const std::string& what, bool wrong_type_ = false)
      : error("'" + field_ + "'" + what), field(std::move(field_)), wrong_type(wrong_type_) {}
  std::string field;
  bool wrong_type;  // the value is of the wrong kind (not a function tool, not an array), not a wrong value
};

// A tool as its calls are held: its name and its arguments' schema compiled.
struct tool {
  std::string name;
  json_node arguments;
};

// Each tool of an OpenAI `tools` array checked and compiled, in order: a function tool,
// named by 1 to 64 letters, digits, underscores or dashes, no name twice, its parameters
// (if any) an object schema tlm's grammar supports. Throws tool_error naming the field.
// The server and the Python module read tools here, so one rule holds for both.
inline std::vector<tool> read_tools(const json& tools) {
  if (!tools.is_array()) throw tool_error("tools", " must be an array of {\"type\": \"function\", \"function\": {...}}", true);
  if (tools.size() > max_tools)
    throw tool_error("tools", " holds " + std::to_string(tools.size()) + " tools; tlm takes at most " +
                                  std::to_string(max_tools));
  std::vector<tool> out;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const std::string key = "tools[" + std::to_string(i) + "]";
    const json& t = tools[i];
    if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") || !t["function"].is_object())
      throw tool_error(key,
                       " must be {\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}; "
                       "tlm calls functions only",
                       true);
    const json& f = t["function"];
    const std::string name = f.contains("name") && f["name"].is_string() ? f["name"].get<std::string>() : std::string();
    const bool good_name = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
    });
    if (!good_name) throw tool_error(key + ".function.name", " must be 1 to 64 letters, digits, underscores or dashes");
    if (std::any_of(out.begin(), out.end(), [&](const tool& o) { return o.name == name; }))
      throw tool_error(key + ".function.name", ": two tools are named '" + name + "'");
    json_node args = json_schema::object({});
    if (f.contains("parameters") && !f["parameters"].is_null()) {
      try {
        args = json_schema::from_json(f["parameters"]);
      } catch (const error& e) {
        throw tool_error(key + ".function.parameters", std::string(": ") + e.what());
      }
      if (args.k != json_node::kind::object)
        throw tool_error(key + ".function.parameters", " must be an object schema (\"type\": \"object\")");
    }
    out.push_back({name, std::move(args)});
  }
  return out;
}

// The grammar of one tool's calls: its head and tail as fixed texts around arguments
// valid against `arguments` (an object schema).
inline json_node call_node(std::string_view name, json_node arguments) {
  return json_schema::sequence({{call_head(name), std::move(arguments)}}, call_tail());
}

struct call {
  std::string name;
  json arguments;
};

// A reply that is one whole call; nothing for words, or for a call cut short.
inline std::optional<call> parse_call(std::string_view text) {
  if (text.size() < call_open.size() + call_close.size() || !text.starts_with(call_open) || !text.ends_with(call_close))
    return std::nullopt;
  const std::string_view body = text.substr(call_open.size(), text.size() - call_open.size() - call_close.size());
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("arguments"))
    return std::nullopt;
  return call{j["name"].get<std::string>(), j["arguments"]};
}

}  // namespace tlm::tools
