#pragma once
// Reader for the TLMFIX01 fixture container written by tests/reference
// (format in tests/fixtures/forward/README.md), and the real model and its tokenizer
// shared by the tests of one program.
#include <tlm/text/tokenizer.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace tlm_test {

struct array {
  std::uint32_t type = 0;  // 1 f32, 2 f64, 3 i32
  std::vector<std::uint64_t> dims;
  std::vector<double> values;  // every element widened to double
  std::vector<std::int32_t> ints() const { return {values.begin(), values.end()}; }
  std::size_t size() const { return values.size(); }
};

class fixture {
 public:
  explicit fixture(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open fixture " + path);
    char magic[8];
    in.read(magic, 8);
    if (std::string(magic, 8) != "TLMFIX01") throw std::runtime_error(path + ": not a TLMFIX01 fixture");
    const auto count = read<std::uint32_t>(in);
    for (std::uint32_t i = 0; i < count; ++i) {
      const auto len = read<std::uint32_t>(in);
      std::string name(len, '\0');
      in.read(name.data(), len);
      array a;
      a.type = read<std::uint32_t>(in);
      const auto ndim = read<std::uint32_t>(in);
      std::uint64_t n = 1;
      for (std::uint32_t d = 0; d < ndim; ++d) {
        a.dims.push_back(read<std::uint64_t>(in));
        n *= a.dims.back();
      }
      a.values.resize(n);
      for (std::uint64_t k = 0; k < n; ++k) {
        if (a.type == 1) a.values[k] = read<float>(in);
        else if (a.type == 2) a.values[k] = read<double>(in);
        else if (a.type == 3) a.values[k] = read<std::int32_t>(in);
        else throw std::runtime_error(path + ": unknown element type in " + name);
      }
      if (!in) throw std::runtime_error(path + ": truncated at " + name);
      arrays_[name] = std::move(a);
    }
  }
  const array& operator[](const std::string& name) const {
    const auto it = arrays_.find(name);
    if (it == arrays_.end()) throw std::runtime_error("fixture has no array " + name);
    return it->second;
  }
  int scalar(const std::string& name) const { return static_cast<int>((*this)[name].values.at(0)); }

 private:
  template <class T>
  static T read(std::istream& in) {
    T v{};
    in.read(reinterpret_cast<char*>(&v), sizeof v);
    return v;
  }
  std::map<std::string, array> arrays_;
};

// True when the binary runs under AddressSanitizer: the slowest checks then use a
// subset (the Release run of the same test covers everything). GCC defines
// __SANITIZE_ADDRESS__; Clang (14, the sanitizer build's) only answers __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TLM_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TLM_TEST_ASAN 1
#endif
constexpr bool sanitized() {
#if defined(TLM_TEST_ASAN)
  return true;
#else
  return false;
#endif
}

// The real model, mapped once per test program. Fails the test, with what to do,
// when the file has not been fetched.
template <class Model>
Model& shared_model() {
  if (!std::filesystem::exists(TLM_MODEL_PATH)) {
    throw std::runtime_error("model missing at " TLM_MODEL_PATH "; run scripts/fetch-model");
  }
  static Model m = Model::load(TLM_MODEL_PATH);
  return m;
}

// The tokenizer of the shared model's file, read once per test program.
template <class Model>
const tlm::tokenizer& shared_tokenizer() {
  static const tlm::tokenizer tok = tlm::tokenizer::from_gguf(shared_model<Model>().file());
  return tok;
}

}  // namespace tlm_test
