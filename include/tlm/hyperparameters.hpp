#pragma once
// The GGUF hyperparameters of a config type: the one list that bind<C> checks a file
// against (load.hpp) and that every writer of a new model file sets (checkpoints,
// exports, synth_model), so a key cannot be written one way and checked another.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "config.hpp"
#include "gguf_writer.hpp"

namespace tlm {

// A key is "<architecture>.<name>" ("llama.block_count", "qwen2.block_count"): the
// prefix comes from C's architecture (the table in config.hpp), so one list serves
// every architecture.
struct hyperparameter {
  std::string_view name;  // the key without its architecture prefix
  bool is_float;     // stored as f32, else u32
  double value;      // what C requires
  bool required;     // bind refuses a file without the key
  double if_absent;  // what an absent optional key means (llama.cpp's reading)
};

// The full key of a name under C's architecture: "qwen2.block_count".
template <LlamaConfig C>
std::string key_of(std::string_view name) {
  std::string k(architecture_name_v<C>);
  k += '.';
  k.append(name);
  return k;
}

template <LlamaConfig C>
constexpr std::array<hyperparameter, 10> hyperparameters{{
    {"block_count", false, double(C::layers), true, 0},
    {"context_length", false, double(C::context), true, 0},
    {"embedding_length", false, double(dim<C>), true, 0},
    {"feed_forward_length", false, double(C::ffn), true, 0},
    {"attention.head_count", false, double(heads<C>), true, 0},
    {"attention.head_count_kv", false, double(C::kv_heads), true, 0},
    {"rope.freq_base", true, double(C::rope_theta), false, 10000.0},
    {"attention.layer_norm_rms_epsilon", true, double(C::rms_eps), true, 0},
    {"vocab_size", false, double(C::vocab), false, double(C::vocab)},
    {"rope.dimension_count", false, double(head_dim<C>), false, double(head_dim<C>)},
}};

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
