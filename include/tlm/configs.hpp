#pragma once
// The configs a program can be asked for by name (generate --config, serve --config,
// tlm.Model(config=...)), listed once. A name is the config type's own name, so
// the list of names cannot drift from the types it stands for.
//
// Example, given std::string name; int options; template <class C> int run(int):
//   return tlm::with_config(name, [&](auto c) {
//     using C = typename decltype(c)::type;
//     return run<C>(options);
//   });
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

#include <tlm/config.hpp>
#include <tlm/error.hpp>

namespace tlm {

template <LlamaConfig... Cs>
struct config_list {
  static constexpr std::array<std::string_view, sizeof...(Cs)> names{config_name<Cs>()...};
  // Two configs of one name (from two namespaces) would make one of them unreachable.
  static_assert(
      [] {
        for (std::size_t i = 0; i < names.size(); ++i)
          for (std::size_t j = i + 1; j < names.size(); ++j)
            if (names[i] == names[j]) return false;
        return true;
      }(),
      "tlm: two configs in one config_list have the same name");

  static constexpr bool contains(std::string_view name) {
    for (const auto n : names)
      if (n == name) return true;
    return false;
  }
};

// The configs of published files, and tiny_train: the config examples/train writes
// from scratch, so generate, serve and Python can read back what it trains.
using shipped_configs = config_list<smollm2_135m, smollm2_360m, smollm2_1_7b, llama32_1b, llama32_3b, qwen25_0_5b,
                                    qwen25_1_5b, tinyllama_1_1b, mistral_7b, tiny_train>;

// The configs a program chooses from by name or from a file (generate, serve, the
// Python module): every shipped config, unless the build defines TLM_PROGRAM_CONFIGS as
// a comma-separated list of config types (CMake: -DTLM_PROGRAM_CONFIGS=smollm2_135m;...).
// Each config is one more instantiation of the model, generator and chat session, the
// bulk of those programs' compile time, so a build that runs few of them (the
// sanitizer build of the test suite) names only those.
#ifdef TLM_PROGRAM_CONFIGS
using program_configs = config_list<TLM_PROGRAM_CONFIGS>;
#else
using program_configs = shipped_configs;
#endif

template <class A, class B>
struct concat_config_lists;
template <class... As, class... Bs>
struct concat_config_lists<config_list<As...>, config_list<Bs...>> {
  using type = config_list<As..., Bs...>;
};

// The shipped configs and the tiny ones of the tests (GQA, an untied output, the
// qwen2 / llama3 traits): what synth_model writes files of and describe describes.
using all_configs =
    concat_config_lists<shipped_configs, config_list<tiny_gqa, tiny_untied, tiny_qwen2, tiny_llama3, tiny_traits>>::type;

// The names of a list's configs, in its order, for help texts and messages.
template <class List = program_configs>
constexpr const auto& config_names() {
  return List::names;
}

// "a, b, c": the names of a list's configs, as a message or help text names them.
template <class List = program_configs>
std::string config_names_text() {
  std::string out;
  for (const auto name : List::names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// What a program says of a config name not in `List` (`what`: how the user gave it, e.g.
// "--config"): the names it knows, and for a shipped config that a build naming fewer
// left out (TLM_PROGRAM_CONFIGS; CI's serve and train), how to build it in.
template <class List = program_configs>
std::string unknown_config(std::string_view name, std::string_view what = "config") {
  std::string message =
      "unknown " + std::string(what) + " '" + std::string(name) + "'; known: " + config_names_text<List>();
  if (!List::contains(name) && shipped_configs::contains(name))
    message += ". '" + std::string(name) +
               "' is a shipped config this program was built without: configure with "
               "-DTLM_PROGRAM_CONFIGS= -DTLM_SERVE_CONFIGS= -DTLM_TRAIN_CONFIGS= (empty: every shipped "
               "config) and build it again";
  return message;
}

namespace detail {

template <class List, class F, LlamaConfig C, LlamaConfig... Rest>
decltype(auto) with_config_of(std::string_view name, F& f) {
  if (name == config_name<C>()) return f(std::type_identity<C>{});
  if constexpr (sizeof...(Rest) > 0) {
    return with_config_of<List, F, Rest...>(name, f);
  } else {
    throw error(unknown_config<List>(name));
  }
}

template <class F, LlamaConfig... Cs>
decltype(auto) with_config_in(std::string_view name, F& f, config_list<Cs...> list) {
  static_assert(sizeof...(Cs) > 0, "tlm: with_config needs a list of at least one config");
  return with_config_of<decltype(list), F, Cs...>(name, f);
}

}  // namespace detail

// Calls f(std::type_identity<C>{}) for the config C of `List` named `name`, and returns
// what f returns (the same type for every config). A name not in the list throws
// tlm::error naming every config that is.
template <class List = program_configs, class F>
decltype(auto) with_config(std::string_view name, F&& f) {
  return detail::with_config_in(name, f, List{});
}

}  // namespace tlm
