// bind<C>: every metadata key that changes the computation is checked, and a file
// that asks for something tlm does not compute is refused with a message naming the
// key, instead of being run as plain Llama.
#include <doctest/doctest.h>

#include <tlm/format/gguf_writer.hpp>
#include <tlm/load.hpp>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_bind {

using C = tlm::tiny_gqa;  // head_dim 8

namespace {

const std::string tiny_path = TLM_FIXTURES "/models/tiny_gqa.gguf";

// The tiny_gqa fixture copied key by key and tensor by tensor, with `edit` applied
// to the metadata; the bytes stay alive for the returned file.
struct rewritten {
  std::vector<std::byte> bytes;  // moving the vector keeps its buffer, so `file` stays valid
  std::optional<tlm::gguf::file> parsed;
  const tlm::gguf::file& file() const { return *parsed; }
};

rewritten rewrite(const std::function<void(tlm::gguf::writer&)>& edit) {
  const tlm::gguf::file src(tiny_path);
  tlm::gguf::writer w;
  for (const auto& e : src.metadata()) w.set_value(e.key, e.val);
  edit(w);
  for (const auto& t : src.tensors()) {
    w.add_tensor(t.name, std::vector<std::uint64_t>(t.dims.begin(), t.dims.begin() + t.n_dims), t.enc, t.data);
  }
  rewritten r{w.to_bytes(), std::nullopt};
  r.parsed.emplace(tlm::gguf::file::from_memory(r.bytes, "edited.gguf"));
  return r;
}

// The problems binding reports, or none when it binds.
std::vector<std::string> problems(const tlm::gguf::file& f) {
  try {
    (void)tlm::bind<C>(f);
    return {};
  } catch (const tlm::bind_error& e) {
    return e.problems();
  }
}

std::vector<std::string> problems_after(const std::function<void(tlm::gguf::writer&)>& edit) {
  return problems(rewrite(edit).file());
}

}  // namespace

TEST_CASE("the unedited copy binds, so every refusal below is the edit's doing") {
  CHECK(problems(tlm::gguf::file(tiny_path)).empty());
  CHECK(problems_after([](tlm::gguf::writer&) {}).empty());
}

TEST_CASE("head sizes other than head_dim are refused") {
  auto p = problems_after([](auto& w) { w.set("llama.attention.key_length", std::uint32_t{16}); });
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "llama.attention.key_length: expected 8, found 16");
  p = problems_after([](auto& w) { w.set("llama.attention.value_length", std::uint32_t{4}); });
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "llama.attention.value_length: expected 8, found 4");
  // Partial rotation (rotating only some dims of each head) is not implemented.
  p = problems_after([](auto& w) { w.set("llama.rope.dimension_count", std::uint32_t{4}); });
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "llama.rope.dimension_count: expected 8, found 4");
  // The matching values bind.
  CHECK(problems_after([](auto& w) {
          w.set("llama.attention.key_length", std::uint32_t{8});
          w.set("llama.attention.value_length", std::uint32_t{8});
        }).empty());
}

TEST_CASE("RoPE scaling is refused on a config that declares none, unless it scales nothing") {
  auto p = problems_after([&](auto& w) { w.set("llama.rope.scaling.type", "linear"); });
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "llama.rope.scaling.type: expected \"none\" (tiny_gqa), found \"linear\"; declare the scaling the file has in "
                "the config's rope_scaling");
  for (const char* type : {"yarn", "longrope"}) {
    p = problems_after([&](auto& w) { w.set("llama.rope.scaling.type", type); });
    REQUIRE(p.size() == 1);
    CHECK(p[0] == std::string("llama.rope.scaling.type: expected \"none\" (tiny_gqa), found \"") + type +
                      "\"; tlm implements RoPE scaling none, linear and llama3 (rope_freqs) only");
  }
  p = problems_after([](auto& w) { w.set("llama.rope.scaling.factor", 2.0f); });
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "llama.rope.scaling.factor: expected 1.000000 (tiny_gqa), found 2.000000");
  p = problems_after([](auto& w) { w.set("llama.rope.scale_linear", 4.0f); });
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "llama.rope.scale_linear: expected 1.000000 (tiny_gqa), found 4.000000");
  p = problems_after([](auto& w) { w.set("llama.rope.scaling.attn_factor", 0.5f); });
  REQUIRE(p.size() == 1);
  CHECK(p[0].starts_with("llama.rope.scaling.attn_factor: 0.5"));
  p = problems_after([](auto& w) { w.set("llama.rope.scaling.attn_factor", 0.0f); });
  CHECK(p.size() == 1);
  // A wrongly typed key is a problem too, not an exception that escapes binding.
  p = problems_after([](auto& w) { w.set("llama.rope.scaling.type", std::uint32_t{1}); });
  REQUIRE(p.size() == 1);
  CHECK(p[0].starts_with("llama.rope.scaling.type: "));
  // What converters write for a model without scaling binds.
  CHECK(problems_after([](auto& w) {
          w.set("llama.rope.scaling.type", "none");
          w.set("llama.rope.scaling.factor", 1.0f);
          w.set("llama.rope.scale_linear", 0.0f);
          w.set("llama.rope.scaling.attn_factor", 1.0f);
          w.set("llama.rope.scaling.original_context_length", std::uint32_t{64});
        }).empty());
}

TEST_CASE("mixture-of-experts and unknown llama.* keys are refused") {
  auto p = problems_after([](auto& w) { w.set("llama.expert_count", std::uint32_t{8}); });
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "llama.expert_count: expected 0, found 8");
  p = problems_after([](auto& w) { w.set("llama.attention.sliding_window", std::uint32_t{32}); });
  REQUIRE(p.size() == 1);
  CHECK(p[0].starts_with("llama.attention.sliding_window: tlm does not know this key"));
  // Keys outside llama.* (general.*, tokenizer.*) say nothing about the computation.
  CHECK(problems_after([](auto& w) { w.set("general.url", "https://example.org"); }).empty());
}

TEST_CASE("the hyperparameters already checked stay checked") {
  auto p = problems_after([](auto& w) { w.set("llama.rope.freq_base", 500000.0f); });
  REQUIRE(p.size() == 1);
  CHECK(p[0].starts_with("llama.rope.freq_base: expected 10000"));
  p = problems_after([](auto& w) { w.set("llama.attention.layer_norm_rms_epsilon", 1e-6f); });
  REQUIRE(p.size() == 1);
  CHECK(p[0].starts_with("llama.attention.layer_norm_rms_epsilon: expected"));
  p = problems_after([](auto& w) { w.set("llama.attention.head_count_kv", std::uint32_t{4}); });
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "llama.attention.head_count_kv: expected 2, found 4");
  // The message names the file, the config and what to do.
  try {
    (void)tlm::bind<C>(rewrite([](auto& w) { w.set("llama.rope.scaling.type", "linear"); }).file());
    FAIL("must not bind");
  } catch (const tlm::bind_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("edited.gguf does not fit tiny_gqa (1 problem)") != std::string::npos);
    CHECK(msg.find("llama.rope.scaling.type") != std::string::npos);
    CHECK(msg.find("Use the config type that matches this file") != std::string::npos);
  }
}

}  // namespace test_bind
