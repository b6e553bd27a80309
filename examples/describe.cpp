// Prints, for each config of tlm::all_configs, its derived sizes, its tensors with
// their shapes, and its parameter count: everything the types know without a file.
// Given a GGUF file instead, prints the C++ config struct that binds it (a header to
// paste or include) and which shipped config, if any, it is.
//
//   describe [--tensors] [CONFIG...]     CONFIG: a name from tlm/configs.hpp (default: all)
//   describe [--name NAME] FILE.gguf     or --model FILE: the struct NAME (default my_model)
#include <tlm/config_match.hpp>
#include <tlm/configs.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/weights.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace {

template <tlm::LlamaConfig C>
void describe(std::string_view name, bool tensors) {
  fmt::print("{}\n", name);
  fmt::print("  heads {} = kv_heads {} x group {}, head_dim {}, dim {}, kv_dim {}, ffn {}, layers {}, vocab {}\n",
             tlm::heads<C>, C::kv_heads, C::group, tlm::head_dim<C>, tlm::dim<C>, tlm::kv_dim<C>, C::ffn, C::layers,
             C::vocab);
  fmt::print("  context {}, rms_eps {:g}, rope_theta {:g}, embeddings {}\n", C::context, C::rms_eps, C::rope_theta,
             C::tied_embeddings ? "tied (token_embd is also the output)" : "separate output.weight");
  constexpr tlm::rope_scaling_params s = tlm::rope_scaling_v<C>;
  const std::string scaling =
      s.type == tlm::rope_scaling_type::none     ? std::string("none")
      : s.type == tlm::rope_scaling_type::linear ? fmt::format("linear (factor {:g})", s.factor)
                                                 : fmt::format("llama3 (factor {:g}, low {:g}, high {:g}, original context {})",
                                                               s.factor, s.low_freq_factor, s.high_freq_factor, s.original_context);
  fmt::print("  architecture {}, rope scaling {}, attention biases {}\n", tlm::architecture_name_v<C>, scaling,
             tlm::attention_bias_v<C> ? "q/k/v" : "none");
  const tlm::model_weights<C> weights;
  if (tensors) {
    tlm::for_each_tensor(
        [](const tlm::tensor_name& n, const auto& t) {
          using T = std::remove_cvref_t<decltype(t)>;
          if constexpr (T::rank == 1) fmt::print("    {:<28} [{}]\n", n.str(), T::cols);
          else fmt::print("    {:<28} [{}, {}]\n", n.str(), T::rows, T::cols);
        },
        weights);
  }
  fmt::print("  {} tensors, {} parameters\n\n", tlm::tensor_count(weights), tlm::parameter_count(weights));
}

// The file mode: a header holding the struct, with what the file is and which shipped
// config fits it as comments, so the whole output compiles as it stands.
int describe_file(const std::string& path, const std::string& name) {
  const tlm::gguf::file f(path);
  const tlm::file_config c = tlm::read_file_config(f);
  const std::string text = tlm::config_struct_text(c, name);  // before printing: a shape it refuses prints nothing
  fmt::print("// The config type of {}\n", path);
  if (f.has("general.name")) fmt::print("// (general.name \"{}\")\n", f.get_string("general.name"));
  fmt::print("// {}\n", tlm::describe_file_config(c));
  const auto all = tlm::compare_configs(c, tlm::shipped_configs{});
  std::vector<std::string_view> fits;
  for (const auto& k : all)
    if (k.differences.empty()) fits.push_back(k.name);
  if (!fits.empty()) {
    for (const auto n : fits) fmt::print("// It is the shipped config {0}: generate --config {0}, or tlm::{0} in C++.\n", n);
  } else {
    const auto nearest = std::min_element(all.begin(), all.end(), [](const auto& a, const auto& b) {
      return a.differences.size() < b.differences.size();
    });
    fmt::print("// No shipped config fits it. The nearest, {}, differs in:\n", nearest->name);
    for (const auto& d : nearest->differences) fmt::print("//   {}\n", d);
    fmt::print("// Bind the file to this struct (tlm::model<{}>::load), or add it to tlm/config.hpp and the list in\n"
               "// tlm/configs.hpp so that generate, serve and Python take it by name.\n", name);
  }
  fmt::print("#pragma once\n#include <cstddef>\n\n#include <tlm/config.hpp>\n\n{}", text);
  return 0;
}

bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; });
}

}  // namespace

int main(int argc, char** argv) try {
  bool tensors = false;
  std::vector<std::string_view> wanted;
  std::string file, struct_name = "my_model";
  using configs = tlm::all_configs;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw tlm::error(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--tensors") tensors = true;
    else if (a == "--model") file = value();
    else if (a == "--name") struct_name = value();
    else if (a == "-h" || a == "--help") {
      fmt::print("usage: describe [--tensors] [CONFIG...]\n"
                 "       describe [--name NAME] FILE.gguf   (or --model FILE) the config struct NAME that binds the file\n");
      return 0;
    } else if (!configs::contains(a) && (a.ends_with(".gguf") || std::filesystem::is_regular_file(a))) {
      if (!file.empty()) throw tlm::error("describe takes one file at a time");
      file = a;
    } else wanted.push_back(a);
  }
  if (!is_identifier(struct_name))
    throw tlm::error(fmt::format("--name '{}' is not a C++ identifier; give a name such as my_model", struct_name));
  if (!file.empty()) {
    if (!wanted.empty() || tensors) throw tlm::error("describe takes either a file or config names, not both");
    return describe_file(file, struct_name);
  }
  for (const auto name : wanted)
    if (!configs::contains(name)) {
      fmt::print(stderr, "describe: unknown config '{}'; known: {}\n", name, tlm::config_names_text<configs>());
      return 1;
    }
  for (const auto name : tlm::config_names<configs>())
    if (wanted.empty() || std::find(wanted.begin(), wanted.end(), name) != wanted.end())
      tlm::with_config<configs>(name, [&](auto c) { describe<typename decltype(c)::type>(name, tensors); });
  return 0;
} catch (const std::exception& e) {  // tlm::error: says what was wrong and what to do
  fmt::print(stderr, "describe: {}\n", e.what());
  return 1;
}
