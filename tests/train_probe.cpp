// The C++ side of tests/reference/torch_check_train.py: runs what a fixture file
// describes and writes tlm's results for the script to compare with PyTorch's.
//
//   train_probe model FIXTURE.gguf OUT.gguf [--precision float|double]
//       OUT: train.loss [1], train.losses [steps], grad.<name>, step10.<name>
//   train_probe layer IN.gguf OUT.gguf --config smollm2_135m [--precision float|double]
//       IN: layer.x [T, D], layer.dy [T, D], blk.0.<member>.weight; one block forward and backward
//       OUT: layer.y [T, D], grad.x [T, D], grad.blk.0.<member>.weight
#include <fmt/core.h>

#include <cstring>
#include <string>
#include <vector>

#include "train_fixture.hpp"

namespace {

template <tlm::LlamaConfig C, tlm::Element T>
void model_probe(const tlm::gguf::file& f, const std::string& out_path) {
  const auto r = tlm_test::run_fixture<C, T>(f);
  tlm::gguf::writer out;
  out.set("general.architecture", "llama");
  const std::vector<float> loss{static_cast<float>(r.loss)};
  out.add_tensor_f32("train.loss", {1}, tlm::encoding::f32, loss);
  const std::vector<float> losses(r.losses.begin(), r.losses.end());
  out.add_tensor_f32("train.losses", {losses.size()}, tlm::encoding::f32, losses);
  tlm_test::write_weights(out, *r.grads, "grad.");
  tlm_test::write_weights(out, *r.stepped, "step10.");
  out.write(out_path);
}

template <tlm::LlamaConfig C, tlm::Element T>
void layer_probe(const tlm::gguf::file& f, const std::string& out_path) {
  constexpr std::size_t D = tlm::dim<C>;
  const auto* xt = f.find_tensor("layer.x");
  if (!xt) throw tlm::error(f.name() + ": no tensor layer.x");
  const std::size_t n = xt->elements / D;
  auto w = std::make_unique<tlm::layer_weights<C, tlm::owned<T>>>();
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, auto& t) {
        const auto v = tlm_test::read_f32(f, "blk.0." + std::string(name.member) + ".weight", t.values().size());
        for (std::size_t i = 0; i < v.size(); ++i) t.data()[i] = static_cast<T>(v[i]);
      },
      *w);
  auto dw = std::make_unique<tlm::layer_weights<C, tlm::owned<T>>>();
  tlm::block_activations<C, T> a;
  a.reserve(n);
  a.x.resize(n);
  tlm::rows<D, T> y(n), dx(n);
  const auto x = tlm_test::read_f32(f, "layer.x", n * D), dy = tlm_test::read_f32(f, "layer.dy", n * D);
  for (std::size_t i = 0; i < n * D; ++i) {
    a.x.data()[i] = static_cast<T>(x[i]);
    dx.data()[i] = static_cast<T>(dy[i]);
  }
  std::vector<tlm::rope_angles<C, T>> angles;
  for (std::size_t t = 0; t < n; ++t) angles.emplace_back(t);
  const tlm::block_context<C, T> ctx{{1, n, 0}, angles.data(), tlm::rope_pairing::adjacent, nullptr};
  tlm::thread_pool pool(1, true);
  tlm::block_forward(*w, a, y, ctx, tlm::kv_in_batch<C, T>{n}, &pool);
  tlm::block_scratch<C, T> scratch;
  scratch.reserve(n);
  tlm::block_backward(*w, a, ctx, dx, *dw, scratch, &pool);
  tlm::gguf::writer out;
  out.set("general.architecture", "llama");
  auto put = [&](const char* name, const tlm::rows<D, T>& r) {
    std::vector<float> v(r.values().begin(), r.values().end());
    out.add_tensor_f32(name, {D, n}, tlm::encoding::f32, v);
  };
  put("layer.y", y);
  put("grad.x", dx);
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, const auto& t) {
        using U = std::remove_cvref_t<decltype(t)>;
        std::vector<float> v(t.values().begin(), t.values().end());
        out.add_tensor_f32("grad.blk.0." + std::string(name.member) + ".weight", tlm_test::gguf_dims<U>(),
                           tlm::encoding::f32, v);
      },
      *dw);
  out.write(out_path);
}

template <tlm::Element T>
void dispatch(const std::string& mode, const std::string& config, const tlm::gguf::file& f, const std::string& out) {
  if (mode == "model" && config == "tiny_gqa") return model_probe<tlm::tiny_gqa, T>(f, out);
  if (mode == "model" && config == "tiny_untied") return model_probe<tlm::tiny_untied, T>(f, out);
  if (mode == "layer" && config == "smollm2_135m") return layer_probe<tlm::smollm2_135m, T>(f, out);
  if (mode == "layer" && config == "tiny_gqa") return layer_probe<tlm::tiny_gqa, T>(f, out);
  throw tlm::error("train_probe: no " + mode + " probe for config '" + config +
                   "' (model: tiny_gqa, tiny_untied; layer: smollm2_135m, tiny_gqa)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 4) throw tlm::error("usage: train_probe model|layer IN.gguf OUT.gguf [--config NAME] [--precision float|double]");
    const std::string mode = argv[1], in = argv[2], out = argv[3];
    std::string config, precision = "float";
    for (int i = 4; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--config" && i + 1 < argc) config = argv[++i];
      else if (a == "--precision" && i + 1 < argc) precision = argv[++i];
      else throw tlm::error("train_probe: unknown option '" + a + "'");
    }
    const tlm::gguf::file f(in);
    if (config.empty()) config = std::string(f.get_string("tlm.fixture.config"));
    if (precision == "double") dispatch<double>(mode, config, f, out);
    else if (precision == "float") dispatch<float>(mode, config, f, out);
    else throw tlm::error("train_probe: --precision is float or double, not '" + precision + "'");
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_probe: {}\n", e.what());
    return 1;
  }
  return 0;
}
