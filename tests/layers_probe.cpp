// The C++ side of the cut-shape checks in tests/reference/check_synthetic.py and
// check_kquant.py: binds a file written by `synth_model --config NAME --layers 2` to
// that config's shape cut to two blocks, and writes the logits of every prompt position
// twice: from one batched prefill, and from feeding the tokens one at a time (the
// decode path).
//
//   layers_probe [--config smollm2_1_7b|smollm2_360m|llama32_1b|qwen25_0_5b] [--greedy N]
//                FILE.gguf OUT.f32 ID,ID,...    OUT: float32 [2, n, vocab]
//   --greedy N also prints the N greedy ids that continue the prompt, one a line.
//
// The cut type lives here, not in the library: smollm2_1_7b itself must refuse a file
// with two blocks, and check_synthetic.py checks that it does.
#include <tlm/model.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace {

// smollm2_1_7b's width, heads (group 1: one key/value head per query head), FFN and
// vocabulary, with only its first two blocks.
struct smollm2_1_7b_first2 : tlm::smollm2_1_7b {
  static constexpr std::size_t layers = 2;
};
// smollm2_360m's (rows of 960, not a multiple of 256: the K-quant files' fallbacks).
struct smollm2_360m_first2 : tlm::smollm2_360m {
  static constexpr std::size_t layers = 2;
};
// The new families' shapes with their traits (check_families.py): Llama 3.2 1B (llama3
// RoPE scaling, rope_freqs) and Qwen2.5 0.5B (qwen2: biases, half-split pairing).
struct llama32_1b_first2 : tlm::llama32_1b {
  static constexpr std::size_t layers = 2;
};
struct qwen25_0_5b_first2 : tlm::qwen25_0_5b {
  static constexpr std::size_t layers = 2;
};

std::vector<std::int32_t> parse_ids(const std::string& s) {
  std::vector<std::int32_t> ids;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    ids.push_back(static_cast<std::int32_t>(std::stol(s.substr(at, comma - at))));
    at = comma + 1;
  }
  return ids;
}

template <class C>
int probe(const char* file, const char* out_path, const char* id_list, std::size_t greedy) {
  const auto ids = parse_ids(id_list);
  // One thread: the reference checks that run this share the machine's cores with the other
  // tests (ctest -j), and a pool of two beside a busy core waits at every barrier.
  auto m = tlm::model<C>::load(file, {.threads = 1});
  std::vector<float> batched;  // [n, vocab]
  {
    tlm::kv_cache<C> cache(ids.size());
    m.prefill(ids, cache, &batched);
  }
  std::vector<float> stepped;  // [n, vocab]
  {
    tlm::kv_cache<C> cache(ids.size());
    for (const auto id : ids) {
      const auto logits = m.forward(id, cache);
      stepped.insert(stepped.end(), logits.begin(), logits.end());
    }
  }
  if (greedy > 0) {
    // Greedy continuation of the prompt (argmax of each step's logits), one id a line.
    tlm::kv_cache<C> cache(ids.size() + greedy);
    auto logits = m.prefill(ids, cache);
    for (std::size_t i = 0; i < greedy; ++i) {
      const auto next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      fmt::print("{}\n", next);
      if (i + 1 < greedy) logits = m.forward(next, cache);
    }
  }
  std::ofstream out(out_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(batched.data()), static_cast<std::streamsize>(batched.size() * sizeof(float)));
  out.write(reinterpret_cast<const char*>(stepped.data()), static_cast<std::streamsize>(stepped.size() * sizeof(float)));
  if (!out) {
    fmt::print(stderr, "layers_probe: cannot write {}\n", out_path);
    return 1;
  }
  return 0;
}

int run(int argc, char** argv) {
  std::string config = "smollm2_1_7b";
  std::size_t greedy = 0;
  while (argc > 4 && std::string(argv[1]).starts_with("--")) {
    const std::string opt = argv[1];
    if (opt == "--config") config = argv[2];
    else if (opt == "--greedy") greedy = std::stoul(argv[2]);
    else break;
    argv += 2;
    argc -= 2;
  }
  if (argc != 4) {
    fmt::print(stderr, "usage: layers_probe [--config NAME] [--greedy N] FILE.gguf OUT.f32 ID,ID,...\n");
    return 2;
  }
  if (config == "smollm2_1_7b") return probe<smollm2_1_7b_first2>(argv[1], argv[2], argv[3], greedy);
  if (config == "smollm2_360m") return probe<smollm2_360m_first2>(argv[1], argv[2], argv[3], greedy);
  if (config == "llama32_1b") return probe<llama32_1b_first2>(argv[1], argv[2], argv[3], greedy);
  if (config == "qwen25_0_5b") return probe<qwen25_0_5b_first2>(argv[1], argv[2], argv[3], greedy);
  fmt::print(stderr, "layers_probe: no cut shape for --config {}; known: smollm2_1_7b, smollm2_360m, llama32_1b, qwen25_0_5b\n",
             config);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "layers_probe: {}\n", e.what());
    return 1;
  }
}
