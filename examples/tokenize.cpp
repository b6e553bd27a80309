// tokenize: shows how a model's tokenizer splits text, and turns ids back into text.
//
//   tokenize --model PATH [--special] [--bos] TEXT...   ids and pieces of TEXT (words joined by spaces)
//   tokenize --model PATH [--special] [--bos]           the same for all of stdin
//   tokenize --model PATH --decode 1,2,3                the text of ids
//   tokenize --model PATH --batch FILE                  machine mode for tests (see run_batch)
//
// --special matches special-token strings such as <|im_start|> in the text; without it
// they are tokenized as ordinary text. --bos puts the BOS id first.
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <tlm/format/gguf.hpp>
#include <tlm/text/tokenizer.hpp>

namespace {

int usage(const char* msg) {
  std::fprintf(stderr,
               "tokenize: %s\n"
               "usage: tokenize --model PATH [--special] [--bos] [TEXT...]   (stdin when no TEXT)\n"
               "       tokenize --model PATH --decode 1,2,3\n"
               "       tokenize --model PATH --batch FILE\n",
               msg);
  return 2;
}

// Bytes shown readably: printable UTF-8 as is, everything else escaped.
std::string readable(std::string_view bytes) {
  std::string out;
  for (std::size_t i = 0; i < bytes.size();) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (b < 0x80) {
      switch (b) {
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\\': out += "\\\\"; break;
        default:
          if (b < 0x20 || b == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", b);
            out += buf;
          } else {
            out.push_back(static_cast<char>(b));
          }
      }
      ++i;
      continue;
    }
    const auto r = tlm::utf8::scan(bytes, i);
    if (r.st == tlm::utf8::status::complete) {
      out.append(bytes.substr(i, r.n));
      i += r.n;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      out += buf;
      ++i;
    }
  }
  return out;
}

std::vector<std::int32_t> parse_ids(std::string_view s) {
  std::vector<std::int32_t> ids;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ',' || s[i] == ' ' || s[i] == '\n' || s[i] == '\t')) ++i;
    if (i >= s.size()) break;
    std::int32_t v = 0;
    const auto [p, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
    if (ec != std::errc{})
      throw tlm::error("tokenize: cannot read a token id at character " + std::to_string(i) + " of \"" +
                       std::string(s) + "\"; give ids as 1,2,3");
    ids.push_back(v);
    i = static_cast<std::size_t>(p - s.data());
  }
  return ids;
}

// Batch protocol (used by tests/reference/check_tokenizer.py and the benchmark script).
// Input records:
//   E <flags> <nbytes>\n<nbytes bytes of text>\n    encode; flags: 1 = parse_special, 2 = add_bos
//   D <count>\n<count ids separated by spaces>\n     decode
// Output, one record per input record:
//   encode: the ids separated by spaces, then \n; or "! <message>\n" if the text was refused
//   decode: <nbytes>\n<nbytes bytes of text>\n; or "! <message>\n"
int run_batch(const tlm::tokenizer& tok, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return usage(("cannot open batch file " + path).c_str());
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  std::size_t pos = 0;
  const auto line = [&]() {
    const auto nl = data.find('\n', pos);
    if (nl == std::string::npos) throw tlm::error("tokenize --batch: record header without newline at byte " + std::to_string(pos));
    std::string_view l(data.data() + pos, nl - pos);
    pos = nl + 1;
    return l;
  };
  while (pos < data.size()) {
    const std::string_view head = line();
    std::istringstream hs{std::string(head)};
    char kind = 0;
    hs >> kind;
    if (kind == 'E') {
      int flags = 0;
      std::size_t n = 0;
      hs >> flags >> n;
      if (!hs || pos + n + 1 > data.size())
        throw tlm::error("tokenize --batch: bad encode record \"" + std::string(head) + "\"");
      const std::string_view text(data.data() + pos, n);
      pos += n + 1;
      try {
        const auto ids = tok.encode(text, {.add_bos = (flags & 2) != 0, .parse_special = (flags & 1) != 0, .add_eos = false});
        for (std::size_t i = 0; i < ids.size(); ++i) {
          if (i) out.push_back(' ');
          out += std::to_string(ids[i]);
        }
        out.push_back('\n');
      } catch (const tlm::text_error& e) {
        out += "! ";
        out += e.what();
        out.push_back('\n');
      }
    } else if (kind == 'D') {
      std::size_t count = 0;
      hs >> count;
      if (!hs) throw tlm::error("tokenize --batch: bad decode record \"" + std::string(head) + "\"");
      const auto ids = parse_ids(line());
      if (ids.size() != count) throw tlm::error("tokenize --batch: decode record announced " + std::to_string(count) + " ids");
      try {
        const std::string text = tok.decode(ids);
        out += std::to_string(text.size());
        out.push_back('\n');
        out += text;
        out.push_back('\n');
      } catch (const tlm::error& e) {
        out += "! ";
        out += e.what();
        out.push_back('\n');
      }
    } else {
      throw tlm::error("tokenize --batch: unknown record \"" + std::string(head) + "\"; expected E or D");
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string model, decode_arg, batch;
  bool special = false, bos = false, have_decode = false;
  std::vector<std::string> words;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--decode" && i + 1 < argc) {
      decode_arg = argv[++i];
      have_decode = true;
    } else if (a == "--batch" && i + 1 < argc) {
      batch = argv[++i];
    } else if (a == "--special") {
      special = true;
    } else if (a == "--bos") {
      bos = true;
    } else if (a == "--help" || a == "-h") {
      usage("help");
      return 0;
    } else if (a.starts_with("--")) {
      return usage(("unknown option " + a).c_str());
    } else {
      words.push_back(a);
    }
  }
  if (model.empty()) return usage("--model PATH is required");
  const tlm::gguf::file f(model);
  const tlm::tokenizer tok = tlm::tokenizer::from_gguf(f);

  if (!batch.empty()) return run_batch(tok, batch);

  if (have_decode) {
    const auto ids = parse_ids(decode_arg);
    std::cout << tok.decode(ids) << '\n';
    return 0;
  }

  std::string text;
  if (words.empty()) {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    for (std::size_t i = 0; i < words.size(); ++i) text += (i ? " " : "") + words[i];
  }
  const auto ids = tok.encode(text, {.add_bos = bos, .parse_special = special});
  std::cout << ids.size() << " tokens\n";
  for (const auto id : ids)
    std::cout << id << '\t' << readable(tok.token_bytes(id)) << '\t' << tok.piece(id) << '\n';
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tokenize: %s\n", e.what());
  return 1;
}
