// Tool calls in the Hermes form (tlm/generation/tools.hpp): JSON spaced as Python's
// json.dumps writes it, a call's text and its grammar agreeing, parse_calls reading back
// exactly what call_text wrote, the system section where Qwen2.5's template puts it, and
// apply putting a request's tools on it as the server and the Python module both do.
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

TEST_CASE("a call's text is one its grammar admits, and parse_calls reads it back") {
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

  using tlm::tools::parse_calls;
  const auto c = parse_calls(text);
  REQUIRE(c.has_value());
  REQUIRE(c->size() == 1);
  CHECK((*c)[0].name == "get_weather");
  CHECK((*c)[0].arguments.dump() == R"({"city":"Paris","days":3})");  // in the order written
  CHECK(parse_calls(tlm::tools::call_head("now") + "{}" + tlm::tools::call_tail())->at(0).arguments == json::object());
  CHECK(!parse_calls("Paris is the capital."));
  CHECK(!parse_calls(""));
  CHECK(!parse_calls(text.substr(0, text.size() - 1)));           // cut short
  CHECK(!parse_calls("<tool_call>\n</tool_call>"));               // open and close overlap
  CHECK(!parse_calls("<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>"));
  CHECK(text.starts_with(tlm::tools::trigger));
  // Several calls, newline-separated as Qwen2.5's template joins them, in order; a
  // separator with no call after it, or words after a call, are not calls.
  const std::string now = tlm::tools::call_text("now", json::object());
  const auto two = parse_calls(text + "\n" + now);
  REQUIRE(two.has_value());
  REQUIRE(two->size() == 2);
  CHECK((*two)[0].name == "get_weather");
  CHECK((*two)[1].name == "now");
  CHECK(parse_calls(now + "\n" + now + "\n" + text)->size() == 3);
  CHECK(!parse_calls(text + "\n"));
  CHECK(!parse_calls(text + "\n\n" + now));
  CHECK(!parse_calls(text + " and more"));
  CHECK(!parse_calls(text + "\n" + now.substr(0, now.size() - 2)));
  // A string argument holding the closing tag's text is still one call: JSON writes its
  // newline as \n, so the body never holds call_close.
  const auto odd = parse_calls(tlm::tools::call_text("echo", json{{"s", "a\n</tool_call>\nb"}}));
  REQUIRE(odd.has_value());
  REQUIRE(odd->size() == 1);
  CHECK((*odd)[0].arguments["s"] == "a\n</tool_call>\nb");
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

TEST_CASE("apply puts tools on a request: the section, the grammar of calls, the trigger, and what it refuses") {
  using tlm::tools::choice;
  const json tools = json::parse(
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
          {"type":"function","function":{"name":"now"}}])");
  // As the grammar writes arguments: compact JSON between call_text's head and tail.
  const std::string weather = tlm::tools::call_head("get_weather") + R"({"city":"Paris"})" + tlm::tools::call_tail();
  const std::string now = tlm::tools::call_text("now", json::object());
  const auto admits = [](const tlm::generation_options& o, const std::string& text) {
    auto st = o.grammar->start();
    return o.grammar->feed(st, text) && o.grammar->can_end(st);
  };
  const std::vector<tlm::chat_message> asked{{"user", "Weather?"}};

  // auto, parallel: the section opens a system message after the default text; calls, up
  // to max_calls, newline-separated; the trigger lets words through.
  auto messages = asked;
  tlm::generation_options o;
  REQUIRE(tlm::tools::apply(tools, {}, true, messages, "You are helpful.", o));
  REQUIRE(messages.size() == 2);
  CHECK(messages[0].role == "system");
  CHECK(messages[0].content == "You are helpful.\n\n" + tlm::tools::system_section(tools));
  CHECK(o.grammar_trigger == tlm::tools::trigger);
  CHECK(admits(o, weather));
  CHECK(admits(o, weather + "\n" + now));
  std::string most = now;
  for (std::size_t i = 1; i < tlm::tools::max_calls; ++i) most += "\n" + now;
  CHECK(admits(o, most));
  CHECK(!admits(o, most + "\n" + now));

  // One call only without parallel; required binds from the first token (no trigger).
  tlm::generation_options single;
  messages = asked;
  REQUIRE(tlm::tools::apply(tools, {choice::kind::required, {}}, false, messages, "", single));
  CHECK(messages[0].content == tlm::tools::system_section(tools));
  CHECK(single.grammar_trigger.empty());
  CHECK(admits(single, now));
  CHECK(!admits(single, now + "\n" + now));

  // Named: that function's calls only.
  tlm::generation_options named;
  messages = asked;
  REQUIRE(tlm::tools::apply(tools, {choice::kind::named, "now"}, true, messages, "", named));
  CHECK(admits(named, now + "\n" + now));
  CHECK(!admits(named, weather));

  // none: neither the section nor a grammar, though the tools are still checked.
  tlm::generation_options untouched;
  messages = asked;
  CHECK(!tlm::tools::apply(tools, {choice::kind::none, {}}, true, messages, "", untouched));
  CHECK(messages.size() == 1);
  CHECK(!untouched.grammar);
  CHECK_THROWS_AS(tlm::tools::apply(json::parse(R"([{"type":"retrieval"}])"), {choice::kind::none, {}}, true, messages, "",
                                    untouched),
                  tlm::tools::tool_error);
  // No tools: nothing for auto; a refusal naming tool_choice when a call is asked.
  CHECK(!tlm::tools::apply(json::array(), {}, true, messages, "", untouched));
  CHECK(messages.size() == 1);
  const auto refused = [&](const json& t, const choice& c, tlm::generation_options opts, const std::string& field,
                           const std::string& message) {
    auto m = asked;
    try {
      tlm::tools::apply(t, c, true, m, "", opts);
      FAIL("accepted");
    } catch (const tlm::tools::tool_error& e) {
      CHECK(e.field == field);
      CHECK(std::string(e.what()) == message);
    }
  };
  refused(json::array(), {choice::kind::required, {}}, {}, "tool_choice",
          "'tool_choice' asks for a tool call, but 'tools' gives no tools");
  refused(tools, {choice::kind::named, "fly"}, {}, "tool_choice", "'tool_choice' names the function 'fly', which 'tools' does not hold");
  tlm::generation_options schema;
  schema.grammar = std::make_shared<const tlm::json_grammar>();
  // A grammar already held is not a tool's fault: its own type, which each caller words
  // in its API's terms (serve: 'response_format'; Python: json_schema).
  auto m = asked;
  CHECK_THROWS_WITH_AS(tlm::tools::apply(tools, {}, true, m, "", schema),
                       "tools and a response format cannot hold one reply together; give one of them",
                       tlm::tools::grammar_conflict);
  CHECK((m.size() == asked.size() && m[0].role == asked[0].role && m[0].content == asked[0].content));
}

}  // namespace test_tools
