// Choosing the config type from a file (tlm/config_match.hpp): a file of each config
// is recognised as that config and no other, a file no config fits is refused with its
// hyperparameters, the nearest config and what differs, and the struct describe prints
// for a file holds the file's values field by field.
#include <doctest/doctest.h>

#include <tlm/config_match.hpp>
#include <tlm/load.hpp>
#include <tlm/train/checkpoint.hpp>
#include <tlm/train/weights.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_config_match {

namespace {

std::filesystem::path temp_path(const std::string& name) {
  const auto dir = std::filesystem::path(TLM_BINARY_DIR) / "test_config_match";
  std::filesystem::create_directories(dir);
  return dir / name;
}

// A file as the library's writers make one: the one hyperparameter list and the one walk.
template <tlm::LlamaConfig C>
std::filesystem::path write_file(const std::string& name) {
  const auto path = temp_path(name);
  const auto p = std::make_unique<tlm::trainable<C, float>>();
  tlm::init_weights(*p, 1, 0.2);
  tlm::gguf::writer w;
  tlm::write_hyperparameters<C>(w, name);
  tlm::add_weights(w, *p, tlm::encoding::f32);
  w.write(path);
  return path;
}

template <class List>
std::vector<std::string_view> fitting(const tlm::file_config& c, List list) {
  std::vector<std::string_view> out;
  for (const auto& k : tlm::compare_configs(c, list))
    if (k.differences.empty()) out.push_back(k.name);
  return out;
}

template <tlm::LlamaConfig... Cs>
void each_config_fits_only_itself(tlm::config_list<Cs...>) {
  (
      [] {
        INFO(tlm::config_name<Cs>());
        CHECK(fitting(tlm::file_config_of<Cs>(), tlm::all_configs{}) == std::vector<std::string_view>{tlm::config_name<Cs>()});
      }(),
      ...);
}

template <class Exception, class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const Exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// tiny_gqa again under another name, and with linear scaling.
struct tiny_gqa_twin : tlm::tiny_gqa {};
struct tiny_linear : tlm::tiny_gqa {
  static constexpr auto rope_scaling = tlm::rope_linear(4.0);
};
// Llama 3.1's published scaling, which no config of the registry has, and one nobody
// published.
struct tiny_llama31 : tlm::tiny_gqa {
  static constexpr auto rope_scaling = tlm::rope_llama3(8.0, 1.0, 4.0, 8192);
};
struct tiny_llama3_odd : tlm::tiny_gqa {
  static constexpr auto rope_scaling = tlm::rope_llama3(16.0, 1.0, 4.0, 1024);
};

}  // namespace

TEST_CASE("no two configs of all_configs look alike to a file, so a tiny test config never shadows a real one") {
  each_config_fits_only_itself(tlm::all_configs{});
}

TEST_CASE("a file of each traits config is read back as that config and matched to it alone") {
  const auto check = [](const std::filesystem::path& path, std::string_view want) {
    const tlm::gguf::file f(path);
    INFO(path.string());
    CHECK(tlm::match_config<tlm::all_configs>(f) == want);
  };
  check(write_file<tlm::tiny_gqa>("tiny_gqa.gguf"), "tiny_gqa");
  check(write_file<tlm::tiny_untied>("tiny_untied.gguf"), "tiny_untied");
  check(write_file<tlm::tiny_qwen2>("tiny_qwen2.gguf"), "tiny_qwen2");
  check(write_file<tlm::tiny_llama3>("tiny_llama3.gguf"), "tiny_llama3");  // rope_freqs: llama3 (8, 1, 4, 1024)
  check(write_file<tlm::tiny_traits>("tiny_traits.gguf"), "tiny_traits");
  check(write_file<tlm::tiny_train>("tiny_train.gguf"), "tiny_train");

  // Linear scaling is read from its keys.
  const tlm::gguf::file linear(write_file<tiny_linear>("tiny_linear.gguf"));
  const tlm::file_config c = tlm::read_file_config(linear);
  CHECK(c.rope_scaling.type == tlm::rope_scaling_type::linear);
  CHECK(c.rope_scaling.factor == 4.0);
  CHECK(tlm::config_differences(c, tlm::file_config_of<tiny_linear>(), "tiny_linear").empty());
}

TEST_CASE("a llama3 scaling is recognised from rope_freqs among the known ones, and an unknown one is refused") {
  const tlm::gguf::file llama31(write_file<tiny_llama31>("tiny_llama31.gguf"));
  const tlm::file_config c = tlm::read_file_config(llama31);
  CHECK(tlm::config_differences(c, tlm::file_config_of<tiny_llama31>(), "tiny_llama31").empty());

  const tlm::gguf::file odd(write_file<tiny_llama3_odd>("tiny_llama3_odd.gguf"));
  const std::string m = message_of<tlm::model_mismatch>([&] { (void)tlm::read_file_config(odd); });
  INFO(m);
  CHECK(m.starts_with("rope_freqs.weight: " + odd.name() + "'s divisors (1 ... 16) are not those of a llama3 scaling tlm knows "
                      "(llama3 (factor 8, low 1, high 4, original context 8192); llama3 (factor 32, low 1, high 4, original "
                      "context 8192); llama3 (factor 8, low 1, high 4, original context 1024)); write the config's rope_scaling"));
}

TEST_CASE("a file no config fits: its hyperparameters, the nearest config, the fields that differ, what to do") {
  const tlm::gguf::file f(write_file<tlm::tiny_llama3>("nearest.gguf"));
  const std::string m = message_of<tlm::no_matching_config>([&] { (void)tlm::match_config(f); });
  INFO(m);
  CHECK(m.starts_with(f.name() + ": no config of tlm fits this file, which has llama: 2 layers, dim 32, heads 4 / kv heads 2, "
                                 "head_dim 8, ffn 64, vocab 96, context 64, rms_eps 1e-05, rope_theta 10000, RoPE scaling "
                                 "llama3 (factor 8, low 1, high 4, original context 1024), attention biases none, embeddings tied."));
  // Among the shipped configs, tiny_train is nearest (6 fields differ; smollm2_135m 10).
  CHECK(m.find("\nThe nearest config is tiny_train, which differs in 6:\n  - dim: the file has 32, tiny_train 64\n") !=
        std::string::npos);
  CHECK(m.find("  - rope_scaling: the file has llama3 (factor 8, low 1, high 4, original context 1024), tiny_train none") !=
        std::string::npos);
  CHECK(m.find("Pass --config NAME") != std::string::npos);
  CHECK(m.find("or add a config type for it: this struct binds the file (`examples/describe " + f.name() +
               "` prints it as a header to include):\nstruct my_model {\n  static constexpr std::size_t kv_heads = 2;\n") !=
        std::string::npos);
  CHECK(m.ends_with("  static constexpr auto rope_scaling = tlm::rope_llama3(8, 1, 4, 1024);\n"
                    "  static constexpr bool attention_bias = false;\n"
                    "  static constexpr auto arch = tlm::architecture::llama;\n};"));
}

TEST_CASE("two configs that fit one file alike are both named, never one picked silently") {
  const tlm::gguf::file f(write_file<tlm::tiny_gqa>("twin.gguf"));
  const std::string m =
      message_of<tlm::no_matching_config>([&] { (void)tlm::match_config<tlm::config_list<tlm::tiny_gqa, tiny_gqa_twin>>(f); });
  CHECK(m == f.name() + ": the file's hyperparameters fit 2 configs alike (tiny_gqa, tiny_gqa_twin); pass --config NAME to choose one");
}

TEST_CASE("a file that cannot say its config: missing keys, an unknown architecture") {
  tlm::gguf::writer w;
  w.set("general.architecture", "llama");
  w.set("llama.block_count", std::uint32_t{2});
  const auto partial = temp_path("partial.gguf");
  w.write(partial);
  const std::string m = message_of<tlm::model_mismatch>([&] { (void)tlm::read_file_config(tlm::gguf::file(partial)); });
  CHECK(m.find("cannot tell which config the file needs (7 problems):\n  - llama.context_length: missing\n") != std::string::npos);
  CHECK(m.find("\n  - llama.vocab_size: missing, and the file has no token_embd.weight or tokenizer.ggml.tokens to count\n") !=
        std::string::npos);

  tlm::gguf::writer g;
  g.set("general.architecture", "gemma2");
  const auto gemma = temp_path("gemma.gguf");
  g.write(gemma);
  CHECK(message_of<tlm::model_mismatch>([&] { (void)tlm::read_file_config(tlm::gguf::file(gemma)); }) ==
        gemma.string() + ": general.architecture is \"gemma2\"; tlm runs the architectures llama, qwen2 only, so no config type "
                         "can describe this file");
}

TEST_CASE("float literals read back as the same float") {
  CHECK(tlm::float_literal(1e-5) == "1e-05f");
  CHECK(tlm::float_literal(10000.0) == "10000.0f");
  CHECK(tlm::float_literal(100000.0) == "100000.0f");
  CHECK(tlm::float_literal(1000000.0) == "1000000.0f");
  CHECK(tlm::float_literal(1e20) == "1e+20f");
  CHECK(tlm::float_literal(1e-6) == "1e-06f");
}

TEST_CASE("the real SmolLM2-135M file is smollm2_135m, and its struct holds the file's values") {
  const tlm::gguf::file f(TLM_MODEL_PATH);
  CHECK(tlm::match_config(f) == "smollm2_135m");
  const std::string text = tlm::config_struct_text(tlm::read_file_config(f), "my_model");
  CHECK(text ==
        "struct my_model {\n"
        "  static constexpr std::size_t kv_heads = 3;\n"
        "  static constexpr std::size_t group = 3;  // query heads per kv head: 9 heads\n"
        "  static constexpr std::size_t half_head = 32;  // head_dim 64\n"
        "  static constexpr std::size_t ffn = 1536;\n"
        "  static constexpr std::size_t layers = 30;\n"
        "  static constexpr std::size_t vocab = 49152;\n"
        "  static constexpr std::size_t context = 8192;\n"
        "  static constexpr float rms_eps = 1e-05f;\n"
        "  static constexpr float rope_theta = 100000.0f;\n"
        "  static constexpr bool tied_embeddings = true;\n"
        "  static constexpr auto rope_scaling = tlm::rope_scaling_params{};  // none\n"
        "  static constexpr bool attention_bias = false;\n"
        "  static constexpr auto arch = tlm::architecture::llama;\n"
        "};\n");
}

TEST_CASE("choose_config: a named config is taken as named, else the file's, said on the note stream") {
  // Named: the file is not opened (a missing one is no error here; loading says so).
  CHECK(tlm::choose_config("tiny_train", "/nonexistent/file.gguf") == "tiny_train");
  std::FILE* note = std::tmpfile();
  REQUIRE(note);
  CHECK(tlm::choose_config("", TLM_MODEL_PATH, note) == "smollm2_135m");
  std::rewind(note);
  char said[128] = {};
  const std::size_t n = std::fread(said, 1, sizeof said - 1, note);
  std::fclose(note);
  CHECK(std::string(said, n) == "config: smollm2_135m (from the file's hyperparameters)\n");
  CHECK_THROWS_AS((void)tlm::choose_config("", "/nonexistent/file.gguf"), tlm::format_error);
}

TEST_CASE("a shape no config type can express is refused by name") {
  tlm::file_config c = tlm::file_config_of<tlm::tiny_gqa>();
  c.values.heads = 5;  // kv heads 2
  CHECK(message_of<tlm::model_mismatch>([&] { (void)tlm::config_struct_text(c, "x"); }) ==
        "5 query heads are not a whole multiple of 2 kv heads, which a config (heads = kv_heads * group) cannot express");
  c = tlm::file_config_of<tlm::tiny_gqa>();
  c.values.dim = 40;
  CHECK(message_of<tlm::model_mismatch>([&] { (void)tlm::config_struct_text(c, "x"); }) ==
        "embedding_length 40 is not heads 4 × head_dim 8, which tlm's configs (dim = heads * head_dim) cannot express");
}

}  // namespace test_config_match
