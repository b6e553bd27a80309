#pragma once
// Training checkpoints and exports, written through the one weight walk.
//
// A checkpoint is a pair of GGUF files plus a one-line pointer file, all in one folder:
//   checkpoint-<step>.gguf        the weights as a normal model file (f32; hyperparameters
//                                 and tokenizer copied from the source model), loadable by
//                                 examples/generate and llama.cpp
//   checkpoint-<step>.optim.gguf  AdamW's m and v ("m.<tensor>", "v.<tensor>", f32) and the
//                                 training state (tlm.train.* keys: step, seed, data position,
//                                 RNG state, options)
//   checkpoint                    the name of the newest complete pair ("checkpoint-<step>")
// The optimizer state lives in a sidecar because llama.cpp refuses a model file whose
// tensor count differs from what the architecture creates ("wrong number of tensors").
// Each file is written atomically (temporary file, fsync, rename, fsync of the folder);
// the pointer file is written last, so it is the commit: a kill at any moment leaves the
// previous pointer naming a complete pair. Both files record the step, so a pair that
// does not belong together is refused on load.
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "../config.hpp"
#include "../encoding.hpp"
#include "../error.hpp"
#include "../gguf.hpp"
#include "../gguf_writer.hpp"
#include "../hyperparameters.hpp"
#include "../load.hpp"
#include "../quant.hpp"
#include "../tokenizer.hpp"
#include "../weights.hpp"
#include "adamw.hpp"
#include "weights.hpp"

namespace tlm {

// Everything besides tensors that a resumed run needs to continue exactly.
struct train_state {
  std::uint64_t step = 0;           // optimizer steps taken
  std::uint64_t seed = 0;           // the run's seed (weights init, data shuffle)
  std::uint64_t data_position = 0;  // training windows consumed so far
  std::uint64_t rng_state = 0;      // the data shuffle's generator after data_position windows
  std::uint64_t batch = 0, seq = 0, threads = 0;
  adamw_options options;
  std::string config;  // config type name, e.g. "smollm2_135m"
  std::string data;    // the data file trained on (checked on resume)
  bool chat = false;
  // The kernel level the run computed with (avx512, avx2, scalar): levels round
  // differently, so a resume is bit-exact only on the same level (and thread count).
  // Empty in checkpoints written before it was recorded.
  std::string kernels;
};

namespace detail {

// GGUF dims of a walked tensor: {cols} for a vector, {cols, rows} for a matrix.
template <class U>
std::vector<std::uint64_t> gguf_dims() {
  if constexpr (U::rank == 1) return {U::cols};
  else return {U::cols, U::rows};
}

// Writes a small file atomically: temporary file, fsync, rename, fsync of the folder.
inline void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
  const std::string tmp = path.string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw error(tmp + ": cannot create: " + std::strerror(errno) + "; check that the folder exists and is writable");
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw error(tmp + ": write failed: " + std::strerror(err) + "; check free disk space");
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw error(tmp + ": fsync/close failed: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw error(path.string() + ": cannot rename " + tmp + " into place: " + std::strerror(err));
  }
  const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// llama.cpp's general.file_type for a model whose matrices are `enc` (norms stay f32).
inline std::uint32_t llama_file_type(encoding enc) {
  const auto* r = find_encoding(enc);
  if (r == nullptr || r->llama_file_type < 0 || !r->writable) {
    throw error("export: cannot write a model as " + std::string(name(enc)) + "; use one of " + writable_encodings_list());
  }
  return static_cast<std::uint32_t>(r->llama_file_type);
}

}  // namespace detail

// Copies the source model's metadata (hyperparameters, tokenizer, chat template, names)
// except the keys that describe the tensor encoding, which the new file sets itself.
inline void copy_model_metadata(gguf::writer& w, const gguf::file& source) {
  for (const auto& e : source.metadata()) {
    if (e.key == "general.alignment" || e.key == "general.file_type" || e.key == "general.quantization_version") continue;
    if (e.key.starts_with("tlm.")) continue;  // a previous run's training state is not this file's
    w.set_value(e.key, e.val);
  }
}

// Adds every weight tensor of `w` to `out`, matrices encoded as `enc` (norms always f32,
// as llama.cpp's quantizer keeps them). Values are read from w when the file is written.
template <class W>
void add_weights(gguf::writer& out, const W& w, encoding enc) {
  for_each_tensor(
      [&](const tensor_name& name, const auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        const encoding e = U::rank == 1 ? encoding::f32 : enc;
        const float* values = t.data();  // [rows, cols]
        out.add_tensor_generated(name.str(), detail::gguf_dims<U>(), e, [values, e](std::span<std::byte> dst) {
          const std::size_t rb = row_bytes(e, U::cols);
          for (std::size_t r = 0; r < U::rows; ++r) quantize_row(e, values + r * U::cols, dst.data() + r * rb, U::cols);
        });
      },
      w);
}

// The tokenizer section of a model trained on bytes (make_byte_vocabulary): byte-level
// BPE with no merges, the SmolLM2 pre-tokenizer, <|endoftext|> as end of text.
inline void write_byte_tokenizer(gguf::writer& w, std::size_t vocab) {
  const byte_vocabulary v = make_byte_vocabulary(vocab);
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", "smollm");
  w.set_string_array("tokenizer.ggml.tokens", std::span<const std::string>(v.tokens));
  w.set_array("tokenizer.ggml.token_type", v.types);
  w.set_string_array("tokenizer.ggml.merges", std::span<const std::string>());
  if (v.eos >= 0) {
    w.set("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(v.eos));
    w.set("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(v.eos));
    w.set("tokenizer.ggml.padding_token_id", static_cast<std::uint32_t>(v.eos));
  }
  w.set("tokenizer.ggml.add_bos_token", false);
}

// Writes `w` as a model file (atomic). `source` supplies metadata; without it the
// hyperparameters of C and a byte tokenizer (the from-scratch trainer reads bytes) are
// written, so the file runs in generate and llama.cpp.
template <LlamaConfig C>
void write_model(const std::filesystem::path& path, const trainable<C, float>& w, encoding enc, const gguf::file* source,
                 std::uint64_t step) {
  gguf::writer out;
  if (source) {
    copy_model_metadata(out, *source);
  } else {
    write_hyperparameters<C>(out, std::string(type_name<C>()) + " trained from scratch by tlm");
    write_byte_tokenizer(out, C::vocab);
  }
  out.set("general.file_type", detail::llama_file_type(enc));
  if (enc != encoding::f32 && enc != encoding::f16 && enc != encoding::bf16) out.set("general.quantization_version", std::uint32_t{2});
  out.set("tlm.train.step", step);
  add_weights(out, w, enc);
  out.write(path);
}

namespace detail {

// The one list of a checkpoint's state keys: put_state writes and get_state reads
// through it, so the two cannot drift apart. f(key, field, required) for each.
template <class State, class F>
  requires std::is_same_v<std::remove_const_t<State>, train_state>
void walk_state(State& s, F&& f) {
  f("tlm.train.step", s.step, true);
  f("tlm.train.seed", s.seed, true);
  f("tlm.train.data_position", s.data_position, true);
  f("tlm.train.rng_state", s.rng_state, true);
  f("tlm.train.batch", s.batch, true);
  f("tlm.train.seq", s.seq, true);
  f("tlm.train.threads", s.threads, true);
  f("tlm.train.config", s.config, true);
  f("tlm.train.data", s.data, true);
  f("tlm.train.chat", s.chat, true);
  f("tlm.train.kernels", s.kernels, false);  // absent from checkpoints written before it was recorded
  auto& o = s.options;
  f("tlm.adamw.lr", o.lr, true);
  f("tlm.adamw.beta1", o.beta1, true);
  f("tlm.adamw.beta2", o.beta2, true);
  f("tlm.adamw.eps", o.eps, true);
  f("tlm.adamw.weight_decay", o.weight_decay, true);
  f("tlm.adamw.clip", o.clip, true);
  f("tlm.adamw.warmup", o.warmup, true);
  f("tlm.adamw.total_steps", o.total_steps, true);
  f("tlm.adamw.min_lr", o.min_lr, true);
}

inline void put_state(gguf::writer& w, const train_state& s) {
  w.set("general.architecture", "tlm-optimizer");
  walk_state(s, [&](std::string_view key, const auto& v, bool) {
    using V = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::string> || std::is_same_v<V, bool> || std::is_same_v<V, double>) w.set(key, v);
    else w.set(key, static_cast<std::uint64_t>(v));
  });
}

inline train_state get_state(const gguf::file& f) {
  train_state s;
  walk_state(s, [&](std::string_view key, auto& v, bool required) {
    if (!f.has(key)) {
      if (!required) return;
      throw format_error(f.name() + ": optimizer state lacks " + std::string(key) +
                         "; the file is not a tlm checkpoint sidecar, or a damaged one: resume from another checkpoint");
    }
    using V = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::string>) v = std::string(f.get_string(key));
    else if constexpr (std::is_same_v<V, bool>) v = f.get_bool(key);
    else if constexpr (std::is_same_v<V, double>) v = f.get_float(key);
    else v = static_cast<V>(f.get_uint(key));
  });
  return s;
}

// Copies tensor `name` of f (f32, exactly `n` values) into dst.
inline void read_f32(const gguf::file& f, const std::string& name, float* dst, std::size_t n) {
  const gguf::tensor_info* t = f.find_tensor(name);
  if (!t) throw format_error(f.name() + ": tensor '" + name + "' is missing; the checkpoint is incomplete or for another model");
  if (t->enc != encoding::f32 || t->elements != n) {
    throw format_error(f.name() + ": tensor '" + name + "' is not " + std::to_string(n) + " f32 values; the checkpoint is for another config");
  }
  std::memcpy(dst, t->data.data(), n * sizeof(float));
}

}  // namespace detail

// The folder's newest complete checkpoint name ("checkpoint-<step>"), or "" when none.
inline std::string latest_checkpoint(const std::filesystem::path& dir) {
  std::ifstream in(dir / "checkpoint");
  std::string name;
  if (!in || !std::getline(in, name)) return "";
  return name;
}

// Writes a checkpoint into `dir` (see the top of this file) and removes the previous pair.
template <LlamaConfig C>
void save_checkpoint(const std::filesystem::path& dir, const trainable<C, float>& w, const adamw<trainable<C, float>>& opt,
                     const train_state& state, const gguf::file* source) {
  const std::string stem = "checkpoint-" + std::to_string(state.step);
  const std::string previous = latest_checkpoint(dir);
  gguf::writer side;
  detail::put_state(side, state);
  for_each_tensor(
      [&](const tensor_name& name, const auto& m, const auto& v) {
        using U = std::remove_cvref_t<decltype(m)>;
        side.add_tensor(("m." + name.str()), detail::gguf_dims<U>(), encoding::f32, std::as_bytes(std::span(m.data(), U::rows * U::cols)));
        side.add_tensor(("v." + name.str()), detail::gguf_dims<U>(), encoding::f32, std::as_bytes(std::span(v.data(), U::rows * U::cols)));
      },
      opt.m(), opt.v());
  side.write(dir / (stem + ".optim.gguf"));
  write_model<C>(dir / (stem + ".gguf"), w, encoding::f32, source, state.step);
  detail::write_file_atomic(dir / "checkpoint", stem + "\n");  // the commit point
  if (!previous.empty() && previous != stem) {
    std::error_code ec;  // a leftover old pair wastes space but is harmless
    std::filesystem::remove(dir / (previous + ".gguf"), ec);
    std::filesystem::remove(dir / (previous + ".optim.gguf"), ec);
  }
}

// Loads the newest checkpoint of `dir` into w and opt; returns its training state.
template <LlamaConfig C>
train_state load_checkpoint(const std::filesystem::path& dir, trainable<C, float>& w, adamw<trainable<C, float>>& opt) {
  const std::string stem = latest_checkpoint(dir);
  if (stem.empty()) {
    throw error((dir / "checkpoint").string() + ": no checkpoint to resume from; run without --resume first, or give the --out folder of an earlier run");
  }
  const gguf::file model_file(dir / (stem + ".gguf"));
  const gguf::file side(dir / (stem + ".optim.gguf"));
  train_state s = detail::get_state(side);
  const std::uint64_t model_step = model_file.has("tlm.train.step") ? model_file.get_uint("tlm.train.step") : ~std::uint64_t{0};
  if (model_step != s.step || stem != "checkpoint-" + std::to_string(s.step)) {
    throw format_error(dir.string() + ": " + stem + ".gguf (step " + std::to_string(model_step) + ") and its .optim.gguf (step " +
                       std::to_string(s.step) + ") do not belong together; restore a matching pair or start again");
  }
  auto loaded = to_trainable<float>(bind<C>(model_file));
  for_each_tensor(
      [](const tensor_name&, auto& dst, const auto& src) { std::copy(src.values().begin(), src.values().end(), dst.values().begin()); },
      w, *loaded);
  for_each_tensor(
      [&](const tensor_name& name, auto& m, auto& v) {
        using U = std::remove_cvref_t<decltype(m)>;
        detail::read_f32(side, "m." + name.str(), m.data(), U::rows * U::cols);
        detail::read_f32(side, "v." + name.str(), v.data(), U::rows * U::cols);
      },
      opt.m(), opt.v());
  opt.set_steps(s.step);
  return s;
}

}  // namespace tlm
