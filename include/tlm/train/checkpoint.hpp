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
// does not belong together is refused on load. Both also carry `tlm.checksums`, one u64
// per tensor in file order (detail::checksum of its bytes), computed from the memory the
// file is written from and verified on load: a byte changed on disk is an error naming
// the tensor, not a silently different (or NaN) model. The newest `keep` pairs stay;
// older ones, uncommitted ones (newer than the pointer) and half pairs are removed.
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/format/quantize_mix.hpp>
#include <tlm/hyperparameters.hpp>
#include <tlm/load.hpp>
#include <tlm/text/tokenizer.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/weights.hpp>
#include <tlm/weights.hpp>

namespace tlm {

// Everything besides tensors that a resumed run needs to continue exactly.
struct train_state {
  std::uint64_t step = 0;           // optimizer steps taken
  std::uint64_t seed = 0;           // the run's seed (weights init, data shuffle)
  std::uint64_t data_position = 0;  // training windows consumed so far
  std::uint64_t rng_state = 0;      // the data shuffle's generator after data_position windows
  std::uint64_t batch = 0;
  std::uint64_t accumulate = 1;  // micro-batches per step (1 in checkpoints written before it was recorded)
  std::uint64_t seq = 0, threads = 0;
  adamw_options options;
  std::string config;  // config type name, e.g. "smollm2_135m"
  std::string data;    // the data file trained on (checked on resume)
  bool chat = false;
  // The kernel level the run computed with (avx512, avx2, scalar): levels round
  // differently, so a resume is bit-exact only on the same level (and thread count).
  // Empty in checkpoints written before it was recorded.
  std::string kernels;
  // A LoRA run's adapter (lora.hpp): the base file it adapts (absolute path), its rank
  // (0: a full run), alpha and targets ("q,k,v,o"). A resume refuses other values.
  std::string lora_base;
  std::uint64_t lora_rank = 0;
  double lora_alpha = 0;
  std::string lora_targets;
  // Chat examples packed several to a window (--pack): other windows, so another data
  // order. False in checkpoints written before it was recorded, which did not pack.
  bool pack = false;
};

namespace detail {

// GGUF dims of a walked tensor: {cols} for a vector, {cols, rows} for a matrix.
template <class U>
std::vector<std::uint64_t> gguf_dims() {
  if constexpr (U::rank == 1) return {U::cols};
  else return {U::cols, U::rows};
}

// The checksum of a tensor's bytes: four independent 64-bit lanes (multiply, rotate),
// so it runs at several GB/s (a byte-wise CRC32 would add seconds to a 1.6 GB
// checkpoint), and each step is a bijection of the lane, so any change confined to one
// 8-byte word always changes the result. The tail bytes go through FNV-1a.
inline std::uint64_t checksum(std::span<const std::byte> b) {
  constexpr std::uint64_t p1 = 0x9E3779B185EBCA87ULL, p2 = 0xC2B2AE3D27D4EB4FULL;
  std::uint64_t lane[4] = {p1, p2, ~p1, ~p2};
  const std::size_t n = b.size();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (std::size_t k = 0; k < 4; ++k) {
      std::uint64_t x;
      std::memcpy(&x, b.data() + i + 8 * k, 8);
      lane[k] = std::rotl(lane[k] + x * p2, 31) * p1;
    }
  }
  std::uint64_t h = static_cast<std::uint64_t>(n) * p1;
  for (std::size_t k = 0; k < 4; ++k) h = (h ^ lane[k]) * p2 + p1;
  for (; i < n; ++i) h = (h ^ std::to_integer<std::uint64_t>(b[i])) * 0x100000001B3ULL;
  h ^= h >> 33;
  h *= p2;
  h ^= h >> 29;
  return h;
}

inline constexpr std::string_view checksums_key = "tlm.checksums";

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

// Adds every weight tensor of `w` to `out`, the i-th tensor of the walk encoded as
// encodings[i]. Values are read from w when the file is written.
template <class W>
void add_weights_as(gguf::writer& out, const W& w, std::span<const encoding> encodings) {
  std::size_t k = 0;
  for_each_tensor(
      [&](const tensor_name& name, const auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        const encoding e = encodings[k++];
        const float* values = t.data();  // [rows, cols]
        out.add_tensor_generated(name.str(), detail::gguf_dims<U>(), e, [values, e](std::span<std::byte> dst) {
          const std::size_t rb = row_bytes(e, U::cols);
          for (std::size_t r = 0; r < U::rows; ++r) quantize_row(e, values + r * U::cols, dst.data() + r * rb, U::cols);
        });
      },
      w);
}

// The encodings add_weights gives the tensors of `w`, in walk order: matrices `enc`
// (norms always f32, as llama.cpp's quantizer keeps them). For a K-quant, each matrix
// takes the encoding llama.cpp's quantizer would give it (format/quantize_mix.hpp: the output
// or tied embedding in Q6_K, Q5_0 / Q5_1 / Q8_0 for rows that are not whole
// super-blocks), since most models have such rows.
template <class W>
std::vector<encoding> export_encodings(const W& w, encoding enc) {
  std::vector<std::string> names;
  std::vector<tensor_desc> descs;
  std::vector<encoding> chosen;
  for_each_tensor(
      [&](const tensor_name& name, const auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        names.push_back(name.str());
        descs.push_back({{}, U::rank, U::cols, encoding::f32});
        chosen.push_back(U::rank == 1 ? encoding::f32 : enc);
      },
      w);
  for (std::size_t i = 0; i < names.size(); ++i) descs[i].name = names[i];
  const quant_type* mix = find_quant_type(lower_name(enc));
  const bool k_quant = enc == encoding::q4_k || enc == encoding::q5_k || enc == encoding::q6_k;
  if (k_quant && mix != nullptr) chosen = choose_encodings(*mix, descs);
  return chosen;
}

// Adds every weight tensor of `w` to `out` as export_encodings(w, enc) says.
template <class W>
void add_weights(gguf::writer& out, const W& w, encoding enc) {
  add_weights_as(out, w, export_encodings(w, enc));
}

// Every encoding a tensor can be bound in (kernels.hpp's matrix encodings, F32 for
// vectors) is one tlm can write, K-quants included, so a model written like its source
// (write_model_like) keeps each tensor's encoding and never needs a fallback. A new
// matrix encoding without a writer breaks this on purpose: give it a quantize_row, or
// choose here which writable encoding of at least its precision stands in for it.
static_assert(std::ranges::all_of(kernels::detail::table_encodings, [](encoding e) { return writable(e); }),
              "a bindable matrix encoding cannot be written: write_model_like needs a fallback for it");

// The encoding of each weight tensor of `w` in `source`, in walk order; `source` is the
// file w was bound from (a LoRA base), so every tensor is there.
template <class W>
std::vector<encoding> source_encodings(const W& w, const gguf::file& source) {
  std::vector<encoding> encodings;
  for_each_tensor(
      [&](const tensor_name& name, const auto&) {
        const gguf::tensor_info* info = source.find_tensor(name.str());
        if (info == nullptr) {
          throw format_error(source.name() + ": tensor '" + name.str() +
                             "' is missing, so the model cannot be written in this file's encodings; give the file the weights came from");
        }
        if (!writable(info->enc)) {
          throw error(source.name() + ": tensor '" + name.str() + "' is " + std::string(tlm::name(info->enc)) +
                      ", which tlm cannot write; choose an encoding for the whole model (one of " + writable_encodings_list() + ")");
        }
        encodings.push_back(info->enc);
      },
      w);
  return encodings;
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

namespace detail {

// Writes `w` as a model file (atomic), the i-th tensor of the walk as encodings[i], with
// general.file_type `file_type`; see write_model.
template <LlamaConfig C>
void write_model_encoded(const std::filesystem::path& path, const trainable<C, float>& w, std::span<const encoding> encodings,
                         std::uint32_t file_type, const gguf::file* source, std::uint64_t step, const std::function<bool()>& cancelled) {
  gguf::writer out;
  if (source) {
    copy_model_metadata(out, *source);
  } else {
    write_hyperparameters<C>(out, std::string(config_name<C>()) + " trained from scratch by tlm");
    write_byte_tokenizer(out, C::vocab);
  }
  out.set("general.file_type", file_type);
  const auto plain = [](encoding e) { return e == encoding::f32 || e == encoding::f16 || e == encoding::bf16; };
  if (!std::ranges::all_of(encodings, plain)) out.set("general.quantization_version", std::uint32_t{2});
  out.set("tlm.train.step", step);
  if (std::ranges::all_of(encodings, [](encoding e) { return e == encoding::f32; })) {
    std::vector<std::uint64_t> sums;
    for_each_tensor([&](const tensor_name&, const auto& t) { sums.push_back(checksum(std::as_bytes(t.values()))); }, w);
    out.set_array(checksums_key, sums);
  }
  add_weights_as(out, w, encodings);
  out.write(path, cancelled);
}

}  // namespace detail

// Writes `w` as a model file (atomic), matrices as `enc` (see export_encodings). `source`
// supplies metadata; without it the hyperparameters of C and a byte tokenizer (the
// from-scratch trainer reads bytes) are written, so the file runs in generate and llama.cpp.
//
// An f32 file (a checkpoint's) also gets `tlm.checksums`: there the file's bytes are the
// values in memory, so the sums come from one walk before the header is written. The
// write is abandoned when `cancelled` says so (see gguf::writer::write).
template <LlamaConfig C>
void write_model(const std::filesystem::path& path, const trainable<C, float>& w, encoding enc, const gguf::file* source,
                 std::uint64_t step, const std::function<bool()>& cancelled = {}) {
  detail::write_model_encoded<C>(path, w, export_encodings(w, enc), detail::llama_file_type(enc), source, step, cancelled);
}

// Writes `w` as a model file (atomic) in the encodings of `source`, tensor by tensor: a
// LoRA merge over a Q4_1 base with F32 norms and a Q6_K output is written so again
// (requantized: base + delta rounded to the base's grid). Metadata, general.file_type
// included, are the source's.
template <LlamaConfig C>
void write_model_like(const std::filesystem::path& path, const trainable<C, float>& w, const gguf::file& source, std::uint64_t step,
                      const std::function<bool()>& cancelled = {}) {
  const std::vector<encoding> encodings = source_encodings(w, source);
  std::uint32_t file_type = 0;
  if (source.has("general.file_type")) {
    file_type = static_cast<std::uint32_t>(source.get_uint("general.file_type"));
  } else {
    // A file without one: the type of its first matrix's encoding, as a reader names it.
    const auto matrix = std::ranges::find_if(encodings, [](encoding e) { return e != encoding::f32; });
    file_type = detail::llama_file_type(matrix == encodings.end() ? encoding::f32 : *matrix);
  }
  detail::write_model_encoded<C>(path, w, encodings, file_type, &source, step, cancelled);
}

// The share of a change to the weights that survives writing them in `encodings` (walk
// order, as export_encodings or source_encodings give): with Δ = changed − base over the
// tensors that differ (a LoRA merge: the adapted matrices) and q the values the file
// holds (changed, encoded and decoded), Σ (q − base)·Δ / Σ Δ². 1 when the change is
// written as it is (f32); near 0 when Δ is finer than the encoding's step, so that
// rounding puts the values back on the base's grid and the file computes nearly the
// base (a short LoRA run merged into a Q4_1 base). NaN when nothing changed.
template <LlamaConfig C>
double kept_change(const model_weights<C, mapped>& base, const trainable<C, float>& changed, std::span<const encoding> encodings) {
  double along = 0, norm = 0;
  std::size_t k = 0;
  std::vector<float> b, q;
  std::vector<std::byte> encoded;
  for_each_tensor(
      [&](const tensor_name&, const auto& src, const auto& dst) {
        using U = std::remove_cvref_t<decltype(dst)>;
        const encoding e = encodings[k++];
        b.resize(U::cols);
        q.resize(U::cols);
        encoded.resize(row_bytes(e, U::cols));
        const std::size_t rb = row_bytes(src.enc(), U::cols);
        for (std::size_t r = 0; r < U::rows; ++r) {
          const float* c = dst.data() + r * U::cols;
          dequantize_row(src.enc(), src.bytes().data() + r * rb, b.data(), U::cols);
          if (std::equal(b.begin(), b.end(), c)) continue;  // unchanged: nothing to keep or lose
          quantize_row(e, c, encoded.data(), U::cols);
          dequantize_row(e, encoded.data(), q.data(), U::cols);
          for (std::size_t i = 0; i < U::cols; ++i) {
            const double delta = double(c[i]) - double(b[i]);
            along += (double(q[i]) - double(b[i])) * delta;
            norm += delta * delta;
          }
        }
      },
      base, changed);
  return norm > 0 ? along / norm : NAN;
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
  f("tlm.train.accumulate", s.accumulate, false);  // absent from checkpoints written before --accumulate: 1
  f("tlm.train.seq", s.seq, true);
  f("tlm.train.threads", s.threads, true);
  f("tlm.train.config", s.config, true);
  f("tlm.train.data", s.data, true);
  f("tlm.train.chat", s.chat, true);
  f("tlm.train.pack", s.pack, false);  // absent from checkpoints written before --pack: off
  f("tlm.train.kernels", s.kernels, false);  // absent from checkpoints written before it was recorded
  f("tlm.lora.base", s.lora_base, false);     // absent from full runs' checkpoints written before LoRA
  f("tlm.lora.rank", s.lora_rank, false);
  f("tlm.lora.alpha", s.lora_alpha, false);
  f("tlm.lora.targets", s.lora_targets, false);
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

// Checks every tensor of f against its `tlm.checksums` entry; files written before
// checksums were recorded have none and pass.
inline void verify_checksums(const gguf::file& f) {
  const gguf::value* v = f.find(checksums_key);
  if (!v) return;
  if (!v->is_array() || v->element_type != gguf::value_type::u64 || v->count != f.tensors().size()) {
    throw format_error(f.name() + ": " + std::string(checksums_key) + " is not one u64 per tensor (" + std::to_string(f.tensors().size()) +
                       "); the file is damaged: restore it, or resume from an older checkpoint");
  }
  for (std::size_t i = 0; i < f.tensors().size(); ++i) {
    const gguf::tensor_info& t = f.tensors()[i];
    if (checksum(t.data) != v->integer(i).magnitude) {
      throw format_error(f.name() + ": tensor '" + t.name + "' fails its checksum: the file changed after it was written (a damaged disk or copy); "
                         "restore it, or resume from an older checkpoint by naming it in the folder's 'checkpoint' file");
    }
  }
}

// A NaN or infinity loaded from a checkpoint (one written before checksums, or damaged
// consistently) is the file's fault, not the learning rate's: say so before a step.
inline void require_finite(const std::string& file, const std::string& name, std::span<const float> x) {
  // First a branch-free pass (all-ones exponent = NaN or infinity) that the compiler
  // vectorizes: 1.6 GB at 135M; the element is looked for only when there is one.
  std::uint32_t any = 0;
  for (const float f : x) {
    const auto bits = std::bit_cast<std::uint32_t>(f);
    any |= static_cast<std::uint32_t>((bits & 0x7F800000U) == 0x7F800000U);
  }
  if (!any) return;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) {
      throw format_error(file + ": tensor '" + name + "' holds " + (std::isnan(x[i]) ? "a NaN" : "an infinity") + " at index " + std::to_string(i) +
                         "; the checkpoint is damaged (training never saves one): restore it, or resume from an older checkpoint");
    }
  }
}

// Copies tensor `name` of f (f32, exactly `n` values) into dst.
inline void read_f32(const gguf::file& f, const std::string& name, float* dst, std::size_t n) {
  const gguf::tensor_info* t = f.find_tensor(name);
  if (!t) throw format_error(f.name() + ": tensor '" + name + "' is missing; the checkpoint is incomplete or for another model");
  if (t->enc != encoding::f32 || t->elements != n) {
    throw format_error(f.name() + ": tensor '" + name + "' is not " + std::to_string(n) + " f32 values; the checkpoint is for another config");
  }
  std::memcpy(dst, t->data.data(), n * sizeof(float));
  require_finite(f.name(), name, std::span<const float>(dst, n));
}

}  // namespace detail

// The folder's newest complete checkpoint name ("checkpoint-<step>"), or "" when none.
inline std::string latest_checkpoint(const std::filesystem::path& dir) {
  std::ifstream in(dir / "checkpoint");
  std::string name;
  if (!in || !std::getline(in, name)) return "";
  return name;
}

// The step of a checkpoint name ("checkpoint-<step>"), or nothing for another name.
inline std::optional<std::uint64_t> checkpoint_step(std::string_view stem) {
  constexpr std::string_view prefix = "checkpoint-";
  if (!stem.starts_with(prefix) || stem.size() == prefix.size() || stem.size() > prefix.size() + 19) return std::nullopt;
  std::uint64_t step = 0;
  for (const char c : stem.substr(prefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return step;
}

// Tidies `dir`: removes temporary files of killed writes, pairs newer than the one the
// pointer names (written but never committed), half pairs, and all but the newest
// `keep` complete pairs (the committed one always stays). Without a pointer every
// checkpoint file is an orphan. Returns the names of the files removed.
inline std::vector<std::string> prune_checkpoints(const std::filesystem::path& dir, std::size_t keep) {
  namespace fs = std::filesystem;
  const std::optional<std::uint64_t> committed = checkpoint_step(latest_checkpoint(dir));
  struct pair_files {
    bool model = false, optim = false;
  };
  std::map<std::uint64_t, pair_files, std::greater<>> pairs;  // newest first
  std::vector<fs::path> doomed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp-") != std::string::npos) {
      doomed.push_back(e.path());
      continue;
    }
    const bool optim = name.ends_with(".optim.gguf");
    if (!optim && !name.ends_with(".gguf")) continue;
    const auto step = checkpoint_step(name.substr(0, name.size() - (optim ? 11 : 5)));
    if (!step) continue;
    (optim ? pairs[*step].optim : pairs[*step].model) = true;
  }
  std::size_t kept = 0;
  for (const auto& [step, files] : pairs) {
    const bool is_committed = committed && step == *committed;
    const bool stays = is_committed || (committed && step < *committed && files.model && files.optim && kept < keep);
    if (stays) {
      ++kept;
      continue;
    }
    const std::string stem = "checkpoint-" + std::to_string(step);
    if (files.model) doomed.push_back(dir / (stem + ".gguf"));
    if (files.optim) doomed.push_back(dir / (stem + ".optim.gguf"));
  }
  std::vector<std::string> removed;
  for (const auto& p : doomed) {
    if (fs::remove(p, ec)) removed.push_back(p.filename().string());  // a file that will not go wastes space but is harmless
  }
  return removed;
}

// Writes a checkpoint into `dir` (see the top of this file), then keeps only the newest
// `keep` pairs. The write is abandoned when `cancelled` says so: the files of the new
// pair are not committed (the pointer still names the previous pair, which is intact).
//
// save_checkpoint_with is the machinery for any trainable parameters W (a model's
// weights, a LoRA adapter): `write_params(path, cancelled)` writes the parameter file
// atomically, with tlm.train.step = state.step, loadable by load_checkpoint_with.
template <class W, class WriteParams>
void save_checkpoint_with(const std::filesystem::path& dir, const adamw<W>& opt, const train_state& state, std::size_t keep,
                          const std::function<bool()>& cancelled, WriteParams&& write_params) {
  const std::string stem = "checkpoint-" + std::to_string(state.step);
  gguf::writer side;
  detail::put_state(side, state);
  std::vector<std::uint64_t> sums;
  for_each_tensor(
      [&](const tensor_name& name, const auto& m, const auto& v) {
        using U = std::remove_cvref_t<decltype(m)>;
        const auto mb = std::as_bytes(std::span(m.data(), U::rows * U::cols)), vb = std::as_bytes(std::span(v.data(), U::rows * U::cols));
        side.add_tensor_view(("m." + name.str()), detail::gguf_dims<U>(), encoding::f32, mb);
        side.add_tensor_view(("v." + name.str()), detail::gguf_dims<U>(), encoding::f32, vb);
        sums.push_back(detail::checksum(mb));
        sums.push_back(detail::checksum(vb));
      },
      opt.m(), opt.v());
  side.set_array(detail::checksums_key, sums);
  const auto unfinished = [&] {  // the pair is not committed: its files are clutter
    std::error_code ec;
    std::filesystem::remove(dir / (stem + ".optim.gguf"), ec);
    std::filesystem::remove(dir / (stem + ".gguf"), ec);
  };
  try {
    side.write(dir / (stem + ".optim.gguf"), cancelled);
    write_params(dir / (stem + ".gguf"), cancelled);
    if (cancelled && cancelled()) throw error((dir / stem).string() + ": checkpoint write cancelled before its commit");
  } catch (...) {
    if (latest_checkpoint(dir) != stem) unfinished();
    throw;
  }
  detail::write_file_atomic(dir / "checkpoint", stem + "\n");  // the commit point
  prune_checkpoints(dir, keep);
}

template <LlamaConfig C>
void save_checkpoint(const std::filesystem::path& dir, const trainable<C, float>& w, const adamw<trainable<C, float>>& opt,
                     const train_state& state, const gguf::file* source, std::size_t keep = 1,
                     const std::function<bool()>& cancelled = {}) {
  save_checkpoint_with(dir, opt, state, keep, cancelled, [&](const std::filesystem::path& path, const std::function<bool()>& c) {
    write_model<C>(path, w, encoding::f32, source, state.step, c);
  });
}

// Loads the newest checkpoint of `dir` into opt, and its parameter file through
// `read_params(const gguf::file&, const train_state&)` (checksums verified, steps
// matched); returns its training state.
template <class W, class ReadParams>
train_state load_checkpoint_with(const std::filesystem::path& dir, adamw<W>& opt, ReadParams&& read_params) {
  const std::string stem = latest_checkpoint(dir);
  if (stem.empty()) {
    throw error((dir / "checkpoint").string() + ": no checkpoint to resume from; run without --resume first, or give the --out folder of an earlier run");
  }
  // Said here, not by the GGUF reader, whose advice (fetch the model) is for models.
  for (const std::string suffix : {".gguf", ".optim.gguf"}) {
    if (!std::filesystem::exists(dir / (stem + suffix))) {
      throw error((dir / (stem + suffix)).string() + ": missing, though " + (dir / "checkpoint").string() + " names " + stem +
                  " as the newest checkpoint; restore the file, name an older complete checkpoint-<step> in that file, "
                  "or start again with --overwrite");
    }
  }
  const gguf::file model_file(dir / (stem + ".gguf"));
  const gguf::file side(dir / (stem + ".optim.gguf"));
  detail::verify_checksums(model_file);
  detail::verify_checksums(side);
  train_state s = detail::get_state(side);
  const std::uint64_t model_step = model_file.has("tlm.train.step") ? model_file.get_uint("tlm.train.step") : ~std::uint64_t{0};
  if (model_step != s.step || stem != "checkpoint-" + std::to_string(s.step)) {
    throw format_error(dir.string() + ": " + stem + ".gguf (step " + std::to_string(model_step) + ") and its .optim.gguf (step " +
                       std::to_string(s.step) + ") do not belong together; restore a matching pair or start again");
  }
  read_params(model_file, s);
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

// Loads the newest checkpoint of `dir` into w and opt; returns its training state.
// `check(state)`, if given, sees the saved state before the weights are read.
template <LlamaConfig C>
train_state load_checkpoint(const std::filesystem::path& dir, trainable<C, float>& w, adamw<trainable<C, float>>& opt,
                            const std::function<void(const train_state&)>& check = {}) {
  return load_checkpoint_with(dir, opt, [&](const gguf::file& model_file, const train_state& s) {
    if (check) check(s);
    auto loaded = to_trainable<float>(bind<C>(model_file));
    for_each_tensor(
        [&](const tensor_name& name, auto& dst, const auto& src) {
          std::copy(src.values().begin(), src.values().end(), dst.values().begin());
          detail::require_finite(model_file.name(), name.str(), dst.values());
        },
        w, *loaded);
  });
}

}  // namespace tlm
