#pragma once
// Scratch files of the tests: a folder of the build tree for each test file, and a model
// file written the way every writer of the library writes one.
#include <tlm/hyperparameters.hpp>
#include <tlm/train/checkpoint.hpp>

#include <filesystem>
#include <string>

namespace tlm_test {

// BUILD/<test>/<name>, the folder made when missing.
inline std::filesystem::path scratch_path(const std::string& test, const std::string& name) {
  const auto dir = std::filesystem::path(TLM_BINARY_DIR) / test;
  std::filesystem::create_directories(dir);
  return dir / name;
}

// The one hyperparameter list (write_hyperparameters) and the one walk (add_weights), in
// f32. No tokenizer: binding and the forward need none (write_model's byte tokenizer
// needs 256 tokens; the tiny configs have fewer).
template <tlm::LlamaConfig C>
std::filesystem::path write_model_file(const std::filesystem::path& path, const tlm::trainable<C, float>& p) {
  tlm::gguf::writer w;
  tlm::write_hyperparameters<C>(w, path.filename().string());
  tlm::add_weights(w, p, tlm::encoding::f32);
  w.write(path);
  return path;
}

}  // namespace tlm_test
