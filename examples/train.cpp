// Trains or fine-tunes a model from the command line: plain text or chat JSONL, AdamW
// with warm-up and cosine decay, atomic checkpoints, exact resume, GGUF export.
// `train --help` lists every option.
#include <fmt/core.h>
#include <unistd.h>

#include <tlm/config_match.hpp>
#include <tlm/configs.hpp>
#include <tlm/load.hpp>
#include <tlm/text/tokenizer.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/progress.hpp>
#include <tlm/train/trainer.hpp>
#include <tlm/train/training_options.hpp>

#include "cli.hpp"

#ifdef TLM_HAVE_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// The configs train takes are the programs' (tlm::program_configs, as generate and serve:
// every shipped config unless the build names fewer); with --model and no --config the
// file's hyperparameters choose one.
using trainable_configs = tlm::program_configs;

constexpr std::string_view usage_head = R"(train: train or fine-tune a Llama-architecture model

  train (--model FILE.gguf | --config NAME) --data FILE [--chat] (--steps N | --epochs E) [options]

)";
constexpr std::string_view usage_tail = R"(  --help               this text

Ctrl-C finishes the current step, writes a checkpoint and exits 0; a second Ctrl-C
abandons that write (the previous checkpoint stays intact) and exits 1.
)";

// The usage text: a line per row of tlm::training_options, "--flag VALUE" in a column of
// 23 and its help beside it, wrapped at 100 columns (and at a '\n' in the help).
std::string usage_text() {
  constexpr std::size_t indent = 23, width = 100;
  std::string text(usage_head);
  for (const auto& o : tlm::training_options) {
    std::string head = "  " + o.flag_name();
    if (!o.value_name.empty()) head += " " + std::string(o.value_name);
    text += head;
    std::size_t line = head.size();
    if (line >= indent) {
      text += '\n';
      line = 0;
    }
    text += std::string(indent - line, ' ');
    line = indent;
    const std::string help = o.help_text();
    std::size_t words = 0;
    for (std::size_t i = 0; i < help.size();) {
      const std::size_t end = std::min(help.find_first_of(" \n", i), help.size());
      const std::string_view word(help.data() + i, end - i);
      if (words > 0 && line + 1 + word.size() > width) {
        text += '\n' + std::string(indent, ' ');
        line = indent;
      } else if (words > 0) {
        text += ' ';
        ++line;
      }
      text += word;
      line += word.size();
      ++words;
      if (end < help.size() && help[end] == '\n') {  // a line break the help asks for
        text += '\n' + std::string(indent, ' ');
        line = indent;
        words = 0;
      }
      i = end + 1;
    }
    text += '\n';
  }
  return text + std::string(usage_tail);
}

using options = tlm::training_request;

[[noreturn]] void fail(const std::string& msg) { throw tlm::error(msg); }

// Every flag is a row of tlm::training_options: its name, kind and range are the ones
// tlm.Trainer's keywords have.
options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      fmt::print("{}", usage_text());
      std::exit(0);
    }
    if (!a.starts_with("--")) fail(fmt::format("unexpected argument '{}'; options start with -- (see --help)", a));
    std::string name = a.substr(2);
    std::replace(name.begin(), name.end(), '-', '_');
    const tlm::training_option* opt = a.find('_') == std::string::npos ? tlm::find_training_option(name) : nullptr;  // flags spell '-'
    if (opt == nullptr) fail(fmt::format("unknown option '{}' (see --help)", a));
    if (opt->kind == tlm::training_option_kind::flag) {
      o.*(opt->flag) = true;
      continue;
    }
    if (i + 1 >= argc) fail(fmt::format("{} needs a value", a));
    const std::string v = argv[++i];
    switch (opt->kind) {
      case tlm::training_option_kind::whole:
        o.*(opt->whole) = cli::whole(a, v, static_cast<std::uint64_t>(opt->lo), static_cast<std::uint64_t>(opt->hi));
        break;
      case tlm::training_option_kind::real: o.*(opt->real) = cli::real(a, v, opt->lo, opt->hi, opt->lo_open); break;
      case tlm::training_option_kind::text: o.*(opt->text) = v; break;
      case tlm::training_option_kind::flag: break;
    }
  }
  tlm::check_request(o);
  if (!o.config.empty() && !trainable_configs::contains(o.config))
    fail(tlm::unknown_config<trainable_configs>(o.config, "--config"));
  return o;
}

// The data-parallel group: the ranks of mpirun, or this process alone (built without MPI,
// or started without mpirun: MPI is initialised only when a launcher set its variables,
// so a plain run never depends on an MPI runtime).
class group {
 public:
  group() {
#ifdef TLM_HAVE_MPI
    if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) {
      MPI_Init(nullptr, nullptr);
      mpi_ = true;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &size_);
    }
#endif
  }
  ~group() {
#ifdef TLM_HAVE_MPI
    if (mpi_) MPI_Finalize();
#endif
  }
  group(const group&) = delete;
  group& operator=(const group&) = delete;
  std::size_t rank() const { return static_cast<std::size_t>(rank_); }
  std::size_t size() const { return static_cast<std::size_t>(size_); }
  bool lead() const { return rank_ == 0; }
  // The trainer's view of the group: in-place sums and a barrier over the ranks; none
  // alone, so a run without mpirun calls no MPI function.
  tlm::data_parallel hooks() {
    tlm::data_parallel d{.rank = rank(), .ranks = size()};
#ifdef TLM_HAVE_MPI
    if (mpi_) {
      d.sum = [](std::span<double> v) { MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); };
      d.sum_floats = [](std::span<float> v) { MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
      d.barrier = [] { MPI_Barrier(MPI_COMM_WORLD); };
    }
#endif
    return d;
  }
  // After an error on one rank the others would wait forever in a collective.
  void abort() {
#ifdef TLM_HAVE_MPI
    if (mpi_ && size_ > 1) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
  }

 private:
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
};

// Ctrl-C presses: the first stops the run after its current step (which then saves); a
// second abandons a save in progress (or about to start), since waiting for the disk is
// what it is pressed against. Both are lock-free atomics, so the handler may set them.
std::atomic<bool> stop_requested{false}, abandon_save{false};
extern "C" void on_sigint(int) {
  if (stop_requested.exchange(true)) abandon_save.store(true);
}

std::string duration(double seconds) {
  const auto s = static_cast<long long>(seconds);
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

// ---- the run: the options handed to tlm::trainer, its reports printed

template <tlm::LlamaConfig C, class Adapter = void>
int run(const options& o, const std::string& config_name, group& grp) {
  std::unique_ptr<tlm::gguf::file> source;
  if (!o.model.empty()) {
    source = std::make_unique<tlm::gguf::file>(o.model);
    (void)tlm::bind<C>(*source);  // a file of another shape is refused before anything else is read
  }
  const tlm::data_source data = tlm::training_data<C>(o, config_name, source.get());
  const tlm::trainer_options to = tlm::to_trainer_options(o, config_name);
  const bool tty = ::isatty(1) && grp.lead();
  std::vector<double> losses;  // this run's, for the live line's sparkline
  tlm::trainer_hooks hooks{.warn = [](const std::string& m) { fmt::print(stderr, "train: {}\n", m); },
                           .on_step = {}, .stop = &stop_requested, .abandon_save = &abandon_save, .group = grp.hooks()};
  hooks.on_step = [&](const tlm::step_report& r) {
    const std::string held = std::isnan(r.last_held_out) ? "-" : fmt::format("{:.4f}", r.last_held_out);
    if (tty) {
      losses.push_back(r.loss);
      const tlm::live_line_parts parts{.fields = {fmt::format("step {}/{}", r.step, r.total), fmt::format("loss {:.4f}", r.loss),
                                                  fmt::format("ETA {}", duration(r.eta_seconds)), fmt::format("held-out {}", held),
                                                  fmt::format("lr {:.2e}", r.lr), fmt::format("{:.0f} tok/s", r.tokens_per_s)},
                                       .losses = losses};
      fmt::print("\r\033[2K{}", tlm::live_line(parts, tlm::terminal_width(1)));  // read each time: the window may be resized
    } else if (grp.lead()) {
      fmt::print("step {} loss {:.6f} held_out {} lr {:.3e} grad_norm {:.4f} tokens_per_s {:.0f} eta {}\n", r.step, r.loss, held, r.lr,
                 r.grad_norm, r.tokens_per_s, duration(r.eta_seconds));
    }
    std::fflush(stdout);
  };
  tlm::trainer<C, Adapter> tr(to, data, source.get(), std::move(hooks));
  std::signal(SIGINT, on_sigint);  // from here a Ctrl-C stops at a step; before, it ends the process
  if (grp.lead())
    if constexpr (!std::is_void_v<Adapter>)
      fmt::print("train: LoRA rank {}, alpha {}, targets {}: {} trainable values over the frozen base\n", Adapter::rank,
                 tr.parameters().alpha, tlm::lora_targets_text(Adapter::targets), tlm::parameter_count(tr.parameters()));
  if (grp.lead())
    fmt::print("train: {} {}, {} training windows{} and {} held-out of {} tokens ({} tokens read), {} steps from step {}, batch {}{}{}, {} threads{}, kernels {}\n",
               config_name, o.model.empty() ? "from scratch" : o.model, tr.data().train.size(), o.pack ? " (conversations packed)" : "",
               tr.data().held_out.size(), o.seq,
               tr.data().tokens, tr.total_steps(), tr.steps(), o.batch,
               o.accumulate > 1 ? fmt::format(" x {} micro-batches ({} windows a step)", o.accumulate, o.accumulate * o.batch) : "",
               o.recompute ? ", activations recomputed" : "", o.threads,
               grp.size() > 1 ? fmt::format(" on each of {} MPI ranks", grp.size()) : "", tr.kernel_level());
  if (o.resume && grp.lead())
    fmt::print("resumed from {} at step {} (checkpoint loaded in {:.2f} s)\n", tlm::latest_checkpoint(o.out), tr.steps(), tr.load_seconds());
  if (!o.resume && grp.lead()) {
    const double h0 = tr.held_out_loss();
    if (!std::isnan(h0)) fmt::print("held-out loss before training {:.4f}\n", h0);
  }
  std::fflush(stdout);
  while (!tr.done()) tr.step();
  if (tty) fmt::print("\n");
  const tlm::finish_report f = tr.finish();
  if (!grp.lead()) return 0;
  if (f.saved) fmt::print("checkpoint {} written (step {}, {:.2f} s)\n", f.checkpoint, tr.steps(), f.save_seconds);
  if (f.exported)
    fmt::print("exported {} ({})\n", f.model.string(), std::is_void_v<Adapter> ? (o.out_type.empty() ? "f32" : o.out_type) : "LoRA adapter, f32");
  if (!f.merged.empty())
    fmt::print("merged the adapter into {} ({}; {:.1f}% of the adapter's change to the weights kept)\n", f.merged.string(),
               tlm::requested_out_type(o) ? o.out_type : "the base's encodings", 100 * f.merge_kept);
  if (!f.exported) fmt::print("stopped at step {} of {}; continue with --resume\n", tr.steps(), tr.total_steps());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  group grp;
  try {
    const options o = parse(argc, argv);
    // Without --config, the file's hyperparameters name the config (the run's first line
    // names it, so no note of its own).
    const std::string config = tlm::choose_config<trainable_configs>(o.config, o.model);
    return tlm::with_training_types<trainable_configs>(o, config, [&]<class C, class Adapter>() {
      if constexpr (std::is_void_v<Adapter>) tlm::refuse_beyond_memory<C>(config);
      return run<C, Adapter>(o, config, grp);
    });
  } catch (const std::exception& e) {
    fmt::print(stderr, "train: {}{}\n", grp.size() > 1 ? fmt::format("rank {}: ", grp.rank()) : "", e.what());
    grp.abort();
    return 1;
  }
}
