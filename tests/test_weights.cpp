// The weight structs and their walk.
#include <doctest/doctest.h>

#include <tlm/weights.hpp>

#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_weights {

using C = tlm::tiny_gqa;

TEST_CASE("the walk names every tensor as the GGUF file does, in order") {
  tlm::model_weights<tlm::smollm2_135m> w;
  std::vector<std::string> names;
  tlm::for_each_tensor([&](const tlm::tensor_name& n, const auto&) { names.push_back(n.str()); }, w);
  REQUIRE(names.size() == 272);
  CHECK(names.front() == "token_embd.weight");
  CHECK(names[1] == "blk.0.attn_norm.weight");
  CHECK(names[2] == "blk.0.attn_q.weight");
  CHECK(names[3] == "blk.0.attn_k.weight");
  CHECK(names[4] == "blk.0.attn_v.weight");
  CHECK(names[5] == "blk.0.attn_output.weight");
  CHECK(names[6] == "blk.0.ffn_norm.weight");
  CHECK(names[7] == "blk.0.ffn_gate.weight");
  CHECK(names[8] == "blk.0.ffn_up.weight");
  CHECK(names[9] == "blk.0.ffn_down.weight");
  CHECK(names[270] == "blk.29.ffn_down.weight");
  CHECK(names.back() == "output_norm.weight");
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
}

TEST_CASE("lora_targets_table: each target's tensor is the member matrix<T> returns, in walk order") {
  tlm::model_weights<C> w;
  // The walk's name of each tensor of layer 0, by address.
  std::vector<std::pair<const void*, std::string>> layer0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& n, const auto& t) {
        if (n.str().starts_with("blk.0.")) layer0.emplace_back(static_cast<const void*>(&t), std::string(n.member));
      },
      w);
  using L = tlm::layer_weights<C>;
  const std::array<const void*, 7> by_target{&L::matrix<tlm::lora_target::q>(w.layers[0]),
                                             &L::matrix<tlm::lora_target::k>(w.layers[0]),
                                             &L::matrix<tlm::lora_target::v>(w.layers[0]),
                                             &L::matrix<tlm::lora_target::o>(w.layers[0]),
                                             &L::matrix<tlm::lora_target::gate>(w.layers[0]),
                                             &L::matrix<tlm::lora_target::up>(w.layers[0]),
                                             &L::matrix<tlm::lora_target::down>(w.layers[0])};
  std::size_t previous = 0;
  for (std::size_t i = 0; i < tlm::lora_targets_table.size(); ++i) {
    const auto& e = tlm::lora_targets_table[i];
    CHECK(static_cast<unsigned>(e.target) == 1u << i);
    const auto it = std::find_if(layer0.begin(), layer0.end(), [&](const auto& p) { return p.first == by_target[i]; });
    REQUIRE(it != layer0.end());
    CHECK(it->second == e.tensor);
    const auto at = static_cast<std::size_t>(it - layer0.begin());
    if (i > 0) CHECK(at > previous);
    previous = at;
  }
}

TEST_CASE("an untied model has an output matrix, visited last") {
  tlm::model_weights<tlm::tiny_untied> w;
  std::vector<std::string> names;
  tlm::for_each_tensor([&](const tlm::tensor_name& n, const auto&) { names.push_back(n.str()); }, w);
  REQUIRE(names.size() == 3 + 9 * 2);
  CHECK(names.back() == "output.weight");
}

TEST_CASE("a lockstep walk pairs each parameter with the same tensor of the others") {
  tlm::model_weights<C, tlm::owned<>> params, grads, moments;
  // Mark each parameter tensor with its index, then check the pairing sees it.
  std::size_t index = 0;
  tlm::for_each_tensor([&](const tlm::tensor_name&, auto& p) { p.data()[0] = static_cast<float>(++index); }, params);
  std::size_t seen = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, auto& p, auto& g, auto& m) {
        ++seen;
        g.data()[0] = 2 * p.data()[0];
        m.data()[0] = g.data()[0] + 1;
      },
      params, grads, moments);
  CHECK(seen == index);
  CHECK(grads.layers[1].ffn_up.data()[0] == doctest::Approx(2 * params.layers[1].ffn_up.data()[0]));
  CHECK(moments.output_norm.data()[0] == doctest::Approx(2 * params.output_norm.data()[0] + 1));
  CHECK(tlm::parameter_count(params) == tlm::parameter_count_v<C>);
}

TEST_CASE("owned tensors start at zero and hold f32 values; mapped tensors check their bytes") {
  tlm::mat<3, 4, tlm::owned<>> m;
  for (float v : m.values()) CHECK(v == 0.0f);
  m(2, 3) = 5.0f;
  CHECK(m.row(2)[3] == 5.0f);
  CHECK(m.enc() == tlm::encoding::f32);
  CHECK(m.bytes().size() == 3 * 4 * sizeof(float));

  tlm::mat<2, 32> q;
  CHECK_FALSE(q.bound());
  std::vector<std::byte> bytes(2 * 20);
  q.bind(tlm::encoding::q4_1, bytes, "blk.0.attn_q.weight");
  CHECK(q.bound());
  CHECK(q.enc() == tlm::encoding::q4_1);
  std::vector<std::byte> short_bytes(39);
  CHECK_THROWS_AS(q.bind(tlm::encoding::q4_1, short_bytes, "x"), tlm::shape_error);
  tlm::mat<2, 48> not_blocks;
  try {
    not_blocks.bind(tlm::encoding::q4_0, bytes, "blk.1.ffn_up.weight");
    FAIL("48 values are not whole Q4_0 blocks");
  } catch (const tlm::shape_error& e) {
    CHECK(std::string(e.what()).find("blk.1.ffn_up.weight") != std::string::npos);
    CHECK(std::string(e.what()).find("Q4_0") != std::string::npos);
  }
}

}  // namespace test_weights
