// The C++ side of tests/reference/torch_check_train.py: runs what a fixture file
// describes and writes tlm's results for the script to compare with PyTorch's.
//
//   train_probe model FIXTURE.gguf OUT.gguf [--precision float|double]
//       OUT: train.loss [1], train.losses [steps], grad.<name>, step10.<name>
//   train_probe layer IN.gguf OUT.gguf --config smollm2_135m [--precision float|double]
//       IN: layer.x [T, D], layer.dy [T, D], blk.0.<member>.weight; one block forward and backward
//       OUT: layer.y [T, D], grad.x [T, D], grad.blk.0.<member>.weight
//   train_probe lora IN.gguf OUT.gguf ADAPTER.gguf --encoding f32|f16|q8_0|q4_1|...
//                    [--config NAME] [--precision float|double]
//       IN: base.<name> (F32, every weight of the config), train.tokens, train.targets and
//       the tlm.fixture.* hyperparameters; ADAPTER: a rank-4 adapter on all seven matrices
//       in llama.cpp's format. The base is quantized to --encoding and mapped (frozen; in
//       double, its dequantized values); then the adapter's loss and gradients on the
//       batch and its AdamW steps.
//       OUT: train.loss [1], train.losses [steps], grad.<adapter name>, step<steps>.<adapter
//       name>, and base.<name> in the encoding used, for the reference to dequantize
#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <tlm/train/lora.hpp>
#include <tlm/train/lora_file.hpp>

#include "train_common.hpp"
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

// The adapter's rank and targets: the ones every case of the reference uses.
template <tlm::LlamaConfig C, class T>
using probe_adapter = tlm::lora<C, 4, tlm::all_layer_matrices, T>;

template <tlm::LlamaConfig C, tlm::Element T>
void lora_probe(const tlm::gguf::file& f, const std::string& out_path, const std::string& adapter_path,
                tlm::encoding enc) {
  using A = probe_adapter<C, T>;
  const std::size_t B = f.get_uint("tlm.fixture.batch"), S = f.get_uint("tlm.fixture.seq");
  const std::size_t steps = f.get_uint("tlm.fixture.steps");
  auto ids = [&](const char* name) {
    const auto v = tlm_test::read_f32(f, name, B * S);
    return std::vector<std::int32_t>(v.begin(), v.end());
  };
  const auto tokens = ids("train.tokens"), targets = ids("train.targets");
  auto pf = std::make_unique<tlm::trainable<C, float>>();
  tlm_test::read_weights(f, *pf, "base.");
  const tlm_test::mapped_base<C> mb(*pf, enc);

  // The adapter file is read as llama.cpp writes it (F32 factors); double widens them.
  auto read = std::make_unique<probe_adapter<C, float>>();
  tlm::read_lora(std::filesystem::path(adapter_path), *read);
  auto ad = std::make_unique<A>();
  ad->alpha = read->alpha;
  tlm::for_each_tensor(
      [](const tlm::tensor_name&, auto& d, const auto& s) {
        for (std::size_t i = 0; i < s.values().size(); ++i) d.data()[i] = static_cast<T>(s.data()[i]);
      },
      *ad, *read);

  auto run_with = [&](const auto& base) {
    tlm::training<C, T> run({.batch = B, .seq = S, .threads = 1});
    auto g = std::make_unique<A>(), first = std::make_unique<A>();
    tlm::adamw<A> opt(tlm_test::fixture_adamw(f, steps));
    std::vector<float> losses;
    for (std::size_t s = 0; s < steps; ++s) {
      losses.push_back(static_cast<float>(run.forward(base, *ad, tokens, targets)));
      tlm::zero(*g);
      run.backward(base, *ad, *g);
      if (s == 0) {
        tlm::for_each_tensor(
            [](const tlm::tensor_name&, auto& d, const auto& src) { std::ranges::copy(src.values(), d.data()); },
            *first, *g);
      }
      opt.step(*ad, *g, &run.pool());
    }
    tlm::gguf::writer out;
    out.set("general.architecture", "llama");
    out.add_tensor_f32("train.loss", {1}, tlm::encoding::f32, std::vector<float>{losses.front()});
    out.add_tensor_f32("train.losses", {losses.size()}, tlm::encoding::f32, losses);
    tlm_test::write_weights(out, *first, "grad.");
    tlm_test::write_weights(out, *ad, "step" + std::to_string(steps) + ".");
    // The base as it was multiplied: matrices in `enc`, vectors F32 (mapped_base's rule).
    tlm::for_each_tensor(
        [&](const tlm::tensor_name& name, const auto& t) {
          using U = std::remove_cvref_t<decltype(t)>;
          const std::vector<float> v(t.values().begin(), t.values().end());
          out.add_tensor_f32("base." + name.str(), tlm_test::gguf_dims<U>(), U::rank == 1 ? tlm::encoding::f32 : enc, v);
        },
        *pf);
    out.write(out_path);
  };
  if constexpr (std::same_as<T, float>) run_with(mb.w);
  else run_with(*tlm::to_trainable<double>(mb.w));
}

template <tlm::Element T>
void dispatch(const std::string& mode, const std::string& config, const tlm::gguf::file& f, const std::string& out,
              const std::string& adapter, tlm::encoding enc) {
  if (mode == "lora") {
    if (config == "tiny_gqa") return lora_probe<tlm::tiny_gqa, T>(f, out, adapter, enc);
    if (config == "tiny_untied") return lora_probe<tlm::tiny_untied, T>(f, out, adapter, enc);
    if (config == "tiny_qwen2") return lora_probe<tlm::tiny_qwen2, T>(f, out, adapter, enc);
    if (config == "tiny_traits") return lora_probe<tlm::tiny_traits, T>(f, out, adapter, enc);
    throw tlm::error("train_probe: no lora probe for config '" + config +
                     "' (tiny_gqa, tiny_untied, tiny_qwen2, tiny_traits)");
  }
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
    if (argc < 4)
      throw tlm::error("usage: train_probe model|layer|lora IN.gguf OUT.gguf [ADAPTER.gguf --encoding ENC] "
                       "[--config NAME] [--precision float|double]");
    const std::string mode = argv[1], in = argv[2], out = argv[3];
    std::string config, precision = "float", adapter, encoding;
    int i = 4;
    if (mode == "lora" && i < argc) adapter = argv[i++];
    for (; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--config" && i + 1 < argc) config = argv[++i];
      else if (a == "--precision" && i + 1 < argc) precision = argv[++i];
      else if (a == "--encoding" && i + 1 < argc) encoding = argv[++i];
      else throw tlm::error("train_probe: unknown option '" + a + "'");
    }
    tlm::encoding enc = tlm::encoding::f32;
    if (mode == "lora") {
      if (adapter.empty() || encoding.empty()) throw tlm::error("train_probe lora: give ADAPTER.gguf and --encoding");
      const auto* e = tlm::parse_writable_encoding(encoding);
      if (e == nullptr) throw tlm::error("train_probe: --encoding is one of " + tlm::writable_encodings_list() + ", not '" + encoding + "'");
      enc = e->enc;
    }
    const tlm::gguf::file f(in);
    if (config.empty()) config = std::string(f.get_string("tlm.fixture.config"));
    if (precision == "double") dispatch<double>(mode, config, f, out, adapter, enc);
    else if (precision == "float") dispatch<float>(mode, config, f, out, adapter, enc);
    else throw tlm::error("train_probe: --precision is float or double, not '" + precision + "'");
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_probe: {}\n", e.what());
    return 1;
  }
  return 0;
}
