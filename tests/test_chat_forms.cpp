// The Mistral 7B / Large and Llama 3.0 chat forms, rendered by hand here (the reference
// check, tests/reference/check_chat_templates.py, compares them with jinja2 on the real
// templates; these pin the renderings down without Python).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <tlm/text/chat.hpp>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_chat_forms {

namespace {

using msgs = std::vector<tlm::chat_message>;

const msgs with_system = {{"system", "S"}, {"user", "Hi"}, {"assistant", " Hello "}, {"user", "More?"}};
const msgs without_system = {{"user", "Hi"}, {"assistant", " Hello "}, {"user", "More?"}};

std::string render(std::string_view form, const msgs& ms, bool gen) { return tlm::chat_template::named(form).render(ms, gen); }

// The concatenated content pieces: what training learns of the assistant's turns.
std::string contents(std::string_view form, const msgs& ms) {
  std::string s;
  for (const auto& p : tlm::chat_template::named(form).pieces(ms, tlm::chat_end::closed))
    if (p.k == tlm::chat_piece::kind::content) s += "[" + p.text + "]";
  return s;
}

// Whether rendering a conversation open, message by message, only ever appends: what
// chat_session needs to keep the earlier turns' tokens in its cache.
bool renders_by_appending(std::string_view form, const msgs& ms) {
  const auto t = tlm::chat_template::named(form);
  std::vector<tlm::chat_piece> before;
  for (std::size_t i = 1; i <= ms.size(); ++i) {
    const auto upto = t.pieces(std::span(ms).first(i), tlm::chat_end::open);
    if (upto.size() < before.size()) return false;
    for (std::size_t k = 0; k < before.size(); ++k)
      if (upto[k].text != before[k].text) return false;
    before = upto;
  }
  return true;
}

}  // namespace

TEST_CASE("mistral: [INST] as text, no system message, the template's own errors") {
  CHECK(render("mistral", without_system, true) == "<s>[INST] Hi [/INST] Hello </s>[INST] More? [/INST]");
  CHECK(render("mistral", without_system, false) == render("mistral", without_system, true));  // no generation prompt
  CHECK(render("mistral", {}, true) == "<s>");
  CHECK(contents("mistral", without_system) == "[ Hello ]");
  CHECK(renders_by_appending("mistral", without_system));
  CHECK_THROWS_WITH_AS((void)render("mistral", with_system, true),
                       doctest::Contains("chat template mistral: Conversation roles must alternate user/assistant/user/assistant/... "
                                         "(this template has no system message"),
                       tlm::error);
  // Each message is checked as the template reaches it: the alternation, then the role.
  CHECK_THROWS_WITH_AS((void)render("mistral", {{"user", "q"}, {"robot", "x"}, {"user", "q"}, {"user", "q"}}, true),
                       "chat template mistral: Only user and assistant roles are supported!", tlm::error);
  CHECK_THROWS_WITH_AS((void)render("mistral", {{"assistant", "a"}}, true),
                       "chat template mistral: Conversation roles must alternate user/assistant/user/assistant/...", tlm::error);
  CHECK(tlm::chat_template::named("mistral").end_marker() == "</s>");
}

TEST_CASE("mistral-v1: \" [INST] \", the system message in the first user message") {
  CHECK(render("mistral-v1", with_system, true) == "<s> [INST] S\n\nHi [/INST]  Hello </s> [INST] More? [/INST]");
  CHECK(render("mistral-v1", without_system, false) == "<s> [INST] Hi [/INST]  Hello </s> [INST] More? [/INST]");
  CHECK(render("mistral-v1", {{"system", "only"}}, true) == "<s>");  // no user message to carry it
  CHECK(contents("mistral-v1", with_system) == "[ Hello ]");
  CHECK(renders_by_appending("mistral-v1", with_system));
  CHECK_THROWS_WITH_AS((void)render("mistral-v1", {}, true), doctest::Contains("the conversation is empty"), tlm::error);
  CHECK_THROWS_WITH_AS((void)render("mistral-v1", {{"system", "S"}, {"user", "q"}, {"system", "late"}}, true),
                       "chat template mistral-v1: Only user and assistant roles are supported, with the exception of an "
                       "initial optional system message!",
                       tlm::error);
  CHECK_THROWS_WITH_AS((void)render("mistral-v1", {{"user", "q"}, {"user", "q"}}, true),
                       "chat template mistral-v1: After the optional system message, conversation roles must alternate "
                       "user/assistant/user/assistant/...",
                       tlm::error);
}

TEST_CASE("mistral-v3: control tokens, answers stripped, the system message in the last user message") {
  CHECK(render("mistral-v3", with_system, true) == "<s>[INST] Hi[/INST] Hello</s>[INST] S\n\nMore?[/INST]");
  // The system message is dropped when the conversation ends with an answer, as the template does.
  CHECK(render("mistral-v3", {{"system", "S"}, {"user", "Hi"}, {"assistant", "A"}}, false) == "<s>[INST] Hi[/INST] A</s>");
  CHECK(contents("mistral-v3", with_system) == "[Hello]");
  CHECK(renders_by_appending("mistral-v3", without_system));
  CHECK_FALSE(renders_by_appending("mistral-v3", with_system));  // chat_session refuses it, as Nemo's
  const msgs hi = {{"user", "Hi"}};
  const auto pieces = tlm::chat_template::named("mistral-v3").pieces(hi, tlm::chat_end::generation_prompt);
  REQUIRE(pieces.size() == 5);
  CHECK((pieces[1].k == tlm::chat_piece::kind::marker && pieces[1].text == "[INST]"));
  CHECK((pieces[4].k == tlm::chat_piece::kind::marker && pieces[4].text == "[/INST]"));
  CHECK_THROWS_WITH_AS((void)render("mistral-v3", {{"user", "q"}, {"tool", "{}"}}, true),
                       doctest::Contains("tool calls are not supported"), tlm::error);
  CHECK_THROWS_WITH_AS((void)render("mistral-v3", {{"user", "q"}, {"user", "q"}}, true),
                       doctest::Contains("After the optional system message, conversation roles must alternate"), tlm::error);
}

TEST_CASE("llama3.0: stripped messages, no dates, BOS with the first message") {
  const msgs ms = {{"system", " S "}, {"user", "Hi\n"}, {"assistant", " Hello "}};
  const std::string body =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>";
  const std::string prompt = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  CHECK(render("llama3.0", ms, false) == body);
  CHECK(render("llama3.0", ms, true) == body + prompt);
  CHECK(render("llama3.0", {}, true) == prompt);  // no message, so no BOS
  CHECK(render("llama3.0", {{"tool", "{}"}}, false) ==
        "<|begin_of_text|><|start_header_id|>tool<|end_header_id|>\n\n{}<|eot_id|>");  // any role is a header
  CHECK(contents("llama3.0", ms) == "[Hello]");
  CHECK(renders_by_appending("llama3.0", ms));
  CHECK(tlm::chat_template::named("llama3.0").end_marker() == "<|eot_id|>");
  CHECK(tlm::chat_template::named("llama3.0").render(ms, false, {.bos_token = "<B>"}).starts_with("<B><|start_header_id|>"));
}

}  // namespace test_chat_forms
