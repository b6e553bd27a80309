// synth_model: write a random-weight GGUF file with the exact shape of a SmolLM2
// config, for tests and benchmarks of models too large to download here.
//
//   synth_model --config NAME --out PATH    (NAME: a config of tlm::all_configs, tlm/configs.hpp)
//               [--encoding q4_1] [--embd-encoding q8_0] [--seed N] [--std S] [--tokenizer-from REAL.gguf]
//               [--layers N]
//
// The tensor list comes from the one walk over tlm::model_weights<C>, so the file
// has exactly the tensors the loader expects, named as it names them. Matrices are
// N(0, S) in --encoding (S = --std, default 0.02; tests give the tiny configs a larger S so that
// attention is far from uniform and RoPE matters) (token_embd in --embd-encoding, as llama.cpp's quantizer
// keeps it at Q8_0 when the row length is not a multiple of 256); norms are F32
// near 1. The tokenizer.* keys are copied from --tokenizer-from, or else a byte-level
// BPE vocabulary of the config's size is synthesized: 3 control tokens, the 256 byte
// symbols, then two-symbol merges (a vocabulary smaller than 259, as the tiny test
// configs have, keeps only the first byte symbols and has no merges).
// --layers N keeps only the first N blocks (block_count N): a file of the config's exact
// width, heads and vocabulary that the float64 reference can check in a few GB of memory
// (tests bind it to a config type with `layers = N`; the named type refuses it).
// The tiny test configs (tiny_gqa, tiny_untied) are accepted too: their files are the
// fuzzers' seeds and the random models that tests compare with the float64 reference.
#include <tlm/configs.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/hyperparameters.hpp>
#include <tlm/ops/rope.hpp>
#include <tlm/text/tokenizer.hpp>
#include <tlm/weights.hpp>

#include <fmt/core.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct options {
  std::string config, out, tokenizer_from;
  tlm::encoding enc = tlm::encoding::q4_1;
  tlm::encoding embd_enc = tlm::encoding::q8_0;
  std::uint64_t seed = 1;
  float std_dev = 0.02f;  // of the matrices' values
  std::size_t layers = 0;  // 0: all of the config's blocks
};

tlm::encoding parse_encoding(std::string_view s) {
  if (const auto* r = tlm::parse_writable_encoding(s)) return r->enc;
  throw tlm::error(fmt::format("unknown encoding '{}'; use one of {}", s, tlm::writable_encodings_list()));
}

// llama.cpp's general.file_type for a model whose matrices are all `enc`.
std::uint32_t file_type(tlm::encoding enc) {
  const auto* r = tlm::find_encoding(enc);
  return r != nullptr && r->llama_file_type >= 0 ? static_cast<std::uint32_t>(r->llama_file_type) : 0;
}

// A seed per tensor name, so a tensor's values do not depend on the order of the walk.
std::uint64_t tensor_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a
  for (const char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// GPT-2's byte-level symbols, in byte order (the tokenizer's own map).
std::vector<std::string> byte_symbols() {
  const auto b2cp = tlm::detail::byte_to_code_point();
  std::vector<std::string> out(256);
  for (std::size_t b = 0; b < 256; ++b) tlm::utf8::append_code_point(out[b], b2cp[b]);
  return out;
}

void synthesize_tokenizer(tlm::gguf::writer& w, std::size_t vocab) {
  const auto bytes = byte_symbols();
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<std::int32_t> types(tokens.size(), 3);  // control
  for (std::size_t b = 0; b < bytes.size() && tokens.size() < vocab; ++b) {
    tokens.push_back(bytes[b]);
    types.push_back(1);
  }
  std::vector<std::string> merges;
  for (std::size_t i = 0; i < 256 && tokens.size() < vocab; ++i) {
    for (std::size_t j = 0; j < 256 && tokens.size() < vocab; ++j) {
      tokens.push_back(bytes[i] + bytes[j]);
      types.push_back(1);
      merges.push_back(bytes[i] + " " + bytes[j]);
    }
  }
  if (tokens.size() != vocab) throw tlm::error(fmt::format("cannot synthesize a vocabulary of {} tokens (at most {})", vocab, tokens.size()));
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", "smollm");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_array("tokenizer.ggml.token_type", types);
  w.set_string_array("tokenizer.ggml.merges", merges);
  w.set("tokenizer.ggml.bos_token_id", std::uint32_t{1});
  w.set("tokenizer.ggml.eos_token_id", std::uint32_t{2});
  w.set("tokenizer.ggml.unknown_token_id", std::uint32_t{0});
  w.set("tokenizer.ggml.padding_token_id", std::uint32_t{2});
  w.set("tokenizer.ggml.add_bos_token", false);
}

template <tlm::LlamaConfig C>
int synthesize(const options& o) {
  if (o.layers > C::layers) {
    throw tlm::error(fmt::format("--layers {}: {} has only {} blocks; give 1 to {}", o.layers, o.config, C::layers, C::layers));
  }
  const std::size_t layers = o.layers != 0 ? o.layers : C::layers;
  tlm::gguf::writer w;
  tlm::write_hyperparameters<C>(w,
                                layers == C::layers
                                    ? fmt::format("synthetic {} (random weights, seed {})", o.config, o.seed)
                                    : fmt::format("synthetic {}, first {} of {} layers (random weights, seed {})", o.config,
                                                  layers, C::layers, o.seed),
                                layers);
  w.set("general.file_type", file_type(o.enc));

  // The source file stays open until write() returns, so copied values stay valid.
  std::optional<tlm::gguf::file> tok;
  if (!o.tokenizer_from.empty()) {
    tok.emplace(o.tokenizer_from);
    std::size_t copied = 0;
    for (const auto& e : tok->metadata()) {
      if (e.key.starts_with("tokenizer.")) {
        w.set_value(e.key, e.val);
        ++copied;
      }
    }
    const auto n = tok->get_string_array("tokenizer.ggml.tokens").size();
    if (n != C::vocab) {
      throw tlm::model_mismatch(fmt::format("{}: its vocabulary has {} tokens but {} needs {}; take the tokenizer from a file of the same family",
                                            o.tokenizer_from, n, o.config, C::vocab));
    }
    fmt::print("copied {} tokenizer keys from {}\n", copied, o.tokenizer_from);
  } else {
    synthesize_tokenizer(w, C::vocab);
  }
  w.set("general.quantization_version", std::uint32_t{2});

  std::uint64_t params = 0;
  tlm::model_weights<C> weights;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, auto& t) {
        using T = std::remove_cvref_t<decltype(t)>;
        if (name.layer >= 0 && static_cast<std::size_t>(name.layer) >= layers) return;
        const std::string n = name.str();
        const std::size_t rows = T::rows, cols = T::cols;
        params += rows * cols;
        const bool is_vec = T::rank == 1;
        const tlm::encoding enc = is_vec ? tlm::encoding::f32 : (n == "token_embd.weight" ? o.embd_enc : o.enc);
        if (tlm::row_bytes(enc, cols) == 0) {
          throw tlm::shape_error(fmt::format("{}: rows of {} values do not fit {} blocks; choose another --encoding", n, cols, tlm::name(enc)));
        }
        std::vector<std::uint64_t> dims = is_vec ? std::vector<std::uint64_t>{cols} : std::vector<std::uint64_t>{cols, rows};
        const std::uint64_t seed = tensor_seed(o.seed, n);
        const float std_dev = o.std_dev;
        if (name.member == "rope_freqs") {
          // Llama 3's per-pair divisors, as llama.cpp's converter writes them: not random.
          const auto d = tlm::rope_divisors<C>();
          std::vector<float> values(d.begin(), d.end());
          w.add_tensor_f32(n, std::move(dims), enc, values);
          return;
        }
        // Norm gains near 1; biases, like matrices, centred on 0.
        const bool is_gain = is_vec && !name.is_bias();
        w.add_tensor_generated(n, std::move(dims), enc, [=](std::span<std::byte> out) {
          std::mt19937_64 rng(seed);
          std::normal_distribution<float> dist(is_gain ? 1.0f : 0.0f, is_gain ? 0.1f : std_dev);
          std::vector<float> row(cols);
          const std::size_t rb = tlm::row_bytes(enc, cols);
          for (std::size_t r = 0; r < rows; ++r) {
            for (auto& v : row) v = dist(rng);
            tlm::quantize_row(enc, row.data(), out.data() + r * rb, cols);
          }
        });
      },
      weights);

  const auto start = std::chrono::steady_clock::now();
  w.write(o.out);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("wrote {}: {} ({} tensors, {} parameters, matrices {}, token_embd {}) in {:.1f} s\n", o.out, o.config, w.tensor_count(),
             params, tlm::name(o.enc), tlm::name(o.embd_enc), secs);
  return 0;
}

int run(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw tlm::error(fmt::format("option {} needs a value", a));
      return argv[++i];
    };
    if (a == "--config") o.config = next();
    else if (a == "--out") o.out = next();
    else if (a == "--encoding") o.enc = parse_encoding(next());
    else if (a == "--embd-encoding") o.embd_enc = parse_encoding(next());
    else if (a == "--seed") o.seed = std::stoull(next());
    else if (a == "--std") {
      o.std_dev = std::stof(next());
      if (!(o.std_dev > 0.0f && o.std_dev < 100.0f)) throw tlm::error(fmt::format("--std {} must be a positive number below 100", o.std_dev));
    }
    else if (a == "--tokenizer-from") o.tokenizer_from = next();
    else if (a == "--layers") {
      const std::string v = next();
      std::size_t used = 0;
      unsigned long long n = 0;
      try {
        n = std::stoull(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || v.empty() || v[0] == '-' || n == 0 || n > 1024)
        throw tlm::error(fmt::format("--layers takes a whole number of blocks from 1 up, got '{}'", v));
      o.layers = static_cast<std::size_t>(n);
    }
    else throw tlm::error(fmt::format("unknown option '{}'", a));
  }
  if (o.config.empty() || o.out.empty()) {
    fmt::print(stderr,
               "usage: synth_model --config NAME --out PATH\n"
               "                   [--encoding q4_1] [--embd-encoding q8_0] [--seed N] [--std S] [--tokenizer-from REAL.gguf]\n"
               "                   [--layers N]\n"
               "NAME: {}\n",
               tlm::config_names_text<tlm::all_configs>());
    return 2;
  }
  return tlm::with_config<tlm::all_configs>(o.config, [&](auto c) { return synthesize<typename decltype(c)::type>(o); });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // tlm::error included: its message says what to do
    fmt::print(stderr, "synth_model: {}\n", e.what());
    return 1;
  }
}
