#pragma once
// The user-facing options of tlm::sampling, described once. examples/generate's flags,
// examples/serve's request fields and the Python Model.generate / Model.chat keywords are
// all read through this table, so an option has one name, one range, one default and
// one help text everywhere (the CLI flag is "--" + name with '_' as '-').
//
// The ranges are those of OpenAI's API where it has the option (temperature, top_p, the
// two additive penalties, logit_bias), because clients written for it send values in
// those ranges and users know them; the rest follow llama.cpp's meaning with a bound
// wide enough for any setting that still means something. The sampler itself accepts
// more (any finite temperature, any penalty): it checks only that a distribution is
// defined (sampling_problem); these ranges are what the programs offer to people.
//
// Surface defaults that differ by design, and only these: the server's temperature is
// OpenAI's 1 (server_temperature) rather than greedy, and the server and Python draw a
// fresh random seed for a request that gives none (the CLI's default seed is 0, so a
// command line reproduces).
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/core.h>

#include <tlm/error.hpp>
#include <tlm/generation/sampler.hpp>

namespace tlm {

enum class option_kind {
  real,        // a finite number in [lo, hi] ((lo, hi] when lo_open)
  whole,       // a whole number in [lo, hi]
  seed,        // a whole number, any 64-bit value
  token_bias,  // a list of (token id, bias); each bias in [lo, hi] or -inf (bans the token)
};

struct sampling_option {
  std::string_view name;  // snake_case: the JSON field and the Python keyword
  option_kind kind;
  double lo, hi;          // real, whole (whole bounds are exact below 2^53) and token_bias's bias
  bool lo_open;           // real: lo itself is refused
  std::string_view value_name;  // in usage lines: X, K, N, ID=X
  std::string_view help;        // what it does, and what it does at temperature 0
  // The member it sets. Real kinds go through double; whole kinds through uint64.
  double (*get_real)(const sampling&);
  void (*set_real)(sampling&, double);
  std::uint64_t (*get_whole)(const sampling&);
  void (*set_whole)(sampling&, std::uint64_t);

  // "--top-p", for the command line.
  std::string flag() const {
    std::string f = "--" + std::string(name);
    for (char& c : f)
      if (c == '_') c = '-';
    return f;
  }
  std::string range_text() const {
    if (kind == option_kind::seed) return fmt::format("[0, {}]", std::numeric_limits<std::uint64_t>::max());
    if (kind == option_kind::token_bias) return fmt::format("[{}, {}] or -inf", lo, hi);
    return fmt::format("{}{}, {}]", lo_open ? "(" : "[", lo, hi);
  }
  bool accepts(double v) const {
    if (kind == option_kind::token_bias && v == -std::numeric_limits<double>::infinity()) return true;
    return std::isfinite(v) && v >= lo && v <= hi && !(lo_open && v == lo);
  }
  // The library default, as the usage text shows it.
  std::string default_text() const {
    const sampling d;
    if (kind == option_kind::real) return fmt::format("{}", get_real(d));
    if (kind == option_kind::token_bias) return "none";
    return fmt::format("{}", get_whole(d));
  }
  // The message for a value out of range; `shown` is how the surface names the option
  // (--top-p, 'top_p', top_p=).
  std::string out_of_range(std::string_view shown, std::string_view value) const {
    return fmt::format("{} {} is outside {}; give {}", shown, value, range_text(), help);
  }
};

namespace sampling_detail {
// Whole-number bounds as doubles: exact, since they are below 2^53.
inline constexpr double max_u32 = 4294967295.0;
}  // namespace sampling_detail

#define TLM_SAMPLING_REAL(member)                                                   \
  [](const sampling& s) { return static_cast<double>(s.member); },                  \
      [](sampling& s, double v) { s.member = static_cast<float>(v); }, nullptr, nullptr
#define TLM_SAMPLING_WHOLE(member)                                                  \
  nullptr, nullptr, [](const sampling& s) { return static_cast<std::uint64_t>(s.member); }, \
      [](sampling& s, std::uint64_t v) { s.member = static_cast<decltype(s.member)>(v); }

// The order of the usage text: the sampler's steps from temperature on, then the
// penalties and the bias that come before them, then the seed.
inline const std::array<sampling_option, 10> sampling_options{{
    // OpenAI's range; above 2 the survivors are close to equally likely for the models tlm runs.
    {"temperature", option_kind::real, 0, 2, false, "X",
     "a temperature: 0 is greedy (the most likely token after bias and penalties), 1 the model's distribution",
     TLM_SAMPLING_REAL(temperature)},
    // Any k: one at or above the vocabulary keeps every token.
    {"top_k", option_kind::whole, 0, sampling_detail::max_u32, false, "K",
     "the number of most likely tokens to keep, 0 for all (at temperature 0 the most likely is kept anyway)",
     TLM_SAMPLING_WHOLE(top_k)},
    {"top_p", option_kind::real, 0, 1, true, "P",
     "the probability mass of the most likely tokens to keep, e.g. 0.9; 1 keeps all (no effect at temperature 0)",
     TLM_SAMPLING_REAL(top_p)},
    {"min_p", option_kind::real, 0, 1, false, "P",
     "the fraction of the top token's probability a token needs, e.g. 0.05; 0 keeps all (no effect at temperature 0)",
     TLM_SAMPLING_REAL(min_p)},
    // llama.cpp's meaning; 100 already reduces a repeated logit to noise.
    {"repeat_penalty", option_kind::real, 0, 100, true, "X",
     "the divisor of a positive repeated logit (multiplier of a negative one) in the window, e.g. 1.1; 1 is none",
     TLM_SAMPLING_REAL(repeat_penalty)},
    {"frequency_penalty", option_kind::real, -2, 2, false, "X",
     "the amount subtracted from a token's logit per occurrence in the window (OpenAI's range); 0 is none",
     TLM_SAMPLING_REAL(frequency_penalty)},
    {"presence_penalty", option_kind::real, -2, 2, false, "X",
     "the amount subtracted from the logit of a token that occurs in the window (OpenAI's range); 0 is none",
     TLM_SAMPLING_REAL(presence_penalty)},
    {"penalty_window", option_kind::whole, 0, sampling_detail::max_u32, false, "N",
     "the number of last context tokens (prompt included) the penalties look at; 0 turns them off",
     TLM_SAMPLING_WHOLE(penalty_window)},
    // OpenAI's range, where -100 in effect bans a token; -inf bans it outright (not in JSON).
    {"logit_bias", option_kind::token_bias, -100, 100, false, "ID=X",
     "token ids with a number added to their logits, -inf (or -100) to ban a token; applies at temperature 0 too",
     nullptr, nullptr, nullptr, nullptr},
    {"seed", option_kind::seed, 0, 0, false, "S",
     "the seed of the draw; the same seed and settings give the same tokens (unused at temperature 0)",
     TLM_SAMPLING_WHOLE(seed)},
}};

#undef TLM_SAMPLING_REAL
#undef TLM_SAMPLING_WHOLE

// The server's temperature when a request gives none: OpenAI's default, not greedy.
inline constexpr float server_temperature = 1.0f;

inline const sampling_option* find_sampling_option(std::string_view name) {
  for (const auto& o : sampling_options)
    if (o.name == name) return &o;
  return nullptr;
}

// Every table option of `s` within its range; throws tlm::error naming the first that
// is not, its value, the range and what to give.
inline void validate(const sampling& s) {
  for (const auto& o : sampling_options) {
    switch (o.kind) {
      case option_kind::real:
        if (!o.accepts(o.get_real(s))) throw error(o.out_of_range(o.name, fmt::format("{}", o.get_real(s))));
        break;
      case option_kind::whole:
        if (static_cast<double>(o.get_whole(s)) > o.hi || static_cast<double>(o.get_whole(s)) < o.lo)
          throw error(o.out_of_range(o.name, fmt::format("{}", o.get_whole(s))));
        break;
      case option_kind::seed:
        break;  // every 64-bit value is a seed
      case option_kind::token_bias:
        for (const auto& [id, b] : s.logit_bias) {
          if (id < 0) throw error(fmt::format("logit_bias names token id {}; give token ids of 0 or more", id));
          if (!o.accepts(b)) throw error(o.out_of_range(fmt::format("logit_bias for token {}", id), fmt::format("{}", b)));
        }
        break;
    }
  }
}

}  // namespace tlm
