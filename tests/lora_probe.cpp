// The C++ side of tests/reference/check_lora_llamacpp.py: an adapter over a real base,
// written in llama.cpp's format, and tlm's logits with it and without it.
//
//   lora_probe MODEL.gguf OUT_DIR TOKEN_IDS
//       OUT_DIR/adapter.gguf    rank 8 on q, k, v, o, alpha 16; A as init_lora (seed 5),
//                               B drawn N(0, 0.1²) (seed 6) so that the adapter matters
//       OUT_DIR/adapted.f32     [T, V] tlm's logits over the mapped base with the adapter
//       OUT_DIR/base.f32        [T, V] the same with B = 0 (the base's logits)
//       OUT_DIR/merged.gguf     the base with the adapter merged, each tensor in its
//                               encoding in MODEL.gguf (train --merge's default)
//       OUT_DIR/merged.f32      [T, V] tlm's logits of merged.gguf alone
//   and prints the share of the adapter's change to the weights merged.gguf keeps
//   lora_probe --read ADAPTER.gguf
//       reads a rank-8 q, k, v, o adapter for smollm2_135m with tlm::read_lora (every
//       check of it) and prints its alpha, tensor count and sum of |B| (tests/train/lora.sh)
#include <tlm/load.hpp>
#include <tlm/train/checkpoint.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/lora_file.hpp>
#include <tlm/train/step.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using C = tlm::smollm2_135m;
using A = tlm::lora<C, 8>;

int main(int argc, char** argv) try {
  if (argc == 3 && std::string(argv[1]) == "--read") {
    auto ad = std::make_unique<A>();
    tlm::read_lora(std::filesystem::path(argv[2]), *ad);
    std::size_t tensors = 0;
    double b_sum = 0;
    tlm::for_each_tensor(
        [&](const tlm::tensor_name& name, const auto& t) {
          ++tensors;
          if (name.member.ends_with(tlm::tensor_name::lora_b_suffix))
            for (const float v : t.values()) b_sum += std::abs(v);
        },
        *ad);
    std::printf("alpha %g tensors %zu sum|B| %g\n", ad->alpha, tensors, b_sum);
    return 0;
  }
  if (argc != 4) {
    std::fprintf(stderr, "usage: lora_probe MODEL.gguf OUT_DIR TOKEN_IDS (comma-separated)\n");
    return 2;
  }
  const tlm::gguf::file f(argv[1]);
  const auto w = tlm::bind<C>(f);
  const std::filesystem::path out(argv[2]);
  std::vector<std::int32_t> tokens;
  std::stringstream ids(argv[3]);
  for (std::string t; std::getline(ids, t, ',');) tokens.push_back(static_cast<std::int32_t>(std::stol(t)));
  // Next-token targets (the loss is not compared; a forward needs one that counts).
  std::vector<std::int32_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(tlm::ignore_target);

  auto ad = std::make_unique<A>();
  tlm::init_lora(*ad, 5);
  tlm::normal_rng rng(6);
  tlm::for_each_tensor(
      [&](const tlm::tensor_name& name, auto& t) {
        if (name.member.ends_with(tlm::tensor_name::lora_b_suffix))
          for (auto& v : t.values()) v = static_cast<float>(0.1 * rng.normal());
      },
      *ad);
  ad->alpha = 16;
  tlm::write_lora(out / "adapter.gguf", *ad);

  tlm::training<C, float> run({.batch = 1, .seq = tokens.size(), .threads = 1});
  auto dump = [&](const char* name) {
    std::ofstream o(out / name, std::ios::binary);
    o.write(reinterpret_cast<const char*>(run.logits().data()),
            static_cast<std::streamsize>(tokens.size() * C::vocab * sizeof(float)));
  };
  run.forward(w, *ad, tokens, targets);
  dump("adapted.f32");
  const auto zero = std::make_unique<A>();  // B = 0: the base alone
  run.forward(w, *zero, tokens, targets);
  dump("base.f32");

  {
    const auto merged = tlm::to_trainable<float>(w);
    tlm::merge_lora(*merged, *ad);
    tlm::write_model_like<C>(out / "merged.gguf", *merged, f, 0);
    std::printf("merged.gguf keeps %.4f of the adapter's change to the weights\n",
                tlm::kept_change<C>(w, *merged, tlm::source_encodings(*merged, f)));
  }
  const tlm::gguf::file merged_file(out / "merged.gguf");
  run.forward(tlm::bind<C>(merged_file), *zero, tokens, targets);
  dump("merged.f32");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "lora_probe: %s\n", e.what());
  return 1;
}
