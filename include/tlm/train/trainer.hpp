#pragma once
// The training loop as a library type: examples/train and the Python module are front
// ends over it (argument parsing, printing, signals), never a second copy of the loop.
//
// Example:
//   tlm::trainer<tlm::tiny_train> t({.steps = 100, .batch = 4, .seq = 64, .out = "run"},
//                                   tlm::data_source::from_text("notes.txt", tlm::byte_tokens, 64, 0.1));
//   while (!t.done()) t.step();   // one AdamW step each, checkpoints at the cadence
//   t.finish();                   // the last checkpoint and out/model.gguf
//
// What it owns: the output folder's policy (an earlier run is refused unless resumed or
// overwritten; what killed runs left is removed), the weights (from a source model, from
// the seed, or from the newest checkpoint, with every check of a resume), the data order,
// AdamW with warm-up and cosine decay, the held-out loss, checkpoints every `save_every`
// steps and the loss log beside them. A resume continues bit for bit at the same thread
// count and kernel level.
//
// What it leaves to the caller, through hooks: where warnings go (a CLI prints them, a
// notebook may collect them), each step's report (a live view), a stop flag read between
// steps (Ctrl-C), a flag that abandons a checkpoint being written (a second Ctrl-C), and
// the sums over the processes of a data-parallel run (MPI), so that the library does not
// depend on an MPI runtime.
//
// LoRA: trainer<C, lora<C, Rank, Targets>> trains a low-rank adapter over the source
// model, which stays mapped and read-only in its file's encodings; only the adapter
// has gradients and AdamW moments. Everything above holds as for full training; the
// checkpoints hold the adapter (llama.cpp's adapter format) and its optimizer state,
// a resume refuses another base file, rank, alpha or targets, and the export is
// out/adapter.gguf instead of out/model.gguf (and with `merge`, out/model.gguf too: the
// base with the adapter merged, in the base's encodings tensor by tensor, or all its
// matrices as out_type when that is set).
//
// Example, given extern const tlm::data_source& data:
//   const tlm::gguf::file base("SmolLM2-135M-Instruct.Q4_1.gguf");
//   tlm::trainer<tlm::smollm2_135m, tlm::lora<tlm::smollm2_135m, 16>> t({.steps = 100, .lora_alpha = 32}, data, &base);
//   t.run();   // out/adapter.gguf
#include <fmt/core.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <tlm/config.hpp>
#include <tlm/error.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/kernels.hpp>
#include <tlm/load.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/checkpoint.hpp>
#include <tlm/train/data.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/lora_file.hpp>
#include <tlm/train/loss_log.hpp>
#include <tlm/train/step.hpp>
#include <tlm/train/weights.hpp>

namespace tlm {

// The options of the loop. Messages name them as examples/train's flags.
struct trainer_options {
  std::size_t steps = 0;   // optimizer steps in total, counting a resumed run's; or:
  std::size_t epochs = 0;  // passes over the training windows (exactly one of the two)
  std::size_t batch = 4;   // windows per micro-batch, over all processes
  std::size_t accumulate = 1;  // micro-batches per step: a step's batch is accumulate * batch windows
  bool recompute = false;      // keep only each block's input in the forward (training_options::recompute)
  bool pack = false;           // chat examples packed several to a window (data_source::from_chat's pack)
  std::size_t seq = 128;   // tokens per window
  double lr = 3e-4;        // peak learning rate
  double min_lr = 0;       // learning rate at the end of the cosine decay
  std::size_t warmup = 0;  // steps of linear warm-up
  double clip = 1.0;       // global gradient-norm clip; 0 turns it off
  double weight_decay = 0.01;
  std::size_t eval_every = 10;  // held-out loss every N steps (0: only at the end)
  std::size_t save_every = 100; // checkpoint every N steps (0: only at the end)
  std::size_t keep_checkpoints = 2;
  std::filesystem::path out = "train-out";  // checkpoints, model.gguf, loss.csv, loss.svg
  // The encoding of the exported model.gguf's matrices (norms stay f32). Unset: f32 for a
  // full run; for a LoRA merge, each tensor in the encoding it has in the base file.
  std::optional<encoding> out_type = {};
  bool resume = false;     // continue from the newest checkpoint in `out`
  bool overwrite = false;  // start anew in an `out` that holds a run, deleting it
  std::size_t threads = 1; // a bit-exact resume needs the same count
  std::uint64_t seed = 1;  // weights (from scratch) and the data order
  std::size_t stop_after = 0;  // stop after this many steps of this run, as the stop flag would (0: never)
  std::string config = {};  // the config's name in checkpoints and messages (default: C's type name)
  double lora_alpha = 0;    // a LoRA run's alpha (scale alpha / rank); 0: the rank (scale 1)
  bool merge = false;       // a LoRA run's export also writes model.gguf: base + (alpha/r) B A (see out_type)
};

// The training data: how to load it (called once, after the output folder is ready, so
// a bad folder is reported before a long tokenization) and what a resume compares.
struct data_source {
  std::string name = {};  // the data file's absolute path: a resume on other data is refused
  bool chat = false;
  std::function<dataset()> load = {};
  bool pack = false;      // the windows pack several examples (window_set::starts)

  // Plain text cut into windows of `seq` (data.hpp's load_text).
  static data_source from_text(const std::string& file, tokenize_fn tokenize, std::size_t seq, double held_out) {
    return {std::filesystem::absolute(file).string(), false,
            [=] { return load_text(file, tokenize, seq, held_out); }};
  }
  // Chat JSONL rendered with `form` (the model's template, with the vocabulary's BOS/EOS
  // texts in `render`), loss on the assistant's tokens (load_chat). The form is copied:
  // the data is loaded later, when the caller's template text may be gone. With `pack`,
  // several conversations share a window (trainer_options::pack must say the same).
  static data_source from_chat(const std::string& file, tokenize_fn tokenize, const chat_template& form, std::int32_t pad,
                               std::size_t seq, double held_out, const chat_render_options& render = {}, bool pack = false) {
    return {std::filesystem::absolute(file).string(), true,
            [=] { return load_chat(file, tokenize, form, pad, seq, held_out, render, pack); }, pack};
  }
  // Windows already made (a notebook's, a test's), under a name of the caller's choice;
  // packed if they carry starts.
  static data_source from_windows(std::string name, dataset d) {
    const bool packed = d.train.packed();
    return {std::move(name), false, [d = std::move(d)] { return d; }, packed};
  }
};

// The sums over the processes of a data-parallel run (MPI_Allreduce and MPI_Barrier,
// say); left empty, the run is one process. Each process takes batch / ranks windows.
struct data_parallel {
  std::size_t rank = 0, ranks = 1;
  std::function<void(std::span<double>)> sum = {};       // in place, over the ranks
  std::function<void(std::span<float>)> sum_floats = {};  // in place, over the ranks
  std::function<void()> barrier = {};
  bool lead() const { return rank == 0; }
};

// What one step did.
struct step_report {
  std::size_t step = 0, total = 0;  // after this step, of the run's total
  double loss = 0;                  // mean over the global batch's counted targets (all its micro-batches')
  double held_out = NAN;            // measured at this step (the eval cadence), else NaN
  double last_held_out = NAN;       // the latest measured in this run
  double lr = 0, grad_norm = 0;     // grad_norm: before clipping
  double tokens_per_s = 0, eta_seconds = 0;
  bool stopping = false;            // the stop flag was seen: done() is now true
};

// Below this share of the adapter's change kept by a merge (finish_report::merge_kept),
// the trainer warns.
inline constexpr double merge_kept_warning = 0.8;

// What finish() did.
struct finish_report {
  bool saved = false;                // a checkpoint was written (no step ran: none)
  std::string checkpoint = {};       // its path
  double save_seconds = 0;
  bool exported = false;             // the run reached its total: model.gguf (LoRA: adapter.gguf) written
  std::filesystem::path model = {};
  std::filesystem::path merged = {};  // LoRA with trainer_options::merge: out/model.gguf
  // The share of the adapter's change to the weights that model.gguf keeps after its
  // rounding to its encodings (kept_change); NaN without a merge.
  double merge_kept = NAN;
};

// Where the trainer reports; every member may be left empty.
struct trainer_hooks {
  std::function<void(const std::string&)> warn = {};       // "warning: ...", "note: ...", what was removed
  std::function<void(const step_report&)> on_step = {};    // after each step, before its checkpoint
  const std::atomic<bool>* stop = nullptr;              // read between steps: stop after this one
  const std::atomic<bool>* abandon_save = nullptr;      // read during a checkpoint write: abandon it
  data_parallel group = {};
};

// A checkpoint write abandoned through trainer_hooks::abandon_save; the previous
// checkpoint stays the committed one.
struct save_abandoned : error {
  using error::error;
};

namespace detail {

// Makes `out` ready before anything slow happens: the folder exists and takes a file (an
// unwritable folder used to surface at the first checkpoint, a hundred steps in), an
// earlier run in it is neither resumed nor deleted by accident, and what killed runs
// left there (temporary files, uncommitted or half checkpoint pairs) is removed.
inline void prepare_out(const trainer_options& o, const std::function<void(const std::string&)>& warn) {
  namespace fs = std::filesystem;
  const fs::path& out = o.out;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    throw error(fmt::format("--out {}: cannot create the folder: {}; give a folder you can write to",
                            out.string(), ec ? ec.message() : std::string("a file of that name is in the way")));
  const fs::path probe = out / fmt::format(".write-probe.tmp-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, "x", 1) != 1) {
    const int err = errno;
    if (fd >= 0) ::close(fd), fs::remove(probe, ec);
    throw error(fmt::format("--out {}: cannot write a file in the folder: {}; give a folder you can write to", out.string(), std::strerror(err)));
  }
  ::close(fd);
  fs::remove(probe, ec);

  if (!o.resume) {
    std::vector<std::string> found;  // what a new run would destroy
    const std::string committed = latest_checkpoint(out);
    if (!committed.empty()) found.push_back(committed);
    for (const char* name : {"model.gguf", "adapter.gguf"})
      if (fs::exists(out / name)) found.push_back(name);
    if (!found.empty() && !o.overwrite) {
      std::string list;
      for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
      throw error(fmt::format("--out {} holds an earlier run ({}); continue it with --resume, replace it with --overwrite, "
                              "or give another --out", out.string(), list));
    }
    if (o.overwrite) {  // the pointer first: from then on nothing here is a committed checkpoint
      for (const char* name : {"checkpoint", "model.gguf", "adapter.gguf", "loss.csv", "loss.svg"}) fs::remove(out / name, ec);
    }
  }
  const std::vector<std::string> removed = prune_checkpoints(out, o.keep_checkpoints);
  if (!removed.empty() && warn) {
    std::string list;
    for (const auto& f : removed) list += (list.empty() ? "" : ", ") + f;
    warn(fmt::format("removed from {} what earlier runs left: {}", out.string(), list));
  }
}

}  // namespace detail

template <LlamaConfig C, class Adapter = void>
  requires(std::is_void_v<Adapter> || (adapter_of_config<Adapter, C> && lora_file_adapter<Adapter>))
class trainer {
 public:
  static constexpr bool is_lora = !std::is_void_v<Adapter>;
  // What trains: the model's weights, or the adapter.
  using weights = std::conditional_t<is_lora, Adapter, trainable<C, float>>;

  // Readies the output folder, loads the data, and takes the weights from the newest
  // checkpoint (o.resume), from `source` (fine-tuning; it must outlive the trainer, whose
  // checkpoints and export copy its metadata), or from o.seed.
  trainer(trainer_options o, const data_source& data, const gguf::file* source = nullptr, trainer_hooks hooks = {})
      : o_(std::move(o)), hooks_(std::move(hooks)), source_(source) {
    namespace fs = std::filesystem;
    if constexpr (!is_lora) {
      if (o_.merge) throw error("--merge merges a LoRA adapter into its base: it needs --lora");
    } else {
      if (source_ == nullptr) throw error("LoRA trains an adapter over a base model: give --model FILE.gguf, not --config alone");
      if (!(o_.lora_alpha >= 0) || !std::isfinite(o_.lora_alpha)) throw error(fmt::format("--lora-alpha {} is not a positive number", o_.lora_alpha));
      base_.emplace(bind<C>(*source_));  // a file of another shape is refused before the folder is touched
    }
    if (o_.config.empty()) o_.config = std::string(config_name<C>());
    if ((o_.steps == 0) == (o_.epochs == 0)) throw error("give exactly one of --steps N and --epochs E");
    if (o_.accumulate == 0) throw error("--accumulate 0: a step needs at least one micro-batch; give 1 or more");
    if (o_.pack && !data.chat && !data.pack) throw error("--pack packs chat examples several to a window: it needs --chat (chat JSONL data)");
    if (o_.pack != data.pack)
      throw error(fmt::format("trainer_options::pack is {}, but the data source's windows are {}; make the source with "
                              "data_source::from_chat(..., pack = {})", o_.pack ? "on" : "off", data.pack ? "packed" : "not packed", o_.pack));
    const data_parallel& grp = hooks_.group;
    if (grp.ranks == 0 || grp.rank >= grp.ranks || (grp.ranks > 1 && (!grp.sum || !grp.sum_floats)))
      throw error(fmt::format("data_parallel: rank {} of {} ranks; more than one rank needs `sum` and `sum_floats`", grp.rank, grp.ranks));
    if (grp.lead()) detail::prepare_out(o_, hooks_.warn);
    barrier();  // no rank reads the folder before it is tidied
    if (o_.batch % grp.ranks != 0)
      throw error(fmt::format("--batch {} is not a multiple of the {} MPI ranks; each rank takes an equal share of the global batch", o_.batch, grp.ranks));
    local_ = o_.batch / grp.ranks;
    if (o_.seq > C::context) throw error(fmt::format("--seq {} is more than the context of {} ({} positions)", o_.seq, o_.config, C::context));

    data_ = data.load();
    // A source made by hand may say one thing and load another.
    for (const window_set* ws : {&data_.train, &data_.held_out})
      if (ws->size() && ws->packed() != o_.pack)
        throw error(fmt::format("trainer_options::pack is {}, but the data source {} loaded windows {}; set data_source::pack to what "
                                "its load() gives", o_.pack ? "on" : "off", data.name, ws->packed() ? "with starts (packed)" : "without starts"));
    const std::size_t n_train = data_.train.size();
    const std::size_t per_step = o_.batch * o_.accumulate;  // windows one step consumes
    const std::size_t steps_per_epoch = (n_train + per_step - 1) / per_step;
    total_ = o_.steps ? o_.steps : o_.epochs * steps_per_epoch;

    const adamw_options ao{.lr = o_.lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = o_.weight_decay, .clip = o_.clip,
                           .warmup = o_.warmup, .total_steps = total_, .min_lr = o_.min_lr};
    p_ = std::make_unique<weights>();
    g_ = std::make_unique<weights>();
    opt_ = std::make_unique<adamw<weights>>(ao);
    st_ = {.step = 0, .seed = o_.seed, .data_position = 0, .rng_state = 0, .batch = o_.batch, .accumulate = o_.accumulate, .seq = o_.seq, .threads = o_.threads,
           .options = ao, .config = o_.config, .data = data.name, .chat = data.chat,
           .kernels = std::string(kernels::kernel_level_name()), .lora_base = {}, .lora_rank = 0, .lora_alpha = 0, .lora_targets = {},
           .pack = o_.pack};
    if constexpr (is_lora) {
      st_.lora_base = fs::absolute(source_->name()).string();
      st_.lora_rank = Adapter::rank;
      st_.lora_alpha = o_.lora_alpha > 0 ? o_.lora_alpha : static_cast<double>(Adapter::rank);
      st_.lora_targets = lora_targets_text(Adapter::targets);
    }
    if (o_.resume) {
      resume(data);
    } else if constexpr (is_lora) {
      init_lora(*p_, o_.seed);
    } else if (source_) {
      p_ = to_trainable<float>(bind<C>(*source_));
    } else {
      init_weights(*p_, o_.seed);
    }
    // A checkpoint at exactly `total` (a run killed between its last checkpoint and the
    // export) only needs the export; beyond it, the user asked for fewer steps than were run.
    if constexpr (is_lora) p_->alpha = g_->alpha = st_.lora_alpha;
    if (st_.step > total_)
      throw error(fmt::format("the checkpoint is at step {}, and --steps/--epochs ask for {} in total; ask for more steps", st_.step, total_));

    run_ = std::make_unique<training<C, float>>(training_options{.batch = local_, .seq = o_.seq, .threads = o_.threads, .recompute = o_.recompute});
    order_ = std::make_unique<window_order>(n_train, o_.seed);
    x_.resize(o_.accumulate * local_ * o_.seq);
    y_.resize(o_.accumulate * local_ * o_.seq);
    if (o_.pack) s_.resize(o_.accumulate * local_ * o_.seq);
  }

  // True once the run reached its total or the stop flag was seen.
  bool done() const { return st_.step >= total_ || stopping_; }

  // One optimizer step over the next batch, the held-out loss at its cadence, the report
  // to the hook, then a checkpoint at its cadence (none when stopping: finish() writes
  // it). A NaN or infinity in the loss or a gradient throws numeric_error before anything
  // changes; nothing on disk is touched, so the last checkpoint stays the run's.
  step_report step() {
    if (st_.step >= total_) throw error(fmt::format("the run is at its last step ({}); ask for more steps to continue it", total_));
    const auto t0 = std::chrono::steady_clock::now();
    if (this_run_ == 0) t_start_ = t0;
    const data_parallel& grp = hooks_.group;
    // Micro-batch k takes windows [k * batch, (k + 1) * batch) of the step's, and each
    // rank its share of those: the step sees the windows one batch of accumulate * batch
    // would, in the same order.
    fill(data_.train, [&](std::size_t k, std::size_t b) { return order_->at(st_.data_position + k * o_.batch + grp.rank * local_ + b); });
    zero(*g_, &run_->pool());
    double loss = forward_backward(true);
    if (grp.ranks > 1) {
      const double counted = static_cast<double>(std::count_if(y_.begin(), y_.end(), [](std::int32_t t) { return t != ignore_target; }));
      double totals[2] = {loss * counted, counted};  // summed loss and count over the ranks
      grp.sum(totals);
      loss = totals[0] / totals[1];
      all_reduce_gradients(counted / totals[1]);
    }
    const adamw_report rep = opt_->step(*p_, *g_);
    st_.step = opt_->steps();
    st_.data_position += o_.batch * o_.accumulate;
    ++this_run_;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss_log_row r{st_.step, loss, NAN, rep.lr, rep.grad_norm, static_cast<double>(o_.batch * o_.accumulate * o_.seq) / secs};
    if (grp.lead() && ((o_.eval_every && st_.step % o_.eval_every == 0) || st_.step == total_)) r.held_out = last_held_ = held_out_loss();
    rows_.push_back(r);
    const bool asked = (hooks_.stop && hooks_.stop->load()) || (o_.stop_after && this_run_ >= o_.stop_after);
    stopping_ = any(asked);  // every rank stops at the same step
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
    const step_report report{.step = st_.step, .total = total_, .loss = loss, .held_out = r.held_out, .last_held_out = last_held_,
                             .lr = rep.lr, .grad_norm = rep.grad_norm, .tokens_per_s = r.tokens_per_s,
                             .eta_seconds = elapsed / static_cast<double>(this_run_) * static_cast<double>(total_ - st_.step),
                             .stopping = stopping_};
    if (hooks_.on_step) hooks_.on_step(report);
    if (o_.save_every && st_.step % o_.save_every == 0 && st_.step < total_ && !stopping_) save();
    return report;
  }

  // Runs step() until done(), then finish().
  finish_report run() {
    while (!done()) step();
    return finish();
  }

  // Ends this run: a checkpoint of the last step (unless no step ran: a resume of a
  // finished run has its checkpoint already), and at the total, out/model.gguf.
  finish_report finish() {
    finish_report f;
    if (this_run_ > 0) {
      save();
      f.saved = true;
      f.checkpoint = (o_.out / latest_checkpoint(o_.out)).string();
      f.save_seconds = save_seconds_;
    }
    if (st_.step == total_ && hooks_.group.lead()) {
      if constexpr (is_lora) {
        f.model = o_.out / "adapter.gguf";
        write_lora(f.model, *p_);
        if (o_.merge) {
          const auto merged = to_trainable<float>(*base_);
          merge_lora(*merged, *p_);
          f.merged = o_.out / "model.gguf";
          if (o_.out_type) write_model<C>(f.merged, *merged, *o_.out_type, source_, st_.step);
          else write_model_like<C>(f.merged, *merged, *source_, st_.step);
          const std::vector<encoding> written = o_.out_type ? export_encodings(*merged, *o_.out_type) : source_encodings(*merged, *source_);
          f.merge_kept = kept_change<C>(*base_, *merged, written);
          // A change finer than the encoding's step is rounded away: the file then computes
          // nearly the base, which its user would not guess from a successful run.
          if (f.merge_kept < merge_kept_warning && hooks_.warn)
            hooks_.warn(fmt::format("{} keeps {:.0f}% of the adapter's change to the weights: the rest is finer than the step of {} "
                                    "and was rounded away, so the merged model computes nearly the base. adapter.gguf has the "
                                    "whole adapter; --out-type q8_0 or f16 keeps it in the merge",
                                    f.merged.string(), 100 * f.merge_kept,
                                    o_.out_type ? std::string(name(*o_.out_type)) : std::string("the base's encodings")));
        }
      } else {
        f.model = o_.out / "model.gguf";
        write_model<C>(f.model, *p_, o_.out_type.value_or(encoding::f32), source_, st_.step);
      }
      f.exported = true;
    }
    return f;
  }

  // The mean of batch losses over the held-out windows (cycled to fill the last batch);
  // NaN without held-out windows. A batch is a step's (accumulate micro-batches), so the
  // figure is the one a run with one batch of accumulate * batch windows reports.
  double held_out_loss() {
    const std::size_t n = data_.held_out.size();
    if (n == 0) return NAN;
    double sum = 0;
    std::size_t batches = 0;
    const std::size_t per_batch = local_ * o_.accumulate;
    for (std::size_t s = 0; s < n; s += per_batch, ++batches) {
      fill(data_.held_out, [&](std::size_t k, std::size_t b) { return (s + k * local_ + b) % n; });
      sum += forward_backward(false);
    }
    return sum / static_cast<double>(batches);
  }

  const trainer_options& options() const { return o_; }
  const dataset& data() const { return data_; }
  const train_state& state() const { return st_; }
  std::size_t steps() const { return st_.step; }
  std::size_t total_steps() const { return total_; }
  std::size_t steps_this_run() const { return this_run_; }
  const std::string& kernel_level() const { return st_.kernels; }
  double load_seconds() const { return load_seconds_; }  // of the checkpoint resumed from
  const std::vector<loss_log_row>& log() const { return rows_; }
  const weights& parameters() const { return *p_; }
  weights& parameters() { return *p_; }

 private:
  // Micro-batch k's forward: its windows are x_, y_'s k-th slice of local_ * seq tokens.
  double forward(std::size_t k) {
    const std::size_t len = local_ * o_.seq;
    const std::span<const std::int32_t> x(x_.data() + k * len, len), y(y_.data() + k * len, len);
    const std::span<const std::uint32_t> s = o_.pack ? std::span<const std::uint32_t>(s_.data() + k * len, len) : std::span<const std::uint32_t>();
    if constexpr (is_lora) return run_->forward(*base_, *p_, x, y, s);
    else return run_->forward(*p_, x, y, s);
  }

  // The mean loss over the counted targets of the filled micro-batches, and with
  // `backward` its gradient added into g_. Micro-batch k's mean loss and gradient are
  // weighed by its share of the counted targets, c_k / sum c, so the sums are the mean
  // over all of them, as one batch of all the windows computes it (up to rounding: the
  // gradient's sums run in another order). One micro-batch takes the plain path, so
  // --accumulate 1 computes exactly what the trainer computed before it existed.
  double forward_backward(bool backward) {
    const std::size_t n = o_.accumulate, len = local_ * o_.seq;
    if (n == 1) {
      const double loss = forward(0);
      if (backward) {
        if constexpr (is_lora) run_->backward(*base_, *p_, *g_);
        else run_->backward(*p_, *g_);
      }
      return loss;
    }
    std::vector<std::size_t>& counted = counted_;  // [accumulate] counted targets of each micro-batch
    counted.assign(n, 0);
    std::size_t total = 0;
    for (std::size_t k = 0; k < n; ++k) {
      counted[k] = static_cast<std::size_t>(std::count_if(y_.begin() + static_cast<std::ptrdiff_t>(k * len), y_.begin() + static_cast<std::ptrdiff_t>((k + 1) * len),
                                                          [](std::int32_t t) { return t != ignore_target; }));
      total += counted[k];
    }
    double loss = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const double share = total ? static_cast<double>(counted[k]) / static_cast<double>(total) : 0.0;
      loss += forward(k) * share;
      if (backward && counted[k]) {
        if constexpr (is_lora) run_->backward(*base_, *p_, *g_, static_cast<float>(share));
        else run_->backward(*p_, *g_, static_cast<float>(share));
      }
    }
    return loss;
  }

  void barrier() const {
    if (hooks_.group.barrier) hooks_.group.barrier();
  }
  bool any(bool b) const {
    if (!hooks_.group.sum) return b;
    double v = b ? 1 : 0;
    hooks_.group.sum(std::span(&v, 1));
    return v > 0;
  }

  // Loads the newest checkpoint of `out` and checks it against this run: what would make
  // the data order or the batches differ is refused; the optimizer's options may change
  // (extending --steps is the common case), with a warning, because the run then differs
  // from an uninterrupted one with either value.
  void resume(const data_source& data) {
    const auto t_load = std::chrono::steady_clock::now();
    const auto differs = [&](const char* what, const std::string& was, const std::string& now) {
      if (was != now)
        throw error(fmt::format("--resume: the checkpoint in {} was made with {} {}, this run has {}; use the same value to resume", o_.out.string(), what, was, now));
    };
    // What makes a checkpoint's parameters another kind than this run's, before they are read.
    const auto same_kind = [&](const train_state& saved) {
      const auto rank = [](std::uint64_t r) { return r == 0 ? std::string("off (full training)") : std::to_string(r); };
      differs("--lora", rank(saved.lora_rank), rank(st_.lora_rank));
      if (st_.lora_rank == 0) return;
      differs("--lora-targets", saved.lora_targets, st_.lora_targets);
      differs("--lora-alpha", fmt::format("{}", saved.lora_alpha), fmt::format("{}", st_.lora_alpha));
      differs("the base model (--model)", saved.lora_base, st_.lora_base);
    };
    train_state saved;
    if constexpr (is_lora) {
      saved = load_lora_checkpoint(o_.out, *p_, *opt_, same_kind);
    } else {
      saved = load_checkpoint<C>(o_.out, *p_, *opt_, same_kind);
    }
    load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    differs("config", saved.config, o_.config);
    differs("--batch", std::to_string(saved.batch), std::to_string(o_.batch));
    differs("--accumulate", std::to_string(saved.accumulate), std::to_string(o_.accumulate));
    differs("--seq", std::to_string(saved.seq), std::to_string(o_.seq));
    differs("--seed", std::to_string(saved.seed), std::to_string(o_.seed));
    differs("--data", saved.data, data.name);
    differs("--chat", saved.chat ? "on" : "off", data.chat ? "on" : "off");
    differs("--pack", saved.pack ? "on" : "off", o_.pack ? "on" : "off");
    const bool lead = hooks_.group.lead() && hooks_.warn;
    const adamw_options& ao = st_.options;
    const auto changed = [&](const char* what, double was, double now) {
      if (was != now && lead)
        hooks_.warn(fmt::format("warning: the checkpoint was made with {} {}, this run uses {}; continuing with {} from step {}", what, was, now, now, saved.step));
    };
    changed("--lr", saved.options.lr, ao.lr);
    changed("--min-lr", saved.options.min_lr, ao.min_lr);
    changed("--warmup", static_cast<double>(saved.options.warmup), static_cast<double>(ao.warmup));
    changed("--clip", saved.options.clip, ao.clip);
    changed("--weight-decay", saved.options.weight_decay, ao.weight_decay);
    changed("total steps (--steps/--epochs)", static_cast<double>(saved.options.total_steps), static_cast<double>(ao.total_steps));
    if (saved.threads != o_.threads && lead)
      hooks_.warn(fmt::format("note: the checkpoint was made with --threads {}, this run uses {}; losses will differ in the last bits", saved.threads, o_.threads));
    if (!saved.kernels.empty() && saved.kernels != st_.kernels && lead)
      hooks_.warn(fmt::format("note: the checkpoint was made with the {} kernels, this run uses {} (another CPU, or TLM_KERNELS); "
                              "losses will differ in the last bits",
                              saved.kernels, st_.kernels));
    st_.step = saved.step;
    st_.data_position = saved.data_position;
    rows_ = read_loss_log(o_.out / "loss.csv", st_.step);
  }

  // Copies the windows window_of(k, b), b < local, of `ws` into micro-batch k < accumulate.
  template <class F>
  void fill(const window_set& ws, F window_of) {
    const std::size_t T = o_.seq;
    for (std::size_t k = 0; k < o_.accumulate; ++k)
      for (std::size_t b = 0; b < local_; ++b) {
        const std::size_t w = window_of(k, b), at = (k * local_ + b) * T;
        std::copy_n(ws.inputs.begin() + static_cast<std::ptrdiff_t>(w * T), T, x_.begin() + static_cast<std::ptrdiff_t>(at));
        std::copy_n(ws.targets.begin() + static_cast<std::ptrdiff_t>(w * T), T, y_.begin() + static_cast<std::ptrdiff_t>(at));
        if (o_.pack) std::copy_n(ws.starts.begin() + static_cast<std::ptrdiff_t>(w * T), T, s_.begin() + static_cast<std::ptrdiff_t>(at));
      }
  }

  // Averages the ranks' gradients with one all-reduce per bucket of 4M floats (16 MB)
  // packed along the weight walk. Each rank's gradient is the mean over its own counted
  // targets, so it is weighted by counted / total_counted: the result is the gradient of
  // the global batch's mean loss, as one process computes it.
  void all_reduce_gradients(double weight) {
    constexpr std::size_t capacity = std::size_t{1} << 22;
    bucket_.resize(capacity);                             // [capacity]
    std::vector<std::pair<float*, std::size_t>> pending;  // where the bucket's pieces go back
    std::size_t used = 0;
    const auto flush = [&] {
      hooks_.group.sum_floats(std::span(bucket_.data(), used));
      std::size_t off = 0;
      for (const auto& [ptr, n] : pending) {
        std::copy_n(bucket_.begin() + static_cast<std::ptrdiff_t>(off), n, ptr);
        off += n;
      }
      pending.clear();
      used = 0;
    };
    for_each_tensor(
        [&](const tensor_name&, auto& t) {
          float* data = t.data();
          const std::size_t n = t.values().size();
          for (std::size_t done = 0; done < n;) {
            const std::size_t take = std::min(capacity - used, n - done);
            for (std::size_t i = 0; i < take; ++i) bucket_[used + i] = static_cast<float>(data[done + i] * weight);
            pending.emplace_back(data + done, take);
            used += take;
            done += take;
            if (used == capacity) flush();
          }
        },
        *g_);
    if (used) flush();
  }

  // A checkpoint of the current step, the loss log first: a kill between the two leaves a
  // log that runs ahead of the checkpoint, which a resume trims; the other order would
  // lose the rows. Only the lead process writes; the others wait for it.
  void save() {
    namespace fs = std::filesystem;
    st_.rng_state = order_->rng_state();
    if (hooks_.group.lead()) {
      const auto t_save = std::chrono::steady_clock::now();
      write_loss_log(o_.out, rows_);
      const std::string previous = latest_checkpoint(o_.out);
      const std::atomic<bool>* abandon = hooks_.abandon_save;
      const auto abandoned = [abandon] { return abandon && abandon->load(); };
      try {
        if constexpr (is_lora) save_lora_checkpoint(o_.out, *p_, *opt_, st_, o_.keep_checkpoints, abandoned);
        else save_checkpoint<C>(o_.out, *p_, *opt_, st_, source_, o_.keep_checkpoints, abandoned);
      } catch (const error&) {
        if (!abandoned()) throw;
        throw save_abandoned(fmt::format("a second Ctrl-C abandoned the checkpoint of step {}; {}", st_.step,
                                         previous.empty() ? "no checkpoint was written, so a new run starts from step 0"
                                                          : fmt::format("{} is intact: continue with --resume", (o_.out / previous).string())));
      }
      save_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_save).count();
    }
    barrier();  // no rank runs ahead of a checkpoint it might be asked to resume from
  }

  trainer_options o_;
  trainer_hooks hooks_;
  const gguf::file* source_;
  std::optional<model_weights<C, mapped>> base_;  // LoRA: the frozen base, views into *source_
  std::size_t local_ = 0;  // windows per step on this rank
  std::size_t total_ = 0;
  dataset data_;
  std::unique_ptr<weights> p_, g_;
  std::unique_ptr<adamw<weights>> opt_;
  train_state st_;
  std::unique_ptr<training<C, float>> run_;
  std::unique_ptr<window_order> order_;
  std::vector<std::int32_t> x_, y_;  // [accumulate, B / ranks, T] each
  std::vector<std::uint32_t> s_;     // [accumulate, B / ranks, T] packed: where each token's example starts
  std::vector<std::size_t> counted_;  // [accumulate] counted targets per micro-batch (sized once, reused)
  std::vector<float> bucket_;        // [4M] the all-reduce's, with more than one rank
  std::vector<loss_log_row> rows_;
  std::size_t this_run_ = 0;
  bool stopping_ = false;
  double last_held_ = NAN;
  double load_seconds_ = 0, save_seconds_ = 0;
  std::chrono::steady_clock::time_point t_start_;
};

}  // namespace tlm
