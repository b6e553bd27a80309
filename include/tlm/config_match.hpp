#pragma once
// Which config type a GGUF file is. The file's architecture and hyperparameters are
// read through the one key list (hyperparameters.hpp), its traits from the tensors
// the binding would map (rope_freqs, q/k/v biases, a separate output matrix), and the
// result is compared with each config of a list (configs.hpp), so a program can take
// a file without being told its config, and a file no config fits is written out as
// the struct to add (examples/describe FILE).
//
// Example, given std::string path; template <class C> void run(const tlm::gguf::file&):
//   const tlm::gguf::file f(path);
//   const std::string name = tlm::match_config(f);  // or a no_matching_config error
//   tlm::with_config(name, [&](auto c) { run<typename decltype(c)::type>(f); });
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <tlm/config.hpp>
#include <tlm/configs.hpp>
#include <tlm/error.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/hyperparameters.hpp>
#include <tlm/ops/rope.hpp>

namespace tlm {

// No config of the list fits the file, or more than one does.
struct no_matching_config : model_mismatch {
  using model_mismatch::model_mismatch;
};

// What a config type must say to bind a file: the free fields of config.hpp (as the
// numbers of hyperparameter_values) and the three traits.
struct file_config {
  architecture arch = architecture::llama;
  hyperparameter_values values;
  rope_scaling_params rope_scaling;
  bool attention_bias = false;
  bool tied_embeddings = true;
};

template <LlamaConfig C>
constexpr file_config file_config_of() {
  return {architecture_v<C>, values_of<C>(), rope_scaling_v<C>, attention_bias_v<C>, C::tied_embeddings};
}

namespace detail {

// Llama 3.1's published scaling (Llama 3.2 and 3.3 use factor 32 and 8), which no
// shipped config has: the llama3 scalings a file's rope_freqs is recognised by are
// these and every config's of all_configs.
inline constexpr rope_scaling_params llama31_scaling = rope_llama3(8.0, 1.0, 4.0, 8192);

template <LlamaConfig... Cs>
std::vector<rope_scaling_params> llama3_scalings(config_list<Cs...>) {
  std::vector<rope_scaling_params> out{llama31_scaling};
  for (const rope_scaling_params& s : {rope_scaling_v<Cs>...}) {
    const bool seen = std::any_of(out.begin(), out.end(), [&](const rope_scaling_params& o) {
      return o.factor == s.factor && o.low_freq_factor == s.low_freq_factor && o.high_freq_factor == s.high_freq_factor &&
             o.original_context == s.original_context;
    });
    if (s.type == rope_scaling_type::llama3 && !seen) out.push_back(s);
  }
  return out;
}

inline std::string scaling_text(const rope_scaling_params& s) {
  switch (s.type) {
    case rope_scaling_type::none: return "none";
    case rope_scaling_type::linear: return fmt::format("linear (factor {:g})", s.factor);
    case rope_scaling_type::llama3: break;
  }
  return fmt::format("llama3 (factor {:g}, low {:g}, high {:g}, original context {})", s.factor, s.low_freq_factor,
                     s.high_freq_factor, s.original_context);
}

// The llama3 scaling whose divisors the file's rope_freqs tensor holds, to bind's
// tolerance (load.hpp, check_rope_freqs). The file does not carry the four numbers
// (llama.cpp's converter writes only the divisors), and they are not recoverable from
// the divisors alone in general, so the known scalings are tried.
inline rope_scaling_params llama3_scaling_of(const gguf::file& f, const gguf::tensor_info& t, double theta,
                                             std::size_t head_width, std::vector<std::string>& problems) {
  if (t.enc != encoding::f32 || t.n_dims != 1 || t.elements != head_width / 2) {
    problems.push_back(fmt::format("rope_freqs.weight: expected {} F32 values (one per pair of a head), found {} {} values",
                                   head_width / 2, t.elements, tlm::name(t.enc)));
    return {};
  }
  std::vector<float> got(head_width / 2);
  std::memcpy(got.data(), t.data.data(), got.size() * sizeof(float));
  const std::vector<rope_scaling_params> known = llama3_scalings(all_configs{});
  for (const rope_scaling_params& s : known) {
    bool same = true;
    for (std::size_t i = 0; same && i < got.size(); ++i) {
      const double want = rope_divisor(s, theta, i, head_width);
      same = std::abs(static_cast<double>(got[i]) - want) <= 1e-6 * want;
    }
    if (same) return s;
  }
  std::string tried;
  for (const rope_scaling_params& s : known) tried += (tried.empty() ? "" : "; ") + scaling_text(s);
  problems.push_back(fmt::format(
      "rope_freqs.weight: {}'s divisors ({:g} ... {:g}) are not those of a llama3 scaling tlm knows ({}); write the "
      "config's rope_scaling = tlm::rope_llama3(factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) "
      "by hand from the rope_scaling of the model's config.json",
      f.name(), got.front(), got.back(), tried));
  return {};
}

}  // namespace detail

// The config a file asks for, read as bind reads it. A file whose keys cannot say
// (no architecture, a required key missing or of the wrong type) is a model_mismatch
// listing every such key.
inline file_config read_file_config(const gguf::file& f) {
  std::vector<std::string> problems;
  file_config c;
  if (!f.has("general.architecture")) {
    throw model_mismatch(f.name() + ": general.architecture: missing, so the file names no model architecture; tlm runs " +
                         "the architectures llama and qwen2. Is it a model file (examples/inspect lists its keys)?");
  }
  const std::string arch(f.get_string("general.architecture"));
  const auto* info = std::find_if(std::begin(architectures), std::end(architectures),
                                  [&](const architecture_info& a) { return a.name == arch; });
  if (info == std::end(architectures)) {
    std::string names;
    for (const auto& a : architectures) names += (names.empty() ? "" : ", ") + std::string(a.name);
    throw model_mismatch(f.name() + ": general.architecture is \"" + arch + "\"; tlm runs the architectures " + names +
                         " only, so no config type can describe this file");
  }
  c.arch = info->arch;
  for (const hyperparameter_key& k : hyperparameter_keys) {
    const std::string key = key_of(c.arch, k.name);
    const key_reading r = read_key(f, key, k.is_float);
    if (!r.problem.empty()) problems.push_back(key + ": " + r.problem);
    else if (r.present) c.values.*k.field = r.value;
    else if (k.required) problems.push_back(key + ": missing");
    else if (k.if_absent) c.values.*k.field = *k.if_absent;
  }
  // The optional keys whose absence means "whatever the config says": the file's
  // tensors and the other keys say it instead.
  const bool vocab_key = f.has(key_of(c.arch, "vocab_size"));
  if (!vocab_key) {
    if (const auto* embd = f.find_tensor("token_embd.weight"); embd != nullptr && embd->n_dims == 2) {
      c.values.vocab = static_cast<double>(embd->dims[1]);
    } else if (f.has("tokenizer.ggml.tokens")) {
      c.values.vocab = static_cast<double>(f.get_string_array("tokenizer.ggml.tokens").size());
    } else {
      problems.push_back(key_of(c.arch, "vocab_size") + ": missing, and the file has no token_embd.weight or tokenizer.ggml.tokens to count");
    }
  }
  if (!f.has(key_of(c.arch, "rope.dimension_count")) && c.values.heads > 0)
    c.values.head_dim = c.values.dim / c.values.heads;
  if (!problems.empty()) {
    std::string msg = f.name() + ": cannot tell which config the file needs (" + std::to_string(problems.size()) +
                      (problems.size() == 1 ? " problem" : " problems") + "):";
    for (const auto& p : problems) msg += "\n  - " + p;
    throw model_mismatch(msg + "\nThe file lacks what a " + arch + " model file declares; convert it again with llama.cpp's converter.");
  }

  // The traits, from the keys and tensors bind checks them by (load.hpp).
  const std::string type_key = key_of(c.arch, "rope.scaling.type");
  const std::string type = f.has(type_key) ? std::string(f.get_string(type_key)) : "none";
  if (type == "linear") {
    key_reading factor = read_key(f, key_of(c.arch, "rope.scaling.factor"), true);
    if (!factor.present) factor = read_key(f, key_of(c.arch, "rope.scale_linear"), true);
    if (!factor.present || !factor.problem.empty() || !(factor.value > 0))
      throw model_mismatch(f.name() + ": " + type_key + " is \"linear\" but " + key_of(c.arch, "rope.scaling.factor") +
                           " is missing or not a positive number; convert the file again with its scaling factor");
    c.rope_scaling = rope_linear(factor.value);
  } else if (type != "none") {
    throw model_mismatch(f.name() + ": " + type_key + " is \"" + type +
                         "\"; tlm implements RoPE scaling none, linear and llama3 (rope_freqs) only");
  } else if (const auto* freqs = f.find_tensor("rope_freqs.weight"); freqs != nullptr) {
    c.rope_scaling = detail::llama3_scaling_of(f, *freqs, c.values.rope_theta, static_cast<std::size_t>(c.values.head_dim), problems);
    if (!problems.empty()) throw model_mismatch(problems.front());
  }
  // A file with biases has them in every block; block 0 says which kind of file it is.
  c.attention_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  return c;
}

// A number as a C++ float literal that reads back as the same float ("1e-05f", "10000.0f").
inline std::string float_literal(double v) {
  std::string s = fmt::format("{}", static_cast<float>(v));
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

// "llama: 30 layers, dim 576, ..." : a file config in one line, for messages.
inline std::string describe_file_config(const file_config& c) {
  const hyperparameter_values& v = c.values;
  return fmt::format("{}: {} layers, dim {}, heads {} / kv heads {}, head_dim {}, ffn {}, vocab {}, context {}, rms_eps {:g}, "
                     "rope_theta {:g}, RoPE scaling {}, attention biases {}, embeddings {}",
                     info_of(c.arch).name, v.layers, v.dim, v.heads, v.kv_heads, v.head_dim, v.ffn, v.vocab, v.context,
                     static_cast<float>(v.rms_eps), static_cast<float>(v.rope_theta), detail::scaling_text(c.rope_scaling),
                     c.attention_bias ? "q/k/v" : "none", c.tied_embeddings ? "tied" : "separate output.weight");
}

// Every field in which a file's config and config `name` differ, as "layers: the file
// has 2, tiny_gqa 3"; empty when the config fits. rms_eps and rope_theta compare at
// f32, as the file stores them and bind compares them.
inline std::vector<std::string> config_differences(const file_config& file, const file_config& config, std::string_view name) {
  std::vector<std::string> out;
  auto differ = [&](std::string_view field, const std::string& in_file, const std::string& in_config) {
    if (in_file != in_config) out.push_back(fmt::format("{}: the file has {}, {} {}", field, in_file, name, in_config));
  };
  differ("architecture", std::string(info_of(file.arch).name), std::string(info_of(config.arch).name));
  const hyperparameter_values& a = file.values;
  const hyperparameter_values& b = config.values;
  using field = std::pair<std::string_view, double hyperparameter_values::*>;
  static constexpr field sizes[] = {{"layers", &hyperparameter_values::layers},   {"dim", &hyperparameter_values::dim},
                                    {"heads", &hyperparameter_values::heads},     {"kv_heads", &hyperparameter_values::kv_heads},
                                    {"head_dim", &hyperparameter_values::head_dim}, {"ffn", &hyperparameter_values::ffn},
                                    {"vocab", &hyperparameter_values::vocab},     {"context", &hyperparameter_values::context}};
  for (const auto& [field_name, m] : sizes) differ(field_name, fmt::format("{}", a.*m), fmt::format("{}", b.*m));
  differ("rms_eps", fmt::format("{}", static_cast<float>(a.rms_eps)), fmt::format("{}", static_cast<float>(b.rms_eps)));
  differ("rope_theta", fmt::format("{}", static_cast<float>(a.rope_theta)), fmt::format("{}", static_cast<float>(b.rope_theta)));
  differ("rope_scaling", detail::scaling_text(file.rope_scaling), detail::scaling_text(config.rope_scaling));
  differ("attention_bias", file.attention_bias ? "true" : "false", config.attention_bias ? "true" : "false");
  differ("tied_embeddings", file.tied_embeddings ? "true" : "false", config.tied_embeddings ? "true" : "false");
  return out;
}

// One config of a list against a file.
struct config_comparison {
  std::string_view name;
  std::vector<std::string> differences;  // empty: the config fits the file
};

template <LlamaConfig... Cs>
std::vector<config_comparison> compare_configs(const file_config& file, config_list<Cs...>) {
  return {config_comparison{config_name<Cs>(), config_differences(file, file_config_of<Cs>(), config_name<Cs>())}...};
}

// The C++ config struct named `name` that binds a file of config `c`: every field
// of config.hpp and every trait, spelled out even where it is plain Llama's. A shape
// no config type can express (heads not a multiple of kv heads, an odd head
// width, dim other than heads × head_dim) is a model_mismatch saying which.
inline std::string config_struct_text(const file_config& c, std::string_view name) {
  const hyperparameter_values& v = c.values;
  const auto whole = [](double x) { return x >= 1 && x == std::floor(x); };
  if (!whole(v.kv_heads) || !whole(v.heads) || std::fmod(v.heads, v.kv_heads) != 0)
    throw model_mismatch(fmt::format("{} query heads are not a whole multiple of {} kv heads, which a config (heads = kv_heads * "
                                     "group) cannot express", v.heads, v.kv_heads));
  if (!whole(v.head_dim) || std::fmod(v.head_dim, 2) != 0)
    throw model_mismatch(fmt::format("head_dim {} is not even, which a config (head_dim = 2 * half_head) cannot express", v.head_dim));
  if (v.dim != v.heads * v.head_dim)
    throw model_mismatch(fmt::format("embedding_length {} is not heads {} × head_dim {}, which tlm's configs (dim = heads * "
                                     "head_dim) cannot express", v.dim, v.heads, v.head_dim));
  std::string s = fmt::format("struct {} {{\n", name);
  const auto size_field = [&](std::string_view field, double x, std::string_view comment = {}) {
    s += fmt::format("  static constexpr std::size_t {} = {};{}\n", field, static_cast<std::uint64_t>(x),
                     comment.empty() ? std::string() : "  // " + std::string(comment));
  };
  size_field("kv_heads", v.kv_heads);
  size_field("group", v.heads / v.kv_heads, fmt::format("query heads per kv head: {} heads", v.heads));
  size_field("half_head", v.head_dim / 2, fmt::format("head_dim {}", v.head_dim));
  size_field("ffn", v.ffn);
  size_field("layers", v.layers);
  size_field("vocab", v.vocab);
  size_field("context", v.context);
  s += fmt::format("  static constexpr float rms_eps = {};\n", float_literal(v.rms_eps));
  s += fmt::format("  static constexpr float rope_theta = {};\n", float_literal(v.rope_theta));
  s += fmt::format("  static constexpr bool tied_embeddings = {};\n", c.tied_embeddings ? "true" : "false");
  const rope_scaling_params& r = c.rope_scaling;
  s += "  static constexpr auto rope_scaling = ";
  if (r.type == rope_scaling_type::none) s += "tlm::rope_scaling_params{};  // none\n";
  else if (r.type == rope_scaling_type::linear) s += fmt::format("tlm::rope_linear({});\n", r.factor);
  else
    s += fmt::format("tlm::rope_llama3({}, {}, {}, {});\n", r.factor, r.low_freq_factor, r.high_freq_factor, r.original_context);
  s += fmt::format("  static constexpr bool attention_bias = {};\n", c.attention_bias ? "true" : "false");
  s += fmt::format("  static constexpr auto arch = tlm::architecture::{};\n", info_of(c.arch).name);
  return s + "};\n";
}

// The name of the one config of `List` whose hyperparameters and traits are the file's.
// None: a no_matching_config that gives the file's hyperparameters, the nearest config
// and how it differs, and what to do (--config, or the struct to add); two or more: one
// that names them.
template <class List = program_configs>
std::string match_config(const gguf::file& f) {
  const file_config file = read_file_config(f);
  const std::vector<config_comparison> all = compare_configs(file, List{});
  std::vector<std::string_view> fits;
  for (const auto& c : all)
    if (c.differences.empty()) fits.push_back(c.name);
  if (fits.size() == 1) return std::string(fits.front());
  if (fits.size() > 1) {
    std::string names;
    for (const auto n : fits) names += (names.empty() ? "" : ", ") + std::string(n);
    throw no_matching_config(f.name() + ": the file's hyperparameters fit " + std::to_string(fits.size()) +
                             " configs alike (" + names + "); pass --config NAME to choose one");
  }
  const auto nearest = std::min_element(all.begin(), all.end(), [](const config_comparison& a, const config_comparison& b) {
    return a.differences.size() < b.differences.size();
  });
  std::string msg = f.name() + ": no config of tlm fits this file, which has " + describe_file_config(file) + ".";
  if (nearest != all.end()) {
    msg += "\nThe nearest config is " + std::string(nearest->name) + ", which differs in " +
           std::to_string(nearest->differences.size()) + ":";
    for (const auto& d : nearest->differences) msg += "\n  - " + d;
  }
  msg += "\nPass --config NAME to bind the file to a config anyway (binding lists every mismatch), or add a config type for it";
  try {
    std::string text = config_struct_text(file, "my_model");
    text.pop_back();  // the message's last line needs no newline
    msg += ": this struct binds the file (`examples/describe " + f.name() + "` prints it as a header to include):\n" + text;
  } catch (const model_mismatch& e) {
    msg += std::string(", though no config type can describe this file: ") + e.what();
  }
  throw no_matching_config(msg);
}

// The config a program runs a model file with: the one the user named (--config,
// config=...), else the one of `List` whose hyperparameters the file has, then said on
// `note` when given (the programs' stderr), so that the choice is never silent.
template <class List = program_configs>
std::string choose_config(std::string_view named, const std::string& path, std::FILE* note = nullptr) {
  if (!named.empty()) return std::string(named);
  std::string name = match_config<List>(gguf::file(path));
  if (note) fmt::print(note, "config: {} (from the file's hyperparameters)\n", name);
  return name;
}

}  // namespace tlm
