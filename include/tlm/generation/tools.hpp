#pragma once
// Tool calls in the form Qwen2.5's chat template writes them (the Hermes form), for
// every template:
// - the tools' signatures go in a "# Tools" section of the system message;
// - a call is <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>, and several
//   calls in one reply are separated by a newline;
// - a tool's result is a user turn of <tool_response>\n...\n</tool_response> blocks.
// Qwen2.5's own template renders exactly this (tests/serve/check_tools.py compares it
// with the Jinja rendering token for token); for the other templates it is tlm's
// documented fallback. `apply` puts a request's tools on it: the section, and a grammar
// that holds the reply to calls (one `call_node` per tool in a json_schema::one_of,
// repeated when calls may be parallel), with grammar_trigger = tools::trigger when the
// model may also answer in words. examples/serve (OpenAI's tools, tool_choice and
// parallel_tool_calls) and the Python module (chat(tools=...)) both call it.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <tlm/error.hpp>
#include <tlm/generation/decode.hpp>
#include <tlm/generation/json_schema.hpp>
#include <tlm/text/chat.hpp>

namespace tlm::tools {

// Ordered: a tool's properties are listed, and its calls written, in the order given.
using json = nlohmann::ordered_json;

inline constexpr std::string_view call_open = "<tool_call>\n";
inline constexpr std::string_view call_close = "\n</tool_call>";
inline constexpr std::string_view call_separator = "\n";  // between calls, as Qwen2.5's template joins them
inline constexpr std::string_view trigger = "<tool_call>";  // a reply that begins so is a call
inline constexpr std::size_t max_tools = 64;                // json_schema::one_of's limit
inline constexpr std::size_t max_calls = 16;                // calls in one reply, when they may be parallel

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

// Thrown by apply when the request's options already hold a grammar (a response format):
// one reply cannot follow two grammars. Not a tool_error, since no tool field is wrong; each
// caller names the two fields in its own API's terms.
struct grammar_conflict : error {
  grammar_conflict() : error("tools and a response format cannot hold one reply together; give one of them") {}
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

// What a request's tool_choice asks for: no call (the tools are not shown either), words
// or calls (auto), at least one call (required), or calls of one named function.
struct choice {
  enum class kind { none, automatic, required, named } k = kind::automatic;
  std::string name{};  // named
};

// Puts `tools` (an OpenAI tools array) on a request: the section joins the system message
// of `messages`, and `options` gets the grammar of the calls (and the trigger, for auto).
// `parallel`: a reply may hold up to max_calls calls, newline-separated; otherwise one.
// Returns whether the reply may be calls. Throws tool_error naming the field: a tool that
// cannot be called (read_tools), a choice that names no tool given, a call asked of no
// tools; grammar_conflict when the options already hold a grammar.
inline bool apply(const json& tools, const choice& c, bool parallel, std::vector<chat_message>& messages,
                  std::string_view default_system, generation_options& options) {
  const bool must_call = c.k == choice::kind::required || c.k == choice::kind::named;
  if (tools.is_array() && tools.empty()) {
    if (must_call) throw tool_error("tool_choice", " asks for a tool call, but 'tools' gives no tools");
    return false;
  }
  std::vector<tool> listed = read_tools(tools);
  std::vector<json_node> calls;
  for (auto& t : listed)
    if (c.k != choice::kind::named || t.name == c.name) calls.push_back(call_node(t.name, std::move(t.arguments)));
  if (c.k == choice::kind::named && calls.empty())
    throw tool_error("tool_choice", " names the function '" + c.name + "', which 'tools' does not hold");
  if (c.k == choice::kind::none) return false;  // the signatures are not shown either: nothing may be called
  if (options.grammar) throw grammar_conflict();
  add_section(messages, system_section(tools), default_system);
  json_node one = json_schema::one_of(std::move(calls));
  json_node held = parallel ? json_schema::repeat(std::move(one), std::string(call_separator), 1, max_calls) : std::move(one);
  options.grammar = std::make_shared<const json_grammar>(std::move(held));
  options.grammar_trigger = c.k == choice::kind::automatic ? std::string(trigger) : std::string();
  return true;
}

struct call {
  std::string name;
  json arguments;
};

// A reply that is one or more whole calls, newline-separated, in order; nothing for
// words, or for calls cut short. (JSON writes a newline inside a string as \n, so a
// call's body never holds call_close.)
inline std::optional<std::vector<call>> parse_calls(std::string_view text) {
  std::vector<call> out;
  for (;;) {
    if (!text.starts_with(call_open)) return std::nullopt;
    const std::size_t end = text.find(call_close, call_open.size());
    if (end == std::string_view::npos) return std::nullopt;
    const json j = json::parse(text.substr(call_open.size(), end - call_open.size()), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("arguments"))
      return std::nullopt;
    out.push_back({j["name"].get<std::string>(), j["arguments"]});
    text.remove_prefix(end + call_close.size());
    if (text.empty()) return out;
    if (!text.starts_with(call_separator)) return std::nullopt;
    text.remove_prefix(call_separator.size());
  }
}

}  // namespace tlm::tools
