// Encode throughput of tlm's tokenizer on a mixed prose + code corpus (single thread).
//
//   tokenizer [--model PATH] [--mb N] [--reps N] [--corpus-out FILE]
//
// The corpus is assembled deterministically from files every Debian machine has:
// prose from /usr/share/common-licenses/* and /usr/share/doc/*/copyright, code from
// /usr/include/c++/<ver>/bits/*.h, each list sorted by path and taken in 64 KiB
// alternating chunks up to N MiB (default 4). Invalid UTF-8 is replaced (U+FFFD).
// --corpus-out writes it so that bench/tokenizer_vs_hf.py runs HF on the same bytes.
//
// Reports: "cold" = first encode with an empty pre-token cache (a fresh tokenizer),
// "warm" = median of --reps further encodes with the cache filled.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <tlm/format/gguf.hpp>
#include <tlm/text/tokenizer.hpp>

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> sorted_files(const std::vector<fs::path>& candidates) {
  std::vector<fs::path> out;
  for (const auto& p : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec) && !fs::is_symlink(p, ec)) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string slurp(const std::vector<fs::path>& files, std::size_t limit) {
  std::string all;
  for (const auto& p : files) {
    if (all.size() >= limit) break;
    std::ifstream in(p, std::ios::binary);
    all.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    all.push_back('\n');
  }
  if (all.size() > limit) all.resize(limit);
  return all;
}

std::string build_corpus(std::size_t bytes) {
  std::vector<fs::path> prose_c, code_c;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/share/common-licenses", ec)) prose_c.push_back(e.path());
  for (const auto& e : fs::directory_iterator("/usr/share/doc", ec)) prose_c.push_back(e.path() / "copyright");
  fs::path bits;
  for (const auto& e : fs::directory_iterator("/usr/include/c++", ec))
    if (fs::exists(e.path() / "bits")) bits = std::max(bits, e.path() / "bits");
  for (const auto& e : fs::directory_iterator(bits, ec))
    if (e.path().extension() == ".h") code_c.push_back(e.path());
  const std::string prose = slurp(sorted_files(prose_c), bytes / 2);
  const std::string code = slurp(sorted_files(code_c), bytes / 2);
  std::string mixed;
  constexpr std::size_t chunk = 64 * 1024;
  for (std::size_t i = 0; i < std::max(prose.size(), code.size()); i += chunk) {
    if (i < prose.size()) mixed.append(prose, i, chunk);
    if (i < code.size()) mixed.append(code, i, chunk);
  }
  // Chunk cuts can split a UTF-8 character; the replacement makes the corpus valid.
  return tlm::utf8::to_valid(mixed);
}

// Documents of about 4 KiB cut at line ends (the same rule as bench/tokenizer_vs_hf.py),
// for the per-document figures.
std::vector<std::string_view> chunks_of(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (start < s.size()) {
    std::size_t end = start + 4096;
    if (end >= s.size()) {
      end = s.size();
    } else {
      const auto nl = s.find('\n', end);
      end = nl == std::string_view::npos ? s.size() : nl + 1;
    }
    out.push_back(s.substr(start, end - start));
    start = end;
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string model = std::getenv("TLM_MODEL_PATH") ? std::getenv("TLM_MODEL_PATH")
                                                     : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string corpus_out;
  double mb = 4;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--mb" && i + 1 < argc) mb = std::atof(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--corpus-out" && i + 1 < argc) corpus_out = argv[++i];
    else {
      std::fprintf(stderr, "usage: tokenizer [--model PATH] [--mb N] [--reps N] [--corpus-out FILE]\n");
      return 2;
    }
  }
  if (!fs::exists(model)) {
    std::fprintf(stderr, "tokenizer bench: %s is missing; run scripts/fetch-model or pass --model\n", model.c_str());
    return 1;
  }
  const std::string corpus = build_corpus(static_cast<std::size_t>(mb * 1024 * 1024));
  if (!corpus_out.empty()) {
    std::ofstream out(corpus_out, std::ios::binary);
    out.write(corpus.data(), static_cast<std::streamsize>(corpus.size()));
  }
  const tlm::gguf::file f(model);
  const double megabytes = static_cast<double>(corpus.size()) / 1e6;

  auto t0 = std::chrono::steady_clock::now();
  const tlm::tokenizer tok = tlm::tokenizer::from_gguf(f);
  const double load_s = seconds_since(t0);
  // No BOS/EOS whatever the file says (Llama 3 and SentencePiece files add BOS), so
  // that decode(ids) is the corpus again.
  const tlm::encode_options plain{.add_bos = false, .parse_special = false, .add_eos = false};

  t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(corpus, plain);
  const double cold_s = seconds_since(t0);

  std::vector<double> warm;
  for (int r = 0; r < reps; ++r) {
    t0 = std::chrono::steady_clock::now();
    const auto again = tok.encode(corpus, plain);
    warm.push_back(seconds_since(t0));
    if (again != ids) {
      std::fprintf(stderr, "tokenizer bench: a warm encode differs from the cold one\n");
      return 1;
    }
  }
  std::sort(warm.begin(), warm.end());
  const double warm_s = warm[warm.size() / 2];

  const auto docs = chunks_of(corpus);
  std::size_t doc_tokens = 0;
  const tlm::tokenizer fresh = tlm::tokenizer::from_gguf(f);  // cold cache again
  t0 = std::chrono::steady_clock::now();
  for (const auto d : docs) doc_tokens += fresh.encode(d, plain).size();
  const double docs_s = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  const std::string text = tok.decode(ids);
  const double decode_s = seconds_since(t0);
  if (text != corpus) std::fprintf(stderr, "tokenizer bench: note: decode(encode(corpus)) != corpus (dropped bytes)\n");

  std::printf("corpus: %.2f MB (licenses + /usr/share/doc copyright files + libstdc++ bits/*.h), %zu tokens\n",
              megabytes, ids.size());
  std::printf("load %.3f s; encode cold %.2f MB/s; encode warm %.2f MB/s (median of %d); decode %.1f MB/s\n", load_s,
              megabytes / cold_s, megabytes / warm_s, reps, megabytes / decode_s);
  std::printf("documents: %zu of ~4 KiB, %zu tokens, encode one by one (cold cache) %.2f MB/s\n", docs.size(),
              doc_tokens, megabytes / docs_s);
  std::printf("RESULT bytes=%zu tokens=%zu cold_mbps=%.3f warm_mbps=%.3f decode_mbps=%.3f docs=%zu doc_tokens=%zu "
              "docs_mbps=%.3f\n",
              corpus.size(), ids.size(), megabytes / cold_s, megabytes / warm_s, megabytes / decode_s, docs.size(),
              doc_tokens, megabytes / docs_s);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tokenizer bench: %s\n", e.what());
  return 1;
}
