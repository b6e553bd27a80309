// The registry of configs by name (tlm/configs.hpp).
#include <doctest/doctest.h>

#include <tlm/configs.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_configs {

static_assert(tlm::config_name<tlm::smollm2_135m>() == "smollm2_135m");
static_assert(tlm::config_name<tlm::tiny_untied>() == "tiny_untied");
static_assert(tlm::shipped_configs::contains("tiny_train"));
static_assert(!tlm::shipped_configs::contains("tiny_gqa"));
static_assert(tlm::all_configs::contains("tiny_gqa"));

namespace {

// A config out of tlm's namespace, named by its type all the same.
struct local_config : tlm::tiny_gqa {};

struct sizes {
  std::size_t dim, layers, kv_heads;
};

template <class List>
sizes sizes_of(std::string_view name) {
  return tlm::with_config<List>(name, [](auto c) {
    using C = typename decltype(c)::type;
    return sizes{tlm::dim<C>, C::layers, C::kv_heads};
  });
}

template <tlm::LlamaConfig C>
void check_maps_to(std::string_view name) {
  CAPTURE(name);
  const sizes s = sizes_of<tlm::all_configs>(name);
  CHECK(s.dim == tlm::dim<C>);
  CHECK(s.layers == C::layers);
  CHECK(s.kv_heads == C::kv_heads);
}

}  // namespace

TEST_CASE("each name maps to the config type of that name") {
  check_maps_to<tlm::smollm2_135m>("smollm2_135m");
  check_maps_to<tlm::smollm2_360m>("smollm2_360m");
  check_maps_to<tlm::smollm2_1_7b>("smollm2_1_7b");
  check_maps_to<tlm::tiny_train>("tiny_train");
  check_maps_to<tlm::tiny_gqa>("tiny_gqa");
  check_maps_to<tlm::tiny_untied>("tiny_untied");
  // The sizes alone would not tell 135M from a config of the same shape.
  const bool exact = tlm::with_config("smollm2_360m", [](auto c) { return std::is_same_v<typename decltype(c)::type, tlm::smollm2_360m>; });
  CHECK(exact);
}

TEST_CASE("the shipped names are the published configs and tiny_train, in order; all adds the test configs") {
  const auto& names = tlm::config_names();
  constexpr std::string_view shipped =
      "smollm2_135m, smollm2_360m, smollm2_1_7b, llama32_1b, llama32_3b, qwen25_0_5b, qwen25_1_5b, tinyllama_1_1b, "
      "mistral_7b, tiny_train";
  REQUIRE(names.size() == 10);
  CHECK(names[0] == "smollm2_135m");
  CHECK(names[3] == "llama32_1b");
  CHECK(names[9] == "tiny_train");
  CHECK(tlm::config_names_text() == shipped);
  CHECK(tlm::config_names_text<tlm::all_configs>() ==
        std::string(shipped) + ", tiny_gqa, tiny_untied, tiny_qwen2, tiny_llama3, tiny_traits");
}

TEST_CASE("an unknown name throws tlm::error listing the known names") {
  CHECK_THROWS_WITH_AS(sizes_of<tlm::shipped_configs>("llama3"),
                       "unknown config 'llama3'; known: smollm2_135m, smollm2_360m, smollm2_1_7b, llama32_1b, llama32_3b, "
                       "qwen25_0_5b, qwen25_1_5b, tinyllama_1_1b, mistral_7b, tiny_train",
                       tlm::error);
  // A test config is not among the shipped ones, and the namespace is not part of a name.
  CHECK_THROWS_AS(sizes_of<tlm::shipped_configs>("tiny_gqa"), tlm::error);
  CHECK_THROWS_AS(sizes_of<tlm::shipped_configs>("tlm::smollm2_135m"), tlm::error);
  CHECK_THROWS_AS(sizes_of<tlm::shipped_configs>(""), tlm::error);
  CHECK_THROWS_WITH(sizes_of<tlm::config_list<tlm::tiny_gqa>>("tiny_untied"), "unknown config 'tiny_untied'; known: tiny_gqa");
  // A shipped config that a narrower list (a build with TLM_PROGRAM_CONFIGS) left out is
  // named as such, with the way to build it in.
  using narrow = tlm::config_list<tlm::smollm2_135m, tlm::tiny_train>;
  CHECK_THROWS_WITH(sizes_of<narrow>("llama32_1b"),
                    "unknown config 'llama32_1b'; known: smollm2_135m, tiny_train. 'llama32_1b' is a shipped config this "
                    "program was built without: configure with -DTLM_PROGRAM_CONFIGS= -DTLM_SERVE_CONFIGS= "
                    "-DTLM_TRAIN_CONFIGS= (empty: every shipped config) and build it again");
  CHECK(tlm::unknown_config<narrow>("llama3", "--config") == "unknown --config 'llama3'; known: smollm2_135m, tiny_train");
}

TEST_CASE("a list of the caller's own configs works the same way") {
  using mine = tlm::config_list<local_config, tlm::tiny_untied>;
  CHECK(tlm::config_name<local_config>() == "local_config");
  CHECK(tlm::config_names_text<mine>() == "local_config, tiny_untied");
  CHECK(sizes_of<mine>("local_config").dim == tlm::dim<tlm::tiny_gqa>);
  // f's result comes back whatever its type, void included.
  std::string seen;
  tlm::with_config<mine>("tiny_untied", [&](auto c) { seen = tlm::config_name<typename decltype(c)::type>(); });
  CHECK(seen == "tiny_untied");
}

}  // namespace test_configs
