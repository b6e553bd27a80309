// checkpoint: time to write and to load a SmolLM2-135M training checkpoint (1.6 GB: the
// f32 weights and AdamW's two moments), and what part of the write the checksums take.
//
//   checkpoint [DIR] [--repeat N]      (DIR default bench-checkpoint, N default 3)
//
// Each repeat writes a new step's pair into DIR (the previous pair is removed as the
// trainer removes it with --keep-checkpoints 1) and loads it back. The write includes
// the fsyncs, so its time is mostly the disk's; run it on the disk the trainer writes to.
#include <tlm/configs.hpp>
#include <tlm/train/checkpoint.hpp>

#include <fmt/core.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace {

using C = tlm::smollm2_135m;
using W = tlm::trainable<C, float>;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path dir = "bench-checkpoint";
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeat" && i + 1 < argc) repeat = std::stoi(argv[++i]);
    else dir = a;
  }
  std::filesystem::create_directories(dir);
  auto p = std::make_unique<W>();
  tlm::adamw<W> opt({.lr = 3e-4});
  // Values that are not all zero, so no layer of the system can skip or compress them.
  tlm::init_weights(*p, 1);
  tlm::init_weights(opt.m(), 2, 0.01);
  tlm::init_weights(opt.v(), 3, 0.001);
  std::uint64_t bytes = 0;
  const auto t_sum = clock_type::now();
  std::uint64_t mix = 0;
  for (const W* w : {p.get(), &opt.m(), &opt.v()})
    tlm::for_each_tensor(
        [&](const tlm::tensor_name&, const auto& t) {
          mix ^= tlm::detail::checksum(std::as_bytes(t.values()));
          bytes += t.values().size_bytes();
        },
        *w);
  const double sum_s = seconds_since(t_sum);
  fmt::print("checkpoint of smollm2_135m: {:.2f} GB of tensors; checksums {:.2f} s ({:.1f} GB/s, {:x})\n", static_cast<double>(bytes) / 1e9, sum_s,
             static_cast<double>(bytes) / 1e9 / sum_s, mix & 0xffff);
  auto q = std::make_unique<W>();
  tlm::adamw<W> loaded({.lr = 3e-4});
  for (int r = 1; r <= repeat; ++r) {
    const tlm::train_state st{.step = static_cast<std::uint64_t>(r), .seed = 1, .batch = 1, .seq = 1, .threads = 1,
                              .options = opt.options(), .config = "smollm2_135m", .data = "bench", .kernels = "", .lora_base = {}, .lora_rank = 0, .lora_alpha = 0, .lora_targets = {}};
    const auto t_save = clock_type::now();
    tlm::save_checkpoint<C>(dir, *p, opt, st, nullptr, 1);
    const double save_s = seconds_since(t_save);
    const auto t_load = clock_type::now();
    tlm::load_checkpoint<C>(dir, *q, loaded);
    const double load_s = seconds_since(t_load);
    fmt::print("repeat {}: write {:.2f} s ({:.0f} MB/s), load {:.2f} s\n", r, save_s, static_cast<double>(bytes) / 1e6 / save_s, load_s);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
