// Trains or fine-tunes a model from the command line: plain text or chat JSONL, AdamW
// with warm-up and cosine decay, atomic checkpoints, exact resume, GGUF export.
// `train --help` lists every option.
#include <fmt/core.h>
#include <unistd.h>

#include <tlm/config_match.hpp>
#include <tlm/configs.hpp>
#include <tlm/load.hpp>
#include <tlm/tokenizer.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/progress.hpp>
#include <tlm/train/trainer.hpp>

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

// LoRA's rank and targets are compile-time (tlm::lora<C, Rank, Targets>): the command
// line picks one of these instantiations, and each is a trainer instantiation per
// config, the bulk of this program's compile time. smollm2_135m (the model of the tests
// and benchmarks) gets every rank of the build option TLM_TRAIN_LORA_RANKS (the
// sanitizer build compiles the two its tests use) with three target sets; every other
// config gets rank 16 on q, k, v, o, the usual choice: with it (and full training) the
// nine other configs take this file from 109 s to about 220 s of Release compile (measured
// once on a 2-vCPU Intel Xeon).
template <class C>
constexpr bool every_lora_choice = std::same_as<C, tlm::smollm2_135m>;
constexpr std::size_t usual_lora_rank = 16;
#ifndef TLM_TRAIN_LORA_RANKS
#define TLM_TRAIN_LORA_RANKS 4, 8, 16, 32, 64
#endif
using lora_rank_list = std::index_sequence<TLM_TRAIN_LORA_RANKS>;
constexpr std::size_t lora_ranks[] = {TLM_TRAIN_LORA_RANKS};

// "4, 8, 16, 32 and 64" (and_last) or "4, 8, 16, 32, 64".
std::string lora_ranks_text(bool and_last) {
  std::string text;
  for (std::size_t i = 0; i < std::size(lora_ranks); ++i) {
    if (i > 0) text += and_last && i + 1 == std::size(lora_ranks) ? " and " : ", ";
    text += std::to_string(lora_ranks[i]);
  }
  return text;
}
constexpr tlm::lora_target lora_qv = tlm::lora_target::q | tlm::lora_target::v;
constexpr tlm::lora_target lora_target_sets[] = {lora_qv, tlm::lora_default_targets, tlm::all_layer_matrices};

// "a, b, c, ..." broken into lines of the help's option column.
std::string indented_list(const std::string& items) {
  constexpr std::size_t indent = 23, width = 100;
  std::string out(indent, ' '), word;
  std::size_t line = indent;
  for (std::size_t i = 0; i <= items.size(); ++i) {
    if (i < items.size() && items[i] != ' ') {
      word += items[i];
      continue;
    }
    if (word.empty()) continue;
    if (line > indent && line + 1 + word.size() > width) {
      out += '\n' + std::string(indent, ' ');
      line = indent;
    } else if (line > indent) {
      out += ' ';
      ++line;
    }
    out += word;
    line += word.size();
    word.clear();
  }
  return out;
}

constexpr std::string_view usage = R"(train: train or fine-tune a Llama-architecture model

  train (--model FILE.gguf | --config NAME) --data FILE [--chat] (--steps N | --epochs E) [options]

  --model FILE.gguf    fine-tune this model; its tokenizer reads the data, and its hyperparameters
                       choose the config unless --config names one
  --config NAME        train from scratch with N(0, 0.02) weights and byte tokens (with --model:
                       the config to bind to), one of:
{configs}
  --data FILE          training data: UTF-8 text, or chat JSONL with --chat
  --chat               FILE is JSONL, one {"messages": [{"role", "content"}, ...]} per line,
                       rendered with the model's chat template; loss on assistant tokens only
  --steps N            optimizer steps to run in total (counting steps of a resumed run)
  --epochs E           passes over the training windows instead of --steps
  --batch B            windows per micro-batch (default 4)
  --accumulate N       micro-batches per optimizer step, 1 to 1024 (default 1): a step's loss and
                       gradient are the mean over N * B windows, as one batch of N * B would give,
                       in the memory of B windows
  --recompute          keep only each block's input in the forward and recompute the block's
                       activations in the backward: far less activation memory, about a third
                       more arithmetic, the same gradients bit for bit
  --pack               with --chat: pack several conversations into each window instead of one
                       window each (first fit in file order); each attends only to itself and
                       its positions start at 0, so fewer windows compute the same losses
  --seq T              tokens per window (default 128)
  --lr X               peak learning rate (default 3e-4)
  --min-lr X           learning rate at the end of the cosine decay (default 0)
  --warmup N           steps of linear warm-up (default 0)
  --clip X             clip the global gradient norm to X; 0 turns it off (default 1)
  --weight-decay X     decoupled weight decay on matrices (default 0.01)
  --held-out F         fraction of windows kept out of training for the held-out loss (default 0.1)
  --eval-every N       held-out loss every N steps (default 10; 0: only at the end)
  --save-every N       checkpoint every N steps (default 100; 0: only at the end)
  --out DIR            output folder: checkpoints, model.gguf (LoRA: adapter.gguf), loss.csv, loss.svg
                       (default train-out)
  --out-type TYPE      encoding of the exported model.gguf: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1,
                       q8_0, q4_k, q5_k, q6_k (default f32; norms stay f32; a K-quant puts each
                       matrix where llama.cpp's quantizer would: Q6_K output, Q5_0/Q5_1/Q8_0
                       for rows that are not a multiple of 256; examples/quantize writes the _M mixes),
                       or, with --merge, base (its default): each tensor in its encoding in --model
  --resume             continue from the newest checkpoint in --out
  --overwrite          start a new run in an --out that holds one, deleting its checkpoints,
                       model.gguf and loss log (without it such an --out is refused)
  --keep-checkpoints K keep the newest K checkpoints in --out (default 2)
  --threads T          worker threads (default 1); a bit-exact resume needs the same count
  --seed S             seed for weights (from scratch) and the data order (default 1)
  --stop-after N       stop after N steps of this run as Ctrl-C would (for tests)
  --lora RANK          train a LoRA adapter over --model instead of every weight: the base stays
                       mapped read-only; writes adapter.gguf (llama.cpp's adapter format) into --out.
                       RANK is one of {ranks} for smollm2_135m, 16 for the other configs
                       (the ranks this build is compiled for)
  --lora-alpha A       scale the adapter by A / RANK (default: A = RANK, scale 1, as llama.cpp's
                       finetune and tlm::lora; PEFT's default is a fixed lora_alpha = 8)
  --lora-targets LIST  matrices to adapt: q,v or q,k,v,o (default) or q,k,v,o,gate,up,down for
                       smollm2_135m; q,k,v,o for the other configs
  --merge              with --lora: also write model.gguf, the base with the adapter merged
                       (W + alpha/RANK B A), each tensor in the encoding it has in --model (a Q4_1
                       base with a Q6_K output stays so), or all matrices as --out-type TYPE
  --help               this text

Ctrl-C finishes the current step, writes a checkpoint and exits 0; a second Ctrl-C
abandons that write (the previous checkpoint stays intact) and exits 1.
)";

struct options {
  std::string model, config, data, out = "train-out";
  std::string out_type;  // empty: f32, or with --merge the base's encodings (as "base")
  bool chat = false, resume = false, overwrite = false, recompute = false, pack = false;
  std::size_t steps = 0, epochs = 0, batch = 4, accumulate = 1, seq = 128, warmup = 0, eval_every = 10, save_every = 100, threads = 1, stop_after = 0,
              keep_checkpoints = 2;
  std::uint64_t seed = 1;
  double lr = 3e-4, min_lr = 0, clip = 1.0, weight_decay = 0.01, held_out = 0.1;
  std::size_t lora = 0;  // the rank; 0: full training
  double lora_alpha = 0;  // 0: the rank
  tlm::lora_target lora_targets = tlm::lora_default_targets;
  bool lora_options_given = false, merge = false;
};

[[noreturn]] void fail(const std::string& msg) { throw tlm::error(msg); }

std::size_t whole(std::string_view flag, const std::string& v, std::size_t min, std::size_t max) {
  return static_cast<std::size_t>(cli::whole(flag, v, min, max));
}
using cli::real;

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::string text(usage);
      text.replace(text.find("{ranks}"), 7, lora_ranks_text(false));
      text.replace(text.find("{configs}"), 9, indented_list(tlm::config_names_text<trainable_configs>()));
      fmt::print("{}", text);
      std::exit(0);
    }
    if (a == "--chat") { o.chat = true; continue; }
    if (a == "--resume") { o.resume = true; continue; }
    if (a == "--overwrite") { o.overwrite = true; continue; }
    if (a == "--merge") { o.merge = true; continue; }
    if (a == "--recompute") { o.recompute = true; continue; }
    if (a == "--pack") { o.pack = true; continue; }
    if (!a.starts_with("--")) fail(fmt::format("unexpected argument '{}'; options start with -- (see --help)", a));
    static const std::vector<std::string> valued = {"--model", "--config", "--data", "--steps", "--epochs", "--batch", "--accumulate", "--seq", "--lr",
                                                    "--min-lr", "--warmup", "--clip", "--weight-decay", "--held-out", "--eval-every",
                                                    "--save-every", "--out", "--out-type", "--threads", "--seed", "--stop-after",
                                                    "--keep-checkpoints", "--lora", "--lora-alpha", "--lora-targets"};
    if (std::find(valued.begin(), valued.end(), a) == valued.end()) fail(fmt::format("unknown option '{}' (see --help)", a));
    if (i + 1 >= argc) fail(fmt::format("{} needs a value", a));
    const std::string v = argv[++i];
    if (a == "--model") o.model = v;
    else if (a == "--config") o.config = v;
    else if (a == "--data") o.data = v;
    else if (a == "--steps") o.steps = whole(a, v, 1, 1'000'000'000);
    else if (a == "--epochs") o.epochs = whole(a, v, 1, 1'000'000);
    else if (a == "--batch") o.batch = whole(a, v, 1, 4096);
    else if (a == "--accumulate") o.accumulate = whole(a, v, 1, 1024);
    else if (a == "--seq") o.seq = whole(a, v, 1, 1'000'000);
    else if (a == "--lr") o.lr = real(a, v, 0, 1, true);
    else if (a == "--min-lr") o.min_lr = real(a, v, 0, 1);
    else if (a == "--warmup") o.warmup = whole(a, v, 0, 1'000'000'000);
    else if (a == "--clip") o.clip = real(a, v, 0, 1e9);
    else if (a == "--weight-decay") o.weight_decay = real(a, v, 0, 1);
    else if (a == "--held-out") o.held_out = real(a, v, 0, 0.9);
    else if (a == "--eval-every") o.eval_every = whole(a, v, 0, 1'000'000'000);
    else if (a == "--save-every") o.save_every = whole(a, v, 0, 1'000'000'000);
    else if (a == "--out") o.out = v;
    else if (a == "--out-type") o.out_type = v;
    else if (a == "--threads") o.threads = whole(a, v, 1, 1024);
    else if (a == "--seed") o.seed = whole(a, v, 0, ~std::size_t{0} >> 1);
    else if (a == "--stop-after") o.stop_after = whole(a, v, 1, 1'000'000'000);
    else if (a == "--keep-checkpoints") o.keep_checkpoints = whole(a, v, 1, 1'000'000);
    else if (a == "--lora") {
      o.lora = whole(a, v, 1, 1'000'000);
      if (o.lora != usual_lora_rank && std::find(std::begin(lora_ranks), std::end(lora_ranks), o.lora) == std::end(lora_ranks))
        fail(fmt::format("--lora {}: this build trains LoRA ranks {}; give one of them", v, lora_ranks_text(true)));
    } else if (a == "--lora-alpha") {
      o.lora_alpha = real(a, v, 0, 1e6, true);
      o.lora_options_given = true;
    } else if (a == "--lora-targets") {
      o.lora_targets = tlm::parse_lora_targets(v);
      if (std::find(std::begin(lora_target_sets), std::end(lora_target_sets), o.lora_targets) == std::end(lora_target_sets))
        fail(fmt::format("--lora-targets {}: this build trains the target sets q,v; q,k,v,o; q,k,v,o,gate,up,down; give one of them", v));
      o.lora_options_given = true;
    }
  }
  if (o.resume && o.overwrite) fail("--resume continues the run in --out and --overwrite deletes it; give one of them");
  if (o.model.empty() && o.config.empty()) fail("give --model FILE.gguf to fine-tune or --config NAME to train from scratch (see --help)");
  if (o.data.empty()) fail("--data FILE is required: the text or chat JSONL to train on");
  if (o.min_lr > o.lr) fail(fmt::format("--min-lr {} is above --lr {}; the decay ends below the peak", o.min_lr, o.lr));
  if (!o.out_type.empty() && o.out_type != "base" && tlm::parse_writable_encoding(o.out_type) == nullptr)
    fail(fmt::format("--out-type is one of {}, or base with --merge, not '{}'", tlm::writable_encodings_list(), o.out_type));
  if (!o.config.empty() && !trainable_configs::contains(o.config))
    fail(fmt::format("unknown --config '{}'; known: {}", o.config, tlm::config_names_text<trainable_configs>()));
  if (o.merge && o.lora == 0) fail("--merge merges a LoRA adapter into its base: it needs --lora RANK");
  if (o.out_type == "base" && !o.merge)
    fail("--out-type base writes each tensor of a LoRA merge in its base's encoding: it needs --lora RANK --merge");
  if (o.lora_options_given && o.lora == 0) fail("--lora-alpha and --lora-targets need --lora RANK");
  if (o.lora && o.model.empty())
    fail("--lora trains an adapter over a base model: give --model FILE.gguf (--config alone trains from scratch)");
  if (o.pack && !o.chat)
    fail("--pack packs chat conversations several to a window: it needs --chat (chat JSONL data); plain text has no conversations to pack");
  if (o.chat && o.model.empty()) fail("--chat needs --model: chat data is rendered with the model's tokenizer and chat template");
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

// --out-type as the trainer takes it: unset for f32's default or the base's encodings,
// which the trainer chooses by itself (a full run: f32; a merge: the base's).
std::optional<tlm::encoding> out_type(const options& o) {
  if (o.out_type.empty() || o.out_type == "base") return std::nullopt;
  return tlm::parse_writable_encoding(o.out_type)->enc;  // checked when the options were read
}

template <tlm::LlamaConfig C, class Adapter = void>
int run(const options& o, const std::string& config_name, group& grp) {
  std::unique_ptr<tlm::gguf::file> source;
  std::optional<tlm::tokenizer> tok;
  tlm::tokenize_fn tokenize = tlm::byte_tokens;
  if (!o.model.empty()) {
    source = std::make_unique<tlm::gguf::file>(o.model);
    (void)tlm::bind<C>(*source);  // a file of another shape is refused before anything else is read
    tok.emplace(tlm::tokenizer::from_gguf(*source));
    tokenize = [&tok](std::string_view text, bool special) { return tok->encode(text, {.add_bos = false, .parse_special = special}); };
  } else if (C::vocab < 256) {
    fail(fmt::format("--config {} has a vocabulary of {}, too small for byte tokens (256)", config_name, C::vocab));
  }
  tlm::data_source data = tlm::data_source::from_text(o.data, tokenize, o.seq, o.held_out);
  if (o.chat) {
    const std::string_view tmpl = source->has("tokenizer.chat_template") ? source->get_string("tokenizer.chat_template") : "";
    const std::int32_t pad = tok->eos() >= 0 ? tok->eos() : 0;
    // The template's BOS/EOS texts are the vocabulary's, as in chat_session.
    tlm::chat_render_options render;
    if (tok->bos() >= 0) render.bos_token = tok->decode(std::vector<std::int32_t>{tok->bos()});
    if (tok->eos() >= 0) render.eos_token = tok->decode(std::vector<std::int32_t>{tok->eos()});
    data = tlm::data_source::from_chat(o.data, tokenize, tlm::chat_template::of(tmpl), pad, o.seq, o.held_out, render, o.pack);
  }
  const tlm::trainer_options to{.steps = o.steps, .epochs = o.epochs, .batch = o.batch, .accumulate = o.accumulate,
                                .recompute = o.recompute, .pack = o.pack, .seq = o.seq, .lr = o.lr, .min_lr = o.min_lr,
                                .warmup = o.warmup, .clip = o.clip, .weight_decay = o.weight_decay, .eval_every = o.eval_every,
                                .save_every = o.save_every, .keep_checkpoints = o.keep_checkpoints, .out = o.out,
                                .out_type = out_type(o),
                                .resume = o.resume, .overwrite = o.overwrite, .threads = o.threads, .seed = o.seed,
                                .stop_after = o.stop_after, .config = config_name, .lora_alpha = o.lora_alpha,
                                .merge = o.merge};
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
               out_type(o) ? o.out_type : "the base's encodings", 100 * f.merge_kept);
  if (!f.exported) fmt::print("stopped at step {} of {}; continue with --resume\n", tr.steps(), tr.total_steps());
  return 0;
}

// Full fine-tuning holds f32 weights, their gradients and AdamW's two moments: 16 bytes a
// parameter before any activation. A config that needs more than the machine's memory is
// refused here, with the way out, rather than failing at allocation or in swap.
template <tlm::LlamaConfig C>
void refuse_beyond_memory(const std::string& config_name) {
  const double need = 16.0 * static_cast<double>(tlm::parameter_count_v<C>);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double have = static_cast<double>(pages) * static_cast<double>(page);
  if (need > have) {
    fail(fmt::format("full fine-tuning of {} needs {:.1f} GiB for its f32 weights, gradients and AdamW moments, more "
                     "than this machine's {:.1f} GiB of memory; train a LoRA adapter instead (--lora 16)",
                     config_name, need / (1u << 30), have / (1u << 30)));
  }
}

// A LoRA run: the instantiation of the rank and targets asked for (checked when the
// options were read, and for configs other than smollm2_135m in run_any).
template <tlm::LlamaConfig C, std::size_t Rank>
int run_lora_rank(const options& o, const std::string& config_name, group& grp) {
  using tlm::lora;
  if (o.lora_targets == lora_qv) return run<C, lora<C, Rank, lora_qv>>(o, config_name, grp);
  if (o.lora_targets == tlm::all_layer_matrices) return run<C, lora<C, Rank, tlm::all_layer_matrices>>(o, config_name, grp);
  return run<C, lora<C, Rank>>(o, config_name, grp);
}

template <tlm::LlamaConfig C>
int run_any(const options& o, const std::string& config_name, group& grp) {
  if (o.lora == 0) {
    refuse_beyond_memory<C>(config_name);
    return run<C>(o, config_name, grp);
  }
  if constexpr (every_lora_choice<C>) {
    if (std::find(std::begin(lora_ranks), std::end(lora_ranks), o.lora) == std::end(lora_ranks))
      fail(fmt::format("--lora {}: this build trains {} at LoRA ranks {}; give one of them", o.lora, config_name, lora_ranks_text(true)));
    return [&]<std::size_t... Ranks>(std::index_sequence<Ranks...>) {
      int status = 1;
      ((o.lora == Ranks && (status = run_lora_rank<C, Ranks>(o, config_name, grp), true)) || ...);
      return status;
    }(lora_rank_list{});
  } else {
    if (o.lora != usual_lora_rank || o.lora_targets != tlm::lora_default_targets)
      fail(fmt::format("--lora {} --lora-targets {}: this build trains {} at LoRA rank {} on q,k,v,o only (smollm2_135m "
                       "at every rank and target set); use those, or add the config in examples/train.cpp's every_lora_choice",
                       o.lora, tlm::lora_targets_text(o.lora_targets), config_name, usual_lora_rank));
    return run<C, tlm::lora<C, usual_lora_rank>>(o, config_name, grp);
  }
}

}  // namespace

int main(int argc, char** argv) {
  group grp;
  try {
    const options o = parse(argc, argv);
    // Without --config, the file's hyperparameters name the config (the run's first line
    // names it, so no note of its own).
    const std::string config = tlm::choose_config<trainable_configs>(o.config, o.model);
    return tlm::with_config<trainable_configs>(config, [&](auto c) { return run_any<typename decltype(c)::type>(o, config, grp); });
  } catch (const std::exception& e) {
    fmt::print(stderr, "train: {}{}\n", grp.size() > 1 ? fmt::format("rank {}: ", grp.rank()) : "", e.what());
    grp.abort();
    return 1;
  }
}
