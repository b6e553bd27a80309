// Prints, for each config of tlm::all_configs, its derived sizes, its tensors with
// their shapes, and its parameter count: everything the types know without a file.
//
//   describe [--tensors] [CONFIG...]     CONFIG: a name from tlm/configs.hpp (default: all)
#include <tlm/configs.hpp>
#include <tlm/weights.hpp>

#include <fmt/core.h>

#include <algorithm>
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

}  // namespace

int main(int argc, char** argv) {
  bool tensors = false;
  std::vector<std::string_view> wanted;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--tensors") tensors = true;
    else if (a == "-h" || a == "--help") {
      fmt::print("usage: describe [--tensors] [CONFIG...]\n");
      return 0;
    } else wanted.push_back(a);
  }
  using configs = tlm::all_configs;
  for (const auto name : wanted)
    if (!configs::contains(name)) {
      fmt::print(stderr, "describe: unknown config '{}'; known: {}\n", name, tlm::config_names_text<configs>());
      return 1;
    }
  for (const auto name : tlm::config_names<configs>())
    if (wanted.empty() || std::find(wanted.begin(), wanted.end(), name) != wanted.end())
      tlm::with_config<configs>(name, [&](auto c) { describe<typename decltype(c)::type>(name, tensors); });
  return 0;
}
