#pragma once
// The command-line parts the example programs share: the usage-error type, the number
// parsers, and the sampling flags read and described from tlm's option table.
#include <tlm/generation/sampling_options.hpp>

#include <fmt/core.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

namespace cli {

// A mistake on the command line. Thrown rather than exiting on the spot, so that a
// model, its threads and its mapping are released in order on every error path.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& msg) { throw usage_error(msg); }

// A whole number written in decimal digits only: no sign, blanks, hex or exponent, and
// no wrap-around (std::stoll would take " +5", and a cast would turn 4294967297 into 1).
inline std::uint64_t whole(std::string_view flag, std::string_view v, std::uint64_t lo, std::uint64_t hi) {
  const auto bad = [&] { fail(fmt::format("{} takes a whole number from {} to {}, got '{}'", flag, lo, hi, v)); };
  if (v.empty() || v.size() > 20) bad();
  std::uint64_t n = 0;
  for (const char c : v) {
    if (c < '0' || c > '9') bad();
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (n > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) bad();
    n = n * 10 + digit;
  }
  if (n < lo || n > hi) bad();
  return n;
}

// A finite decimal number that also fits a float (every caller may narrow it to one);
// std::stod alone would take "inf", "nan" and hex.
inline double finite(std::string_view flag, const std::string& v) {
  double x = 0;
  std::size_t used = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || !std::isfinite(x) || std::fabs(x) > std::numeric_limits<float>::max() ||
      v.find_first_of("xXnN") != std::string::npos)
    fail(fmt::format("{} takes a finite number, got '{}'", flag, v));
  return x;
}

// A finite number in [lo, hi] ((lo, hi] when lo_open).
inline double real(std::string_view flag, const std::string& v, double lo, double hi, bool lo_open = false) {
  const double x = finite(flag, v);
  if (x < lo || x > hi || (lo_open && x == lo)) fail(fmt::format("{} {} is outside {}{}, {}]", flag, v, lo_open ? "(" : "[", lo, hi));
  return x;
}

// Sets the sampling option of `flag` (as the command line names it) from its text.
inline void set_sampling(const tlm::sampling_option& o, tlm::sampling& s, std::string_view flag, const std::string& v) {
  switch (o.kind) {
    case tlm::option_kind::real: {
      const double x = finite(flag, v);
      if (!o.accepts(x)) fail(o.out_of_range(flag, v));
      o.set_real(s, x);
      break;
    }
    case tlm::option_kind::whole:
      o.set_whole(s, whole(flag, v, static_cast<std::uint64_t>(o.lo), static_cast<std::uint64_t>(o.hi)));
      break;
    case tlm::option_kind::seed:
      o.set_whole(s, whole(flag, v, 0, std::numeric_limits<std::uint64_t>::max()));
      break;
    case tlm::option_kind::token_bias: {  // ID=X, repeatable
      const std::size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0)
        fail(fmt::format("{} takes ID=X (a token id, '=', a number or -inf), got '{}'", flag, v));
      const auto id = static_cast<std::int32_t>(whole(flag, std::string_view(v).substr(0, eq), 0, std::numeric_limits<std::int32_t>::max()));
      const std::string x = v.substr(eq + 1);
      const double b = x == "-inf" ? -std::numeric_limits<double>::infinity() : finite(flag, x);
      if (!o.accepts(b)) fail(o.out_of_range(flag, v));
      s.logit_bias.emplace_back(id, static_cast<float>(b));
      break;
    }
  }
}

// Reads argv[i] if it is a sampling flag (taking its value from argv[i + 1]); false if
// it is not one.
inline bool read_sampling_flag(int argc, char** argv, int& i, tlm::sampling& s) {
  const std::string_view a = argv[i];
  for (const auto& o : tlm::sampling_options) {
    if (a != o.flag()) continue;
    if (i + 1 >= argc) fail(fmt::format("{} needs a value ({})", a, o.value_name));
    set_sampling(o, s, a, argv[++i]);
    return true;
  }
  return false;
}

// The usage lines of the sampling flags, with their ranges and the library's defaults.
inline std::string sampling_usage() {
  std::string out;
  for (const auto& o : tlm::sampling_options) {
    const std::string head = o.flag() + " " + std::string(o.value_name);
    const bool whole = o.kind == tlm::option_kind::whole || o.kind == tlm::option_kind::seed;
    out += fmt::format("  {:<19} {}\n  {:<19} {} {}, default {}{}\n", head, o.help, "", whole ? "whole number" : "number",
                       o.range_text(), o.default_text(), o.kind == tlm::option_kind::token_bias ? "; repeatable" : "");
  }
  return out;
}

}  // namespace cli
