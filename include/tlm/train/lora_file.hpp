#pragma once
// An adapter as a file: llama.cpp's LoRA adapter GGUF, so `llama-cli --lora` and
// llama-cpp-python's Llama(lora_path=...) load what tlm trains.
//
// What llama.cpp checks (src/llama-adapter.cpp, llama_adapter_lora_init_impl):
// general.type is "adapter", general.architecture is the base's, adapter.type is
// "lora", adapter.lora.alpha is read as an F32 (missing: 0, which means no alpha/r
// scaling, so it is always written); tensors "<base tensor>.lora_a" of GGUF dims
// [in, r] and ".lora_b" of [r, out] (lora.hpp). The tensors are written by the walk
// that writes checkpoints (add_weights), as F32, with one checksum per tensor under
// tlm.checksums (a key llama.cpp ignores), so that a damaged file is found and the
// damaged tensor named before a value of it is used.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/checkpoint.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/weights.hpp>

namespace tlm {

// Adapters are files of float factors (what training holds).
template <class A>
concept lora_file_adapter = is_lora_v<A> && std::same_as<typename A::storage, owned<float>>;

// Writes `ad` atomically (gguf::writer::write: temporary file, fsync, rename).
namespace detail {
// The adapter file's writer: metadata and tensors (values read from `ad` when written).
template <class A>
  requires lora_file_adapter<A>
gguf::writer lora_writer(const A& ad) {
  using C = typename A::config;
  gguf::writer out;
  out.set("general.architecture", architecture_name_v<C>);
  out.set("general.type", "adapter");
  out.set("general.name", std::string(config_name<C>()) + " LoRA adapter (rank " + std::to_string(A::rank) + ") by tlm");
  out.set("adapter.type", "lora");
  out.set("adapter.lora.alpha", static_cast<float>(ad.alpha));
  std::vector<std::uint64_t> sums;
  for_each_tensor([&](const tensor_name&, const auto& t) { sums.push_back(detail::checksum(std::as_bytes(t.values()))); },
                  ad);
  out.set_array(detail::checksums_key, sums);
  add_weights(out, ad, encoding::f32);
  return out;
}
}  // namespace detail

template <class A>
  requires lora_file_adapter<A>
void write_lora(const std::filesystem::path& path, const A& ad, const std::function<bool()>& cancelled = {}) {
  detail::lora_writer(ad).write(path, cancelled);
}

// Reads an adapter file into `ad`, whose type says what the file must hold: its
// config's architecture, its rank and targets (every tensor of the walk, with its
// shape, and no other). Values in F32, F16 or BF16 are accepted (llama.cpp's
// converter writes F16 by default). Anything else, a checksum that fails, or a NaN
// or infinity is a format_error naming the file and the tensor.
template <class A>
  requires lora_file_adapter<A>
void read_lora(const gguf::file& f, A& ad) {
  using C = typename A::config;
  const std::string file = f.name();
  auto text = [&](std::string_view key) -> std::string {
    if (!f.has(key)) throw format_error(file + ": " + std::string(key) + " is missing; this is not a LoRA adapter file");
    return std::string(f.get_string(key));
  };
  if (const auto t = text("general.type"); t != "adapter") {
    throw format_error(file + ": general.type is \"" + t + "\", not \"adapter\"; give an adapter file, not a model");
  }
  if (const auto t = text("adapter.type"); t != "lora") {
    throw format_error(file + ": adapter.type is \"" + t + "\"; only \"lora\" adapters are supported");
  }
  if (const auto a = text("general.architecture"); a != architecture_name_v<C>) {
    throw format_error(file + ": an adapter for architecture \"" + a + "\", not \"" + std::string(architecture_name_v<C>) +
                       "\" (" + std::string(config_name<C>()) + "); use an adapter trained on this base");
  }
  if (!f.has("adapter.lora.alpha")) {
    throw format_error(file + ": adapter.lora.alpha is missing; tlm scales by alpha / rank and needs it");
  }
  const double alpha = f.get_float("adapter.lora.alpha");
  if (!std::isfinite(alpha) || alpha <= 0) {
    throw format_error(file + ": adapter.lora.alpha is " + std::to_string(alpha) + "; it must be a positive number");
  }

  // Checksums first, so damage is reported as damage, with the tensor it hit.
  const std::vector<gguf::tensor_info>& infos = f.tensors();
  if (const gguf::value* v = f.find(detail::checksums_key)) {
    if (!v->is_array() || v->element_type != gguf::value_type::u64 || v->count != infos.size()) {
      throw format_error(file + ": " + std::string(detail::checksums_key) + " is not one u64 per tensor (" +
                         std::to_string(infos.size()) + "); the file is damaged: write or copy it again");
    }
    for (std::size_t i = 0; i < infos.size(); ++i) {
      if (detail::checksum(infos[i].data) != v->integer(i).magnitude) {
        throw format_error(file + ": tensor '" + infos[i].name +
                           "' fails its checksum: the file changed after it was written (a damaged disk or copy); "
                           "write or copy it again");
      }
    }
  }

  std::unordered_set<std::string> expected;
  std::vector<float> row;
  for_each_tensor(
      [&](const tensor_name& tn, auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        const std::string name = tn.str();
        expected.insert(name);
        const gguf::tensor_info* info = f.find_tensor(name);
        if (info == nullptr) {
          throw format_error(file + ": tensor '" + name + "' is missing; the adapter has other targets than " +
                             "the type it is read into (rank " + std::to_string(A::rank) + ")");
        }
        if (info->n_dims != 2 || info->dims[0] != U::cols || info->dims[1] != U::rows) {
          throw format_error(file + ": tensor '" + name + "' has dims [" + std::to_string(info->dims[0]) + ", " +
                             std::to_string(info->dims[1]) + "], expected [" + std::to_string(U::cols) + ", " +
                             std::to_string(U::rows) + "] (GGUF order); the adapter has another rank or config");
        }
        if (info->enc != encoding::f32 && info->enc != encoding::f16 && info->enc != encoding::bf16) {
          throw format_error(file + ": tensor '" + name + "' is " + std::string(tlm::name(info->enc)) +
                             "; adapter factors are read as F32, F16 or BF16");
        }
        const std::size_t rb = row_bytes(info->enc, U::cols);
        for (std::size_t r = 0; r < U::rows; ++r)
          dequantize_row(info->enc, info->data.data() + r * rb, t.data() + r * U::cols, U::cols);
        for (std::size_t i = 0; i < U::rows * U::cols; ++i) {
          if (!std::isfinite(t.data()[i])) {
            throw format_error(file + ": tensor '" + name + "' holds " +
                               (std::isnan(t.data()[i]) ? std::string("a NaN") : std::string("an infinity")) +
                               " at index " + std::to_string(i) + "; the adapter is damaged");
          }
        }
      },
      ad);
  for (const auto& info : infos) {
    if (!expected.contains(info.name)) {
      throw format_error(file + ": tensor '" + info.name + "' is not one of this adapter type's (rank " +
                         std::to_string(A::rank) + ", " + std::to_string(expected.size()) +
                         " tensors); read it into an adapter that targets that matrix");
    }
  }
  ad.alpha = alpha;
}

template <class A>
  requires lora_file_adapter<A>
void read_lora(const std::filesystem::path& path, A& ad) {
  const gguf::file f(path);
  read_lora(f, ad);
}

// A LoRA run's checkpoint (checkpoint.hpp's pair and pointer): checkpoint-<step>.gguf
// is the adapter as write_lora writes it (so llama.cpp loads it) plus tlm.train.step,
// and the .optim.gguf sidecar holds AdamW's m and v of the adapter and the state.
template <class A>
  requires lora_file_adapter<A>
void save_lora_checkpoint(const std::filesystem::path& dir, const A& ad, const adamw<A>& opt, const train_state& state,
                          std::size_t keep = 1, const std::function<bool()>& cancelled = {}) {
  save_checkpoint_with(dir, opt, state, keep, cancelled, [&](const std::filesystem::path& path, const std::function<bool()>& c) {
    gguf::writer out = detail::lora_writer(ad);
    out.set("tlm.train.step", state.step);
    out.write(path, c);
  });
}

// Loads the newest checkpoint of `dir` into ad and opt. `check(state)` sees the saved
// state before the adapter is read (to refuse another rank, targets or base by name
// rather than by a tensor that does not fit); returns the state.
template <class A, class Check>
  requires lora_file_adapter<A>
train_state load_lora_checkpoint(const std::filesystem::path& dir, A& ad, adamw<A>& opt, Check&& check) {
  return load_checkpoint_with(dir, opt, [&](const gguf::file& f, const train_state& s) {
    check(s);
    read_lora(f, ad);
  });
}

}  // namespace tlm
