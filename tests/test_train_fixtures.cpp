// Against PyTorch (float64, tests/reference/make_train_fixtures.py): the loss and
// every gradient of one batch, and the weights after 10 AdamW steps with warm-up,
// cosine decay, clipping and decoupled weight decay, for tiny_gqa (tied, group 2)
// and tiny_untied (separate output, group 4), in float and in double.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "train_fixture.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_fixtures {

namespace {

// max |ours - ref| / max |ref| over one tensor.
template <class A>
double tensor_error(const tlm::gguf::file& f, const std::string& name, const A& ours) {
  const auto ref = tlm_test::read_f32(f, name, ours.values().size());
  double m = 0, e = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(ref[i])));
    e = std::max(e, std::abs(static_cast<double>(ours.data()[i]) - static_cast<double>(ref[i])));
  }
  return m > 0 ? e / m : e;
}

template <tlm::LlamaConfig C, tlm::Element T>
void check(const char* file, double grad_tol, double step_tol) {
  const tlm::gguf::file f(std::string(TLM_FIXTURES) + "/train/" + file);
  REQUIRE(f.get_string("tlm.fixture.config") == std::string(file).substr(0, std::string(file).size() - 5));
  const auto r = tlm_test::run_fixture<C, T>(f, 2);
  const auto loss = tlm_test::read_f32(f, "train.loss", 1);
  const auto losses = tlm_test::read_f32(f, "train.losses", r.losses.size());
  CHECK(std::abs(r.loss - loss[0]) / std::abs(loss[0]) <= 1e-6);
  for (std::size_t s = 0; s < losses.size(); ++s) {
    INFO("loss before step " << s + 1);
    CHECK(std::abs(r.losses[s] - losses[s]) / std::abs(losses[s]) <= 1e-5);
  }
  double worst_grad = 0, worst_step = 0;
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& g, const auto& p) {
        const double eg = tensor_error(f, "grad." + name.str(), g), ep = tensor_error(f, "step10." + name.str(), p);
        INFO(name.str() << ": gradient " << eg << ", after 10 steps " << ep);
        CHECK(eg <= grad_tol);
        CHECK(ep <= step_tol);
        worst_grad = std::max(worst_grad, eg);
        worst_step = std::max(worst_step, ep);
      },
      *r.grads, *r.stepped);
  MESSAGE(std::string(file) << " in " << std::string(sizeof(T) == 4 ? "float" : "double") << ": worst gradient error " << worst_grad
               << ", worst weight error after 10 AdamW steps " << worst_step);
}

}  // namespace

TEST_CASE("loss, gradients and 10 AdamW steps equal PyTorch's: double") {
  check<tlm::tiny_gqa, double>("tiny_gqa.gguf", 1e-6, 1e-6);
  check<tlm::tiny_untied, double>("tiny_untied.gguf", 1e-6, 1e-6);
}

// In float the gradients agree to about 1e-6; after 10 AdamW steps the weights
// agree to about 1e-4, not 1e-5: Adam divides each moment by the root of its second
// moment, so an entry whose gradient is near zero moves by about lr whatever its
// size, and float rounding in such a gradient changes that move. PyTorch's own
// float32 run differs from its float64 run in the same way (see
// tests/reference/torch_check_train.py's yardstick column). How far depends on the
// summation order alone: tiny_untied's worst weight error after 10 steps was 7.9e-5,
// 1.33e-4 and 8.8e-5 at the scalar, avx2 and avx512 levels with per-key attention, and
// is 7.9e-5, 9.5e-5 and 1.21e-4 with the blocked attention kernels, whose gradients
// agree as closely (8.5e-7 to 1.6e-6); hence 2e-4.
TEST_CASE("loss, gradients and 10 AdamW steps equal PyTorch's: float") {
  check<tlm::tiny_gqa, float>("tiny_gqa.gguf", 3e-6, 2e-4);
  check<tlm::tiny_untied, float>("tiny_untied.gguf", 3e-6, 2e-4);
}

}  // namespace test_train_fixtures
