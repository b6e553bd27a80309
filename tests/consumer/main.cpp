#include <tlm/weights.hpp>

#include <fmt/core.h>

int main() {
  tlm::model_weights<tlm::smollm2_135m> weights;
  const std::size_t n = tlm::parameter_count(weights);
  fmt::print("smollm2_135m: {} parameters in {} tensors\n", n, tlm::tensor_count(weights));
  return n == 134'515'008 ? 0 : 1;
}
