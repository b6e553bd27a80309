#pragma once
// The GGUF hyperparameters of a config type: the one list that bind<C> checks a file
// against (load.hpp), that every writer of a new model file sets (checkpoints,
// exports, synth_model) and that describe and the choice of a config from a file read
// (config_match.hpp), so a key cannot be written one way and checked or read another.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>

namespace tlm {

// The hyperparameters as plain numbers: a config's (values_of<C>) or a file's
// (read_file_config in config_match.hpp), so the two compare field by field.
struct hyperparameter_values {
  double layers = 0, context = 0, dim = 0, ffn = 0, heads = 0, kv_heads = 0, rope_theta = 0, rms_eps = 0, vocab = 0,
         head_dim = 0;
};

template <LlamaConfig C>
constexpr hyperparameter_values values_of() {
  return {double(C::layers),    double(C::context),    double(dim<C>),  double(C::ffn),
          double(heads<C>),     double(C::kv_heads),   double(C::rope_theta), double(C::rms_eps),
          double(C::vocab),     double(head_dim<C>)};
}

// One key of the list, with no config in it: what reading a file needs.
struct hyperparameter_key {
  std::string_view name;                    // the key without its architecture prefix
  bool is_float;                            // stored as f32, else u32
  bool required;                            // bind refuses a file without the key
  double hyperparameter_values::*field;     // the value it holds
  std::optional<double> if_absent = {};     // what an absent optional key means (llama.cpp's
                                            // reading); none: the config's own value
};

// The one list of keys. A key is "<architecture>.<name>" ("llama.block_count",
// "qwen2.block_count"): the prefix comes from the architecture (the table in
// config.hpp), so one list serves every architecture.
inline constexpr std::array<hyperparameter_key, 10> hyperparameter_keys{{
    {"block_count", false, true, &hyperparameter_values::layers},
    {"context_length", false, true, &hyperparameter_values::context},
    {"embedding_length", false, true, &hyperparameter_values::dim},
    {"feed_forward_length", false, true, &hyperparameter_values::ffn},
    {"attention.head_count", false, true, &hyperparameter_values::heads},
    {"attention.head_count_kv", false, true, &hyperparameter_values::kv_heads},
    {"rope.freq_base", true, false, &hyperparameter_values::rope_theta, 10000.0},
    {"attention.layer_norm_rms_epsilon", true, true, &hyperparameter_values::rms_eps},
    {"vocab_size", false, false, &hyperparameter_values::vocab},
    {"rope.dimension_count", false, false, &hyperparameter_values::head_dim},
}};

// A key of the list for config C.
struct hyperparameter {
  std::string_view name;  // the key without its architecture prefix
  bool is_float;     // stored as f32, else u32
  double value;      // what C requires
  bool required;     // bind refuses a file without the key
  double if_absent;  // what an absent optional key means (llama.cpp's reading)
};

// The full key of a name under an architecture: "qwen2.block_count".
inline std::string key_of(architecture a, std::string_view name) {
  std::string k(info_of(a).name);
  k += '.';
  k.append(name);
  return k;
}
template <LlamaConfig C>
std::string key_of(std::string_view name) {
  return key_of(architecture_v<C>, name);
}

template <LlamaConfig C>
constexpr std::array<hyperparameter, hyperparameter_keys.size()> hyperparameters = [] {
  constexpr hyperparameter_values v = values_of<C>();
  std::array<hyperparameter, hyperparameter_keys.size()> out{};
  for (std::size_t i = 0; i < out.size(); ++i) {
    const hyperparameter_key& k = hyperparameter_keys[i];
    out[i] = {k.name, k.is_float, v.*k.field, k.required, k.if_absent.value_or(v.*k.field)};
  }
  return out;
}();

// A number of the file as the list reads it (f32, or a non-negative integer): the
// one reading of a key, shared by bind's checks and by read_file_config.
struct key_reading {
  bool present = false;
  double value = 0;           // the number, when present and readable
  std::uint64_t integer = 0;  // the same, exactly, for an integer key
  std::string problem;        // why it could not be read ("" when it could)
};

inline key_reading read_key(const gguf::file& f, std::string_view key, bool is_float) {
  key_reading r;
  if (!f.has(key)) return r;
  r.present = true;
  try {
    if (is_float) {
      r.value = f.get_float(key);
    } else {
      r.integer = f.get_uint(key);
      r.value = static_cast<double>(r.integer);
    }
  } catch (const error& e) {
    r.problem = e.what();
  }
  return r;
}

// Sets general.architecture, every hyperparameter of C, and the keys of its RoPE
// scaling as llama.cpp reads them: linear writes rope.scaling.type and its factor;
// llama3 has no key in llama.cpp's format (its converter writes the divisors as the
// rope_freqs tensor, which is a member of the weights, so every writer of the walk
// writes it). `layers` (0: C's own) writes a file of C's width with fewer blocks,
// which only a config type with that many layers binds (synth_model --layers, for
// reference checks in less memory).
template <LlamaConfig C>
void write_hyperparameters(gguf::writer& w, std::string_view name, std::size_t layers = 0) {
  w.set("general.architecture", architecture_name_v<C>);
  w.set("general.type", "model");
  w.set("general.name", name);
  for (const hyperparameter& h : hyperparameters<C>) {
    if (h.is_float) {
      w.set(key_of<C>(h.name), static_cast<float>(h.value));
    } else {
      const double v = h.name == "block_count" && layers != 0 ? double(layers) : h.value;
      w.set(key_of<C>(h.name), static_cast<std::uint32_t>(v));
    }
  }
  if constexpr (rope_scaling_v<C>.type == rope_scaling_type::linear) {
    w.set(key_of<C>("rope.scaling.type"), "linear");
    w.set(key_of<C>("rope.scaling.factor"), static_cast<float>(rope_scaling_v<C>.factor));
  }
}

}  // namespace tlm
