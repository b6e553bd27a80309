// quantize: re-encode a GGUF model's matrices as one of the types llama.cpp's quantizer
// writes, choosing each tensor's encoding as llama.cpp does (tlm/format/quantize_mix.hpp).
//
//   quantize IN.gguf OUT.gguf TYPE [--threads N]
//
// TYPE: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k (= q4_k_s), q5_k (= q5_k_s),
// q6_k, q4_k_m, q5_k_m. IN may hold any encoding tlm reads: a quantized tensor is
// dequantized to float32 first (what llama-quantize --allow-requantize does), a tensor
// already in its target encoding is copied unchanged. Metadata is kept; general.file_type
// and general.quantization_version are set. OUT is written atomically (a temporary file
// renamed into place), so an interrupted run leaves no partial model behind.
#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/format/quantize_mix.hpp>
#include <tlm/thread_pool.hpp>

#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace {

constexpr const char* usage =
    "usage: quantize IN.gguf OUT.gguf TYPE [--threads N]\n"
    "  TYPE: one of {}\n"
    "  (q4_k and q5_k are llama.cpp's Q4_K_S and Q5_K_S mixes)\n";

// Fails now, not after minutes of work, when OUT's folder cannot take a file.
void check_writable(const std::filesystem::path& out) {
  const std::filesystem::path dir = out.has_parent_path() ? out.parent_path() : std::filesystem::path(".");
  const std::string probe = (dir / (".quantize-probe-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw tlm::error(fmt::format("{}: cannot write a file in the folder {}: {}; give an output path in a folder you can write to",
                                 out.string(), dir.string(), std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

int run(int argc, char** argv) {
  std::vector<std::string_view> pos;
  std::size_t threads = tlm::threads_or_every_core(0);
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      fmt::print(usage, tlm::quant_type_list());
      return 0;
    }
    if (a == "--threads") {
      if (i + 1 >= argc) throw tlm::error("--threads needs a number of threads");
      const std::string v = argv[++i];
      std::size_t used = 0;
      unsigned long n = 0;
      try {
        n = std::stoul(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || n == 0 || n > 256) throw tlm::error(fmt::format("--threads takes a whole number from 1 to 256, got '{}'", v));
      threads = n;
    } else if (a.starts_with("--")) {
      fmt::print(stderr, "quantize: unknown option '{}'\n", a);
      fmt::print(stderr, usage, tlm::quant_type_list());
      return 2;
    } else {
      pos.push_back(a);
    }
  }
  if (pos.size() != 3) {
    fmt::print(stderr, usage, tlm::quant_type_list());
    return 2;
  }
  const std::filesystem::path in_path(pos[0]), out_path(pos[1]);
  const tlm::quant_type* type = tlm::find_quant_type(pos[2]);
  if (type == nullptr) throw tlm::error(fmt::format("unknown type '{}'; use one of {}", pos[2], tlm::quant_type_list()));

  const tlm::gguf::file in(in_path);
  check_writable(out_path);

  std::vector<tlm::tensor_desc> descs;
  for (const auto& t : in.tensors()) descs.push_back({t.name, t.n_dims, t.row_length(), t.enc});
  const std::vector<tlm::encoding> target = tlm::choose_encodings(*type, descs);

  tlm::gguf::writer w;
  for (const auto& e : in.metadata()) {
    if (e.key == "general.alignment") w.set_alignment(static_cast<std::uint32_t>(in.alignment()));
    else if (e.key != "general.quantization_version" && e.key != "general.file_type") w.set_value(e.key, e.val);
  }
  // Last, in this order, as llama.cpp's gguf_set_* moves a key it sets to the end: the
  // two headers are then the same bytes.
  w.set("general.quantization_version", std::uint32_t{2});
  w.set("general.file_type", type->llama_file_type());

  tlm::thread_pool pool(threads);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const std::size_t total = in.tensors().size();
  std::size_t done = 0, converted = 0;
  std::uint64_t in_bytes = 0, out_bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const auto progress = [&](const tlm::gguf::tensor_info& t, tlm::encoding to) {
    ++done;
    const auto s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print(stderr, "{}quantize: [{:>4}/{}] {:6.1f} s  {:<28} {:>5} -> {:<5}{}", tty ? "\r" : "", done, total, s, t.name,
               tlm::name(t.enc), tlm::name(to), tty ? "" : "\n");
  };
  // Written in llama.cpp's order, so the two files list the same tensors alike.
  for (const std::size_t k : tlm::llama_tensor_order(descs)) {
    const auto& t = in.tensors()[k];
    const tlm::encoding to = target[k];
    std::vector<std::uint64_t> dims(t.dims.begin(), t.dims.begin() + t.n_dims);
    const std::size_t cols = static_cast<std::size_t>(t.row_length());
    in_bytes += t.data.size();
    out_bytes += t.rows() * tlm::row_bytes(to, cols);
    if (to == t.enc) {
      // Copied unchanged (llama.cpp does the same: re-encoding to the same type would
      // only lose precision). The mapping outlives write().
      w.add_tensor_generated(t.name, dims, t.enc, [&t, &progress](std::span<std::byte> out) {
        std::memcpy(out.data(), t.data.data(), out.size());
        progress(t, t.enc);
      });
      continue;
    }
    ++converted;
    // Encoded while the file is written, tensor by tensor, rows in parallel: memory
    // holds one tensor's output, not the model's.
    w.add_tensor_generated(t.name, dims, to, [&t, to, cols, &pool, &progress](std::span<std::byte> out) {
      const std::size_t in_rb = tlm::row_bytes(t.enc, cols), out_rb = tlm::row_bytes(to, cols);
      const std::size_t grain = std::max<std::size_t>(1, 16384 / cols);
      pool.parallel_for(static_cast<std::size_t>(t.rows()), grain, [&](std::size_t r0, std::size_t r1) {
        std::vector<float> row(cols);
        for (std::size_t r = r0; r < r1; ++r) {
          tlm::dequantize_row(t.enc, t.data.data() + r * in_rb, row.data(), cols);
          try {
            tlm::quantize_row(to, row.data(), out.data() + r * out_rb, cols);
          } catch (const tlm::error& e) {
            throw tlm::error(fmt::format("tensor '{}' row {}: {}", t.name, r, e.what()));
          }
        }
      });
      progress(t, to);
    });
  }
  w.write(out_path);
  if (tty) fmt::print(stderr, "\n");
  const auto s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("wrote {} as {}: {} tensors, {} re-encoded, {} copied; {:.1f} MiB -> {:.1f} MiB in {:.1f} s ({} threads)\n",
             out_path.string(), type->name, total, converted, total - converted, static_cast<double>(in_bytes) / (1 << 20),
             static_cast<double>(out_bytes) / (1 << 20), s, pool.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tlm::error& e) {
    fmt::print(stderr, "quantize: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "quantize: unexpected error: {}\n", e.what());
    return 1;
  }
}
