// The tokenizer against Hugging Face tokenizers 0.23.3 (fixtures written by
// tests/reference/make_tokenizer_fixtures.py) and its own contracts.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <tlm/format/gguf.hpp>
#include <tlm/text/tokenizer.hpp>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_tokenizer {

namespace {

const tlm::tokenizer& model_tokenizer() {
  static const std::optional<tlm::tokenizer> tok = []() -> std::optional<tlm::tokenizer> {
    if (!std::filesystem::exists(TLM_MODEL_PATH)) return std::nullopt;
    const tlm::gguf::file f(TLM_MODEL_PATH);
    return tlm::tokenizer::from_gguf(f);
  }();
  if (!tok) FAIL("the model file " TLM_MODEL_PATH " is missing; run scripts/fetch-model");
  return *tok;
}

std::string read_file(const std::string& name) {
  const std::string path = std::string(TLM_FIXTURES) + "/tokenizer/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot read fixture " << path << "; regenerate with tests/reference/make_tokenizer_fixtures.py");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A cursor over the fixtures' length-prefixed records.
struct reader {
  std::string data;
  std::size_t pos = 0;
  bool done() const { return pos >= data.size(); }
  std::string line() {
    const auto nl = data.find('\n', pos);
    REQUIRE(nl != std::string::npos);
    std::string l = data.substr(pos, nl - pos);
    pos = nl + 1;
    return l;
  }
  std::string bytes(std::size_t n) {
    REQUIRE(pos + n + 1 <= data.size());
    std::string b = data.substr(pos, n);
    pos += n + 1;  // and the newline after the bytes
    return b;
  }
};

std::vector<std::int32_t> parse_ids(const std::string& l) {
  std::vector<std::int32_t> ids;
  std::istringstream s(l);
  std::int32_t v = 0;
  while (s >> v) ids.push_back(v);
  return ids;
}

struct encode_case {
  std::string text;
  bool special = false;
  std::vector<std::int32_t> ids;
};

std::vector<encode_case> read_encode_fixture(const std::string& name) {
  reader r{read_file(name)};
  std::vector<encode_case> out;
  while (!r.done()) {
    std::istringstream head(r.line());
    char kind = 0;
    int flags = 0;
    std::size_t n = 0;
    head >> kind >> flags >> n;
    REQUIRE(kind == 'E');
    encode_case c;
    c.special = (flags & 1) != 0;
    c.text = r.bytes(n);
    c.ids = parse_ids(r.line());
    out.push_back(std::move(c));
  }
  return out;
}

std::string show(const std::string& s) {
  std::string o;
  for (const char ch : s) {
    const auto b = static_cast<unsigned char>(ch);
    if (b >= 0x20 && b < 0x7F) {
      o.push_back(ch);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      o += buf;
    }
  }
  return o;
}

bool all_bytes_have_tokens(const tlm::tokenizer& tok, const std::string& s) {
  for (const char c : s)
    if (!tok.byte_has_token(static_cast<std::uint8_t>(c))) return false;
  return true;
}

void check_encode_fixture(const std::string& name, std::size_t min_cases) {
  const auto& tok = model_tokenizer();
  const auto cases = read_encode_fixture(name);
  CHECK(cases.size() >= min_cases);
  std::size_t mismatches = 0, round_trips = 0, lossy = 0;
  for (const auto& c : cases) {
    const auto ids = tok.encode(c.text, {.parse_special = c.special});
    if (ids != tok.encode_without_fast_path(c.text, {.parse_special = c.special}))
      FAIL_CHECK("the ASCII fast path changes the ids of \"" << show(c.text) << "\"");
    if (ids != c.ids) {
      ++mismatches;
      if (mismatches <= 5) FAIL_CHECK("ids differ from HF for \"" << show(c.text) << "\" special=" << c.special);
    }
    if (all_bytes_have_tokens(tok, c.text)) {
      ++round_trips;
      if (tok.decode(ids) != c.text) FAIL_CHECK("decode(encode(t)) != t for \"" << show(c.text) << "\"");
    } else {
      ++lossy;
    }
  }
  MESSAGE(name << ": " << cases.size() << " texts, " << mismatches << " mismatches, " << round_trips
               << " round trips, " << lossy << " texts with dropped bytes");
  CHECK(mismatches == 0);
  CHECK(round_trips > cases.size() / 2);
}

std::string utf8_of(std::uint32_t cp) {
  std::string s;
  tlm::utf8::append_code_point(s, cp);
  return s;
}

}  // namespace

TEST_CASE("vocabulary and special ids come from the GGUF file") {
  const auto& tok = model_tokenizer();
  CHECK(tok.vocab_size() == 49152);
  CHECK(tok.bos() == 1);
  CHECK(tok.eos() == 2);
  CHECK_FALSE(tok.add_bos_default());
  CHECK(tok.piece(1) == "<|im_start|>");
  CHECK(tok.piece(2) == "<|im_end|>");
  CHECK(tok.piece(0) == "<|endoftext|>");
  CHECK(tok.piece(905) == "\xC4\xA0world");  // "Ġworld": the byte symbol of a space is U+0120
  CHECK(tok.token_bytes(905) == " world");
  CHECK(tok.is_special(0));
  CHECK(tok.is_special(16));
  CHECK_FALSE(tok.is_special(17));
  CHECK_FALSE(tok.is_special(905));
}

TEST_CASE("the two vectors in formats.md") {
  const auto& tok = model_tokenizer();
  CHECK(tok.encode("Hello world! 123") == std::vector<std::int32_t>{19556, 905, 17, 216, 33, 34, 35});
  CHECK(tok.encode("\n") == std::vector<std::int32_t>{198});
}

TEST_CASE("fixed texts match Hugging Face") { check_encode_fixture("encode_fixed.txt", 100); }

TEST_CASE("random texts match Hugging Face") { check_encode_fixture("encode_random.txt", 1000); }

TEST_CASE("decoding matches Hugging Face, and streaming matches decoding") {
  const auto& tok = model_tokenizer();
  reader r{read_file("decode.txt")};
  std::size_t n = 0, mismatches = 0, stream_mismatches = 0;
  while (!r.done()) {
    std::istringstream head(r.line());
    char kind = 0;
    std::size_t count = 0;
    head >> kind >> count;
    REQUIRE(kind == 'D');
    const auto ids = parse_ids(r.line());
    REQUIRE(ids.size() == count);
    const std::string expected = r.bytes(std::stoul(r.line()));
    ++n;
    const std::string got = tok.decode(ids);
    if (got != expected) {
      ++mismatches;
      if (mismatches <= 5) FAIL_CHECK("decode differs from HF: \"" << show(got) << "\" vs \"" << show(expected) << "\"");
    }
    tlm::stream_decoder sd(tok);
    std::string streamed;
    for (const auto id : ids) {
      const std::string part = sd.push(id);
      // Every piece handed out is valid UTF-8 on its own.
      if (tlm::utf8::first_invalid(part) != std::string_view::npos) ++stream_mismatches;
      streamed += part;
    }
    streamed += sd.flush();
    if (streamed != got) ++stream_mismatches;
  }
  MESSAGE("decode.txt: " << n << " id sequences, " << mismatches << " mismatches");
  CHECK(n >= 1500);
  CHECK(mismatches == 0);
  CHECK(stream_mismatches == 0);
}

TEST_CASE("stream_decoder holds back a character split across tokens") {
  const auto& tok = model_tokenizer();
  const std::string text = "\xE6\x97\xA5 \xF0\x9F\x98\x80!";  // "日 😀!"
  const auto ids = tok.encode(text);
  // The vocabulary splits both characters over several tokens; otherwise this test is void.
  std::size_t partial = 0;
  for (const auto id : ids)
    if (tlm::utf8::first_invalid(tok.token_bytes(id)) != std::string_view::npos) ++partial;
  REQUIRE(partial >= 2);
  tlm::stream_decoder sd(tok);
  std::string out;
  std::size_t empty_pushes = 0;
  for (const auto id : ids) {
    const std::string part = sd.push(id);
    CHECK(tlm::utf8::first_invalid(part) == std::string_view::npos);
    if (part.empty()) ++empty_pushes;
    out += part;
  }
  CHECK(empty_pushes >= 1);
  CHECK(sd.flush().empty());
  CHECK(out == text);

  // An incomplete character at the end comes out of flush as one U+FFFD.
  tlm::stream_decoder sd2(tok);
  const std::vector<std::int32_t> head(ids.begin(), ids.begin() + 1);
  CHECK(tok.token_bytes(head[0]).size() < 3);
  CHECK(sd2.push(head[0]).empty());
  CHECK(sd2.flush() == "\xEF\xBF\xBD");
  CHECK(tok.decode(head) == "\xEF\xBF\xBD");
}

TEST_CASE("special tokens are matched only with parse_special") {
  const auto& tok = model_tokenizer();
  const std::string text = "<|im_start|>user\nHi<|im_end|>\n";
  const auto plain = tok.encode(text);
  const auto special = tok.encode(text, {.parse_special = true});
  CHECK(special.front() == 1);
  CHECK(std::count(special.begin(), special.end(), 2) == 1);
  for (const auto id : plain) CHECK_FALSE(tok.is_special(id));
  CHECK(tok.decode(plain) == text);
  CHECK(tok.decode(special) == text);
  CHECK(tok.encode("<|endoftext|>", {.parse_special = true}) == std::vector<std::int32_t>{0});
  CHECK(tok.encode("<|im_start|><|im_start|>", {.parse_special = true}) == std::vector<std::int32_t>{1, 1});
  // Near misses stay text.
  const auto near = tok.encode("<|im_start|", {.parse_special = true});
  CHECK(std::find(near.begin(), near.end(), 1) == near.end());
}

TEST_CASE("add_bos puts the BOS id first, once") {
  const auto& tok = model_tokenizer();
  const auto with = tok.encode("Hello", {.add_bos = true});
  const auto without = tok.encode("Hello");
  REQUIRE(with.size() == without.size() + 1);
  CHECK(with[0] == tok.bos());
  CHECK(std::equal(without.begin(), without.end(), with.begin() + 1));
  CHECK(tok.encode("", {.add_bos = true}) == std::vector<std::int32_t>{1});
  CHECK(tok.encode("").empty());
}

TEST_CASE("invalid UTF-8 is refused with the byte offset") {
  const auto& tok = model_tokenizer();
  const std::vector<std::pair<std::string, std::size_t>> bad = {
      {"\xFF", 0},                  // never a UTF-8 byte
      {"ab\xC0\x80", 2},            // overlong NUL
      {"abc\xE6\x97", 3},           // truncated at the end
      {"x\xED\xA0\x80y", 1},        // a surrogate
      {"\xE0\x80\x80", 0},          // overlong
      {"ok \xF4\x90\x80\x80", 3},   // above U+10FFFF
      {"\x80", 0},                  // a lone continuation byte
      {"\xE6\x97" "a", 0},          // interrupted sequence
  };
  for (const auto& [text, offset] : bad) {
    const std::string shown = show(text);
    CAPTURE(shown);
    bool threw = false;
    try {
      (void)tok.encode(text);
    } catch (const tlm::text_error& e) {
      threw = true;
      const std::string msg = e.what();
      CHECK(msg.find("byte offset " + std::to_string(offset)) != std::string::npos);
      CHECK(msg.find("UTF-8") != std::string::npos);
    }
    CHECK(threw);
    CHECK_THROWS_AS((void)tok.encode(text, {.parse_special = true}), tlm::text_error);
  }
}

TEST_CASE("out-of-range ids are an error naming the id and the vocabulary size") {
  const auto& tok = model_tokenizer();
  for (const std::int32_t id : {49152, -1, 1 << 30}) {
    const std::vector<std::int32_t> ids{19556, id};
    bool threw = false;
    try {
      (void)tok.decode(ids);
    } catch (const tlm::error& e) {
      threw = true;
      const std::string msg = e.what();
      CHECK(msg.find(std::to_string(id)) != std::string::npos);
      CHECK(msg.find("49152") != std::string::npos);
    }
    CHECK(threw);
  }
  tlm::stream_decoder sd(tok);
  CHECK_THROWS_AS(sd.push(49152), tlm::error);
  CHECK_THROWS_AS((void)tok.piece(-5), tlm::error);
}

TEST_CASE("bytes without a token are dropped, as in HF") {
  const auto& tok = model_tokenizer();
  CHECK_FALSE(tok.byte_has_token(0x04));
  CHECK_FALSE(tok.byte_has_token(0xF1));
  CHECK(tok.byte_has_token('a'));
  CHECK(tok.encode(std::string(1, '\x04')).empty());
  // U+40000 is F1 80 80 80: the lead byte is dropped, the three continuation bytes stay.
  const auto ids = tok.encode(utf8_of(0x40000));
  std::string bytes;
  for (const auto id : ids) bytes += tok.token_bytes(id);
  CHECK(bytes == "\x80\x80\x80");
}

TEST_CASE("Unicode classes: whitespace and digits as in HF") {
  const auto& tok = model_tokenizer();
  // U+180E is not whitespace for HF (PCRE2's \s says it is; the pattern uses White_Space), so
  // "x" U+180E U+180E "z" has the pieces x | U+180E U+180E | z, while U+3000 (whitespace
  // in both) gives x | U+3000 | U+3000 | z.
  const auto cat = [&](std::initializer_list<std::string> parts) {
    std::vector<std::int32_t> ids;
    for (const auto& p : parts) {
      const auto e = tok.encode(p);
      ids.insert(ids.end(), e.begin(), e.end());
    }
    return ids;
  };
  const std::string mvs = utf8_of(0x180E), ideo = utf8_of(0x3000);
  CHECK(tok.encode("x" + mvs + mvs + "z") == cat({"x", mvs + mvs, "z"}));
  CHECK(tok.encode("x" + ideo + ideo + "z") == cat({"x", ideo, ideo, "z"}));
  // Every numeric character is its own pre-token: "१२" (Devanagari) is not merged.
  const auto deva = tok.encode("\xE0\xA5\xA7\xE0\xA5\xA8");
  const auto one = tok.encode("\xE0\xA5\xA7");
  CHECK(deva.size() == 2 * one.size());
  // Kawi digit one (U+11F51, Unicode 15) is numeric for HF although PCRE2 10.42 does not know it.
  const auto kawi2 = tok.encode(utf8_of(0x11F51) + utf8_of(0x11F51));
  const auto kawi1 = tok.encode(utf8_of(0x11F51));
  CHECK(kawi2.size() == 2 * kawi1.size());
}

TEST_CASE("from_vocab: a small vocabulary, and corrupt data") {
  // Byte symbols for a, b, c and a space (U+0120).
  std::vector<std::string> tokens = {"<s>", "a", "b", "c", "\xC4\xA0", "ab", "abc", "\xC4\xA0" "a"};
  std::vector<std::int32_t> types = {3, 1, 1, 1, 1, 1, 1, 1};
  std::vector<std::string> merges = {"a b", "ab c", "\xC4\xA0 a"};
  const auto tok = tlm::tokenizer::from_vocab(tokens, types, merges, {.bos = 0});
  // "a b" (rank 0) wins over "Ġ a" (rank 2), then "ab c": Ġ | abc.
  CHECK(tok.encode("abc abc") == std::vector<std::int32_t>{6, 4, 6});
  CHECK(tok.encode(" a") == std::vector<std::int32_t>{7});
  CHECK(tok.encode("abcabc") == std::vector<std::int32_t>{6, 6});
  // Long words take the heap path: 40 letters, ties leftmost.
  std::string longword;
  std::vector<std::int32_t> expect;
  for (int i = 0; i < 20; ++i) {
    longword += "ab";
    expect.push_back(5);
  }
  CHECK(tok.encode(longword) == expect);
  CHECK(tok.encode("<s>", {.parse_special = true}) == std::vector<std::int32_t>{0});
  CHECK(tok.encode("x").empty());  // no token for "x": dropped

  CHECK_THROWS_AS(tlm::tokenizer::from_vocab(tokens, types, {"a z"}, {}), tlm::format_error);
  CHECK_THROWS_AS(tlm::tokenizer::from_vocab(tokens, types, {"ab"}, {}), tlm::format_error);
  CHECK_THROWS_AS(tlm::tokenizer::from_vocab(tokens, {1, 1}, merges, {}), tlm::format_error);
  CHECK_THROWS_AS(tlm::tokenizer::from_vocab(tokens, types, merges, {.eos = 99}), tlm::format_error);
  CHECK_THROWS_AS(tlm::tokenizer::from_vocab({}, {}, {}, {}), tlm::format_error);
}

TEST_CASE("copies share state and the BPE cache, and a repeated piece is served from it") {
  const tlm::gguf::file f(TLM_MODEL_PATH);
  const auto tok = tlm::tokenizer::from_gguf(f);  // a fresh cache, not the shared test tokenizer's
  const tlm::tokenizer copy = tok;
  REQUIRE(tok.cached_pieces() == 0);
  const std::string text = "Copies are cheap: 42 tokens? \xE6\x97\xA5\xE6\x9C\xAC";
  const auto first = tok.encode(text);
  const std::size_t cached = tok.cached_pieces();
  CHECK(cached > 0);
  CHECK(copy.cached_pieces() == cached);  // the copy sees the same cache
  // The copy encodes the same text from the cache: every piece is found, none added.
  CHECK(tok.cache_hits() == 0);
  CHECK(copy.encode(text) == first);
  CHECK(tok.cached_pieces() == cached);
  CHECK(tok.cache_hits() == cached);
  // A new piece is added once, however often it is encoded.
  auto twice = tok.encode(" zebras");
  CHECK(tok.cached_pieces() == cached + 1);
  twice.insert(twice.end(), twice.begin(), twice.end());
  CHECK(copy.encode(" zebras zebras") == twice);
  CHECK(tok.cached_pieces() == cached + 1);
  CHECK(tok.cache_hits() == cached + 2);
  // Pieces longer than the cache's key limit are never stored.
  (void)tok.encode(" " + std::string(tlm::detail::bpe_cache::max_key_bytes + 10, 'q'));
  CHECK(tok.cached_pieces() == cached + 1);
}

TEST_CASE("the ASCII fast path agrees with PCRE2 on ASCII-heavy random text") {
  const auto& tok = model_tokenizer();
  // A fixed linear congruential sequence over an alphabet that stresses the pattern:
  // contractions, runs of spaces and newlines before letters, punctuation, digits, and
  // a few non-ASCII characters (a letter, a no-break space, a dash) next to them.
  const std::vector<std::string> alphabet = {" ", "  ", "\n", "\t", "\r\n", "\x0B", "'", "'s", "'re", "'ll", "'D",
                                             "a", "Zz", "word", "1", "42", "!", "?!", "\x1F", "\x7F", "-", "_",
                                             "\xC3\xA9", "\xC2\xA0", "\xE2\x80\x94", "\xE1\xA0\x8E", "\xD9\xA3"};
  std::uint64_t state = 12345;
  std::size_t disagreements = 0, texts = 0;
  for (int t = 0; t < 3000; ++t) {
    std::string text;
    const int len = 1 + static_cast<int>(state % 24);
    for (int k = 0; k < len; ++k) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      text += alphabet[(state >> 33) % alphabet.size()];
    }
    ++texts;
    if (tok.encode(text) != tok.encode_without_fast_path(text)) {
      ++disagreements;
      if (disagreements <= 5) FAIL_CHECK("fast path differs on \"" << show(text) << "\"");
    }
  }
  CHECK(texts == 3000);
  CHECK(disagreements == 0);
}

}  // namespace test_tokenizer
