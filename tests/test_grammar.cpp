// Constrained output: the JSON recognizer by itself (what it admits, what it refuses,
// how far a prefix is from a document), schemas that admit nothing are errors, and
// 100 of 100 sampled outputs at temperature 1 parse (nlohmann::json) and validate.
#include <doctest/doctest.h>

#include <tlm/generate.hpp>
#include <tlm/generation/json_schema.hpp>
#include <tlm/generation/tools.hpp>
#include <tlm/serving/scheduler.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "fixture.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_grammar {

using C = tlm::smollm2_135m;

namespace {

bool admits(const tlm::json_grammar& g, std::string_view text) {
  auto s = g.start();
  return g.feed(s, text) && g.can_end(s);
}
bool prefix(const tlm::json_grammar& g, std::string_view text) {
  auto s = g.start();
  return g.feed(s, text);
}

const char* person_schema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "height": {"type": "number"},
    "student": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1}
  },
  "required": ["name", "age", "height", "student", "color", "tags"]
})";

bool validates(const nlohmann::json& j) {
  if (!j.is_object() || j.size() != 6) return false;
  if (!j.contains("name") || !j["name"].is_string()) return false;
  if (!j.contains("age") || !j["age"].is_number_integer()) return false;
  if (!j.contains("height") || !j["height"].is_number()) return false;
  if (!j.contains("student") || !j["student"].is_boolean()) return false;
  if (!j.contains("color") || !j["color"].is_string()) return false;
  const std::string c = j["color"];
  if (c != "red" && c != "green" && c != "blue") return false;
  if (!j.contains("tags") || !j["tags"].is_array() || j["tags"].empty()) return false;
  for (const auto& t : j["tags"])
    if (!t.is_string()) return false;
  return true;
}

}  // namespace

TEST_CASE("the JSON recognizer admits compact JSON and nothing else") {
  const tlm::json_grammar any;
  for (const char* ok : {"0", "-12.5e+3", "\"a\\\"b\\u00e9\"", "true", "null", "[]", "[1,[2,{}]]", "{\"a\":1,\"b\":[true]}",
                         "{}", "\"\""})
    CHECK_MESSAGE(admits(any, ok), ok);
  for (const char* bad : {"1e123", "01", "-", "1.", "[1,]", "{\"a\"}", "{a:1}", "tru", "[1 ]", "\"\x01\"", "1 ", "{\"a\":1,}", "[[[[[0]]]]]"})
    CHECK_MESSAGE(!admits(any, bad), bad);
  CHECK(prefix(any, "{\"ab"));
  CHECK(!prefix(any, "}"));
  auto s = any.start();
  CHECK(any.min_to_finish(s) == 1);
  REQUIRE(any.feed(s, "{\"ab"));
  CHECK(any.min_to_finish(s) == 4);  // "":0} less the open key: "ab" + `":0}`
  REQUIRE(any.feed(s, "\":[1,"));
  CHECK(any.min_to_finish(s) == 3);  // 0]}
}

TEST_CASE("every control byte 0x00-0x1f is refused unescaped inside a JSON string, key or schema string") {
  const tlm::json_grammar any;
  const tlm::json_grammar person(tlm::json_schema::from_text(person_schema));
  // The boundaries are admitted, so a refusal below is the byte's, not the string's.
  CHECK(admits(any, "\"a b\""));  // 0x20, the first byte allowed
  CHECK(admits(any, "\"a~b\""));  // 0x7e
  CHECK(admits(any, "\"a\\u001fb\""));  // the escaped form of 0x1f is fine
  CHECK(prefix(person, "{\"name\":\"a b"));
  for (int b = 0; b < 0x20; ++b) {
    const std::string raw(1, static_cast<char>(b));  // std::string, so 0x00 is a byte, not an end
    INFO("byte ", b, " (decimal)");
    CHECK(!prefix(any, "\"a" + raw));
    CHECK(!admits(any, "\"a" + raw + "b\""));
    CHECK(!admits(any, "[\"" + raw + "\"]"));
    CHECK(!prefix(any, "{\"k" + raw));  // an object key is a string too
    CHECK(!prefix(person, "{\"name\":\"a" + raw));
    CHECK(!prefix(person, "{\"name\":\"a\",\"age\":1,\"height\":1,\"student\":true,\"color\":\"red\",\"tags\":[\"" + raw));
  }
}

TEST_CASE("a schema fixes the properties, their order and their types") {
  const tlm::json_grammar g(tlm::json_schema::from_text(person_schema));
  CHECK(admits(g, R"({"name":"Ann","age":31,"height":1.7,"student":false,"color":"red","tags":["x"]})"));
  CHECK(!admits(g, R"({"name":"Ann","age":31.5,"height":1.7,"student":false,"color":"red","tags":["x"]})"));
  CHECK(!admits(g, R"({"name":"Ann","age":31,"height":1.7,"student":false,"color":"pink","tags":["x"]})"));
  CHECK(!admits(g, R"({"name":"Ann","age":31,"height":1.7,"student":false,"color":"red","tags":[]})"));
  CHECK(!admits(g, R"({"age":31,"name":"Ann","height":1.7,"student":false,"color":"red","tags":["x"]})"));
  auto s = g.start();
  CHECK(g.min_to_finish(s) == std::string(R"({"name":"","age":0,"height":0,"student":true,"color":"red","tags":[""]})").size());
}

TEST_CASE("a schema too deep or too big is refused before anything recurses over it or compiles it") {
  using tlm::json_schema::from_text;
  // 100,000 levels: compiled recursively (as before) this overflows the stack.
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"type":"array","items":)";
  deep += R"({"type":"string"})" + std::string(100000, '}');
  CHECK_THROWS_WITH_AS(from_text(deep), doctest::Contains("nested more than 32"), tlm::error);
  // The parsed value is checked without recursion too (nlohmann parses iteratively).
  CHECK_THROWS_WITH_AS(tlm::json_schema::from_json(nlohmann::ordered_json::parse(deep)), doctest::Contains("nested more than 32"),
                       tlm::error);
  std::string wide = R"({"type":"object","properties":{)", required;
  for (int i = 0; i < 600; ++i) {
    wide += (i ? ",\"p" : "\"p") + std::to_string(i) + R"(":{"type":"string"})";
    required += (i ? ",\"p" : "\"p") + std::to_string(i) + "\"";
  }
  wide += "},\"required\":[" + required + "]}";
  CHECK_THROWS_WITH_AS(from_text(wide), doctest::Contains("more than 1024 JSON values"), tlm::error);
  // Brackets inside strings, escaped quotes included, are not nesting.
  CHECK(tlm::json_nesting_depth(R"({"a":"[[\"{{","b":[{}]})") == 3);
  CHECK(tlm::json_nesting_depth(std::string(1000, '['), 40) == 41);  // stops once past the limit
}

TEST_CASE("a schema outside the subset, or one that admits nothing, is an error") {
  using tlm::json_schema::from_text;
  CHECK_THROWS_WITH_AS(from_text(R"({"enum": []})"), doctest::Contains("admits nothing"), tlm::error);
  CHECK_THROWS_WITH_AS(from_text(R"({"type":"object","properties":{},"required":["a"]})"), doctest::Contains("nothing is admitted"),
                       tlm::error);
  CHECK_THROWS_WITH_AS(tlm::json_grammar(from_text(R"({"type":"array","items":{"type":"string"},"minItems":100})")),
                       doctest::Contains("nothing is admitted"), tlm::error);
  CHECK_THROWS_WITH_AS(from_text(R"({"type":"string","pattern":"a+"})"), doctest::Contains("\"pattern\" is not supported"),
                       tlm::error);
  CHECK_THROWS_WITH_AS(from_text(R"({"type":"object","properties":{"a":{"type":"string"}}})"),
                       doctest::Contains("optional"), tlm::error);
  CHECK_THROWS_AS(from_text("{"), tlm::error);
  // A budget too small for the shortest document is an error before any token, not a hang.
  auto& m = tlm_test::shared_model<tlm::model<C>>();
  const auto& tok = tlm_test::shared_tokenizer<tlm::model<C>>();
  tlm::generator gen(m, tok);
  tlm::generation_options o{.max_tokens = 10};
  o.grammar = std::make_shared<const tlm::json_grammar>(tlm::json_schema::from_text(person_schema));
  CHECK_THROWS_WITH_AS(gen.generate("x", o), doctest::Contains("raise max_tokens"), tlm::error);
}

TEST_CASE("100 of 100 outputs sampled at temperature 1 parse, and validate against the schema") {
  // The samples are independent, so they run through the scheduler, 16 sequences decoded
  // together: a batched step reads the weights once for all its rows, and the 200 replies
  // took 65 s one at a time on the 2-vCPU Xeon. Each reply is still one sequence sampled
  // under the grammar's mask, from its own seed; the generator's path runs grammars in
  // the other cases here.
  auto& m = tlm_test::shared_model<tlm::model<C>>();
  const auto& tok = tlm_test::shared_tokenizer<tlm::model<C>>();
  struct run {
    const char* what;
    std::shared_ptr<const tlm::json_grammar> grammar;
    const char* prompt;
    std::size_t max_tokens;
    bool schema;
  };
  const run runs[] = {
      {"any JSON value", std::make_shared<const tlm::json_grammar>(), "Some JSON data: ", 40, false},
      {"the person schema", std::make_shared<const tlm::json_grammar>(tlm::json_schema::from_text(person_schema)),
       "A person as JSON: ", 90, true},
  };
  constexpr std::size_t samples = 100;
  for (const auto& r : runs) {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<tlm::sequence_outcome> outcomes(samples);
    std::size_t left = samples;
    const auto t0 = std::chrono::steady_clock::now();
    {
      tlm::scheduler<C> s(m, tok, {.parallel = 16, .queue = samples});
      const auto prompt = tok.encode(r.prompt);
      for (std::size_t i = 0; i < samples; ++i) {
        tlm::sequence_request q{.prompt = prompt, .options = {.max_tokens = r.max_tokens}};
        q.options.sample = {.temperature = 1.0f, .seed = 1000 + i};
        q.options.grammar = r.grammar;
        q.stop_ids.assign(tok.end_of_generation().begin(), tok.end_of_generation().end());
        q.on_done = [&, i](tlm::sequence_outcome& out) {
          std::lock_guard lock(mu);
          outcomes[i] = std::move(out);
          --left;
          cv.notify_all();
        };
        REQUIRE(s.submit(std::move(q)) == tlm::admission::accepted);
      }
      std::unique_lock lock(mu);
      REQUIRE(cv.wait_for(lock, std::chrono::minutes(10), [&] { return left == 0; }));
    }
    int parsed = 0, valid = 0;
    std::size_t tokens = 0;
    std::string example;
    for (std::size_t i = 0; i < samples; ++i) {
      const auto& out = outcomes[i];
      REQUIRE(!out.error);
      tokens += out.result.ids.size();
      CHECK(out.result.reason == tlm::stop_reason::eos);
      try {
        const auto j = nlohmann::json::parse(out.result.text);
        ++parsed;
        if (!r.schema || validates(j)) ++valid;
        else FAIL_CHECK("does not validate: " << out.result.text);
      } catch (const nlohmann::json::exception&) {
        FAIL_CHECK("does not parse: " << out.result.text);
      }
      if (i < 3) example += "\n  " + out.result.text;
    }
    // Different seeds, different replies: the samples are not one reply repeated.
    std::vector<std::string> texts;
    for (const auto& o : outcomes) texts.push_back(o.result.text);
    std::sort(texts.begin(), texts.end());
    const auto distinct = static_cast<std::size_t>(std::unique(texts.begin(), texts.end()) - texts.begin());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(std::string(r.what) << ": " << parsed << "/100 parse, " << valid << "/100 validate, " << distinct
                   << " distinct; " << tokens << " tokens in " << secs << " s; e.g." << example);
    CHECK(parsed == 100);
    CHECK(valid == 100);
    CHECK(distinct > samples / 2);
  }
}

namespace {
// Two tools as the server writes their calls: a sequence per tool, one_of over them.
tlm::json_node tool_calls() {
  using namespace tlm::json_schema;
  const auto call = [](const std::string& name, tlm::json_node args) {
    return sequence({{"<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": ", std::move(args)}}, "}\n</tool_call>");
  };
  return one_of({call("get_weather", object({{"city", string()}, {"days", integer()}})),
                 call("get", object({{"key", enumeration({"\"a\"", "\"b\""})}})),
                 call("now", object({}))});
}
}  // namespace

TEST_CASE("a grammar's copies share its tree: a state outlives the grammar that made it, and the fewest characters to finish agree") {
  using namespace tlm::json_schema;
  auto made = std::make_unique<tlm::json_grammar>(repeat(tool_calls(), "\n", 1, 3));
  const tlm::json_grammar copy = *made;
  const std::string first = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Pa";
  auto st = made->start();
  REQUIRE(made->feed(st, first));
  const std::size_t need = made->min_to_finish(st);
  made.reset();  // the state points into the tree, which the copy holds (ASan would see a stale pointer)
  CHECK(copy.min_to_finish(st) == need);
  // '"' closes the city, ',"days":0' and '}}\n</tool_call>' follow: 1 + 9 + 15.
  CHECK(need == 25);
  REQUIRE(copy.feed(st, "ris\",\"days\":3}}\n</tool_call>"));
  CHECK(copy.can_end(st));
  CHECK(copy.min_to_finish(st) == 0);
  // Before the first byte: the shortest whole reply is the shortest call ("now").
  CHECK(copy.min_to_finish(copy.start()) == std::string("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>").size());
}

TEST_CASE("a sequence writes its texts exactly around its values, and one_of picks a sequence by its first text") {
  const tlm::json_grammar g(tool_calls());
  CHECK(admits(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":3}}\n</tool_call>"));
  CHECK(admits(g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"key\":\"b\"}}\n</tool_call>"));
  CHECK(admits(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  // "get" and "get_weather" share a prefix up to the closing quote, which tells them apart.
  CHECK(prefix(g, "<tool_call>\n{\"name\": \"get"));
  CHECK(!admits(g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\":\"Paris\",\"days\":3}}\n</tool_call>"));
  CHECK(!admits(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"key\":\"a\"}}\n</tool_call>"));
  CHECK(!prefix(g, "<tool_call>\n{\"name\": \"delete_everything\""));
  CHECK(!prefix(g, "<tool_call> {"));
  CHECK(!admits(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call"));  // tail unfinished
  CHECK(!prefix(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>x"));  // nothing after the tail
  // The distance to a document counts the texts still to write.
  auto st = g.start();
  const std::string head = "<tool_call>\n{\"name\": \"now\", \"arguments\": ";
  REQUIRE(g.feed(st, head));
  CHECK(g.min_to_finish(st) == std::string("{}}\n</tool_call>").size());
  CHECK(g.min_to_finish(g.start()) == head.size() + std::string("{}}\n</tool_call>").size());
  auto mid = g.start();
  REQUIRE(g.feed(mid, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Pa"));
  CHECK(g.min_to_finish(mid) == std::string("\",\"days\":0}}\n</tool_call>").size());

  // Alternatives one of which begins another cannot be told apart: refused.
  using namespace tlm::json_schema;
  CHECK_THROWS_WITH_AS(tlm::json_grammar(one_of({sequence({{"ab", integer()}}, ""), sequence({{"abc", integer()}}, "")})),
                       doctest::Contains("start alike"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::json_grammar(one_of({})), doctest::Contains("1 to 64 alternatives"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::json_grammar(one_of({integer()})), doctest::Contains("must be a sequence"), tlm::error);
}

TEST_CASE("repeat: items with a separator between, as many as allowed, each whole before the document may end") {
  using namespace tlm::json_schema;
  const std::string now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  const std::string get = "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"key\":\"a\"}}\n</tool_call>";
  const tlm::json_grammar g(repeat(tool_calls(), "\n", 1, 3));
  CHECK(admits(g, now));
  CHECK(admits(g, now + "\n" + get));
  CHECK(admits(g, get + "\n" + now + "\n" + now));
  CHECK(!admits(g, now + "\n"));                                   // a separator promises another item
  CHECK(!admits(g, now + "\n" + get.substr(0, 20)));
  CHECK(!prefix(g, now + "\n" + now + "\n" + now + "\n"));        // a fourth: past max_items
  CHECK(!prefix(g, now + " "));                                    // only the separator follows an item
  CHECK(!prefix(g, now + "\n\n"));
  CHECK(!admits(g, ""));
  // The distance to a document: the item begun, the separator's rest and its item, and
  // the items still owed to min_items.
  const std::size_t shortest = now.size();
  CHECK(g.min_to_finish(g.start()) == shortest);
  auto st = g.start();
  REQUIRE(g.feed(st, now));
  CHECK(g.can_end(st));
  CHECK(g.min_to_finish(st) == 0);
  REQUIRE(g.feed(st, "\n"));
  CHECK(!g.can_end(st));
  CHECK(g.min_to_finish(st) == shortest);
  REQUIRE(g.feed(st, "<tool_call>\n{\"name\": \"no"));
  CHECK(g.min_to_finish(st) == shortest - std::string("<tool_call>\n{\"name\": \"no").size());

  // min_items 2, a separator of two characters: the document owes both items.
  const tlm::json_grammar two(repeat(tool_calls(), ";\n", 2, 4));
  CHECK(two.min_to_finish(two.start()) == 2 * shortest + 2);
  CHECK(!admits(two, now));
  CHECK(admits(two, now + ";\n" + now));
  auto half = two.start();
  REQUIRE(two.feed(half, now + ";"));
  CHECK(two.min_to_finish(half) == 1 + shortest);
  auto first = two.start();
  REQUIRE(two.feed(first, now.substr(0, 5)));
  CHECK(two.min_to_finish(first) == (shortest - 5) + 2 + shortest);

  // Items whose end is not known when they are written, an empty separator and counts out
  // of order are refused when the grammar is made.
  CHECK_THROWS_WITH_AS(tlm::json_grammar(repeat(integer(), "\n", 1, 2)), doctest::Contains("ends in a text"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::json_grammar(repeat(sequence({{"a", integer()}}, ""), "\n", 1, 2)),
                       doctest::Contains("ends in a text"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::json_grammar(repeat(tool_calls(), "", 1, 2)), doctest::Contains("separator"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::json_grammar(repeat(tool_calls(), "\n", 0, 2)), doctest::Contains("1 <= min_items"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::json_grammar(repeat(tool_calls(), "\n", 3, 2)), doctest::Contains("1 <= min_items"), tlm::error);
}

TEST_CASE("a grammar with a trigger binds a reply that begins with it and leaves any other reply free") {
  const auto& tok = tlm_test::shared_tokenizer<tlm::model<C>>();
  const auto g = std::make_shared<const tlm::json_grammar>(tool_calls());
  const std::vector<std::int32_t> stop(tok.end_of_generation().begin(), tok.end_of_generation().end());
  // decode_state alone, fed logits that lead it: the first steps favour the given tokens
  // strongly, the rest are flat, so that temperature 1 samples anything the mask allows.
  const auto run = [&](const std::vector<std::int32_t>& lead, std::uint64_t seed) {
    tlm::generation_options o{.max_tokens = 120};
    o.sample = {.temperature = 1.0f, .seed = seed};
    o.grammar = g;
    o.grammar_trigger = "<tool_call>";
    tlm::decode_state st(tok, o, stop, {}, {});
    std::vector<float> logits(tok.vocab_size());
    for (std::size_t step = 0;; ++step) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      if (step < lead.size()) logits[static_cast<std::size_t>(lead[step])] = 30.0f;
      if (!st.next(logits, step, 1000)) break;
    }
    return st.finish();
  };
  const auto trigger = tok.encode("<tool_call>");
  REQUIRE(trigger.size() > 1);  // spelled in pieces: the undecided steps are exercised
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const auto out = run(trigger, seed);
    CAPTURE(out.text);
    auto st = g->start();
    CHECK((g->feed(st, out.text) && g->can_end(st)));
    CHECK(out.reason == tlm::stop_reason::eos);
  }
  // A reply that leaves the trigger behind at its second piece is free: flat logits then
  // sample any token of the vocabulary, step after step, to the token limit.
  const auto elsewhere = tok.encode("<b");
  REQUIRE(elsewhere.size() == 2);
  REQUIRE(elsewhere[0] == trigger[0]);
  for (std::uint64_t seed = 0; seed < 5; ++seed) {
    const auto out = run(elsewhere, seed);
    CHECK(out.text.starts_with("<b"));
    CHECK(out.ids.size() > 100);
    CHECK(out.reason == tlm::stop_reason::max_tokens);
  }
  // Calls several to a reply: logits that favour a newline wherever the mask allows one
  // give calls until the budget has no room for another, each whole, then the end. (The
  // budget is max_tokens - 1 characters: 399 hold a first call of at most about 130 and
  // then a second of at least 55.)
  const auto calls = std::make_shared<const tlm::json_grammar>(tlm::json_schema::repeat(tool_calls(), "\n", 1, 16));
  const auto newline = tok.encode("\n");
  REQUIRE(newline.size() == 1);
  for (std::uint64_t seed = 0; seed < 5; ++seed) {
    tlm::generation_options o{.max_tokens = 400};
    o.sample = {.temperature = 1.0f, .seed = seed};
    o.grammar = calls;
    tlm::decode_state st(tok, o, stop, {}, {});
    std::vector<float> logits(tok.vocab_size());
    for (std::size_t step = 0;; ++step) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      logits[static_cast<std::size_t>(newline[0])] = 30.0f;
      if (!st.next(logits, step, 1000)) break;
    }
    const auto out = st.finish();
    CAPTURE(out.text);
    auto g2 = calls->start();
    CHECK((calls->feed(g2, out.text) && calls->can_end(g2)));
    CHECK(out.reason == tlm::stop_reason::eos);
    std::size_t n = 0;
    for (std::size_t at = out.text.find("<tool_call>"); at != std::string::npos; at = out.text.find("<tool_call>", at + 1)) ++n;
    CHECK(n >= 2);
  }
  // Without the trigger the same grammar binds every reply from its first token.
  tlm::generation_options o{.max_tokens = 120};
  o.sample = {.temperature = 1.0f, .seed = 9};
  o.grammar = g;
  tlm::decode_state bound(tok, o, stop, {}, {});
  std::vector<float> flat(tok.vocab_size(), 0.0f);
  for (std::size_t step = 0; bound.next(flat, step, 1000); ++step) {
  }
  auto st = g->start();
  CHECK((g->feed(st, bound.finish().text) && g->can_end(st)));
}

namespace {
// allowed() by its definition: every text token fed to a copy of the state, admitted when
// the grammar takes it and the document can still be finished within the budget.
std::vector<std::uint8_t> allowed_by_definition(const tlm::json_grammar& g, const tlm::json_grammar::state& s,
                                                const tlm::tokenizer& tok, std::size_t budget) {
  std::vector<std::uint8_t> out(tok.vocab_size(), 0);
  for (std::size_t id = 0; id < out.size(); ++id) {
    const auto i = static_cast<std::int32_t>(id);
    if (const auto t = tok.type(i);
        t == tlm::token_type::control || t == tlm::token_type::unknown || t == tlm::token_type::unused)
      continue;
    const std::string_view bytes = tok.token_bytes(i);
    if (bytes.empty()) continue;
    auto next = s;
    if (g.feed(next, bytes) && next.chars + g.min_to_finish(next) <= budget) out[id] = 1;
  }
  if (g.can_end(s))
    for (const std::int32_t id : tok.end_of_generation()) out[static_cast<std::size_t>(id)] = 1;
  return out;
}
}  // namespace

TEST_CASE("allowed() equals its definition at every prefix of documents, with tight and loose budgets") {
  // allowed() skips work: a token's first byte rules out most of the vocabulary, a token
  // of plain characters inside a string is not fed, and the frames a token leaves alone
  // are costed once. Each shortcut is checked here against feeding every token.
  const auto& tok = tlm_test::shared_tokenizer<tlm::model<C>>();
  struct doc {
    tlm::json_grammar grammar;
    std::string text;
  };
  const doc docs[] = {
      // Strings of at most 7 characters (the longest key), so that tokens meet the limit; escapes.
      {tlm::json_grammar(tlm::json_schema::from_text(person_schema), {.max_string = 7}),
       R"({"name":"Ab\"c\u0041","age":-12,"height":1.5e3,"student":true,"color":"green","tags":["a","bcdefgh"]})"},
      {tlm::json_grammar(), R"([{"k":[1,-2.5e-3,null]},"x y",false,{}])"},
      {tlm::json_grammar(tool_calls()), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":3}}\n</tool_call>"},
  };
  std::size_t states = 0, admitted = 0;
  std::vector<std::uint8_t> got;
  for (const auto& d : docs) {
    auto s = d.grammar.start();
    for (std::size_t at = 0; at <= d.text.size(); ++at) {
      if (at > 0) REQUIRE(d.grammar.feed(s, d.text.substr(at - 1, 1)));
      const std::size_t tight = s.chars + d.grammar.min_to_finish(s);
      for (const std::size_t budget : {tight, tight + 2, std::size_t{1000}}) {
        d.grammar.allowed(s, tok, budget, got);
        const auto want = allowed_by_definition(d.grammar, s, tok, budget);
        CAPTURE(d.text.substr(0, at));
        CAPTURE(budget);
        CHECK(got == want);
        ++states;
        admitted += static_cast<std::size_t>(std::count(want.begin(), want.end(), std::uint8_t{1}));
      }
    }
  }
  MESSAGE(states << " states compared; " << admitted << " admitted tokens in all");
  CHECK(admitted > 100000);  // the string states admit most of the vocabulary
}

TEST_CASE("added tokens that are text (user-defined, as Qwen2.5's <tool_call>) are written whole, control tokens never") {
  // SmolLM2's vocabulary with the two tags added as user-defined tokens, as Qwen2.5's
  // file has them (tokenizer.json's added tokens with special: false).
  const auto& f = tlm_test::shared_model<tlm::model<C>>().file();
  const auto& base = tlm_test::shared_tokenizer<tlm::model<C>>();
  std::vector<std::string> tokens, merges;
  std::vector<std::int32_t> types;
  for (const auto t : f.get_string_array("tokenizer.ggml.tokens")) tokens.emplace_back(t);
  for (const auto t : f.get_int_array("tokenizer.ggml.token_type")) types.push_back(static_cast<std::int32_t>(t));
  for (const auto m : f.get_string_array("tokenizer.ggml.merges")) merges.emplace_back(m);
  const auto open_id = static_cast<std::int32_t>(tokens.size()), close_id = open_id + 1;
  tokens.insert(tokens.end(), {"<tool_call>", "</tool_call>"});
  types.insert(types.end(), {4, 4});
  const auto tok = tlm::tokenizer::from_vocab(tokens, types, merges, {.bos = base.bos(), .eos = base.eos()});
  REQUIRE(tok.encode("<tool_call>", {.parse_special = true}) == std::vector<std::int32_t>{open_id});
  const std::vector<std::int32_t> stop(tok.end_of_generation().begin(), tok.end_of_generation().end());
  REQUIRE(!stop.empty());

  // Tools whose arguments hold no free string, so that every tag written is structure.
  using namespace tlm::json_schema;
  const auto g = std::make_shared<const tlm::json_grammar>(
      repeat(one_of({tlm::tools::call_node("now", object({})),
                     tlm::tools::call_node("get", object({{"key", enumeration({"\"a\"", "\"b\""})}}))}),
             "\n", 1, 4));
  std::vector<std::uint8_t> allowed;
  g->allowed(g->start(), tok, 1000, allowed);
  CHECK(allowed[static_cast<std::size_t>(open_id)] == 1);
  CHECK(allowed[static_cast<std::size_t>(close_id)] == 0);
  auto st = g->start();
  REQUIRE(g->feed(st, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"));
  g->allowed(st, tok, 1000, allowed);
  CHECK(allowed[static_cast<std::size_t>(close_id)] == 1);
  CHECK(allowed[static_cast<std::size_t>(open_id)] == 0);
  for (const std::int32_t id : stop) CHECK(allowed[static_cast<std::size_t>(id)] == 0);  // not yet whole
  // Every control token stays out, wherever the document stands.
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == 3 && std::find(stop.begin(), stop.end(), static_cast<std::int32_t>(i)) == stop.end()) {
      CAPTURE(tokens[i]);
      CHECK(allowed[i] == 0);
    }

  // A decode that favours the tags wherever the mask allows them writes each as its one
  // token, under the trigger as without it, and the text reads back as the same calls.
  for (const bool trigger : {true, false})
    for (std::uint64_t seed = 0; seed < 5; ++seed) {
      tlm::generation_options o{.max_tokens = 300};
      o.sample = {.temperature = 1.0f, .seed = seed};
      o.grammar = g;
      if (trigger) o.grammar_trigger = "<tool_call>";
      tlm::decode_state d(tok, o, stop, {}, {});
      std::vector<float> logits(tok.vocab_size());
      for (std::size_t step = 0;; ++step) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        logits[static_cast<std::size_t>(open_id)] = 30.0f;
        // Under the trigger a first token other than the trigger's frees the reply.
        if (step > 0) logits[static_cast<std::size_t>(close_id)] = 30.0f;
        if (!d.next(logits, step, 1000)) break;
      }
      const auto out = d.finish();
      CAPTURE(out.text);
      CHECK(out.reason == tlm::stop_reason::eos);
      auto doc = g->start();
      CHECK((g->feed(doc, out.text) && g->can_end(doc)));
      const auto opens = std::count(out.ids.begin(), out.ids.end(), open_id);
      CHECK(opens >= 1);
      CHECK(std::count(out.ids.begin(), out.ids.end(), close_id) == opens);
      CHECK(out.ids.front() == open_id);
      const auto calls = tlm::tools::parse_calls(out.text);
      REQUIRE(calls.has_value());
      CHECK(static_cast<std::ptrdiff_t>(calls->size()) == opens);
      // Tokenized again (a chat history) the text gives the same tags.
      const auto again = tok.encode(out.text, {.parse_special = true});
      CHECK(std::count(again.begin(), again.end(), open_id) == opens);
    }
}

}  // namespace test_grammar
