// apply_chat_template against jinja2's rendering of the model's template (fixtures from
// tests/reference/make_tokenizer_fixtures.py).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tlm/chat.hpp"
#include "tlm/gguf.hpp"

namespace {

std::string read_fixture(const std::string& name) {
  const std::string path = std::string(TLM_FIXTURES) + "/tokenizer/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot read fixture " << path << "; regenerate with tests/reference/make_tokenizer_fixtures.py");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string model_template() {
  if (!std::filesystem::exists(TLM_MODEL_PATH)) FAIL("the model file " TLM_MODEL_PATH " is missing; run scripts/fetch-model");
  const tlm::gguf::file f(TLM_MODEL_PATH);
  return std::string(f.get_string("tokenizer.chat_template"));
}

}  // namespace

TEST_CASE("the fixture's template is the model's template") { CHECK(read_fixture("template.txt") == model_template()); }

TEST_CASE("renders as jinja2 does, for every fixture conversation") {
  const std::string tmpl = model_template();
  const std::string data = read_fixture("chat.txt");
  std::size_t pos = 0, cases = 0;
  const auto line = [&]() {
    const auto nl = data.find('\n', pos);
    REQUIRE(nl != std::string::npos);
    std::string l = data.substr(pos, nl - pos);
    pos = nl + 1;
    return l;
  };
  const auto bytes = [&](std::size_t n) {
    REQUIRE(pos + n + 1 <= data.size());
    std::string b = data.substr(pos, n);
    pos += n + 1;
    return b;
  };
  bool saw_default_system = false, saw_own_system = false;
  while (pos < data.size()) {
    std::istringstream head(line());
    char kind = 0;
    std::size_t n = 0;
    int gen = 0;
    head >> kind >> n >> gen;
    REQUIRE(kind == 'C');
    std::vector<tlm::chat_message> msgs;
    for (std::size_t i = 0; i < n; ++i) {
      std::istringstream sizes(line());
      std::size_t rl = 0, cl = 0;
      sizes >> rl >> cl;
      const std::string rc = bytes(rl + cl);
      msgs.push_back({rc.substr(0, rl), rc.substr(rl)});
    }
    const std::string expected = bytes(std::stoul(line()));
    CAPTURE(expected);
    CHECK(tlm::apply_chat_template(tmpl, msgs, gen != 0) == expected);
    if (expected.find("named SmolLM") != std::string::npos) saw_default_system = true;
    if (!msgs.empty() && msgs[0].role == "system") saw_own_system = true;
    ++cases;
  }
  CHECK(cases >= 10);
  CHECK(saw_default_system);
  CHECK(saw_own_system);
}

TEST_CASE("the default system message is inserted only when the first message is not a system message") {
  const std::string tmpl = model_template();
  const std::vector<tlm::chat_message> user_only = {{"user", "Hi"}};
  CHECK(tlm::apply_chat_template(tmpl, user_only, true) ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<tlm::chat_message> with_system = {{"system", "S"}, {"user", "U"}};
  CHECK(tlm::apply_chat_template(tmpl, with_system, false) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
  CHECK(tlm::apply_chat_template(tmpl, {}, true) == "<|im_start|>assistant\n");
}

TEST_CASE("the same template written with \\n escapes, and plain ChatML, are recognised") {
  std::string tmpl = model_template();
  std::string escaped;
  for (const char c : tmpl) escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
  const std::vector<tlm::chat_message> msgs = {{"user", "Hi"}};
  CHECK(tlm::apply_chat_template(escaped, msgs, true) == tlm::apply_chat_template(tmpl, msgs, true));
  const std::string plain =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  CHECK(tlm::apply_chat_template(plain, msgs, true) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("any other template is refused with a clear error") {
  const std::vector<tlm::chat_message> msgs = {{"user", "Hi"}};
  const std::string llama3 =
      "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
      "message['content'] + '<|eot_id|>' }}{% endfor %}";
  try {
    (void)tlm::apply_chat_template(llama3, msgs, true);
    FAIL("a Llama 3 template was accepted");
  } catch (const tlm::error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("not supported") != std::string::npos);
    CHECK(msg.find("start_header_id") != std::string::npos);  // shows the template's start
  }
  CHECK_THROWS_AS((void)tlm::apply_chat_template("", msgs, true), tlm::error);
  std::string tampered = model_template();
  tampered.replace(tampered.find("loop.first"), 10, "loop.last ");
  CHECK_THROWS_AS((void)tlm::apply_chat_template(tampered, msgs, true), tlm::error);
}
