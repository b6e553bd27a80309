#pragma once
// Binding a GGUF file to a config type: bind<C>(file) checks the architecture,
// every hyperparameter, and every tensor's name, dims and encoding against C,
// and reports every mismatch at once. On success the weights are views into the
// file's mapping: no tensor data is copied.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config.hpp"
#include "error.hpp"
#include "gguf.hpp"
#include "hyperparameters.hpp"
#include "kernels.hpp"
#include "weights.hpp"

namespace tlm {

// A file that does not fit its config. problems() lists every mismatch found.
struct bind_error : model_mismatch {
  bind_error(std::string message, std::vector<std::string> problems)
      : model_mismatch(std::move(message)), problems_(std::move(problems)) {}
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

namespace detail {

inline std::string dims_string(const std::uint64_t* d, std::size_t n) {
  std::string s = "{";
  for (std::size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "}";
}

template <LlamaConfig C>
std::vector<std::string> hyperparameter_problems(const gguf::file& f) {
  std::vector<std::string> out;
  if (!f.has("general.architecture")) {
    out.push_back("general.architecture: missing; expected \"llama\"");
  } else if (f.get_string("general.architecture") != "llama") {
    out.push_back("general.architecture: expected \"llama\", found \"" + std::string(f.get_string("general.architecture")) + "\"");
    return out;  // other keys would be named after that architecture
  }
  auto check_uint = [&](std::string_view key, std::size_t want, bool required = true) {
    if (!f.has(key)) {
      if (required) out.push_back(std::string(key) + ": missing; expected " + std::to_string(want));
      return;
    }
    try {
      const auto got = f.get_uint(key);
      if (got != want) out.push_back(std::string(key) + ": expected " + std::to_string(want) + ", found " + std::to_string(got));
    } catch (const error& e) {
      out.push_back(std::string(key) + ": " + e.what());
    }
  };
  auto check_float = [&](std::string_view key, double want, bool required, double fallback) {
    double got = fallback;
    if (f.has(key)) {
      try {
        got = f.get_float(key);
      } catch (const error& e) {
        out.push_back(std::string(key) + ": " + e.what());
        return;
      }
    } else if (required) {
      out.push_back(std::string(key) + ": missing; expected " + std::to_string(want));
      return;
    }
    // The file stores these as f32: compare at f32 precision.
    if (static_cast<float>(got) != static_cast<float>(want)) {
      out.push_back(std::string(key) + ": expected " + std::to_string(want) + ", found " + std::to_string(got));
    }
  };
  for (const hyperparameter& h : hyperparameters<C>) {
    if (h.is_float) check_float(h.key, h.value, h.required, h.if_absent);
    else check_uint(h.key, static_cast<std::size_t>(h.value), h.required);
  }

  // Keys that change the computation when present with another value than plain
  // Llama's. A file that sets one is refused, never run as if it were absent.
  check_uint("llama.attention.key_length", head_dim<C>, false);
  check_uint("llama.attention.value_length", head_dim<C>, false);
  check_uint("llama.expert_count", 0, false);
  check_uint("llama.expert_used_count", 0, false);
  const auto not_implemented = [&](std::string_view key, const std::string& found, std::string_view what) {
    out.push_back(std::string(key) + ": " + found + ", but tlm implements " + std::string(what) +
                  " only; use a file converted without it");
  };
  if (f.has("llama.rope.scaling.type")) {
    try {
      const std::string_view type = f.get_string("llama.rope.scaling.type");
      if (type != "none") not_implemented("llama.rope.scaling.type", "\"" + std::string(type) + "\"", "unscaled RoPE");
    } catch (const error& e) {
      out.push_back(std::string("llama.rope.scaling.type: ") + e.what());
    }
  }
  // A factor of 1 scales nothing, and llama.cpp reads 0 as "not set".
  for (const std::string_view key : {"llama.rope.scaling.factor", "llama.rope.scale_linear", "llama.rope.scaling.attn_factor"}) {
    if (!f.has(key)) continue;
    try {
      const double v = f.get_float(key);
      if (v != 1.0 && !(v == 0.0 && key != "llama.rope.scaling.attn_factor"))
        not_implemented(key, std::to_string(v), "unscaled RoPE (factor 1)");
    } catch (const error& e) {
      out.push_back(std::string(key) + ": " + e.what());
    }
  }
  // Every other llama.* key is unknown to tlm, so it cannot vouch that the key leaves
  // the computation alone: refuse rather than compute something else silently.
  static constexpr std::string_view known[] = {
      "llama.attention.key_length", "llama.attention.value_length", "llama.expert_count", "llama.expert_used_count", "llama.rope.scaling.type",
      "llama.rope.scaling.factor", "llama.rope.scale_linear", "llama.rope.scaling.attn_factor",
      // Informational unless a scaling type is set, which is checked above.
      "llama.rope.scaling.original_context_length", "llama.rope.scaling.finetuned"};
  for (const auto& e : f.metadata()) {
    if (!e.key.starts_with("llama.")) continue;
    if (std::find(std::begin(known), std::end(known), e.key) != std::end(known)) continue;
    if (std::any_of(hyperparameters<C>.begin(), hyperparameters<C>.end(),
                    [&](const hyperparameter& h) { return h.key == e.key; }))
      continue;
    out.push_back(std::string(e.key) + ": tlm does not know this key, so it cannot tell whether the file needs a computation tlm "
                          "does not do; remove the key if it is only informational");
  }
  return out;
}

}  // namespace detail

template <LlamaConfig C>
model_weights<C, mapped> bind(const gguf::file& f) {
  std::vector<std::string> problems = detail::hyperparameter_problems<C>(f);
  model_weights<C, mapped> w;
  std::vector<const gguf::tensor_info*> used;
  for_each_tensor(
      [&](const tensor_name& n, auto& t) {
        using T = std::remove_cvref_t<decltype(t)>;
        const std::string name = n.str();
        const gguf::tensor_info* info = f.find_tensor(name);
        const std::uint64_t want[2] = {T::cols, T::rows};
        const std::size_t want_dims = T::rank;
        if (info == nullptr) {
          problems.push_back(name + ": missing; expected dims " + detail::dims_string(want, want_dims));
          return;
        }
        used.push_back(info);
        bool dims_ok = info->n_dims == want_dims;
        for (std::size_t i = 0; dims_ok && i < want_dims; ++i) dims_ok = info->dims[i] == want[i];
        if (!dims_ok) {
          problems.push_back(name + ": expected dims " + detail::dims_string(want, want_dims) + ", found " +
                             detail::dims_string(info->dims.data(), info->n_dims));
          return;
        }
        // Matrices need an encoding some kernel multiplies by; norm gains must be F32.
        const bool enc_ok = T::rank == 1 ? info->enc == encoding::f32 : kernels::has_matrix_kernel(info->enc);
        if (!enc_ok) {
          problems.push_back(name + ": encoding " + std::string(tlm::name(info->enc)) + " is not supported here (" +
                             (T::rank == 1 ? "norm gains must be F32" : "no kernel multiplies by it") + ")");
          return;
        }
        try {
          t.bind(info->enc, info->data, name);
        } catch (const error& e) {
          problems.push_back(e.what());
        }
      },
      w);
  if (C::tied_embeddings && f.find_tensor("output.weight") != nullptr) {
    problems.push_back("output.weight: the file has a separate output matrix, but " + std::string(type_name<C>()) +
                       " ties the output to token_embd");
  }
  for (const auto& info : f.tensors()) {
    if (info.name == "output.weight" && C::tied_embeddings) continue;  // reported above
    if (std::find(used.begin(), used.end(), &info) == used.end()) {
      problems.push_back(info.name + ": the file has this tensor, but " + std::string(type_name<C>()) + " has no such tensor");
    }
  }
  if (!problems.empty()) {
    std::string msg = f.name() + " does not fit " + std::string(type_name<C>()) + " (" + std::to_string(problems.size()) +
                      (problems.size() == 1 ? " problem" : " problems") + "):";
    constexpr std::size_t shown = 16;
    for (std::size_t i = 0; i < problems.size() && i < shown; ++i) msg += "\n  - " + problems[i];
    if (problems.size() > shown) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
    msg += "\nUse the config type that matches this file (examples/inspect prints its hyperparameters), or a file made for " +
           std::string(type_name<C>()) + ".";
    throw bind_error(std::move(msg), std::move(problems));
  }
  return w;
}

}  // namespace tlm
