// The tokenizers of the other Llama-family vocabularies against llama.cpp's own test
// cases (models/llama.cpp/vocab, from scripts/fetch-vocab): every text of each .inp
// file encodes to exactly the ids of the .out file. Those ids are without BOS
// (llama.cpp's test-tokenizer-0 tokenizes with add_special = false, and the files
// confirm it: no line starts with the BOS id), so the test asks for no BOS either.
// tests/reference/check_tokenizer_families.py compares random texts with Hugging Face.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>
#include <tlm/text/tokenizer.hpp>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_tokenizer_families {

namespace {

const std::string vocab_dir = TLM_VOCAB_DIR;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot read " << path << "; run scripts/fetch-vocab");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct vocab_case {
  std::string text;
  std::vector<std::int32_t> ids;
};

// .inp: each text followed by "\n__ggml_vocab_test__\n"; .out: one line of ids per text.
std::vector<vocab_case> read_cases(const std::string& name) {
  const std::string inp = slurp(vocab_dir + "/ggml-vocab-" + name + ".gguf.inp");
  const std::string outp = slurp(vocab_dir + "/ggml-vocab-" + name + ".gguf.out");
  constexpr std::string_view sep = "\n__ggml_vocab_test__\n";
  std::vector<vocab_case> cases;
  for (std::size_t pos = 0; pos < inp.size();) {
    const std::size_t end = inp.find(sep, pos);
    REQUIRE(end != std::string::npos);
    cases.push_back({inp.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(outp);
  std::string line;
  std::size_t i = 0;
  for (; std::getline(lines, line); ++i) {
    REQUIRE(i < cases.size());
    std::istringstream ids(line);
    std::int32_t v = 0;
    while (ids >> v) cases[i].ids.push_back(v);
  }
  REQUIRE(i == cases.size());
  return cases;
}

tlm::tokenizer load(const std::string& name, double* ms = nullptr) {
  const std::string path = vocab_dir + "/ggml-vocab-" + name + ".gguf";
  if (!std::filesystem::exists(path)) FAIL(path << " is missing; run scripts/fetch-vocab");
  const tlm::gguf::file f(path);
  const auto t0 = std::chrono::steady_clock::now();
  auto tok = tlm::tokenizer::from_gguf(f);
  if (ms) *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return tok;
}

std::string show(const std::vector<std::int32_t>& ids) {
  std::string s;
  for (const auto id : ids) s += std::to_string(id) + " ";
  return s;
}

void check_vocab(const std::string& name) {
  double ms = 0;
  const auto tok = load(name, &ms);
  MESSAGE(name << ": tokenizer built in " << ms << " ms");
  const auto cases = read_cases(name);
  REQUIRE(cases.size() >= 40);
  std::size_t passed = 0;
  for (const auto& c : cases) {
    const auto got = tok.encode(c.text, {.add_bos = false, .parse_special = false, .add_eos = false});
    if (got == c.ids) {
      ++passed;
    } else {
      FAIL_CHECK(name << ": \"" << c.text << "\": tlm " << show(got) << "| llama.cpp " << show(c.ids));
    }
    // Every case is plain text the vocabulary can spell, so it decodes back.
    CHECK(tok.decode(got) == c.text);
  }
  MESSAGE(name << ": " << passed << "/" << cases.size() << " cases identical to llama.cpp");
  CHECK(passed == cases.size());
}

}  // namespace

TEST_CASE("llama-bpe (Llama 3): every llama.cpp case") {
  check_vocab("llama-bpe");
}
TEST_CASE("qwen2: every llama.cpp case") { check_vocab("qwen2"); }
TEST_CASE("llama-spm (Llama 2, SentencePiece): every llama.cpp case") { check_vocab("llama-spm"); }
TEST_CASE("phi-3 (SentencePiece): every llama.cpp case") { check_vocab("phi-3"); }

TEST_CASE("the algorithm, BOS/EOS and end of generation follow the file") {
  const auto l3 = load("llama-bpe");
  CHECK(l3.model() == tlm::tokenizer_model::bpe);
  CHECK(l3.pre() == tlm::pre_tokenizer::llama3);
  CHECK(l3.add_bos_default());  // no key in the file: llama.cpp's default for Llama 3
  CHECK(l3.encode("Hi").front() == 128000);
  CHECK(l3.encode("Hi", {.add_bos = false}).front() != 128000);
  CHECK(l3.is_end_of_generation(128001));  // <|end_of_text|>, the eos id
  CHECK(l3.is_end_of_generation(128009));  // <|eot_id|>, by its text
  CHECK_FALSE(l3.is_end_of_generation(128000));
  CHECK(l3.end_of_generation().size() == 2);

  const auto q = load("qwen2");
  CHECK_FALSE(q.add_bos_default());
  CHECK(q.is_end_of_generation(151643));  // <|endoftext|>
  CHECK(q.is_end_of_generation(151645));  // <|im_end|>
  CHECK_FALSE(q.is_end_of_generation(128247));  // "</s>" here is an ordinary token

  const auto spm = load("llama-spm");
  CHECK(spm.model() == tlm::tokenizer_model::spm);
  CHECK(spm.add_bos_default());
  CHECK_FALSE(spm.add_eos_default());
  CHECK(spm.encode("Hello") == std::vector<std::int32_t>{1, 15043});
  CHECK(spm.encode("Hello", {.add_eos = true}) == std::vector<std::int32_t>{1, 15043, 2});
  CHECK(spm.is_end_of_generation(2));
  // Byte fallback: U+10FFFF has no piece, so its four bytes come out as <0xXX> tokens
  // (<0x00> is id 3), and decode puts them back together.
  const auto ids = spm.encode("\xF4\x8F\xBF\xBF", {.add_bos = false});
  CHECK(ids == std::vector<std::int32_t>{29871, 3 + 0xF4, 3 + 0x8F, 3 + 0xBF, 3 + 0xBF});
  CHECK(spm.decode(ids) == "\xF4\x8F\xBF\xBF");
  // Special tokens are matched only with parse_special, and the text after one gets its
  // own space prefix (HF's normalizer runs on each stretch between special tokens).
  CHECK(spm.encode("</s>Hi", {.add_bos = false, .parse_special = true}) == std::vector<std::int32_t>{2, 6324});

  const auto phi = load("phi-3");
  CHECK(phi.is_end_of_generation(32000));  // <|endoftext|>, the eos id
  CHECK(phi.is_end_of_generation(32007));  // <|end|>
  CHECK_FALSE(phi.is_end_of_generation(2));  // "</s>" is user-defined in this file, not control
}

TEST_CASE("SentencePiece from plain vectors: merges by score, no space prefix when the file says so") {
  // "ab" scores higher than "bc": a|b|c merges to ab|c.
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc", "\xE2\x96\x81"};
  const std::vector<std::int32_t> types = {2, 3, 3, 1, 1, 1, 1, 1, 1};
  std::vector<float> scores = {0, 0, 0, -5, -5, -5, -1, -2, -3};
  const auto tok = tlm::tokenizer::from_spm_vocab(tokens, types, scores, {.bos = 1, .eos = 2, .unknown = 0}, false);
  CHECK(tok.encode("abc", {.add_bos = false}) == std::vector<std::int32_t>{6, 5});
  scores[7] = 0;  // now "bc" first
  const auto tok2 = tlm::tokenizer::from_spm_vocab(tokens, types, scores, {.bos = 1, .eos = 2, .unknown = 0}, false);
  CHECK(tok2.encode("abc", {.add_bos = false}) == std::vector<std::int32_t>{3, 7});
  // No byte tokens: unknown characters become <unk>, consecutive ones fused.
  CHECK(tok.encode("a\xC3\xA9\xC3\xA9 b", {.add_bos = false}) == std::vector<std::int32_t>{3, 0, 8, 4});
  CHECK(tok.decode(std::vector<std::int32_t>{8, 3}) == " a");  // no prefix, so nothing stripped
  CHECK_THROWS_AS(tlm::tokenizer::from_spm_vocab(tokens, types, std::vector<float>(3), {}), tlm::format_error);
  // A token with U+2581 after another character ("a\u2581") can join across a space, so
  // that vocabulary is merged as one stretch, not word by word.
  auto joined_tokens = tokens;
  joined_tokens.push_back("a\xE2\x96\x81");
  auto joined_types = types;
  joined_types.push_back(1);
  auto joined_scores = scores;
  joined_scores.push_back(10);
  const auto joined =
      tlm::tokenizer::from_spm_vocab(joined_tokens, joined_types, joined_scores, {.bos = 1, .eos = 2, .unknown = 0}, false);
  CHECK(joined.encode("a b", {.add_bos = false}) == std::vector<std::int32_t>{9, 4});
  CHECK(tok.encode("a b", {.add_bos = false}) == std::vector<std::int32_t>{3, 8, 4});
}

TEST_CASE("an unknown pre-tokenizer or model is a one-line error naming the key, the value and the supported ones") {
  const auto message = [](const char* model, const char* pre) {
    tlm::gguf::writer w;
    w.set("tokenizer.ggml.model", model);
    if (pre) w.set("tokenizer.ggml.pre", pre);
    w.set_string_array("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b", "ab"});
    w.set_string_array("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
    w.set_array("tokenizer.ggml.scores", std::vector<float>{0, 0, 0});
    const auto bytes = w.to_bytes();
    const auto f = tlm::gguf::file::from_memory(bytes, "bogus.gguf");
    try {
      (void)tlm::tokenizer::from_gguf(f);
    } catch (const tlm::model_mismatch& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string pre = message("gpt2", "frobnicate");
  CHECK(pre ==
        "tokenizer: tokenizer.ggml.pre is \"frobnicate\"; with tokenizer.ggml.model \"gpt2\" tlm supports \"smollm\", "
        "\"llama-bpe\" and \"qwen2\"");
  const std::string model = message("t5", nullptr);
  CHECK(model.find("tokenizer.ggml.model is \"t5\"") != std::string::npos);
  CHECK(model.find("\"gpt2\"") != std::string::npos);
  CHECK(model.find("\"llama\"") != std::string::npos);
  CHECK(message("llama", "qwen2").find("tokenizer.ggml.pre is \"qwen2\"") != std::string::npos);
  CHECK(pre.find('\n') == std::string::npos);
  CHECK(message("llama", "default") == "no error");
  CHECK(message("gpt2", "qwen2") == "no error");
}

}  // namespace test_tokenizer_families
