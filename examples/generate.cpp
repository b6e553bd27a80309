// Generates text with a model of a shipped config type, streaming the continuation token
// by token. The config is the one whose hyperparameters the --model file has (said on
// stderr), SmolLM2-135M's for the default file, or --config's.
//
//   generate [--model PATH] [--config NAME] [--prompt TEXT | TEXT] [-n N] [--threads T] [--ctx N]
//            [--kv-type f32|q8] [--chat] [--chat-template NAME] [--context-shift] [--keep N] [--system TEXT] [--special] [--temperature X] [--top-k K] [--top-p P] [--min-p P]
//            [--repeat-penalty X] [--frequency-penalty X] [--presence-penalty X] [--penalty-window N]
//            [--logit-bias ID=X] [--stop TEXT] [--ignore-eos] [--seed S]
//            [--lora FILE [--lora-scale S]]... [--token-ids 1,2,3] [--print-ids] [--dump-logits FILE] [--show-config] [--timing] [--trace]
//
// It is a thin layer over tlm/generate.hpp: the decoding loop is the library's.
// `--chat` without a prompt starts an interactive chat on the terminal.
#include <tlm/config_match.hpp>
#include <tlm/configs.hpp>
#include <tlm/generate.hpp>
#include <tlm/generation/json_schema.hpp>
#include <tlm/generation/sampler.hpp>
#include <tlm/model.hpp>
#include <tlm/text/chat.hpp>
#include <tlm/text/tokenizer.hpp>

#include "cli.hpp"

#include <csignal>
#include <iostream>
#include <iterator>
#include <memory>

#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

// More threads than this is a typo, not a machine.
constexpr std::size_t max_threads = 1024;

// {configs} stands for tlm's list of config names, so a config added there is offered here.
constexpr std::string_view usage_format = R"(usage: generate [options] [TEXT]
  --model PATH        GGUF file (default: $TLM_MODEL or models/SmolLM2-135M-Instruct.Q4_1.gguf)
  --config NAME       the config type to bind the file to (default: the one whose hyperparameters
                      --model's file has; smollm2_135m for the default file):
                      {configs}
                      (tiny_train: a model trained from scratch by examples/train --config tiny_train)
  --prompt TEXT       the prompt (or give it as the last argument)
  -n N                tokens to generate (default 32); stops early at end-of-sequence
  --threads T         threads for the matrix kernels (default: all cores)
  --precision MODE    exact (default: float32 precision, logits within 3.5e-6 of float64) or
                      fast (int8 activations and integer dot products, as llama.cpp)
  --lora FILE         apply a LoRA adapter (llama.cpp's adapter GGUF, e.g. written by train --lora)
                      over the model; repeatable, each adapter adds its own low-rank path
  --lora-scale S      the scale of the --lora just before it (default 1; the effective scale of
                      each matrix is S * alpha / rank, as llama.cpp's --lora-scaled; 0: no effect)
  --ctx N             KV-cache capacity in tokens (default: prompt + N; at most the context)
  --kv-type T         KV-cache entries: f32 (default) or q8 (int8 with one scale per head and position:
                      3.76x less cache memory; logits within ~0.9 of f32, see the README)
  --chat              wrap the prompt as a user message with the model's chat template;
                      without a prompt, chat interactively: end a line with \ to continue it,
                      /reset, /system TEXT (a new conversation with that system message), /quit;
                      Ctrl-C stops the reply, not the program (default -n there: 512)
  --system TEXT       system message for --chat (default: the template's own)
  --chat-template NAME  --chat: render with this chat template instead of the file's:
                      {templates}
  --context-shift     --chat: when a turn does not fit --ctx, drop the oldest whole turns (never the
                      system message) and shift the cache instead of starting over; no re-prefill
  --keep N            --context-shift: never drop the first N tokens (default: the system message)
  --special           recognise special tokens such as <|im_start|> in the prompt text
{sampling}  --stop TEXT         stop when TEXT appears (it is not printed); repeatable
  --ignore-eos        keep generating past the end-of-sequence token
  --json              constrain the output to one compact JSON value (it ends within -n - 1 characters)
  --json-schema FILE  constrain the output to JSON valid against the schema in FILE (a subset: object with
                      required properties, string, number, integer, boolean, enum, array with items/minItems)
  --beams W           beam search with W beams (greedy scoring; prints the best beam); 1 equals greedy
  --length-penalty X  beam ranking: log-prob / length^X (default 1; 0 ranks raw log-probs)
  Sampling applies, in order: logit bias, penalties, top-k, top-p, min-p, temperature; the
  sampling options are those of the server's requests and of Python's Model.generate.
  --token-ids LIST    the prompt as comma-separated token ids instead of text
  --print-ids         print the generated ids, comma-separated, on a last line
  --dump-logits FILE  write the logits of every prompt position (float32, [positions, vocab])
  --show-config       print the compiled config and the file's hyperparameters
  --timing            print load time, prefill tokens/s and decode ms/token to stderr
  --trace             print per-layer residual RMS, attention entropy and logit statistics to stderr
)";

std::string usage() {
  return fmt::format(fmt::runtime(usage_format), fmt::arg("configs", tlm::config_names_text()),
                     fmt::arg("templates", tlm::chat_template_names()), fmt::arg("sampling", cli::sampling_usage()));
}

struct options {
  std::string model;
  std::string config;  // --config; empty: chosen from the file (chosen_config)
  bool model_given = false;
  std::optional<std::string> prompt;
  std::optional<std::vector<std::int32_t>> token_ids;
  std::optional<std::string> system;
  std::string chat_template;  // --chat-template; empty: the file's
  std::optional<std::string> dump_logits;
  std::size_t n = 32, threads = 0;
  std::optional<std::size_t> ctx;
  bool n_given = false;
  bool chat = false, special = false, print_ids = false, show_config = false, timing = false, trace = false;
  tlm::sampling sampling;
  tlm::kernels::precision precision = tlm::kernels::default_precision();
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::shared_ptr<const tlm::json_grammar> grammar;
  std::size_t beams = 0;  // 0: no beam search
  float length_penalty = 1.0f;
  tlm::kv_type kv = tlm::kv_type::f32;
  bool context_shift = false;
  std::optional<std::size_t> keep;
  std::vector<std::pair<std::string, float>> loras;  // --lora FILE, --lora-scale S
};

using cli::fail;

std::size_t to_count(std::string_view flag, const std::string& v) {
  return static_cast<std::size_t>(cli::whole(flag, v, 0, std::numeric_limits<std::uint32_t>::max()));
}

std::vector<std::int32_t> parse_ids(const std::string& list) {
  std::vector<std::int32_t> ids;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(',', start), list.size());
    ids.push_back(static_cast<std::int32_t>(
        cli::whole("--token-ids", list.substr(start, end - start), 0, std::numeric_limits<std::int32_t>::max())));
    start = end + 1;
  }
  return ids;
}

options parse(int argc, char** argv) {
  options o;
  const char* env = std::getenv("TLM_MODEL");
  o.model = env ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(fmt::format("{} needs a value\n{}", a, usage()));
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      fmt::print("{}", usage());
      std::exit(0);
    } else if (cli::read_sampling_flag(argc, argv, i, o.sampling)) {
    } else if (a == "--model") {
      o.model = value();
      o.model_given = true;
    }
    else if (a == "--config") o.config = value();
    else if (a == "--lora") o.loras.emplace_back(value(), 1.0f);
    else if (a == "--lora-scale") {
      if (o.loras.empty()) fail("--lora-scale sets the scale of the --lora before it; give --lora FILE first");
      o.loras.back().second = static_cast<float>(cli::finite(a, value()));
    }
    else if (a == "--prompt") o.prompt = value();
    else if (a == "-n") {
      o.n = to_count(a, value());
      o.n_given = true;
    }
    else if (a == "--threads") o.threads = to_count(a, value());
    else if (a == "--precision") {
      const std::string v = value();
      if (v == "exact") o.precision = tlm::kernels::precision::exact;
      else if (v == "fast") o.precision = tlm::kernels::precision::fast;
      else fail(fmt::format("--precision {} is unknown; give exact or fast", v));
    }
    else if (a == "--ctx") {
      o.ctx = to_count(a, value());
      if (*o.ctx == 0) fail("--ctx 0 leaves no room in the KV cache; give at least the prompt length plus -n, or leave --ctx out");
    }
    else if (a == "--chat") o.chat = true;
    else if (a == "--kv-type") {
      const std::string v = value();
      if (v == "f32") o.kv = tlm::kv_type::f32;
      else if (v == "q8") o.kv = tlm::kv_type::q8;
      else fail(fmt::format("--kv-type {} is unknown; give f32 or q8", v));
    }
    else if (a == "--context-shift") o.context_shift = true;
    else if (a == "--keep") o.keep = to_count(a, value());
    else if (a == "--system") o.system = value();
    else if (a == "--chat-template") o.chat_template = value();
    else if (a == "--special") o.special = true;
    else if (a == "--stop") {
      o.stop.push_back(value());
      if (o.stop.back().empty()) fail("--stop needs a non-empty text; an empty one would stop before the first token");
    }
    else if (a == "--ignore-eos") o.ignore_eos = true;
    else if (a == "--json") o.grammar = std::make_shared<const tlm::json_grammar>();
    else if (a == "--json-schema") {
      const std::string path = value();
      std::ifstream in(path);
      if (!in) fail(fmt::format("--json-schema: cannot read '{}'; give the path of a JSON Schema file", path));
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      try {
        o.grammar = std::make_shared<const tlm::json_grammar>(tlm::json_schema::from_text(text));
      } catch (const tlm::error& e) {
        fail(fmt::format("--json-schema {}: {}", path, e.what()));
      }
    }
    else if (a == "--beams") {
      o.beams = to_count(a, value());
      if (o.beams == 0) fail("--beams 0 keeps no beam; give 1 (greedy) or more, e.g. 4");
    }
    else if (a == "--length-penalty") o.length_penalty = static_cast<float>(cli::finite(a, value()));
    else if (a == "--token-ids") o.token_ids = parse_ids(value());
    else if (a == "--print-ids") o.print_ids = true;
    else if (a == "--dump-logits") o.dump_logits = value();
    else if (a == "--show-config") o.show_config = true;
    else if (a == "--timing") o.timing = true;
    else if (a == "--trace") o.trace = true;
    else if (a.starts_with("-") && a.size() > 1) fail(fmt::format("unknown option '{}'\n{}", a, usage()));
    else if (!o.prompt) o.prompt = std::string(a);
    else fail(fmt::format("two prompts given ('{}' and '{}'); quote the prompt as one argument", *o.prompt, a));
  }
  if (o.prompt && o.token_ids) fail("give the prompt either as text or as --token-ids, not both");
  if (!o.prompt && !o.token_ids && !o.chat) o.prompt = "The capital of France is";
  if (o.chat && !o.prompt && !o.token_ids && !o.n_given) o.n = 512;  // an interactive reply
  // Every option is checked here, before the file is mapped or a token computed.
  if (!o.config.empty() && !tlm::program_configs::contains(o.config))
    fail(tlm::unknown_config(o.config, "--config"));
  if (o.threads > max_threads) fail(fmt::format("--threads {} is more than {}; give 0 for every core", o.threads, max_threads));
  if ((o.context_shift || o.keep) && !o.chat) fail("--context-shift and --keep apply to a conversation; add --chat");
  if (o.keep && !o.context_shift) fail("--keep sets what --context-shift never drops; add --context-shift, or leave --keep out");
  if (o.chat && o.token_ids) fail("--chat takes its messages as text; give the prompt as text, not --token-ids");
  if (!o.chat_template.empty() && !o.chat) fail("--chat-template sets how --chat renders messages; add --chat");
  if (!o.chat_template.empty()) (void)tlm::chat_template::named(o.chat_template);  // an unknown name lists the names
  if (o.length_penalty < 0.0f) fail(fmt::format("--length-penalty {} is negative; give 0 or more (default 1)", o.length_penalty));
  if (o.beams && (o.sampling.temperature != 0.0f || !o.stop.empty() || o.grammar || o.chat || o.trace || o.dump_logits))
    fail("--beams is a search, not sampling: it does not combine with --temperature, --stop, --json, --chat, --trace or --dump-logits");
  return o;
}

double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

template <tlm::LlamaConfig config>
void show_config(const tlm::gguf::file& f) {
  fmt::print(stderr, "config {}: dim {}, heads {} (kv {}), head_dim {}, ffn {}, layers {}, vocab {}, context {}\n",
             tlm::config_name<config>(), tlm::dim<config>, tlm::heads<config>, config::kv_heads, tlm::head_dim<config>,
             config::ffn, config::layers, config::vocab, config::context);
  fmt::print(stderr, "file {}: {} tensors, GGUF v{}, name '{}'\n", f.name(), f.tensors().size(), f.version(),
             f.has("general.name") ? f.get_string("general.name") : "");
}

// The checks that need the config's sizes but not the file: done before loading it.
template <tlm::LlamaConfig config>
void check_against(const options& o) {
  if (o.token_ids) {
    for (const auto id : *o.token_ids) {
      if (static_cast<std::size_t>(id) >= config::vocab)
        fail(fmt::format("--token-ids: token id {} is outside the vocabulary of {} (ids 0 to {})", id,
                         tlm::config_name<config>(), config::vocab - 1));
    }
  }
  for (const auto& [id, bias] : o.sampling.logit_bias) {
    if (static_cast<std::size_t>(id) >= config::vocab)
      fail(fmt::format("--logit-bias: token id {} is outside the vocabulary of {} (ids 0 to {})", id,
                       tlm::config_name<config>(), config::vocab - 1));
  }
  if (o.ctx && *o.ctx > config::context)
    fail(fmt::format("--ctx {} is more than the context of {} ({} positions)", *o.ctx, tlm::config_name<config>(), config::context));
  if (o.keep && o.ctx && *o.keep >= *o.ctx)
    fail(fmt::format("--keep {} leaves no room in a cache of --ctx {}; keep fewer tokens", *o.keep, *o.ctx));
  if (o.n >= config::context)
    fail(fmt::format("-n {} leaves no room for the prompt in the context of {} ({} positions)", o.n, tlm::config_name<config>(),
                     config::context));
}

tlm::chat_options chat_options(const options& o, std::size_t capacity) {
  return {.capacity = capacity,
          .kv = o.kv,
          .context_shift = o.context_shift,
          .n_keep = o.keep ? *o.keep : tlm::chat_options::keep_system,
          .chat_template = o.chat_template};
}

tlm::generation_options generation(const options& o) {
  return {.max_tokens = o.n, .sample = o.sampling, .stop = o.stop, .stop_at_eos = !o.ignore_eos, .grammar = o.grammar};
}

// Prints each piece as it comes.
tlm::token_callback print_pieces() {
  return tlm::make_token_callback([](std::int32_t, std::string_view text) {
    fmt::print("{}", text);
    std::fflush(stdout);
  });
}

template <tlm::LlamaConfig config>
tlm::generation_hooks<config> hooks_for(const options& o, std::vector<float>& all) {
  tlm::generation_hooks<config> h;
  if (o.dump_logits) h.prompt_logits = &all;
  if (o.trace) {
    h.on_trace = [](std::int32_t token, std::size_t pos, const tlm::forward_trace<config>& trace) {
      fmt::print(stderr, "\n[trace] token {} at position {}: logit max {:.3f}, entropy {:.3f} nats\n", token, pos,
                 trace.logit_max, trace.logit_entropy);
      for (std::size_t l = 0; l < config::layers; ++l) {
        std::string ent;
        for (float e : trace.attention_entropy[l]) ent += fmt::format(" {:.2f}", e);
        fmt::print(stderr, "[trace]   layer {:2}: rms after attention {:.3f}, after mlp {:.3f}; attention entropy{}\n", l,
                   trace.attn_residual_rms[l], trace.mlp_residual_rms[l], ent);
      }
    };
  }
  return h;
}

// Set by Ctrl-C; the reply's callback sees it and stops the reply, not the program.
volatile std::sig_atomic_t interrupted = 0;
extern "C" void on_interrupt(int) { interrupted = 1; }

// One message from the terminal: lines ending in a backslash continue it.
bool read_message(std::string& out) {
  out.clear();
  std::string line;
  fmt::print("> ");
  std::fflush(stdout);
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      out += line + "\n";
      fmt::print(". ");
      std::fflush(stdout);
      continue;
    }
    out += line;
    return true;
  }
  return !out.empty();
}

template <tlm::LlamaConfig config>
int interactive(const options& o, tlm::model<config>& m, const tlm::tokenizer& tok) {
  const std::size_t capacity = o.ctx ? *o.ctx : std::min<std::size_t>(4096, config::context);
  tlm::chat_session<config> chat(m, tok, chat_options(o, capacity));
  std::optional<std::string> system = o.system;
  const auto start = [&] {
    chat.reset();
    if (system) chat.add("system", *system);
  };
  start();
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  fmt::print("tlm chat ({}). /reset starts over, /system TEXT sets the system message, /quit ends; "
             "end a line with \\ to continue it; Ctrl-C stops a reply.\n",
             tlm::config_name<config>());
  std::string msg;
  while (read_message(msg)) {
    if (msg == "/quit") break;
    if (msg == "/reset") {
      start();
      fmt::print("(new conversation)\n");
      continue;
    }
    if (msg.starts_with("/system")) {
      const std::string text = msg.size() > 7 ? msg.substr(msg[7] == ' ' ? 8 : 7) : "";
      if (text.empty()) {
        fmt::print(stderr, "/system needs a text: /system You are a helpful assistant.\n");
        continue;
      }
      system = text;
      start();
      fmt::print("(new conversation with that system message)\n");
      continue;
    }
    if (msg.starts_with("/")) {
      fmt::print(stderr, "unknown command '{}'; the commands are /reset, /system TEXT and /quit\n", msg);
      continue;
    }
    if (msg.empty()) continue;
    interrupted = 0;
    try {
      chat.add("user", msg);
      const auto r = chat.reply(generation(o), tlm::make_token_callback([](std::int32_t, std::string_view text) {
                                  fmt::print("{}", text);
                                  std::fflush(stdout);
                                  return interrupted == 0;
                                }));
      fmt::print("{}\n", r.reason == tlm::stop_reason::callback ? " [stopped]" : "");
      if (r.dropped_tokens)
        fmt::print(stderr, "(context shift: the oldest turns, {} tokens, were dropped to make room)\n", r.dropped_tokens);
      if (o.timing)
        fmt::print(stderr, "prefill {} tokens in {:.1f} ms | decode {} tokens, {:.2f} ms/token\n", r.prompt_tokens,
                   r.prefill_ms, r.decoded_tokens, r.decoded_tokens ? r.decode_ms / static_cast<double>(r.decoded_tokens) : 0.0);
    } catch (const tlm::capacity_error& e) {
      fmt::print(stderr, "\n{}\n", e.what());
      start();
      fmt::print("(the conversation no longer fits the cache; it starts over)\n");
    }
  }
  fmt::print("\n");
  return 0;
}

template <tlm::LlamaConfig config>
int run(const options& o) {
  check_against<config>(o);
  const auto t_load = clock_type::now();
  tlm::model<config> m = tlm::model<config>::load(o.model, {.threads = o.threads, .precision = o.precision});
  for (const auto& [file, scale] : o.loras) m.add_lora(file, scale);
  const double load_ms = ms_since(t_load);
  const auto t_tok = clock_type::now();
  const tlm::tokenizer tok = tlm::tokenizer::from_gguf(m.file());
  const double tokenizer_ms = ms_since(t_tok);
  if (o.show_config) show_config<config>(m.file());
  if (o.chat && !o.prompt) return interactive(o, m, tok);

  std::vector<std::int32_t> prompt;
  std::string shown;  // what is printed before the continuation
  std::vector<tlm::chat_message> msgs;
  if (o.token_ids) {
    prompt = *o.token_ids;
    shown = tok.decode(prompt);
  } else if (o.chat) {
    if (o.system) msgs.push_back({"system", *o.system});
    msgs.push_back({"user", *o.prompt});
    const std::string_view tmpl = m.file().has("tokenizer.chat_template") ? m.file().get_string("tokenizer.chat_template") : "";
    // Rendered as the chat session renders it: the vocabulary's BOS/EOS texts.
    tlm::chat_render_options render;
    if (tok.bos() >= 0) render.bos_token = tok.decode(std::vector<std::int32_t>{tok.bos()});
    if (tok.eos() >= 0) render.eos_token = tok.decode(std::vector<std::int32_t>{tok.eos()});
    shown = tlm::chat_template::of(tmpl, o.chat_template).render(msgs, true, render);
    prompt = tok.encode(shown, {.add_bos = false, .parse_special = true});  // only to check the length below
  } else {
    shown = *o.prompt;
    prompt = tok.encode(shown, {.parse_special = o.special});  // BOS/EOS as the file says
  }
  if (prompt.empty()) fail("the prompt is empty after tokenization; give some text");
  const std::size_t needed = prompt.size() + o.n;
  const std::size_t capacity = o.ctx ? *o.ctx : std::min(needed, config::context);
  if (needed > capacity || needed > config::context) {
    fail(fmt::format("the prompt ({} tokens) plus {} new tokens needs {} positions, but the KV cache holds {}{}; "
                     "shorten the prompt, lower -n{}",
                     prompt.size(), o.n, needed, std::min(capacity, config::context),
                     o.ctx ? " (--ctx)" : fmt::format(" (the model's context)"),
                     o.ctx && *o.ctx < config::context ? fmt::format(", or raise --ctx (at most {})", config::context) : ""));
  }

  fmt::print("{}", shown);
  std::fflush(stdout);
  std::vector<float> all;
  const auto hooks = hooks_for<config>(o, all);
  tlm::generation_result r;
  if (o.beams) {
    const auto t0 = clock_type::now();
    const auto beams = tlm::generate_beam(m, tok, prompt,
                                          {.width = o.beams, .max_tokens = o.n, .length_penalty = o.length_penalty,
                                           .stop_at_eos = !o.ignore_eos, .kv = o.kv});
    fmt::print("{}\n", beams.front().text);
    if (o.print_ids) {
      std::string ids;
      for (std::size_t i = 0; i < beams.front().ids.size(); ++i) ids += (i ? "," : "") + std::to_string(beams.front().ids[i]);
      fmt::print("{}\n", ids);
    }
    if (o.timing)
      fmt::print(stderr, "load {:.1f} ms, tokenizer {:.1f} ms | beam search, {} beams, {:.1f} ms | best score {:.4f}, log-prob {:.4f}\n",
                 load_ms, tokenizer_ms, o.beams, ms_since(t0), beams.front().score, beams.front().log_prob);
    return 0;
  }
  if (o.chat) {
    tlm::chat_session<config> chat(m, tok, chat_options(o, capacity));
    for (const auto& msg : msgs) chat.add(msg.role, msg.content);
    r = chat.reply(generation(o), print_pieces(), hooks);
  } else {
    tlm::generator<config> gen(m, tok, o.kv);
    r = gen.generate(prompt, generation(o), print_pieces(), hooks);
  }
  if (o.dump_logits) {
    std::ofstream out(*o.dump_logits, std::ios::binary);
    out.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float)));
    if (!out) fail(fmt::format("cannot write the logits to {}", *o.dump_logits));
  }
  fmt::print("\n");
  if (o.print_ids) {
    std::string ids;
    for (std::size_t i = 0; i < r.ids.size(); ++i) ids += (i ? "," : "") + std::to_string(r.ids[i]);
    fmt::print("{}\n", ids);
  }
  if (o.timing) {
    fmt::print(stderr, "load {:.1f} ms, tokenizer {:.1f} ms | prefill {} tokens in {:.1f} ms ({:.1f} tokens/s) | decode {} tokens, {:.2f} ms/token | "
                       "{} threads, kernels {} | kv cache {}, {} bytes/position | stop: {}\n",
               load_ms, tokenizer_ms, r.prompt_tokens, r.prefill_ms, r.prompt_tokens * 1000.0 / r.prefill_ms, r.decoded_tokens,
               r.decoded_tokens ? r.decode_ms / static_cast<double>(r.decoded_tokens) : 0.0, m.threads(),
               tlm::kernels::kernel_level_name(), tlm::to_string(o.kv), tlm::kv_storage<config>::bytes_per_position(o.kv),
               tlm::to_string(r.reason));
  }
  return 0;
}

}  // namespace

// --config's, else the shipped config whose hyperparameters the --model file has (its
// header read here, so an unknown file is a clear error before anything is loaded), else
// smollm2_135m: the default file (models/ or $TLM_MODEL) is SmolLM2-135M's, as before.
std::string chosen_config(const options& o) {
  return o.model_given ? tlm::choose_config(o.config, o.model, stderr) : o.config.empty() ? "smollm2_135m" : o.config;
}

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    return tlm::with_config(chosen_config(o), [&](auto c) { return run<typename decltype(c)::type>(o); });
  } catch (const std::exception& e) {  // tlm::error and usage_error: both say what to do
    fmt::print(stderr, "generate: {}\n", e.what());
    return 1;
  }
}
