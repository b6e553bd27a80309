#pragma once
// The GGUF hyperparameters of a config type: the one list that bind<C> checks a file
// against (load.hpp) and that every writer of a new model file sets (checkpoints,
// exports, synth_model), so a key cannot be written one way and checked another.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config.hpp"
#include "gguf_writer.hpp"

namespace tlm {

struct hyperparameter {
  std::string_view key;
  bool is_float;     // stored as f32, else u32
  double value;      // what C requires
  bool required;     // bind refuses a file without the key
  double if_absent;  // what an absent optional key means (llama.cpp's reading)
};

template <LlamaConfig C>
constexpr std::array<hyperparameter, 10> hyperparameters{{
    {"llama.block_count", false, double(C::layers), true, 0},
    {"llama.context_length", false, double(C::context), true, 0},
    {"llama.embedding_length", false, double(dim<C>), true, 0},
    {"llama.feed_forward_length", false, double(C::ffn), true, 0},
    {"llama.attention.head_count", false, double(heads<C>), true, 0},
    {"llama.attention.head_count_kv", false, double(C::kv_heads), true, 0},
    {"llama.rope.freq_base", true, double(C::rope_theta), false, 10000.0},
    {"llama.attention.layer_norm_rms_epsilon", true, double(C::rms_eps), true, 0},
    {"llama.vocab_size", false, double(C::vocab), false, double(C::vocab)},
    {"llama.rope.dimension_count", false, double(head_dim<C>), false, double(head_dim<C>)},
}};

// Sets general.architecture and every hyperparameter of C. `layers` (0: C's own)
// writes a file of C's width with fewer blocks, which only a config type with that
// many layers binds (synth_model --layers, for reference checks in less memory).
template <LlamaConfig C>
void write_hyperparameters(gguf::writer& w, std::string_view name, std::size_t layers = 0) {
  w.set("general.architecture", "llama");
  w.set("general.type", "model");
  w.set("general.name", name);
  for (const hyperparameter& h : hyperparameters<C>) {
    if (h.is_float) {
      w.set(h.key, static_cast<float>(h.value));
    } else {
      const double v = h.key == "llama.block_count" && layers != 0 ? double(layers) : h.value;
      w.set(h.key, static_cast<std::uint32_t>(v));
    }
  }
}

}  // namespace tlm
