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

#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/hyperparameters.hpp>
#include <tlm/kernels.hpp>
#include <tlm/ops/rope.hpp>
#include <tlm/weights.hpp>

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

// The file's architecture against C's: "" when they agree. A file of another
// architecture has other key names and tensors, so this is its only problem worth naming.
template <LlamaConfig C>
std::string architecture_problem(const gguf::file& f) {
  const std::string arch(architecture_name_v<C>);
  if (!f.has("general.architecture")) return "general.architecture: missing; expected \"" + arch + "\"";
  std::string found;
  try {
    found = std::string(f.get_string("general.architecture"));
  } catch (const error& e) {
    return std::string("general.architecture: ") + e.what();
  }
  if (found == arch) return "";
  return "general.architecture: expected \"" + arch + "\" (" + std::string(config_name<C>()) + "), found \"" + found + "\"";
}

// Throws the bind_error that lists `problems`.
template <LlamaConfig C>
[[noreturn]] void throw_bind_error(const gguf::file& f, std::vector<std::string> problems) {
  std::string msg = f.name() + " does not fit " + std::string(config_name<C>()) + " (" + std::to_string(problems.size()) +
                    (problems.size() == 1 ? " problem" : " problems") + "):";
  constexpr std::size_t shown = 16;
  for (std::size_t i = 0; i < problems.size() && i < shown; ++i) msg += "\n  - " + problems[i];
  if (problems.size() > shown) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
  msg += "\nUse the config type that matches this file (examples/inspect prints its hyperparameters), or a file made for " +
         std::string(config_name<C>()) + ".";
  throw bind_error(std::move(msg), std::move(problems));
}

template <LlamaConfig C>
std::vector<std::string> hyperparameter_problems(const gguf::file& f) {
  std::vector<std::string> out;
  const std::string arch(architecture_name_v<C>);
  auto check_uint = [&](std::string_view key, std::size_t want, bool required = true) {
    const key_reading r = read_key(f, key, false);
    if (!r.present) {
      if (required) out.push_back(std::string(key) + ": missing; expected " + std::to_string(want));
      return;
    }
    if (!r.problem.empty()) out.push_back(std::string(key) + ": " + r.problem);
    else if (r.integer != want) out.push_back(std::string(key) + ": expected " + std::to_string(want) + ", found " + std::to_string(r.integer));
  };
  auto check_float = [&](std::string_view key, double want, bool required, double fallback) {
    const key_reading r = read_key(f, key, true);
    if (!r.problem.empty()) {
      out.push_back(std::string(key) + ": " + r.problem);
      return;
    }
    if (!r.present && required) {
      out.push_back(std::string(key) + ": missing; expected " + std::to_string(want));
      return;
    }
    const double got = r.present ? r.value : fallback;
    // The file stores these as f32: compare at f32 precision.
    if (static_cast<float>(got) != static_cast<float>(want)) {
      out.push_back(std::string(key) + ": expected " + std::to_string(want) + ", found " + std::to_string(got));
    }
  };
  for (const hyperparameter& h : hyperparameters<C>) {
    if (h.is_float) check_float(key_of<C>(h.name), h.value, h.required, h.if_absent);
    else check_uint(key_of<C>(h.name), static_cast<std::size_t>(h.value), h.required);
  }

  // Keys that change the computation when present with another value than plain
  // Llama's. A file that sets one is refused, never run as if it were absent.
  check_uint(key_of<C>("attention.key_length"), head_dim<C>, false);
  check_uint(key_of<C>("attention.value_length"), head_dim<C>, false);
  check_uint(key_of<C>("expert_count"), 0, false);
  check_uint(key_of<C>("expert_used_count"), 0, false);

  // RoPE scaling: the file's keys must say what C's rope_scaling says. llama.cpp's
  // format has keys for linear scaling only; Llama 3's travels as the rope_freqs
  // tensor (checked in bind), with no scaling key or type "none".
  constexpr rope_scaling_params scaling = rope_scaling_v<C>;
  constexpr bool linear = scaling.type == rope_scaling_type::linear;
  const std::string type_key = key_of<C>("rope.scaling.type");
  std::string type = "none";
  if (f.has(type_key)) {
    try {
      type = std::string(f.get_string(type_key));
    } catch (const error& e) {
      out.push_back(type_key + ": " + e.what());
    }
  }
  const std::string want_type = linear ? "linear" : "none";
  if (type != want_type) {
    const bool known_type = type == "none" || type == "linear";
    out.push_back(type_key + ": expected \"" + want_type + "\" (" + std::string(config_name<C>()) + "), found " +
                  (f.has(type_key) ? "\"" + type + "\"" : "no key") +
                  (known_type ? "; declare the scaling the file has in the config's rope_scaling"
                              : "; tlm implements RoPE scaling none, linear and llama3 (rope_freqs) only"));
  }
  // A factor of 1 scales nothing, and llama.cpp reads 0 as "not set".
  const double want_factor = linear ? scaling.factor : 1.0;
  for (const std::string_view name : {"rope.scaling.factor", "rope.scale_linear"}) {
    const std::string key = key_of<C>(name);
    if (!f.has(key)) continue;
    try {
      double v = f.get_float(key);
      if (v == 0.0) v = 1.0;
      if (static_cast<float>(v) != static_cast<float>(want_factor))
        out.push_back(key + ": expected " + std::to_string(want_factor) + " (" + std::string(config_name<C>()) + "), found " +
                      std::to_string(v));
    } catch (const error& e) {
      out.push_back(key + ": " + e.what());
    }
  }
  if (linear && !f.has(key_of<C>("rope.scaling.factor")) && !f.has(key_of<C>("rope.scale_linear")))
    out.push_back(key_of<C>("rope.scaling.factor") + ": missing; expected " + std::to_string(scaling.factor) + " (" +
                  std::string(config_name<C>()) + " scales RoPE linearly)");
  {
    const std::string key = key_of<C>("rope.scaling.attn_factor");
    if (f.has(key)) {
      try {
        if (const double v = f.get_float(key); v != 1.0)
          out.push_back(key + ": " + std::to_string(v) + ", but tlm implements attention factor 1 only; use a file converted without it");
      } catch (const error& e) {
        out.push_back(key + ": " + e.what());
      }
    }
  }
  // Every other key of the architecture is unknown to tlm, so it cannot vouch that the
  // key leaves the computation alone: refuse rather than compute something else silently.
  static constexpr std::string_view known[] = {
      "attention.key_length", "attention.value_length", "expert_count", "expert_used_count", "rope.scaling.type",
      "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor",
      // Informational: the scaling is checked above and through rope_freqs.
      "rope.scaling.original_context_length", "rope.scaling.finetuned"};
  const std::string prefix = arch + ".";
  for (const auto& e : f.metadata()) {
    if (!e.key.starts_with(prefix)) continue;
    const std::string_view name = std::string_view(e.key).substr(prefix.size());
    if (std::find(std::begin(known), std::end(known), name) != std::end(known)) continue;
    if (std::any_of(hyperparameters<C>.begin(), hyperparameters<C>.end(),
                    [&](const hyperparameter& h) { return h.name == name; }))
      continue;
    out.push_back(std::string(e.key) + ": tlm does not know this key, so it cannot tell whether the file needs a computation tlm "
                          "does not do; remove the key if it is only informational");
  }
  return out;
}

// Llama 3's rope_freqs tensor must hold the divisors C's scaling gives (rope_divisors),
// which the forward uses: a file converted with other factors is another model.
template <LlamaConfig C>
void check_rope_freqs(const model_weights<C, mapped>& w, std::vector<std::string>& problems) {
  if constexpr (rope_scaling_v<C>.type == rope_scaling_type::llama3) {
    if (!w.rope_freqs.bound()) return;  // reported by the walk
    const auto got = w.rope_freqs.f32();
    const auto want = rope_divisors<C>();
    for (std::size_t i = 0; i < C::half_head; ++i) {
      // The file holds f32 roundings of the double divisors: allow a few f32 ulps.
      if (!(std::abs(static_cast<double>(got[i]) - want[i]) <= 1e-6 * want[i])) {
        problems.push_back("rope_freqs.weight: pair " + std::to_string(i) + " divides by " + std::to_string(got[i]) +
                           ", but the llama3 scaling of " + std::string(config_name<C>()) + " gives " + std::to_string(want[i]) +
                           "; the file was converted with other scaling factors");
        return;
      }
    }
  }
}

}  // namespace detail

template <LlamaConfig C>
model_weights<C, mapped> bind(const gguf::file& f) {
  if (std::string p = detail::architecture_problem<C>(f); !p.empty()) detail::throw_bind_error<C>(f, {std::move(p)});
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
          problems.push_back(name + ": missing; expected dims " + detail::dims_string(want, want_dims) +
                             (n.member == "rope_freqs" ? " (" + std::string(config_name<C>()) +
                                                             " declares llama3 RoPE scaling, which a GGUF file carries as "
                                                             "this tensor of per-pair divisors)"
                                                       : ""));
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
                             (T::rank == 1 ? "vectors (norm gains, biases, rope_freqs) must be F32" : "no kernel multiplies by it") + ")");
          return;
        }
        try {
          t.bind(info->enc, info->data, name);
        } catch (const error& e) {
          problems.push_back(e.what());
        }
      },
      w);
  detail::check_rope_freqs<C>(w, problems);
  if (C::tied_embeddings && f.find_tensor("output.weight") != nullptr) {
    problems.push_back("output.weight: the file has a separate output matrix, but " + std::string(config_name<C>()) +
                       " ties the output to token_embd");
  }
  for (const auto& info : f.tensors()) {
    if (info.name == "output.weight" && C::tied_embeddings) continue;  // reported above
    if (std::find(used.begin(), used.end(), &info) == used.end()) {
      if (info.name == "rope_freqs.weight") {
        problems.push_back("rope_freqs.weight: the file scales RoPE frequencies (Llama 3), but " + std::string(config_name<C>()) +
                           " declares no llama3 rope_scaling");
        continue;
      }
      problems.push_back(info.name + ": the file has this tensor, but " + std::string(config_name<C>()) + " has no such tensor");
    }
  }
  if (!problems.empty()) detail::throw_bind_error<C>(f, std::move(problems));
  return w;
}

}  // namespace tlm
