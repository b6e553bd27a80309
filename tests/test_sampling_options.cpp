// The table of sampling options (tlm/generation/sampling_options.hpp) that generate, serve and the
// Python module read: every entry's range refuses a value below and above it, with a
// message naming the option, the value and the range, and accepts the library default
// and its own bounds, which the sampler takes too.
#include <doctest/doctest.h>

#include <tlm/generation/sampler.hpp>
#include <tlm/generation/sampling_options.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_sampling_options {

namespace {

// The refusal of `s`, or "" when validate accepts it.
std::string refusal(const tlm::sampling& s) {
  try {
    tlm::validate(s);
  } catch (const tlm::error& e) {
    return e.what();
  }
  return {};
}

// `s` with option `o` set to `v` (a real or a whole number).
tlm::sampling with(const tlm::sampling_option& o, double v) {
  tlm::sampling s;
  if (o.kind == tlm::option_kind::real) o.set_real(s, v);
  else o.set_whole(s, static_cast<std::uint64_t>(v));
  return s;
}

}  // namespace

TEST_CASE("every option has a snake_case name, its own flag and help, and a default in its range") {
  std::set<std::string> names;
  for (const auto& o : tlm::sampling_options) {
    CAPTURE(o.name);
    CHECK(names.insert(std::string(o.name)).second);
    CHECK(o.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string_view::npos);
    CHECK(o.flag().find('_') == std::string::npos);
    CHECK(o.flag().starts_with("--"));
    CHECK(!o.help.empty());
    CHECK(tlm::find_sampling_option(o.name) == &o);
  }
  CHECK(refusal(tlm::sampling{}).empty());
  CHECK(tlm::find_sampling_option("nonexistent") == nullptr);
}

TEST_CASE("every bounded option refuses below and above its range and accepts its bounds") {
  for (const auto& o : tlm::sampling_options) {
    if (o.kind != tlm::option_kind::real && o.kind != tlm::option_kind::whole) continue;
    CAPTURE(o.name);
    const auto check_refused = [&](double v) {
      const std::string r = refusal(with(o, v));
      CAPTURE(v);
      CHECK(r.find(std::string(o.name)) != std::string::npos);
      CHECK(r.find(o.range_text()) != std::string::npos);
      CHECK(r.find("give") != std::string::npos);
    };
    if (o.kind == tlm::option_kind::real) {
      check_refused(o.lo_open ? o.lo : o.lo - 0.5);  // the open bound itself, or below a closed one
      check_refused(o.hi + 0.5);
      CHECK(!o.accepts(std::nan("")));
      CHECK(!o.accepts(std::numeric_limits<double>::infinity()));
      if (!o.lo_open) CHECK(refusal(with(o, o.lo)).empty());
    } else {
      check_refused(o.hi + 1);  // whole numbers cannot be below 0, the lower bound of each
      CHECK(o.lo == 0);
      CHECK(refusal(with(o, o.lo)).empty());
    }
    CHECK(refusal(with(o, o.hi)).empty());
  }
}

TEST_CASE("logit_bias: each bias within [-100, 100] or -inf, each id 0 or more") {
  const tlm::sampling_option& o = *tlm::find_sampling_option("logit_bias");
  CHECK(o.kind == tlm::option_kind::token_bias);
  tlm::sampling s;
  s.logit_bias = {{5, -100.0f}, {6, 100.0f}, {7, -std::numeric_limits<float>::infinity()}};
  CHECK(refusal(s).empty());
  s.logit_bias = {{5, 100.5f}};
  CHECK(refusal(s).find("logit_bias for token 5 100.5 is outside [-100, 100] or -inf") != std::string::npos);
  s.logit_bias = {{5, std::numeric_limits<float>::infinity()}};
  CHECK(!refusal(s).empty());
  s.logit_bias = {{-1, 1.0f}};
  CHECK(refusal(s).find("token id -1") != std::string::npos);
}

TEST_CASE("every setting the table accepts is one the sampler takes") {
  for (const auto& o : tlm::sampling_options) {
    if (o.kind != tlm::option_kind::real && o.kind != tlm::option_kind::whole) continue;
    CAPTURE(o.name);
    for (const double v : {o.lo_open ? o.hi / 2 : o.lo, o.hi}) {
      tlm::sampling s = with(o, v);
      if (o.name != "temperature") s.temperature = 1.0f;
      tlm::sampler draw(s);
      const std::vector<float> logits{0.5f, 2.0f, 1.0f, -1.0f};
      const std::vector<std::int32_t> recent{1, 1, 2};
      const std::int32_t id = draw(logits, recent);
      CHECK(id >= 0);
      CHECK(id < 4);
    }
  }
}

TEST_CASE("at temperature 0, top-k, top-p and min-p leave the greedy choice as it is") {
  const std::vector<float> logits{0.5f, 2.0f, 1.9f, -1.0f};
  tlm::sampler plain(tlm::sampling{});
  tlm::sampling limited;
  limited.top_k = 1;
  limited.top_p = 0.1f;
  limited.min_p = 0.9f;
  CHECK(refusal(limited).empty());
  tlm::sampler greedy(limited);
  CHECK(greedy(logits) == plain(logits));
  CHECK(greedy(logits) == 1);
}

}  // namespace test_sampling_options
