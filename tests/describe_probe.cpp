// Binds GGUF files to the config structs examples/describe printed for them
// (tests/cli/describe_struct.cmake writes the headers into BUILD/describe-test): the
// printed text compiles as a config, binds its file, and equals the config the file was
// made from in every field and trait.
//
//   describe_probe TINY_TRAITS.gguf SMOLLM2_135M.gguf
#include "described_smollm2.hpp"
#include "described_traits.hpp"

#include <tlm/config_match.hpp>
#include <tlm/load.hpp>

#include <fmt/core.h>

#include <exception>

namespace {

template <tlm::LlamaConfig Described, tlm::LlamaConfig Original>
bool check(const char* path) {
  const tlm::gguf::file f(path);
  const auto weights = tlm::bind<Described>(f);  // throws, listing every mismatch, if the struct does not fit
  const auto differences = tlm::config_differences(tlm::file_config_of<Described>(), tlm::file_config_of<Original>(),
                                                   tlm::config_name<Original>());
  for (const auto& d : differences) fmt::print(stderr, "{} (described) against {}\n", d, tlm::type_name<Described>());
  if (!differences.empty()) return false;
  fmt::print("{} binds {} ({} tensors) and equals {} in every field and trait\n", tlm::type_name<Described>(), path,
             tlm::tensor_count(weights), tlm::config_name<Original>());
  return true;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 3) {
    fmt::print(stderr, "usage: describe_probe TINY_TRAITS.gguf SMOLLM2_135M.gguf\n");
    return 2;
  }
  const bool traits = check<described_traits, tlm::tiny_traits>(argv[1]);
  const bool smollm2 = check<described_smollm2, tlm::smollm2_135m>(argv[2]);
  return traits && smollm2 ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "describe_probe: {}\n", e.what());
  return 1;
}
