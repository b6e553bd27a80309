// apply_chat_template against jinja2's rendering of the model's template (fixtures from
// tests/reference/make_tokenizer_fixtures.py).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <tlm/format/gguf.hpp>
#include <tlm/text/chat.hpp>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_chat {

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
    CHECK(msg.find("--chat-template NAME") != std::string::npos);
    CHECK(msg.find("start_header_id") != std::string::npos);  // shows the template's start
  }
  CHECK_THROWS_AS((void)tlm::apply_chat_template("", msgs, true), tlm::error);
  std::string tampered = model_template();
  tampered.replace(tampered.find("loop.first"), 10, "loop.last ");
  CHECK_THROWS_AS((void)tlm::apply_chat_template(tampered, msgs, true), tlm::error);
}

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) FAIL("cannot read " << p.string() << "; run scripts/fetch-vocab");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const std::filesystem::path llama_cpp_dir = std::filesystem::path(TLM_MODEL_PATH).parent_path() / "llama.cpp";

std::string vocab_template(const std::string& name) {
  const tlm::gguf::file f((llama_cpp_dir / "vocab" / ("ggml-vocab-" + name + ".gguf")).string());
  return std::string(f.get_string("tokenizer.chat_template"));
}

// Every form whose test accepts the template (there must be exactly one).
std::vector<std::string> forms_matching(std::string_view text) {
  std::vector<std::string> names;
  const std::string t = tlm::detail::trimmed_template(text);
  for (const auto& f : tlm::detail::chat_forms)
    if (f.recognise(t)) names.emplace_back(f.name);
  return names;
}

}  // namespace

TEST_CASE("each fetched template is recognised as exactly one form") {
  const std::pair<const char*, const char*> files[] = {
      {"meta-llama-Llama-3.1-8B-Instruct", "llama3"}, {"meta-llama-Llama-3.2-3B-Instruct", "llama3"},
      {"Qwen-Qwen2.5-7B-Instruct", "qwen2.5"},       {"microsoft-Phi-3.5-mini-instruct", "phi3.5"},
      {"mistralai-Mistral-Nemo-Instruct-2407", "mistral-nemo"},
      // llama.cpp's copies in tests/test-chat-template.cpp (scripts/fetch-vocab).
      {"mistralai-Mistral-7B-Instruct-v0.2-pre-v1", "mistral"}, {"mistralai-Mistral-7B-Instruct-v0.2-v1", "mistral-v1"},
      {"mistralai-Mistral-Large-Instruct-2407-v3", "mistral-v3"}, {"meta-llama-Meta-Llama-3-Instruct", "llama3.0"}};
  for (const auto& [file_, form] : files) {
    const std::string file = file_;
    CAPTURE(file);
    const std::string text = read_file(llama_cpp_dir / "templates" / (std::string(file) + ".jinja"));
    CHECK(forms_matching(text) == std::vector<std::string>{form});
    CHECK(tlm::chat_template::recognise(text).name() == form);
  }
  // Llama 3.0's first template prints the generation prompt unasked, Meta's later one
  // (the same with {% if add_generation_prompt %} around it) only when asked.
  const std::string llama30 = read_file(llama_cpp_dir / "templates" / "meta-llama-Meta-Llama-3-Instruct.jinja");
  const std::string prompt = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";
  REQUIRE(llama30.ends_with(prompt));
  const std::string asked = llama30.substr(0, llama30.size() - prompt.size()) + "{% if add_generation_prompt %}" + prompt + "{% endif %}";
  CHECK(forms_matching(asked) == std::vector<std::string>{"llama3.0"});
  const std::vector<tlm::chat_message> hi = {{"user", "Hi"}};
  CHECK(tlm::apply_chat_template(llama30, hi, false).ends_with("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"));
  CHECK(tlm::apply_chat_template(asked, hi, false).ends_with("Hi<|eot_id|>"));
  CHECK(forms_matching(vocab_template("qwen2")) == std::vector<std::string>{"smollm2"});
  CHECK(tlm::chat_template::recognise(vocab_template("qwen2")).default_system() == "You are a helpful assistant");
  CHECK(forms_matching(vocab_template("phi-3")) == std::vector<std::string>{"phi3"});
  CHECK(forms_matching(model_template()) == std::vector<std::string>{"smollm2"});
  CHECK(tlm::chat_template::recognise(model_template()).default_system() ==
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

TEST_CASE("SmolLM3's template is none of the forms, and the error says how to pass one") {
  const std::string text = read_file(llama_cpp_dir / "templates" / "HuggingFaceTB-SmolLM3-3B.jinja");
  CHECK(forms_matching(text).empty());
  try {
    (void)tlm::chat_template::recognise(text);
    FAIL("SmolLM3's template was accepted");
  } catch (const tlm::error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("--chat-template NAME") != std::string::npos);
    CHECK(msg.find(tlm::chat_template_names()) != std::string::npos);
  }
}

TEST_CASE("Llama-2-like templates that render otherwise than Meta's format are refused") {
  // FusionNet's has no [INST] before the first user message and strips nothing; Vigogne's
  // adds a French default system message and one BOS only.
  for (const char* file : {"TheBloke-FusionNet_34Bx2_MoE-AWQ", "bofenghuang-vigogne-2-70b-chat"}) {
    CAPTURE(file);
    const std::string text = read_file(llama_cpp_dir / "templates" / (std::string(file) + ".jinja"));
    CHECK(forms_matching(text).empty());
  }
}

TEST_CASE("the refusal shows the template's start cut at a character's start") {
  // 119 bytes, then a two-byte character that the 120-byte cut would split.
  const std::string text = std::string(119, 'x') + "\xc3\xa9 and more";
  try {
    (void)tlm::chat_template::recognise(text);
    FAIL("the template was accepted");
  } catch (const tlm::error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("It begins: \"" + std::string(119, 'x') + "...\"") != std::string::npos);
  }
}

TEST_CASE("forms by name; an unknown name lists the names") {
  for (const auto& f : tlm::detail::chat_forms) CHECK(tlm::chat_template::named(f.name).name() == f.name);
  CHECK(tlm::chat_template_names() == "chatml, smollm2, qwen2.5, llama3, llama3.0, phi3, phi3.5, mistral, mistral-v1, mistral-v3, "
                                        "mistral-nemo, llama2, zephyr");
  CHECK_THROWS_WITH_AS((void)tlm::chat_template::named("vicuna"),
                       doctest::Contains("no such chat template; the names are chatml, smollm2"), tlm::error);
  // A file without a template is plain ChatML; a name overrides the file's template.
  CHECK(tlm::chat_template::of("").name() == "chatml");
  CHECK(tlm::chat_template::of("{{ unknown }}", "llama3").name() == "llama3");
}

TEST_CASE("Llama 3: the date lines, the date option, and Jinja's trim") {
  const auto t = tlm::chat_template::named("llama3");
  const std::vector<tlm::chat_message> msgs = {{"system", " S\n"}, {"user", "\xe3\x80\x80hi\xc2\xa0"}};
  CHECK(t.render(msgs, true) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(t.render(msgs, false, {.date_string = "01 Dec 2026"}).find("Today Date: 01 Dec 2026\n\n") != std::string::npos);
  CHECK(t.end_marker() == "<|eot_id|>");
  CHECK_THROWS_WITH_AS((void)t.render({}, true), doctest::Contains("empty"), tlm::error);
  const std::vector<tlm::chat_message> tool = {{"user", "q"}, {"tool", "{}"}};
  CHECK_THROWS_WITH_AS((void)t.render(tool, true), doctest::Contains("tool calls are not supported"), tlm::error);
}

TEST_CASE("python_strip removes what str.strip() removes, and keeps invalid bytes") {
  CHECK(tlm::detail::python_strip(" \t\n\v\f\r\x1c\x1f a b \xc2\x85\xe2\x80\xa8\xe3\x80\x80") == "a b");
  CHECK(tlm::detail::python_strip("\xe2\x80\x8b x") == "\xe2\x80\x8b x");  // U+200B is not whitespace in Python
  CHECK(tlm::detail::python_strip("\xff ") == "\xff");
  CHECK(tlm::detail::python_strip("   ").empty());
}

TEST_CASE("the end-of-turn marker of each form") {
  CHECK(tlm::chat_template::named("chatml").end_marker() == "<|im_end|>");
  CHECK(tlm::chat_template::named("phi3.5").end_marker() == "<|end|>");
  CHECK(tlm::chat_template::named("mistral-nemo").end_marker() == "</s>");
  CHECK(tlm::chat_template::named("zephyr").end_marker({.eos_token = "<eos>"}) == "<eos>");
}

}  // namespace test_chat
