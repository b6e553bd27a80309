#pragma once
// The user-facing options of a training run, described once. examples/train's flags and
// the Python module's tlm.Trainer / tlm.train keywords are both read through this table,
// so an option has one name, one range and one default everywhere (the flag is "--" +
// name with '_' as '-'), and both go through the same checks (check_request) and the same
// construction of the run: its data source (training_data), the config and adapter type it
// trains (with_training_types) and the trainer's options (to_trainer_options).
//
// What stays with each front end: how a value is written (a flag's text, a Python
// object), printing, and signals.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <unistd.h>

#include <tlm/configs.hpp>
#include <tlm/error.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/text/tokenizer.hpp>
#include <tlm/train/lora.hpp>
#include <tlm/train/trainer.hpp>

namespace tlm {

// Everything a user asks of a run, before it is checked against a config and a file.
struct training_request {
  std::string model = {};   // a GGUF file to fine-tune (its tokenizer reads the data)
  std::string config = {};  // a config name; empty: the file's
  std::string data = {};
  bool chat = false, resume = false, overwrite = false, recompute = false, pack = false, merge = false;
  std::uint64_t steps = 0, epochs = 0, batch = 4, accumulate = 1, seq = 128, warmup = 0, eval_every = 10, save_every = 100,
                threads = 1, stop_after = 0, keep_checkpoints = 2, seed = 1, lora = 0;
  double lr = 3e-4, min_lr = 0, clip = 1.0, weight_decay = 0.01, held_out = 0.1, lora_alpha = 0;
  std::string out = "train-out";
  std::string out_type = {};      // empty: f32, or with merge the base's encodings (as "base")
  std::string lora_targets = {};  // empty: q,k,v,o
};

enum class training_option_kind {
  whole,  // a whole number in [lo, hi]
  real,   // a finite number in [lo, hi] ((lo, hi] when lo_open)
  text,   // a string (a path, a name, a list)
  flag,   // on or off; the command line's flag takes no value
};

struct training_option {
  std::string_view name;  // snake_case: the Python keyword; the flag is --name with '-'
  training_option_kind kind;
  double lo, hi;  // whole and real (whole bounds are exact: below 2^53)
  bool lo_open;
  std::string_view value_name;  // in the usage line: N, X, FILE; empty for a flag
  // train --help's text and the Python docstring's, with {default} (the member's initial
  // value), {min} and {max}, {configs} (the configs this build trains) and {ranks} (its
  // LoRA ranks) filled in by help_text(); a '\n' breaks the usage line there.
  std::string_view help;
  // The member it sets: exactly one, by kind.
  std::uint64_t training_request::* whole = nullptr;
  double training_request::* real = nullptr;
  std::string training_request::* text = nullptr;
  bool training_request::* flag = nullptr;

  std::string flag_name() const {
    std::string f = "--" + std::string(name);
    for (char& c : f)
      if (c == '_') c = '-';
    return f;
  }
  std::string range_text() const { return fmt::format("{}{}, {}]", lo_open ? "(" : "[", lo, hi); }
  bool accepts(double v) const { return std::isfinite(v) && v >= lo && v <= hi && !(lo_open && v == lo); }
  // The message for a value out of range; `shown` is how the surface names the option.
  std::string out_of_range(std::string_view shown, std::string_view value) const {
    return fmt::format("{} {} is outside {}", shown, value, range_text());
  }
  std::string default_text() const;
  std::string help_text() const;
};

namespace training_detail {
inline constexpr double billion = 1e9;
using K = training_option_kind;
using R = training_request;
}  // namespace training_detail

// In the order of examples/train's usage text.
inline const std::array<training_option, 31> training_options{{
    {"model", training_detail::K::text, 0, 0, false, "FILE.gguf",
     "fine-tune this model; its tokenizer reads the data, and its hyperparameters choose the config unless --config names one",
     nullptr, nullptr, &training_detail::R::model},
    {"config", training_detail::K::text, 0, 0, false, "NAME",
     "train from scratch with N(0, 0.02) weights and byte tokens (with --model: the config to bind to), one of: {configs}",
     nullptr, nullptr, &training_detail::R::config},
    {"data", training_detail::K::text, 0, 0, false, "FILE", "training data: UTF-8 text, or chat JSONL with --chat", nullptr, nullptr,
     &training_detail::R::data},
    {"chat", training_detail::K::flag, 0, 0, false, "",
     "--data FILE is JSONL, one {\"messages\": [{\"role\", \"content\"}, ...]} per line, rendered with the model's chat template; "
     "loss on assistant tokens only",
     nullptr, nullptr, nullptr, &training_detail::R::chat},
    {"steps", training_detail::K::whole, 1, training_detail::billion, false, "N",
     "optimizer steps to run in total (counting steps of a resumed run)", &training_detail::R::steps},
    {"epochs", training_detail::K::whole, 1, 1e6, false, "E", "passes over the training windows instead of --steps",
     &training_detail::R::epochs},
    {"batch", training_detail::K::whole, 1, 4096, false, "B", "windows per micro-batch (default {default})", &training_detail::R::batch},
    {"accumulate", training_detail::K::whole, 1, 1024, false, "N",
     "micro-batches per optimizer step, {min} to {max} (default {default}): a step's loss and gradient are the mean over N * B "
     "windows, as one batch of N * B would give, in the memory of B windows",
     &training_detail::R::accumulate},
    {"recompute", training_detail::K::flag, 0, 0, false, "",
     "keep only each block's input in the forward and recompute the block's activations in the backward: far less activation "
     "memory, about a third more arithmetic, the same gradients bit for bit",
     nullptr, nullptr, nullptr, &training_detail::R::recompute},
    {"pack", training_detail::K::flag, 0, 0, false, "",
     "with --chat: pack several conversations into each window instead of one window each (first fit in file order); each "
     "attends only to itself and its positions start at 0, so fewer windows compute the same losses",
     nullptr, nullptr, nullptr, &training_detail::R::pack},
    {"seq", training_detail::K::whole, 1, 1e6, false, "T", "tokens per window (default {default})", &training_detail::R::seq},
    {"lr", training_detail::K::real, 0, 1, true, "X", "peak learning rate (default {default})", nullptr, &training_detail::R::lr},
    {"min_lr", training_detail::K::real, 0, 1, false, "X", "learning rate at the end of the cosine decay (default {default})", nullptr,
     &training_detail::R::min_lr},
    {"warmup", training_detail::K::whole, 0, training_detail::billion, false, "N", "steps of linear warm-up (default {default})",
     &training_detail::R::warmup},
    {"clip", training_detail::K::real, 0, 1e9, false, "X", "clip the global gradient norm to X; 0 turns it off (default {default})",
     nullptr, &training_detail::R::clip},
    {"weight_decay", training_detail::K::real, 0, 1, false, "X", "decoupled weight decay on matrices (default {default})", nullptr,
     &training_detail::R::weight_decay},
    {"held_out", training_detail::K::real, 0, 0.9, false, "F",
     "fraction of windows kept out of training for the held-out loss (default {default})", nullptr, &training_detail::R::held_out},
    {"eval_every", training_detail::K::whole, 0, training_detail::billion, false, "N",
     "held-out loss every N steps (default {default}; 0: only at the end)", &training_detail::R::eval_every},
    {"save_every", training_detail::K::whole, 0, training_detail::billion, false, "N",
     "checkpoint every N steps (default {default}; 0: only at the end)", &training_detail::R::save_every},
    {"out", training_detail::K::text, 0, 0, false, "DIR",
     "output folder: checkpoints, model.gguf (LoRA: adapter.gguf), loss.csv, loss.svg (default {default})", nullptr, nullptr,
     &training_detail::R::out},
    {"out_type", training_detail::K::text, 0, 0, false, "TYPE",
     "encoding of the exported model.gguf: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k (default f32; norms "
     "stay f32; a K-quant puts each matrix where llama.cpp's quantizer would: Q6_K output, Q5_0/Q5_1/Q8_0 for rows that are not "
     "a multiple of 256; examples/quantize writes the _M mixes), or, with --merge, base (its default): each tensor in its "
     "encoding in --model",
     nullptr, nullptr, &training_detail::R::out_type},
    {"resume", training_detail::K::flag, 0, 0, false, "", "continue from the newest checkpoint in --out", nullptr, nullptr, nullptr,
     &training_detail::R::resume},
    {"overwrite", training_detail::K::flag, 0, 0, false, "",
     "start a new run in an --out that holds one, deleting its checkpoints, model.gguf and loss log (without it such an --out "
     "is refused)",
     nullptr, nullptr, nullptr, &training_detail::R::overwrite},
    {"keep_checkpoints", training_detail::K::whole, 1, 1e6, false, "K", "keep the newest K checkpoints in --out (default {default})",
     &training_detail::R::keep_checkpoints},
    {"threads", training_detail::K::whole, 1, 1024, false, "T",
     "worker threads (default {default}); a bit-exact resume needs the same count", &training_detail::R::threads},
    {"seed", training_detail::K::whole, 0, 9007199254740991.0, false, "S",
     "seed for weights (from scratch) and the data order (default {default})", &training_detail::R::seed},
    {"stop_after", training_detail::K::whole, 1, training_detail::billion, false, "N",
     "stop after N steps of this run as Ctrl-C would (for tests)", &training_detail::R::stop_after},
    {"lora", training_detail::K::whole, 1, 1e6, false, "RANK",
     "train a LoRA adapter over --model instead of every weight: the base stays mapped read-only; writes adapter.gguf "
     "(llama.cpp's adapter format) in --out.\nRANK is one of {ranks} for smollm2_135m, 16 for the other configs (the ranks "
     "this build is compiled for)",
     &training_detail::R::lora},
    {"lora_alpha", training_detail::K::real, 0, 1e6, true, "A",
     "scale the adapter by A / RANK (default: A = RANK, scale 1, as llama.cpp's finetune and tlm::lora; PEFT's default is a "
     "fixed lora_alpha = 8)",
     nullptr, &training_detail::R::lora_alpha},
    {"lora_targets", training_detail::K::text, 0, 0, false, "LIST",
     "matrices to adapt: q,v or q,k,v,o (default) or q,k,v,o,gate,up,down for smollm2_135m; q,k,v,o for the other configs",
     nullptr, nullptr, &training_detail::R::lora_targets},
    {"merge", training_detail::K::flag, 0, 0, false, "",
     "with --lora: also write model.gguf, the base with the adapter merged (W + alpha/RANK B A), each tensor in the encoding it "
     "has in --model (a Q4_1 base with a Q6_K output stays so), or all matrices as --out-type TYPE",
     nullptr, nullptr, nullptr, &training_detail::R::merge},
}};

inline const training_option* find_training_option(std::string_view name) {
  for (const auto& o : training_options)
    if (o.name == name) return &o;
  return nullptr;
}

// "batch, chat, ...": every option's name, for an unknown one's message.
inline std::string training_option_names() {
  std::string s;
  for (const auto& o : training_options) s += (s.empty() ? "" : ", ") + std::string(o.name);
  return s;
}

// The checks between options, made before any file is read; messages name the flags,
// as examples/train's help does.
inline void check_request(const training_request& r) {
  if (r.resume && r.overwrite) throw error("--resume continues the run in --out and --overwrite deletes it; give one of them");
  if (r.model.empty() && r.config.empty()) throw error("give --model FILE.gguf to fine-tune or --config NAME to train from scratch (see --help)");
  if (r.data.empty()) throw error("--data FILE is required: the text or chat JSONL to train on");
  if (r.min_lr > r.lr) throw error(fmt::format("--min-lr {} is above --lr {}; the decay ends below the peak", r.min_lr, r.lr));
  if (!r.out_type.empty() && r.out_type != "base" && parse_writable_encoding(r.out_type) == nullptr)
    throw error(fmt::format("--out-type is one of {}, or base with --merge, not '{}'", writable_encodings_list(), r.out_type));
  if (r.merge && r.lora == 0) throw error("--merge merges a LoRA adapter into its base: it needs --lora RANK");
  if (r.out_type == "base" && !r.merge)
    throw error("--out-type base writes each tensor of a LoRA merge in its base's encoding: it needs --lora RANK --merge");
  if ((r.lora_alpha != 0 || !r.lora_targets.empty()) && r.lora == 0) throw error("--lora-alpha and --lora-targets need --lora RANK");
  if (r.lora && r.model.empty())
    throw error("--lora trains an adapter over a base model: give --model FILE.gguf (--config alone trains from scratch)");
  if (r.pack && !r.chat)
    throw error("--pack packs chat conversations several to a window: it needs --chat (chat JSONL data); plain text has no conversations to pack");
  if (r.chat && r.model.empty()) throw error("--chat needs --model: chat data is rendered with the model's tokenizer and chat template");
  if (!r.lora_targets.empty()) (void)parse_lora_targets(r.lora_targets);  // its own message for a bad name
}

inline lora_target requested_lora_targets(const training_request& r) {
  return r.lora_targets.empty() ? lora_default_targets : parse_lora_targets(r.lora_targets);
}

// --out-type as the trainer takes it: unset for f32's default or the base's encodings,
// which the trainer chooses by itself (a full run: f32; a merge: the base's).
inline std::optional<encoding> requested_out_type(const training_request& r) {
  if (r.out_type.empty() || r.out_type == "base") return std::nullopt;
  return parse_writable_encoding(r.out_type)->enc;  // checked by check_request
}

inline trainer_options to_trainer_options(const training_request& r, const std::string& config_name) {
  return {.steps = r.steps, .epochs = r.epochs, .batch = r.batch, .accumulate = r.accumulate, .recompute = r.recompute,
          .pack = r.pack, .seq = r.seq, .lr = r.lr, .min_lr = r.min_lr, .warmup = r.warmup, .clip = r.clip,
          .weight_decay = r.weight_decay, .eval_every = r.eval_every, .save_every = r.save_every,
          .keep_checkpoints = r.keep_checkpoints, .out = r.out, .out_type = requested_out_type(r), .resume = r.resume,
          .overwrite = r.overwrite, .threads = r.threads, .seed = r.seed, .stop_after = r.stop_after, .config = config_name,
          .lora_alpha = r.lora_alpha, .merge = r.merge};
}

// The data of a run: with a model, read by its tokenizer (chat JSONL in its template),
// else byte tokens. `source` is the opened model file or null; the tokenizer is shared
// with the returned source's loader, which runs later.
template <LlamaConfig C>
data_source training_data(const training_request& r, const std::string& config_name, const gguf::file* source) {
  if (source == nullptr) {
    if (C::vocab < 256)
      throw error(fmt::format("--config {} has a vocabulary of {}, too small for byte tokens (256)", config_name, C::vocab));
    return data_source::from_text(r.data, byte_tokens, r.seq, r.held_out);
  }
  auto tok = std::make_shared<tokenizer>(tokenizer::from_gguf(*source));
  const tokenize_fn tokenize = [tok](std::string_view text, bool special) {
    return tok->encode(text, {.add_bos = false, .parse_special = special});
  };
  if (!r.chat) return data_source::from_text(r.data, tokenize, r.seq, r.held_out);
  const std::string_view tmpl = source->has("tokenizer.chat_template") ? source->get_string("tokenizer.chat_template") : "";
  const std::int32_t pad = tok->eos() >= 0 ? tok->eos() : 0;
  // The template's BOS/EOS texts are the vocabulary's, as in chat_session.
  chat_render_options render;
  if (tok->bos() >= 0) render.bos_token = tok->decode(std::vector<std::int32_t>{tok->bos()});
  if (tok->eos() >= 0) render.eos_token = tok->decode(std::vector<std::int32_t>{tok->eos()});
  return data_source::from_chat(r.data, tokenize, chat_template::of(tmpl), pad, r.seq, r.held_out, render, r.pack);
}

// Full fine-tuning holds f32 weights, their gradients and AdamW's two moments: 16 bytes a
// parameter before any activation. A config that needs more than the machine's memory is
// refused before the run, with the way out, rather than failing at allocation or in swap.
template <LlamaConfig C>
void refuse_beyond_memory(const std::string& config_name) {
  const double need = 16.0 * static_cast<double>(parameter_count_v<C>);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double have = static_cast<double>(pages) * static_cast<double>(page);
  if (need > have)
    throw error(fmt::format("full fine-tuning of {} needs {:.1f} GiB for its f32 weights, gradients and AdamW moments, more "
                            "than this machine's {:.1f} GiB of memory; train a LoRA adapter instead (--lora 16)",
                            config_name, need / (1u << 30), have / (1u << 30)));
}

// LoRA's rank and targets are compile-time (lora<C, Rank, Targets>): a run picks one of
// these instantiations, and each is a trainer instantiation per config, the bulk of a
// front end's compile time. smollm2_135m (the model of the tests and benchmarks) gets
// every rank of the build option TLM_TRAIN_LORA_RANKS with three target sets; every
// other config gets rank 16 on q, k, v, o, the usual choice: with it (and full training)
// the nine other configs take examples/train from 109 s to about 220 s of Release compile
// (measured once on a 2-vCPU Intel Xeon).
#ifndef TLM_TRAIN_LORA_RANKS
#define TLM_TRAIN_LORA_RANKS 4, 8, 16, 32, 64
#endif
namespace training_detail {
template <class C>
constexpr bool every_lora_choice = std::same_as<C, smollm2_135m>;
inline constexpr std::size_t usual_lora_rank = 16;
using lora_rank_list = std::index_sequence<TLM_TRAIN_LORA_RANKS>;
inline constexpr std::size_t lora_ranks[] = {TLM_TRAIN_LORA_RANKS};
inline constexpr lora_target lora_qv = lora_target::q | lora_target::v;
inline constexpr lora_target lora_target_sets[] = {lora_qv, lora_default_targets, all_layer_matrices};
}  // namespace training_detail

// "4, 8, 16, 32 and 64" (and_last) or "4, 8, 16, 32, 64".
inline std::string lora_ranks_text(bool and_last) {
  std::string text;
  const auto& ranks = training_detail::lora_ranks;
  for (std::size_t i = 0; i < std::size(ranks); ++i) {
    if (i > 0) text += and_last && i + 1 == std::size(ranks) ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

// The member's initial value in training_request, as the help shows it.
inline std::string training_option::default_text() const {
  const training_request d;
  switch (kind) {
    case training_option_kind::whole: return fmt::format("{}", d.*whole);
    case training_option_kind::real: return fmt::format("{}", d.*real);
    case training_option_kind::text: return d.*text;
    case training_option_kind::flag: return d.*flag ? "on" : "off";
  }
  return {};
}

inline std::string training_option::help_text() const {
  std::string h(help);
  const auto fill = [&h](std::string_view key, const std::string& value) {
    for (std::size_t at = h.find(key); at != std::string::npos; at = h.find(key, at + value.size())) h.replace(at, key.size(), value);
  };
  fill("{default}", default_text());
  fill("{min}", fmt::format("{}", lo));
  fill("{max}", fmt::format("{}", hi));
  fill("{configs}", config_names_text<program_configs>());
  fill("{ranks}", lora_ranks_text(false));
  return h;
}

// Returns f.template operator()<C, Adapter>() (a value, the same type for each) for the config named `config_name` (one of
// Configs) and the adapter the request asks for (void: full training), or refuses a rank
// or target set this build has no instantiation for.
template <class Configs, class F>
decltype(auto) with_training_types(const training_request& r, const std::string& config_name, F&& f) {
  namespace d = training_detail;
  const auto has_rank = [](std::uint64_t rank) { return std::find(std::begin(d::lora_ranks), std::end(d::lora_ranks), rank) != std::end(d::lora_ranks); };
  if (r.lora && r.lora != d::usual_lora_rank && !has_rank(r.lora))
    throw error(fmt::format("--lora {}: this build trains LoRA ranks {}; give one of them", r.lora, lora_ranks_text(true)));
  const lora_target targets = requested_lora_targets(r);
  if (std::find(std::begin(d::lora_target_sets), std::end(d::lora_target_sets), targets) == std::end(d::lora_target_sets))
    throw error(fmt::format("--lora-targets {}: this build trains the target sets q,v; q,k,v,o; q,k,v,o,gate,up,down; give one of them", r.lora_targets));
  return with_config<Configs>(config_name, [&](auto c) -> decltype(auto) {
    using C = typename decltype(c)::type;
    if (r.lora == 0) return f.template operator()<C, void>();
    if constexpr (d::every_lora_choice<C>) {
      if (!has_rank(r.lora))
        throw error(fmt::format("--lora {}: this build trains {} at LoRA ranks {}; give one of them", r.lora, config_name, lora_ranks_text(true)));
      using result = decltype(f.template operator()<C, void>());
      return [&]<std::size_t... Ranks>(std::index_sequence<Ranks...>) -> result {
        std::optional<result> out;
        const auto one = [&]<std::size_t Rank>() {
          if (targets == d::lora_qv) out.emplace(f.template operator()<C, lora<C, Rank, d::lora_qv>>());
          else if (targets == all_layer_matrices) out.emplace(f.template operator()<C, lora<C, Rank, all_layer_matrices>>());
          else out.emplace(f.template operator()<C, lora<C, Rank>>());
        };
        static_cast<void>(((r.lora == Ranks && (one.template operator()<Ranks>(), true)) || ...));
        return std::move(*out);
      }(d::lora_rank_list{});
    } else {
      if (r.lora != d::usual_lora_rank || targets != lora_default_targets)
        throw error(fmt::format("--lora {} --lora-targets {}: this build trains {} at LoRA rank {} on q,k,v,o only (smollm2_135m "
                                "at every rank and target set); use those, or add the config in tlm/train/training_options.hpp's every_lora_choice",
                                r.lora, lora_targets_text(targets), config_name, d::usual_lora_rank));
      return f.template operator()<C, lora<C, d::usual_lora_rank>>();
    }
  });
}

}  // namespace tlm
