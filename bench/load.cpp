// load: time from opening a GGUF file to having its weights ready, and peak RSS.
//
//   load MODEL.gguf [--repeat N] [--json]
//
// Phases, each timed over N fresh opens (the page cache is warm after the first):
//   open     gguf::file: mmap, parse and validate the header, metadata and tensor infos
//   bind     open + bind<C>: every hyperparameter, tensor name, dims and encoding checked
//            against the config type, weights bound as views (C chosen from the file's
//            llama.embedding_length; skipped for other shapes)
//   touch    open + bind + reading one byte per 4 KiB page of every tensor, so that all
//            weight pages are resident: the cost a first forward pass would otherwise pay
// Peak RSS (getrusage) is reported after all phases: it includes the resident pages.
#include <tlm/config.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/load.hpp>
#include <tlm/weights.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <sys/resource.h>

namespace {

using clock_type = std::chrono::steady_clock;

struct timing {
  double min_ms = 0, median_ms = 0;
};

timing measure(int repeat, const std::function<void()>& fn) {
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = clock_type::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms.front(), ms[ms.size() / 2]};
}

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;  // KiB on Linux
}

volatile std::uint64_t sink = 0;

// Walks every tensor info the way a loader does: name lookup, dims, byte span.
void touch_infos(const tlm::gguf::file& f) {
  std::uint64_t s = 0;
  for (const auto& t : f.tensors()) {
    s += f.find_tensor(t.name)->data.size() + t.elements + static_cast<std::uint64_t>(t.enc);
  }
  sink = sink + s;
}

void touch_pages(const tlm::gguf::file& f) {
  std::uint64_t s = 0;
  for (const auto& t : f.tensors()) {
    for (std::size_t i = 0; i < t.data.size(); i += 4096) s += std::to_integer<std::uint8_t>(t.data[i]);
  }
  sink = sink + s;
}

template <tlm::LlamaConfig C>
void bind_once(const tlm::gguf::file& f) {
  const auto w = tlm::bind<C>(f);
  sink = sink + static_cast<std::uint64_t>(w.token_embd.bound());
}

std::function<void(const tlm::gguf::file&)> binder(const tlm::gguf::file& f, std::string& config) {
  const auto d = f.has("llama.embedding_length") ? f.get_uint("llama.embedding_length") : 0;
  if (d == tlm::dim<tlm::smollm2_135m>) { config = "smollm2_135m"; return bind_once<tlm::smollm2_135m>; }
  if (d == tlm::dim<tlm::smollm2_360m>) { config = "smollm2_360m"; return bind_once<tlm::smollm2_360m>; }
  if (d == tlm::dim<tlm::smollm2_1_7b>) { config = "smollm2_1_7b"; return bind_once<tlm::smollm2_1_7b>; }
  config = "none";
  return {};
}

int run(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: load MODEL.gguf [--repeat N] [--json]\n");
    return 2;
  }
  const std::string path = argv[1];
  int repeat = 20;
  bool json = false;
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--repeat" && i + 1 < argc) repeat = std::max(1, std::stoi(argv[++i]));
    else if (a == "--json") json = true;
    else throw tlm::error(fmt::format("unknown option '{}'", a));
  }
  const long rss_before = peak_rss_kib();

  // First open: cold or warm page cache, whatever the system has.
  const auto t0 = clock_type::now();
  tlm::gguf::file first(path);
  touch_infos(first);
  const double first_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  std::string config;
  const auto bind = binder(first, config);
  const std::size_t n_tensors = first.tensors().size();
  const std::size_t file_bytes = first.bytes().size();

  const timing open = measure(repeat, [&] {
    tlm::gguf::file f(path);
    touch_infos(f);
  });
  timing bound{}, touched{};
  if (bind) {
    bound = measure(repeat, [&] {
      tlm::gguf::file f(path);
      bind(f);
    });
  }
  touched = measure(repeat, [&] {
    tlm::gguf::file f(path);
    if (bind) bind(f);
    touch_pages(f);
  });
  const long rss_peak = peak_rss_kib();

  if (json) {
    fmt::print(
        "{{\"file\": \"{}\", \"bytes\": {}, \"tensors\": {}, \"config\": \"{}\", \"repeat\": {}, \"first_open_ms\": {:.3f}, "
        "\"open_min_ms\": {:.3f}, \"open_median_ms\": {:.3f}, \"bind_min_ms\": {:.3f}, \"bind_median_ms\": {:.3f}, "
        "\"touch_min_ms\": {:.3f}, \"touch_median_ms\": {:.3f}, \"rss_start_kib\": {}, \"rss_peak_kib\": {}}}\n",
        path, file_bytes, n_tensors, config, repeat, first_ms, open.min_ms, open.median_ms, bound.min_ms, bound.median_ms,
        touched.min_ms, touched.median_ms, rss_before, rss_peak);
  } else {
    fmt::print("file        {} ({} bytes, {} tensors, config {})\n", path, file_bytes, n_tensors, config);
    fmt::print("first open  {:.3f} ms\n", first_ms);
    fmt::print("open        min {:.3f} ms, median {:.3f} ms   (mmap + parse + validate + tensor infos, {} runs)\n", open.min_ms,
               open.median_ms, repeat);
    if (bind) fmt::print("open+bind   min {:.3f} ms, median {:.3f} ms\n", bound.min_ms, bound.median_ms);
    fmt::print("+ touch     min {:.3f} ms, median {:.3f} ms   (every weight page made resident)\n", touched.min_ms, touched.median_ms);
    fmt::print("peak RSS    {:.1f} MiB (at start {:.1f} MiB)\n", rss_peak / 1024.0, rss_before / 1024.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // tlm::error included: its message says what to do
    fmt::print(stderr, "load: {}\n", e.what());
    return 1;
  }
}
