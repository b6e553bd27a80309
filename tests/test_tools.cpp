// Tool calls in the Hermes form (tlm/generation/tools.hpp): JSON spaced as Python's
// json.dumps writes it, a call's text and its grammar agreeing, parse_call reading back
// exactly what call_text wrote, and the system section where Qwen2.5's template puts it.
// The whole prompt against the Jinja rendering is tests/serve/check_tools.py.
#include <doctest/doctest.h>

#include <tlm/generation/grammar.hpp>
#include <tlm/generation/tools.hpp>

#include <string>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_tools {

using tlm::tools::json;

TEST_CASE("dump_spaced writes JSON as Python's json.dumps(ensure_ascii=False) does, keys in the order given") {
  const json v = json::parse(R"({"type":"function","function":{"name":"f","parameters":{"z":1,"a":[1,2.5,true,null],"é":"ü\"\n"}}})");
  // json.dumps(v, ensure_ascii=False) in Python 3.11, the value parsed from the same text:
  CHECK(tlm::tools::dump_spaced(v) ==
        R"({"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": [1, 2.5, true, null], "é": "ü\"\n"}}})");
  CHECK(tlm::tools::dump_spaced(json::object()) == "{}");
  CHECK(tlm::tools::dump_spaced(json::array()) == "[]");
}

TEST_CASE("a call's text is one its grammar admits, and parse_call reads it back") {
  using namespace tlm::json_schema;
  const json args = json::parse(R"({"city":"Paris","days":3})");
  const std::string text = tlm::tools::call_text("get_weather", args);
  CHECK(text == "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>");
  std::vector<tlm::json_node> calls;
  calls.push_back(tlm::tools::call_node("get_weather", object({{"city", string()}, {"days", integer()}})));
  calls.push_back(tlm::tools::call_node("now", object({})));
  const tlm::json_grammar g(one_of(std::move(calls)));
  // The grammar writes the arguments without spaces (as it writes all JSON); the head and
  // tail around them are call_text's, byte for byte.
  auto st = g.start();
  REQUIRE(g.feed(st, tlm::tools::call_head("get_weather") + args.dump() + tlm::tools::call_tail()));
  CHECK(g.can_end(st));
  CHECK(tlm::tools::call_head("get_weather") + tlm::tools::dump_spaced(args) + tlm::tools::call_tail() == text);
  auto other = g.start();
  CHECK(g.feed(other, tlm::tools::call_text("now", json::object())));
  CHECK(g.can_end(other));
  auto wrong = g.start();
  CHECK(!g.feed(wrong, tlm::tools::call_text("delete_everything", json::object())));

  const auto c = tlm::tools::parse_call(text);
  REQUIRE(c.has_value());
  CHECK(c->name == "get_weather");
  CHECK(c->arguments.dump() == R"({"city":"Paris","days":3})");  // in the order written
  CHECK(tlm::tools::parse_call(tlm::tools::call_head("now") + "{}" + tlm::tools::call_tail())->arguments == json::object());
  CHECK(!tlm::tools::parse_call("Paris is the capital."));
  CHECK(!tlm::tools::parse_call(text.substr(0, text.size() - 1)));           // cut short
  CHECK(!tlm::tools::parse_call("<tool_call>\n</tool_call>"));               // open and close overlap
  CHECK(!tlm::tools::parse_call("<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>"));
  CHECK(text.starts_with(tlm::tools::trigger));
}

TEST_CASE("the tools' section joins the system message, or opens one after the template's default text") {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"now"}}])");
  const std::string section = tlm::tools::system_section(tools);
  CHECK(section.starts_with("# Tools\n\n"));
  CHECK(section.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"now\"}}\n</tools>") != std::string::npos);
  CHECK(section.ends_with("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"));

  std::vector<tlm::chat_message> with{{"system", "Be brief."}, {"user", "Hi"}};
  tlm::tools::add_section(with, section, "You are Qwen.");
  REQUIRE(with.size() == 2);
  CHECK(with[0].content == "Be brief.\n\n" + section);
  std::vector<tlm::chat_message> without{{"user", "Hi"}};
  tlm::tools::add_section(without, section, "You are Qwen.");
  REQUIRE(without.size() == 2);
  CHECK(without[0].role == "system");
  CHECK(without[0].content == "You are Qwen.\n\n" + section);
  std::vector<tlm::chat_message> plain{{"user", "Hi"}};
  tlm::tools::add_section(plain, section, "");
  CHECK(plain[0].content == section);
  CHECK(tlm::tools::response_block("22 C") == "<tool_response>\n22 C\n</tool_response>");
}

TEST_CASE("read_tools compiles each tool and names the field of the first that cannot be called") {
  const auto tools = tlm::tools::read_tools(json::parse(
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
          {"type":"function","function":{"name":"now"}}])"));
  REQUIRE(tools.size() == 2);
  CHECK(tools[0].name == "get_weather");
  CHECK(tools[0].arguments.k == tlm::json_node::kind::object);
  CHECK(tools[1].name == "now");  // no parameters: no arguments, {}
  const auto refused = [](const char* text, const std::string& field, const std::string& message, bool wrong_type) {
    try {
      tlm::tools::read_tools(json::parse(text));
      FAIL("accepted: " << text);
    } catch (const tlm::tools::tool_error& e) {
      CHECK(e.field == field);
      CHECK(std::string(e.what()) == message);
      CHECK(e.wrong_type == wrong_type);
    }
  };
  refused(R"("all")", "tools", R"('tools' must be an array of {"type": "function", "function": {...}})", true);
  refused(R"([{"type":"retrieval"}])", "tools[0]",
          R"('tools[0]' must be {"type": "function", "function": {"name", "description", "parameters"}}; tlm calls functions only)",
          true);
  refused(R"([{"type":"function","function":{"name":"bad name"}}])", "tools[0].function.name",
          "'tools[0].function.name' must be 1 to 64 letters, digits, underscores or dashes", false);
  refused(R"([{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}])",
          "tools[1].function.name", "'tools[1].function.name': two tools are named 'f'", false);
  refused(R"([{"type":"function","function":{"name":"f","parameters":{"type":"string"}}}])", "tools[0].function.parameters",
          R"('tools[0].function.parameters' must be an object schema ("type": "object"))", false);
  json many = json::array();
  for (int i = 0; i < 65; ++i) many.push_back({{"type", "function"}, {"function", {{"name", "f" + std::to_string(i)}}}});
  try {
    tlm::tools::read_tools(many);
    FAIL("65 tools accepted");
  } catch (const tlm::tools::tool_error& e) {
    CHECK(std::string(e.what()) == "'tools' holds 65 tools; tlm takes at most 64");
  }
  try {  // a schema the grammar does not support: the field, then the schema reader's reason
    tlm::tools::read_tools(json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
        "properties":{"x":{"type":"string","format":"date"}},"required":["x"]}}}])"));
    FAIL("an unsupported schema accepted");
  } catch (const tlm::tools::tool_error& e) {
    CHECK(e.field == "tools[0].function.parameters");
    CHECK(std::string(e.what()).starts_with("'tools[0].function.parameters': "));
  }
}

}  // namespace test_tools
