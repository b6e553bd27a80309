// Trains or fine-tunes a model from the command line: plain text or chat JSONL, AdamW
// with warm-up and cosine decay, atomic checkpoints, exact resume, GGUF export.
// `train --help` lists every option.
#include <fmt/core.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <tlm/configs.hpp>
#include <tlm/load.hpp>
#include <tlm/tokenizer.hpp>
#include <tlm/train/adamw.hpp>
#include <tlm/train/checkpoint.hpp>
#include <tlm/train/data.hpp>
#include <tlm/train/progress.hpp>
#include <tlm/train/step.hpp>
#include <tlm/train/weights.hpp>

#ifdef TLM_HAVE_MPI
#include <mpi.h>
#endif

#include <fcntl.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The configs train takes: the tiny one it trains from scratch in the tests and
// benchmarks, and the one whose published file it fine-tunes.
using trainable_configs = tlm::config_list<tlm::tiny_train, tlm::smollm2_135m>;

constexpr std::string_view usage = R"(train: train or fine-tune a Llama-architecture model

  train (--model FILE.gguf | --config NAME) --data FILE [--chat] (--steps N | --epochs E) [options]

  --model FILE.gguf    fine-tune this model (SmolLM2-135M); its tokenizer reads the data
  --config NAME        train from scratch with N(0, 0.02) weights and byte tokens:
                       tiny_train or smollm2_135m (with --model: the config to bind to)
  --data FILE          training data: UTF-8 text, or chat JSONL with --chat
  --chat               FILE is JSONL, one {"messages": [{"role", "content"}, ...]} per line,
                       rendered with the model's ChatML template; loss on assistant tokens only
  --steps N            optimizer steps to run in total (counting steps of a resumed run)
  --epochs E           passes over the training windows instead of --steps
  --batch B            windows per step (default 4)
  --seq T              tokens per window (default 128)
  --lr X               peak learning rate (default 3e-4)
  --min-lr X           learning rate at the end of the cosine decay (default 0)
  --warmup N           steps of linear warm-up (default 0)
  --clip X             clip the global gradient norm to X; 0 turns it off (default 1)
  --weight-decay X     decoupled weight decay on matrices (default 0.01)
  --held-out F         fraction of windows kept out of training for the held-out loss (default 0.1)
  --eval-every N       held-out loss every N steps (default 10; 0: only at the end)
  --save-every N       checkpoint every N steps (default 100; 0: only at the end)
  --out DIR            output folder: checkpoints, model.gguf, loss.csv, loss.svg (default train-out)
  --out-type TYPE      encoding of the exported model.gguf: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1,
                       q8_0, q4_k, q5_k, q6_k (default f32; norms stay f32; a K-quant puts each
                       matrix where llama.cpp's quantizer would: Q6_K output, Q5_0/Q5_1/Q8_0
                       for rows that are not a multiple of 256; examples/quantize writes the _M mixes)
  --resume             continue from the newest checkpoint in --out
  --overwrite          start a new run in an --out that holds one, deleting its checkpoints,
                       model.gguf and loss log (without it such an --out is refused)
  --keep-checkpoints K keep the newest K checkpoints in --out (default 2)
  --threads T          worker threads (default 1); a bit-exact resume needs the same count
  --seed S             seed for weights (from scratch) and the data order (default 1)
  --stop-after N       stop after N steps of this run as Ctrl-C would (for tests)
  --help               this text

Ctrl-C finishes the current step, writes a checkpoint and exits 0; a second Ctrl-C
abandons that write (the previous checkpoint stays intact) and exits 1.
)";

struct options {
  std::string model, config, data, out = "train-out", out_type = "f32";
  bool chat = false, resume = false, overwrite = false;
  std::size_t steps = 0, epochs = 0, batch = 4, seq = 128, warmup = 0, eval_every = 10, save_every = 100, threads = 1, stop_after = 0,
              keep_checkpoints = 2;
  std::uint64_t seed = 1;
  double lr = 3e-4, min_lr = 0, clip = 1.0, weight_decay = 0.01, held_out = 0.1;
};

[[noreturn]] void fail(const std::string& msg) { throw tlm::error(msg); }

std::size_t whole(const std::string& flag, const std::string& v, std::size_t min, std::size_t max) {
  std::size_t n = 0;
  const bool digits = !v.empty() && v.size() <= 19 && v.find_first_not_of("0123456789") == std::string::npos;
  if (digits) n = std::stoull(v);
  if (!digits || n < min || n > max)
    fail(fmt::format("{} takes a whole number from {} to {}, got '{}'", flag, min, max, v));
  return n;
}

double real(const std::string& flag, const std::string& v, double min, double max, bool min_open = false) {
  double x = 0;
  std::size_t pos = 0;
  try {
    x = std::stod(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != v.size() || !std::isfinite(x)) fail(fmt::format("{} takes a finite number, got '{}'", flag, v));
  if (x < min || x > max || (min_open && x == min))
    fail(fmt::format("{} {} is outside {}{}, {}]", flag, v, min_open ? "(" : "[", min, max));
  return x;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      fmt::print("{}", usage);
      std::exit(0);
    }
    if (a == "--chat") { o.chat = true; continue; }
    if (a == "--resume") { o.resume = true; continue; }
    if (a == "--overwrite") { o.overwrite = true; continue; }
    if (!a.starts_with("--")) fail(fmt::format("unexpected argument '{}'; options start with -- (see --help)", a));
    static const std::vector<std::string> valued = {"--model", "--config", "--data", "--steps", "--epochs", "--batch", "--seq", "--lr",
                                                    "--min-lr", "--warmup", "--clip", "--weight-decay", "--held-out", "--eval-every",
                                                    "--save-every", "--out", "--out-type", "--threads", "--seed", "--stop-after",
                                                    "--keep-checkpoints"};
    if (std::find(valued.begin(), valued.end(), a) == valued.end()) fail(fmt::format("unknown option '{}' (see --help)", a));
    if (i + 1 >= argc) fail(fmt::format("{} needs a value", a));
    const std::string v = argv[++i];
    if (a == "--model") o.model = v;
    else if (a == "--config") o.config = v;
    else if (a == "--data") o.data = v;
    else if (a == "--steps") o.steps = whole(a, v, 1, 1'000'000'000);
    else if (a == "--epochs") o.epochs = whole(a, v, 1, 1'000'000);
    else if (a == "--batch") o.batch = whole(a, v, 1, 4096);
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
  }
  if (o.resume && o.overwrite) fail("--resume continues the run in --out and --overwrite deletes it; give one of them");
  if (o.model.empty() && o.config.empty()) fail("give --model FILE.gguf to fine-tune or --config NAME to train from scratch (see --help)");
  if (o.data.empty()) fail("--data FILE is required: the text or chat JSONL to train on");
  if ((o.steps == 0) == (o.epochs == 0)) fail("give exactly one of --steps N and --epochs E");
  if (o.min_lr > o.lr) fail(fmt::format("--min-lr {} is above --lr {}; the decay ends below the peak", o.min_lr, o.lr));
  if (tlm::parse_writable_encoding(o.out_type) == nullptr)
    fail(fmt::format("--out-type is one of {}, not '{}'", tlm::writable_encodings_list(), o.out_type));
  if (!o.config.empty() && !trainable_configs::contains(o.config))
    fail(fmt::format("unknown --config '{}'; known: {}", o.config, tlm::config_names_text<trainable_configs>()));
  if (o.chat && o.model.empty()) fail("--chat needs --model: chat data is rendered with the model's tokenizer and chat template");
  return o;
}

// --out-type was checked against the encoding table when the options were read.
tlm::encoding encoding_of(const std::string& t) { return tlm::parse_writable_encoding(t)->enc; }

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
  // In-place sums over the ranks (no-ops alone).
  void sum(double* v, int n) {
#ifdef TLM_HAVE_MPI
    if (mpi_) MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#else
    (void)v, (void)n;
#endif
  }
  void sum(float* v, std::size_t n) {
#ifdef TLM_HAVE_MPI
    if (mpi_) MPI_Allreduce(MPI_IN_PLACE, v, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
#else
    (void)v, (void)n;
#endif
  }
  bool any(bool b) {
    double v = b ? 1 : 0;
    sum(&v, 1);
    return v > 0;
  }
  void barrier() {
#ifdef TLM_HAVE_MPI
    if (mpi_) MPI_Barrier(MPI_COMM_WORLD);
#endif
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

// Averages the ranks' gradients with one all-reduce per step, in buckets of 4M floats
// (16 MB) packed along the weight walk. Each rank's gradient is the mean over its own
// counted targets, so it is weighted by counted / total_counted: the result is the
// gradient of the global batch's mean loss, as one process computes it.
template <class W>
void all_reduce_gradients(group& grp, W& g, double weight) {
  constexpr std::size_t capacity = std::size_t{1} << 22;
  static std::vector<float> bucket(capacity);           // [capacity]
  std::vector<std::pair<float*, std::size_t>> pending;  // where the bucket's pieces go back
  std::size_t used = 0;
  const auto flush = [&] {
    grp.sum(bucket.data(), used);
    std::size_t off = 0;
    for (const auto& [ptr, n] : pending) {
      std::copy_n(bucket.begin() + static_cast<std::ptrdiff_t>(off), n, ptr);
      off += n;
    }
    pending.clear();
    used = 0;
  };
  tlm::for_each_tensor(
      [&](const tlm::tensor_name&, auto& t) {
        float* data = t.data();
        const std::size_t n = t.values().size();
        for (std::size_t done = 0; done < n;) {
          const std::size_t take = std::min(capacity - used, n - done);
          for (std::size_t i = 0; i < take; ++i) bucket[used + i] = static_cast<float>(data[done + i] * weight);
          pending.emplace_back(data + done, take);
          used += take;
          done += take;
          if (used == capacity) flush();
        }
      },
      g);
  if (used) flush();
}

// Ctrl-C presses: the first finishes the step and saves; a second abandons a save in
// progress (or about to start), since waiting for the disk is what it is pressed against.
std::atomic<int> interrupts{0};
extern "C" void on_sigint(int) { interrupts.fetch_add(1); }

// ---- loss log, plot and terminal view

struct log_row {
  std::size_t step;
  double loss, held_out, lr, grad_norm, tokens_per_s;  // held_out: NaN when not measured
};

std::vector<log_row> read_log(const std::filesystem::path& p, std::size_t up_to_step) {
  std::vector<log_row> rows;
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    log_row r{};
    std::string held;
    std::istringstream s(line);
    char c = 0;
    if (!(s >> r.step >> c >> r.loss >> c) || !std::getline(s, held, ',') || !(s >> r.lr >> c >> r.grad_norm >> c >> r.tokens_per_s)) continue;
    r.held_out = held.empty() ? NAN : std::stod(held);
    if (r.step <= up_to_step) rows.push_back(r);
  }
  return rows;
}

void write_log(const std::filesystem::path& dir, const std::vector<log_row>& rows) {
  std::string csv = "step,loss,held_out_loss,lr,grad_norm,tokens_per_s\n";
  for (const auto& r : rows)
    csv += fmt::format("{},{:.17g},{},{:.9g},{:.9g},{:.1f}\n", r.step, r.loss, std::isnan(r.held_out) ? "" : fmt::format("{:.17g}", r.held_out), r.lr,
                       r.grad_norm, r.tokens_per_s);
  tlm::detail::write_file_atomic(dir / "loss.csv", csv);
  // The plot: training loss as a line, held-out loss as dots on the same axes.
  const double w = 800, h = 400, m = 50;
  double lo = INFINITY, hi = -INFINITY;
  std::size_t s0 = rows.empty() ? 0 : rows.front().step, s1 = rows.empty() ? 1 : rows.back().step;
  if (s1 == s0) s1 = s0 + 1;
  for (const auto& r : rows) {
    lo = std::min({lo, r.loss, std::isnan(r.held_out) ? r.loss : r.held_out});
    hi = std::max({hi, r.loss, std::isnan(r.held_out) ? r.loss : r.held_out});
  }
  if (!(hi > lo)) { lo -= 1; hi += 1; }
  const auto X = [&](std::size_t s) { return m + (w - 2 * m) * static_cast<double>(s - s0) / static_cast<double>(s1 - s0); };
  const auto Y = [&](double l) { return h - m - (h - 2 * m) * (l - lo) / (hi - lo); };
  // Ticks at round values on both axes, with faint grid lines, so a reader can tell
  // where the loss was at a step without the extremes alone.
  std::string ticks;
  for (const double v : tlm::nice_ticks(lo, hi, 4))
    ticks += fmt::format("<line x1=\"{m}\" y1=\"{y:.1f}\" x2=\"{r}\" y2=\"{y:.1f}\" stroke=\"#ddd\"/>"
                         "<text class=\"y-tick\" x=\"{tx}\" y=\"{ty:.1f}\" text-anchor=\"end\">{v:.6g}</text>\n",
                         fmt::arg("m", m), fmt::arg("r", w - m), fmt::arg("y", Y(v)), fmt::arg("tx", m - 4), fmt::arg("ty", Y(v) + 4), fmt::arg("v", v));
  for (const double v : tlm::nice_ticks(static_cast<double>(s0), static_cast<double>(s1), 4)) {
    if (v != std::floor(v)) continue;  // steps are whole
    const double x = X(static_cast<std::size_t>(v));
    ticks += fmt::format("<line x1=\"{x:.1f}\" y1=\"{b}\" x2=\"{x:.1f}\" y2=\"{b5}\" stroke=\"black\"/>"
                         "<text class=\"x-tick\" x=\"{x:.1f}\" y=\"{ty}\" text-anchor=\"middle\">{v:.0f}</text>\n",
                         fmt::arg("x", x), fmt::arg("b", h - m), fmt::arg("b5", h - m + 5), fmt::arg("ty", h - m + 18), fmt::arg("v", v));
  }
  std::string svg = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
                                "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
                                "<line x1=\"{m}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/><line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{b}\" stroke=\"black\"/>\n"
                                "<text x=\"{cx}\" y=\"{ty}\" text-anchor=\"middle\">step</text>\n"
                                "<text x=\"12\" y=\"{cy}\" transform=\"rotate(-90 12 {cy})\" text-anchor=\"middle\">loss</text>\n"
                                "<text x=\"{r}\" y=\"20\" text-anchor=\"end\"><tspan fill=\"steelblue\">training loss</tspan> <tspan fill=\"darkorange\">held-out loss</tspan></text>\n",
                                w, h, fmt::arg("m", m), fmt::arg("b", h - m), fmt::arg("r", w - m), fmt::arg("ty", h - m + 36), fmt::arg("cx", w / 2),
                                fmt::arg("cy", h / 2));
  svg += ticks;
  svg += "<polyline fill=\"none\" stroke=\"steelblue\" points=\"";
  for (const auto& r : rows) svg += fmt::format("{:.1f},{:.1f} ", X(r.step), Y(r.loss));
  svg += "\"/>\n";
  for (const auto& r : rows)
    if (!std::isnan(r.held_out)) svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"darkorange\"/>\n", X(r.step), Y(r.held_out));
  svg += "</svg>\n";
  tlm::detail::write_file_atomic(dir / "loss.svg", svg);
}

std::string duration(double seconds) {
  const auto s = static_cast<long long>(seconds);
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

// ---- the output folder

// Makes --out ready before anything slow happens: the folder exists and takes a file (an
// unwritable --out used to surface at the first checkpoint, a hundred steps in), an
// earlier run in it is neither resumed nor deleted by accident, and what killed runs
// left there (temporary files, uncommitted or half checkpoint pairs) is removed.
void prepare_out(const options& o) {
  namespace fs = std::filesystem;
  const fs::path out(o.out);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    fail(fmt::format("--out {}: cannot create the folder: {}; give a folder you can write to",
                     o.out, ec ? ec.message() : std::string("a file of that name is in the way")));
  const fs::path probe = out / fmt::format(".write-probe.tmp-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, "x", 1) != 1) {
    const int err = errno;
    if (fd >= 0) ::close(fd), fs::remove(probe, ec);
    fail(fmt::format("--out {}: cannot write a file in the folder: {}; give a folder you can write to", o.out, std::strerror(err)));
  }
  ::close(fd);
  fs::remove(probe, ec);

  if (!o.resume) {
    std::vector<std::string> found;  // what a new run would destroy
    const std::string committed = tlm::latest_checkpoint(out);
    if (!committed.empty()) found.push_back(committed);
    if (fs::exists(out / "model.gguf")) found.push_back("model.gguf");
    if (!found.empty() && !o.overwrite) {
      std::string list;
      for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
      fail(fmt::format("--out {} holds an earlier run ({}); continue it with --resume, replace it with --overwrite, "
                       "or give another --out", o.out, list));
    }
    if (o.overwrite) {  // the pointer first: from then on nothing here is a committed checkpoint
      for (const char* name : {"checkpoint", "model.gguf", "loss.csv", "loss.svg"}) fs::remove(out / name, ec);
    }
  }
  const std::vector<std::string> removed = tlm::prune_checkpoints(out, o.keep_checkpoints);
  if (!removed.empty()) {
    std::string list;
    for (const auto& f : removed) list += (list.empty() ? "" : ", ") + f;
    fmt::print(stderr, "train: removed from {} what earlier runs left: {}\n", o.out, list);
  }
}

// ---- the run

template <tlm::LlamaConfig C>
int run(const options& o, const std::string& config_name, group& grp) {
  namespace fs = std::filesystem;
  using weights = tlm::trainable<C, float>;
  if (grp.lead()) prepare_out(o);
  grp.barrier();  // no rank reads --out before it is tidied
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
  if (o.batch % grp.size() != 0)
    fail(fmt::format("--batch {} is not a multiple of the {} MPI ranks; each rank takes an equal share of the global batch", o.batch, grp.size()));
  const std::size_t local = o.batch / grp.size();  // windows per step on this rank
  if (o.seq > C::context) fail(fmt::format("--seq {} is more than the context of {} ({} positions)", o.seq, config_name, C::context));

  tlm::dataset data;
  if (o.chat) {
    const std::string_view tmpl = source->has("tokenizer.chat_template") ? source->get_string("tokenizer.chat_template") : "";
    const std::int32_t pad = tok->eos() >= 0 ? tok->eos() : 0;
    // The template's BOS/EOS texts are the vocabulary's, as in chat_session.
    tlm::chat_render_options render;
    if (tok->bos() >= 0) render.bos_token = tok->decode(std::vector<std::int32_t>{tok->bos()});
    if (tok->eos() >= 0) render.eos_token = tok->decode(std::vector<std::int32_t>{tok->eos()});
    data = tlm::load_chat(o.data, tokenize, tlm::chat_template::of(tmpl), pad, o.seq, o.held_out, render);
  } else {
    data = tlm::load_text(o.data, tokenize, o.seq, o.held_out);
  }
  const std::size_t n_train = data.train.size();
  const std::size_t steps_per_epoch = (n_train + o.batch - 1) / o.batch;
  const std::size_t total = o.steps ? o.steps : o.epochs * steps_per_epoch;

  tlm::adamw_options ao{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = o.weight_decay, .clip = o.clip,
                        .warmup = o.warmup, .total_steps = total, .min_lr = o.min_lr};
  auto p = std::make_unique<weights>();
  auto g = std::make_unique<weights>();
  tlm::adamw<weights> opt(ao);
  tlm::train_state st{.step = 0, .seed = o.seed, .data_position = 0, .rng_state = 0, .batch = o.batch, .seq = o.seq, .threads = o.threads,
                      .options = ao, .config = config_name, .data = fs::absolute(o.data).string(), .chat = o.chat,
                      .kernels = std::string(tlm::kernels::kernel_level_name())};
  std::vector<log_row> rows;
  double load_seconds = 0, save_seconds = 0;  // the last checkpoint load and write, for the log
  if (o.resume) {
    const auto t_load = std::chrono::steady_clock::now();
    const tlm::train_state saved = tlm::load_checkpoint<C>(o.out, *p, opt);
    load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    const auto differs = [&](const char* what, const std::string& was, const std::string& now) {
      if (was != now) fail(fmt::format("--resume: the checkpoint in {} was made with {} {}, this run has {}; use the same value to resume", o.out, what, was, now));
    };
    differs("config", saved.config, config_name);
    differs("--batch", std::to_string(saved.batch), std::to_string(o.batch));
    differs("--seq", std::to_string(saved.seq), std::to_string(o.seq));
    differs("--seed", std::to_string(saved.seed), std::to_string(o.seed));
    differs("--data", saved.data, st.data);
    differs("--chat", saved.chat ? "on" : "off", o.chat ? "on" : "off");
    // Options the run may change on resume: it continues with the new value (extending
    // --steps is the common case), and says so, because the run then differs from an
    // uninterrupted one with either value.
    const auto changed = [&](const char* what, double was, double now) {
      if (was != now && grp.lead())
        fmt::print(stderr, "train: warning: the checkpoint was made with {} {}, this run uses {}; continuing with {} from step {}\n",
                   what, was, now, now, saved.step);
    };
    changed("--lr", saved.options.lr, ao.lr);
    changed("--min-lr", saved.options.min_lr, ao.min_lr);
    changed("--warmup", static_cast<double>(saved.options.warmup), static_cast<double>(ao.warmup));
    changed("--clip", saved.options.clip, ao.clip);
    changed("--weight-decay", saved.options.weight_decay, ao.weight_decay);
    changed("total steps (--steps/--epochs)", static_cast<double>(saved.options.total_steps), static_cast<double>(ao.total_steps));
    if (saved.threads != o.threads && grp.lead())
      fmt::print(stderr, "train: note: the checkpoint was made with --threads {}, this run uses {}; losses will differ in the last bits\n", saved.threads, o.threads);
    if (!saved.kernels.empty() && saved.kernels != st.kernels && grp.lead())
      fmt::print(stderr,
                 "train: note: the checkpoint was made with the {} kernels, this run uses {} (another CPU, or TLM_KERNELS); "
                 "losses will differ in the last bits\n",
                 saved.kernels, st.kernels);
    st.step = saved.step;
    st.data_position = saved.data_position;
    rows = read_log(fs::path(o.out) / "loss.csv", st.step);
  } else if (source) {
    auto loaded = tlm::to_trainable<float>(tlm::bind<C>(*source));
    p = std::move(loaded);
  } else {
    tlm::init_weights(*p, o.seed);
  }
  // A checkpoint at exactly `total` (a run killed between its last checkpoint and the
  // export) only needs the export; beyond it, the user asked for fewer steps than were run.
  if (st.step > total) fail(fmt::format("the checkpoint is at step {}, and --steps/--epochs ask for {} in total; ask for more steps", st.step, total));

  tlm::training<C, float> tr({.batch = local, .seq = o.seq, .threads = o.threads});
  tlm::window_order order(n_train, o.seed);
  std::vector<std::int32_t> x(local * o.seq), y(local * o.seq);  // [B / ranks, T] each
  const auto fill = [&](const tlm::window_set& ws, auto window_of) {
    for (std::size_t b = 0; b < local; ++b) {
      const std::size_t w = window_of(b);
      std::copy_n(ws.inputs.begin() + static_cast<std::ptrdiff_t>(w * o.seq), o.seq, x.begin() + static_cast<std::ptrdiff_t>(b * o.seq));
      std::copy_n(ws.targets.begin() + static_cast<std::ptrdiff_t>(w * o.seq), o.seq, y.begin() + static_cast<std::ptrdiff_t>(b * o.seq));
    }
  };
  // Held-out loss: the mean of batch losses over the held-out windows (cycled to fill the last batch).
  const auto held_out_loss = [&]() -> double {
    const std::size_t n = data.held_out.size();
    if (n == 0) return NAN;
    double sum = 0;
    std::size_t batches = 0;
    for (std::size_t s = 0; s < n; s += local, ++batches) {
      fill(data.held_out, [&](std::size_t b) { return (s + b) % n; });
      sum += tr.forward(*p, x, y);
    }
    return sum / static_cast<double>(batches);
  };
  const auto save = [&] {
    st.rng_state = order.rng_state();
    // The log first: a kill between the two leaves a log that runs ahead of the
    // checkpoint, which a resume trims; the other order would lose the rows.
    if (grp.lead()) {
      const auto t_save = std::chrono::steady_clock::now();
      write_log(o.out, rows);
      const std::string previous = tlm::latest_checkpoint(o.out);
      try {
        tlm::save_checkpoint<C>(o.out, *p, opt, st, source.get(), o.keep_checkpoints, [] { return interrupts.load() >= 2; });
      } catch (const tlm::error&) {
        if (interrupts.load() < 2) throw;
        fail(fmt::format("a second Ctrl-C abandoned the checkpoint of step {}; {}", st.step,
                         previous.empty() ? "no checkpoint was written, so a new run starts from step 0"
                                          : fmt::format("{} is intact: continue with --resume", (fs::path(o.out) / previous).string())));
      }
      save_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_save).count();
    }
    grp.barrier();  // no rank runs ahead of a checkpoint it might be asked to resume from
  };

  std::signal(SIGINT, on_sigint);
  const bool tty = ::isatty(1) && grp.lead();
  std::vector<double> losses;  // this run's, for the live line's sparkline
  if (grp.lead())
    fmt::print("train: {} {}, {} training windows and {} held-out of {} tokens ({} tokens read), {} steps from step {}, batch {}, {} threads{}, kernels {}\n",
               config_name, o.model.empty() ? "from scratch" : o.model, n_train, data.held_out.size(), o.seq, data.tokens, total, st.step, o.batch,
               o.threads, grp.size() > 1 ? fmt::format(" on each of {} MPI ranks", grp.size()) : "", st.kernels);
  if (o.resume && grp.lead()) fmt::print("resumed from {} at step {} (checkpoint loaded in {:.2f} s)\n", tlm::latest_checkpoint(o.out), st.step, load_seconds);
  if (!o.resume && grp.lead()) {
    const double h0 = held_out_loss();
    if (!std::isnan(h0)) fmt::print("held-out loss before training {:.4f}\n", h0);
  }
  std::fflush(stdout);
  const auto t_start = std::chrono::steady_clock::now();
  std::size_t this_run = 0;
  double last_held = NAN;
  bool stop = false;
  while (st.step < total && !stop) {
    const auto t0 = std::chrono::steady_clock::now();
    fill(data.train, [&](std::size_t b) { return order.at(st.data_position + grp.rank() * local + b); });
    double loss = tr.forward(*p, x, y);
    tlm::zero(*g);
    tr.backward(*p, *g);
    if (grp.size() > 1) {
      const double counted = static_cast<double>(std::count_if(y.begin(), y.end(), [](std::int32_t t) { return t != tlm::ignore_target; }));
      double totals[2] = {loss * counted, counted};  // summed loss and count over the ranks
      grp.sum(totals, 2);
      loss = totals[0] / totals[1];
      all_reduce_gradients(grp, *g, counted / totals[1]);
    }
    const tlm::adamw_report rep = opt.step(*p, *g);
    st.step = opt.steps();
    st.data_position += o.batch;
    ++this_run;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_row r{st.step, loss, NAN, rep.lr, rep.grad_norm, static_cast<double>(o.batch * o.seq) / secs};
    if (grp.lead() && ((o.eval_every && st.step % o.eval_every == 0) || st.step == total)) r.held_out = last_held = held_out_loss();
    rows.push_back(r);
    stop = grp.any(interrupts.load() > 0 || (o.stop_after && this_run >= o.stop_after));  // every rank stops at the same step
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    const double eta = elapsed / static_cast<double>(this_run) * static_cast<double>(total - st.step);
    const std::string held = std::isnan(last_held) ? "-" : fmt::format("{:.4f}", last_held);
    if (tty) {
      losses.push_back(loss);
      const tlm::live_line_parts parts{.fields = {fmt::format("step {}/{}", st.step, total), fmt::format("loss {:.4f}", loss),
                                                  fmt::format("ETA {}", duration(eta)), fmt::format("held-out {}", held),
                                                  fmt::format("lr {:.2e}", rep.lr), fmt::format("{:.0f} tok/s", r.tokens_per_s)},
                                       .losses = losses};
      fmt::print("\r\033[2K{}", tlm::live_line(parts, tlm::terminal_width(1)));  // read each time: the window may be resized
    } else if (grp.lead()) {
      fmt::print("step {} loss {:.6f} held_out {} lr {:.3e} grad_norm {:.4f} tokens_per_s {:.0f} eta {}\n", st.step, loss, held, rep.lr, rep.grad_norm,
                 r.tokens_per_s, duration(eta));
    }
    std::fflush(stdout);
    if (o.save_every && st.step % o.save_every == 0 && st.step < total && !stop) save();
  }
  if (tty) fmt::print("\n");
  if (this_run > 0) save();  // a resume of a finished run has its checkpoint already
  if (!grp.lead()) return 0;
  if (this_run > 0)
    fmt::print("checkpoint {} written (step {}, {:.2f} s)\n", (fs::path(o.out) / tlm::latest_checkpoint(o.out)).string(), st.step, save_seconds);
  if (st.step == total) {
    const fs::path model_out = fs::path(o.out) / "model.gguf";
    tlm::write_model<C>(model_out, *p, encoding_of(o.out_type), source.get(), st.step);
    fmt::print("exported {} ({})\n", model_out.string(), o.out_type);
  } else {
    fmt::print("stopped at step {} of {}; continue with --resume\n", st.step, total);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  group grp;
  try {
    const options o = parse(argc, argv);
    const std::string config = o.config.empty() ? "smollm2_135m" : o.config;
    return tlm::with_config<trainable_configs>(config, [&](auto c) { return run<typename decltype(c)::type>(o, config, grp); });
  } catch (const std::exception& e) {
    fmt::print(stderr, "train: {}{}\n", grp.size() > 1 ? fmt::format("rank {}: ", grp.rank()) : "", e.what());
    grp.abort();
    return 1;
  }
}
