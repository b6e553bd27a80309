// An OpenAI-compatible HTTP server over tlm's generator and chat session.
//
//   serve [--model PATH] [--config NAME] [--lora FILE [--lora-scale S]]... [--host ADDR] [--port N] [--parallel N]
//         [--threads T] [--queue N] [--ctx N] [--kv-budget MIB] [--kv-type f32|q8] [--prefill-chunk N]
//         [--no-prefix-cache] [--max-tokens N] [--max-body BYTES] [--api-key KEY] [--name ID]
//         [--cors ORIGIN] [--max-connections N] [--read-timeout S] [--chat-template NAME]
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions (both with "stream": true as
// server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus' text format),
// GET /slots (what each sequence is doing). One model serves every request: a scheduler
// (tlm/serving/scheduler.hpp) advances all running requests by one token per step in one batched
// forward pass, runs new prompts in chunks between steps, and reuses the cached prefix of
// an earlier request (a system prompt, a chat's earlier turns). Requests beyond --parallel
// wait in a bounded queue; beyond that they get 503.
#include <tlm/config_match.hpp>
#include <tlm/configs.hpp>
#include <tlm/generate.hpp>
#include <tlm/generation/json_schema.hpp>
#include <tlm/generation/tools.hpp>
#include <tlm/generation/sampler.hpp>
#include <tlm/model.hpp>
#include <tlm/serving/scheduler.hpp>
#include <tlm/text/chat.hpp>
#include <tlm/text/tokenizer.hpp>

#include "cli.hpp"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/random.h>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <functional>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

using json = nlohmann::ordered_json;  // keeps the order of a schema's properties, which tlm writes in that order

// {configs} stands for tlm's list of config names, so a config added there is offered here.
constexpr std::string_view usage_format = R"(usage: serve [options]
  --model PATH       GGUF file (default: $TLM_MODEL or models/SmolLM2-135M-Instruct.Q4_1.gguf)
  --config NAME      config type to bind the file to (default: the one whose hyperparameters
                     --model's file has; smollm2_135m for the default file):
                     {configs}
  --host ADDR        address to listen on (default 127.0.0.1: this machine only)
  --port N           TCP port (default 8080; 0 picks a free one, printed on the first line)
  --parallel N       requests generated at once, decoded together in one batch, each with
                     its own KV cache (default 4; --slots N is the same option)
  --threads T        matrix-kernel threads of the one model (default: the cores)
  --queue N          requests that may wait beyond --parallel; more get 503 (default 32)
  --kv-budget MIB    KV cache memory over all requests, in MiB (default: no limit); a request
                     that does not fit waits, one that cannot fit alone gets 400
  --kv-type T        the KV caches' element type: f32 (default) or q8 (3.76x smaller)
  --prefill-chunk N  prompt tokens run between two decode steps (default 128): a long prompt
                     delays the running requests' next token by one chunk, not by all of it
  --no-prefix-cache  run every prompt whole (default: reuse the longest prefix an earlier
                     request left in a cache)
  --pooling P        how /v1/embeddings pools a text's final hidden states: mean (default)
                     or last (the last position's); either way scaled to unit length
  --lora FILE        apply a LoRA adapter (llama.cpp's adapter GGUF) to every request; repeatable
  --lora-scale S     the scale of the --lora just before it (default 1; effective: S * alpha / rank)
  --ctx N            positions per request, prompt plus max_tokens (default 4096; at most the context)
  --max-tokens N     the largest max_tokens a request may ask for, and the default of a chat
                     request (default 1024; a completion request defaults to 16, as OpenAI's)
  --max-body BYTES   the largest request body (default 1048576); larger ones get 413
  --api-key KEY      require "Authorization: Bearer KEY" on every endpoint but /health (else 401);
                     also read from $TLM_API_KEY
  --name ID          the model id reported by /v1/models and in responses (default: the file's stem);
                     a request's "model" field is not checked against it
  --cors ORIGIN      answer browsers from ORIGIN (repeatable; * for any) with CORS headers
                     and preflight OPTIONS requests (default: no CORS headers)
  --max-connections N  open connections served at once, one thread each (default 256); more
                     wait until one closes. Also the listen backlog: as many may connect at once
  --read-timeout S   a connection that sends nothing for S seconds while its request is
                     read is closed (default 10); one that sends no request at all is
                     closed after 2 s
  --chat-template NAME  render chat requests with this template instead of the file's
                     ({templates})
  -h, --help         this text
A request's sampling fields are generate's sampling options (tlm/generation/sampling_options.hpp), by the
same names and with the same ranges: temperature, top_p, frequency_penalty, presence_penalty,
logit_bias and seed as OpenAI's; top_k, min_p, repeat_penalty and penalty_window besides.
Their defaults are generate's, except OpenAI's temperature 1 and a random seed.
)";

std::string usage() {
  return fmt::format(fmt::runtime(usage_format), fmt::arg("configs", tlm::config_names_text()),
                     fmt::arg("templates", tlm::chat_template_names()));
}

using cli::fail;

struct options {
  std::string model, config, host = "127.0.0.1", api_key, name;  // config empty: chosen from the file
  bool model_given = false;
  std::string chat_template;  // --chat-template; empty: the file's
  std::vector<std::string> cors;
  std::vector<std::pair<std::string, float>> loras;  // --lora FILE, --lora-scale S
  std::size_t port = 8080, slots = 4, threads = 0, queue = 32, ctx = 4096, max_tokens = 1024, max_body = 1 << 20,
              max_connections = 256, read_timeout = 10, kv_budget_mib = 0, prefill_chunk = 128;
  tlm::kv_type kv = tlm::kv_type::f32;
  bool prefix_cache = true;
  tlm::pooling pooling = tlm::pooling::mean;
};

std::uint64_t to_whole(std::string_view flag, const std::string& v, std::uint64_t lo, std::uint64_t hi) {
  return cli::whole(flag, v, lo, hi);
}

options parse(int argc, char** argv) {
  options o;
  const char* env = std::getenv("TLM_MODEL");
  o.model = env ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (const char* key = std::getenv("TLM_API_KEY")) o.api_key = key;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(fmt::format("{} needs a value\n{}", a, usage()));
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      fmt::print("{}", usage());
      std::exit(0);
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
    else if (a == "--host") o.host = value();
    else if (a == "--port") o.port = to_whole(a, value(), 0, 65535);
    else if (a == "--slots" || a == "--parallel") o.slots = to_whole(a, value(), 1, 256);
    else if (a == "--kv-budget") o.kv_budget_mib = to_whole(a, value(), 1, std::uint64_t{1} << 24);
    else if (a == "--kv-type") {
      const std::string t = value();
      if (t == "f32") o.kv = tlm::kv_type::f32;
      else if (t == "q8") o.kv = tlm::kv_type::q8;
      else fail(fmt::format("--kv-type takes f32 or q8, got '{}'", t));
    }
    else if (a == "--prefill-chunk") o.prefill_chunk = to_whole(a, value(), 1, 1 << 20);
    else if (a == "--no-prefix-cache") o.prefix_cache = false;
    else if (a == "--pooling") {
      const std::string t = value();
      if (t == "mean") o.pooling = tlm::pooling::mean;
      else if (t == "last") o.pooling = tlm::pooling::last;
      else fail(fmt::format("--pooling takes mean or last, got '{}'", t));
    }
    else if (a == "--threads") o.threads = to_whole(a, value(), 1, 1024);
    else if (a == "--queue") o.queue = to_whole(a, value(), 0, 100000);
    else if (a == "--ctx") o.ctx = to_whole(a, value(), 2, 1 << 20);
    else if (a == "--max-tokens") o.max_tokens = to_whole(a, value(), 1, 1 << 20);
    else if (a == "--max-body") o.max_body = to_whole(a, value(), 64, std::uint64_t{1} << 32);
    else if (a == "--api-key") {
      o.api_key = value();
      if (o.api_key.empty()) fail("--api-key needs a non-empty key; leave the option out to serve without one");
    } else if (a == "--name") o.name = value();
    else if (a == "--chat-template") {
      o.chat_template = value();
      (void)tlm::chat_template::named(o.chat_template);  // an unknown name lists the names
    }
    else if (a == "--cors") {
      o.cors.push_back(value());
      if (o.cors.back().empty()) fail("--cors needs an origin such as https://example.com, or * for any");
    } else if (a == "--max-connections") o.max_connections = to_whole(a, value(), 1, 100000);
    else if (a == "--read-timeout") o.read_timeout = to_whole(a, value(), 1, 3600);
    else fail(fmt::format("unknown option '{}'\n{}", a, usage()));
  }
  if (!o.config.empty() && !tlm::program_configs::contains(o.config))
    fail(tlm::unknown_config(o.config, "--config"));
  o.threads = tlm::threads_or_every_core(o.threads);
  if (o.name.empty()) o.name = std::filesystem::path(o.model).stem().string();
  return o;
}

// A request the server refuses: the HTTP status and OpenAI's error fields.
struct api_error : std::runtime_error {
  api_error(int status_, std::string message, std::string param_ = {}, std::string code_ = {},
            std::string type_ = "invalid_request_error")
      : std::runtime_error(std::move(message)), status(status_), param(std::move(param_)), code(std::move(code_)),
        type(std::move(type_)) {}
  int status;
  std::string param, code, type;
};

json error_body(const std::string& message, const std::string& type, const std::string& param, const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

// Model output and echoed input may hold bytes that are not UTF-8; they are replaced
// rather than allowed to throw out of a response.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const api_error& e) {
  res.status = e.status;
  res.set_content(dump(error_body(e.what(), e.type, e.param, e.code)), "application/json");
}

// Equal keys take the same time whatever their contents, so the time a wrong key takes
// does not tell how much of it was right.
bool same_key(std::string_view given, std::string_view expected) {
  unsigned diff = given.size() == expected.size() ? 0u : 1u;
  for (std::size_t i = 0; i < given.size(); ++i) {
    const char e = expected.empty() ? '\0' : expected[i % expected.size()];
    diff |= static_cast<unsigned char>(given[i] ^ e);
  }
  return diff == 0;
}

// The key of "Authorization: Bearer KEY", or nothing. The scheme's name is
// case-insensitive (RFC 9110, 11.1), and clients send "bearer" as well as "Bearer".
std::optional<std::string_view> bearer_token(std::string_view auth) {
  constexpr std::string_view scheme = "bearer";
  if (auth.size() <= scheme.size() || auth[scheme.size()] != ' ') return std::nullopt;
  for (std::size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(auth[i])) != scheme[i]) return std::nullopt;
  auth.remove_prefix(scheme.size());
  while (!auth.empty() && auth.front() == ' ') auth.remove_prefix(1);
  return auth;
}

// A request id nobody can guess from another (sequential ids tell how busy the server
// is and name other users' requests): 128 bits from the kernel's generator.
std::string random_id(std::string_view prefix) {
  unsigned char bytes[16];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
    else if (errno != EINTR) throw std::runtime_error("getrandom failed; the kernel gives no random bytes");
  }
  std::string id(prefix);
  id += '-';
  for (const unsigned char b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

// The descriptors of this process's sockets, in turn, until `f` returns true; returns that
// descriptor, or -1.
template <class F>
int find_socket(F&& f) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage self{};
    socklen_t self_len = sizeof self;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0) continue;
    if (f(fd, self, self_len)) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

bool numeric_address(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV))
    return false;
  host = h;
  port = std::atoi(p);
  return true;
}

// httplib 0.11 gives a handler neither its socket nor word that the client left, so a
// non-streaming request would be generated to its end for nobody. The connection's socket
// is the open descriptor whose two ends are the request's addresses; the handler's thread
// owns it until the handler returns, so it cannot be closed and reused meanwhile.
// Returns -1 if none matches (then the request runs to its end, as before).
int connection_socket(const httplib::Request& req) {
  return find_socket([&](int fd, const sockaddr_storage& self, socklen_t self_len) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
    std::string peer_host, self_host;
    int peer_port = -1, self_port = -1;
    return numeric_address(peer, peer_len, peer_host, peer_port) && numeric_address(self, self_len, self_host, self_port) &&
           peer_host == req.remote_addr && peer_port == req.remote_port && self_port == req.local_port;
  });
}

// Debian's httplib 0.11 is a compiled library that listens with a backlog of 5: 16 clients
// connecting at once overflow it (measured: the kernel's ListenOverflows counter), their
// SYNs are dropped and retried a second later. The likely cause of the two connections
// reset in serve_batching under ThreadSanitizer: a connection accepted that late has its
// request arrive after httplib's 2 s wait for it (the reset itself was not reproduced).
// Listening again on a listening socket only sets its backlog (Linux), so it is raised
// here to the number of connections served at once; the kernel caps it at
// net.core.somaxconn.
void widen_backlog(int port, int backlog) {
  const int fd = find_socket([&](int candidate, const sockaddr_storage& self, socklen_t self_len) {
    int listening = 0;
    socklen_t len = sizeof listening;
    std::string host;
    int self_port = -1;
    return getsockopt(candidate, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening &&
           numeric_address(self, self_len, host, self_port) && self_port == port;
  });
  if (fd < 0 || ::listen(fd, backlog) != 0)
    fmt::print(stderr, "serve: warning: could not raise the listen backlog to {} ({}); clients connecting at once "
               "beyond 5 may wait a second or more\n", backlog, fd < 0 ? "no listening socket found" : std::strerror(errno));
}

// Whether the client has closed its end (or the connection broke).
bool peer_left(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// Requests nest a few levels (messages, content parts, a schema of up to 8 levels);
// deeper JSON is refused before it is parsed, so nothing later recurses over it.
constexpr std::size_t max_body_depth = 64;
// OpenAI takes up to 2048 texts per embeddings request; so does tlm.
constexpr std::size_t max_embedding_inputs = 2048;

// The fields of a request, checked one by one so that a wrong type names its field.
struct request_reader {
  const json& body;

  const json* find(std::string_view key) const {
    const auto it = body.find(std::string(key));
    return it == body.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] static void wrong(std::string_view key, const std::string& what) {
    throw api_error(400, fmt::format("'{}' {}", key, what), std::string(key), "invalid_type");
  }
  // `give`: what the refusal says to give instead, if more than the range.
  std::optional<std::uint64_t> whole(std::string_view key, std::uint64_t lo, std::uint64_t hi, std::string_view give = {}) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) wrong(key, "must be a whole number");
    const bool negative = !v->is_number_unsigned() && v->get<std::int64_t>() < 0;
    const std::uint64_t n = negative ? 0 : v->get<std::uint64_t>();
    if (negative || n < lo || n > hi)
      throw api_error(400, fmt::format("'{}' {} is outside [{}, {}]{}{}", key, v->dump(), lo, hi, give.empty() ? "" : "; give ", give),
                      std::string(key), "invalid_value");
    return n;
  }
  bool boolean(const char* key, bool dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_boolean()) wrong(key, "must be true or false");
    return v->get<bool>();
  }
};

// A Prometheus histogram: counts per upper bound (not yet cumulative; the exposition
// sums them), their sum and count. Guarded by its owner's mutex.
struct histogram {
  explicit histogram(std::vector<double> bounds_) : bounds(std::move(bounds_)), counts(bounds.size() + 1, 0) {}
  void observe(double v) {
    const auto at = std::lower_bound(bounds.begin(), bounds.end(), v);  // le: the first bound >= v
    ++counts[static_cast<std::size_t>(at - bounds.begin())];
    sum += v;
    ++count;
  }
  void write(std::string& out, std::string_view name, std::string_view help) const {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    std::uint64_t below = 0;
    for (std::size_t i = 0; i < bounds.size(); ++i) {
      below += counts[i];
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds[i], below);
    }
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count, name, sum, name, count);
  }
  std::vector<double> bounds;
  std::vector<std::uint64_t> counts;  // counts[bounds.size()]: above the last bound
  double sum = 0;
  std::uint64_t count = 0;
};

// The endpoint label of a request: its route, or "other" for a path no route has, so
// that clients probing random paths cannot grow the metrics without bound.
std::string endpoint_label(const std::string& path) {
  static constexpr std::string_view known[] = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                                               "/v1/models", "/health", "/metrics", "/slots"};
  for (const std::string_view k : known)
    if (path == k) return path;
  if (path.starts_with("/v1/models/")) return "/v1/models/{id}";
  return "other";
}

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A request's sampling fields, read by tlm's option table: the names and ranges of
// generate's flags and Python's keywords. The server's own defaults: OpenAI's temperature
// 1, and a fresh random seed unless the request gives one.
template <tlm::LlamaConfig C>
tlm::sampling read_sampling(const request_reader& r) {
  tlm::sampling s;
  s.temperature = tlm::server_temperature;
  s.seed = std::random_device{}();
  for (const auto& o : tlm::sampling_options) {
    const json* v = r.find(o.name);
    if (!v) continue;
    const std::string name(o.name);
    switch (o.kind) {
      case tlm::option_kind::real:
        if (!v->is_number()) r.wrong(name, "must be a number");
        if (!o.accepts(v->get<double>())) throw api_error(400, o.out_of_range("'" + name + "'", v->dump()), name, "invalid_value");
        o.set_real(s, v->get<double>());
        break;
      case tlm::option_kind::whole:
        o.set_whole(s, *r.whole(name, static_cast<std::uint64_t>(o.lo), static_cast<std::uint64_t>(o.hi), o.help));
        break;
      case tlm::option_kind::seed:
        o.set_whole(s, *r.whole(name, 0, std::numeric_limits<std::uint64_t>::max(), o.help));
        break;
      case tlm::option_kind::token_bias:
        if (!v->is_object()) r.wrong(name, fmt::format("must be an object mapping token ids to numbers in {}", o.range_text()));
        for (const auto& [key, b] : v->items()) {
          // Decimal digits only, below the vocabulary: std::stoul would take " 5" or "-1".
          const bool digits = !key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos;
          if (!digits || std::stoull(key) >= C::vocab)
            throw api_error(400, fmt::format("'{}' key '{}' is not a token id from 0 to {}", name, key, C::vocab - 1), name,
                            "invalid_value");
          if (!b.is_number() || !o.accepts(b.template get<double>()))
            throw api_error(400, o.out_of_range(fmt::format("'{}' for token {}", name, key), b.dump()), name, "invalid_value");
          s.logit_bias.emplace_back(static_cast<std::int32_t>(std::stoull(key)), static_cast<float>(b.template get<double>()));
        }
        break;
    }
  }
  return s;
}

// What a request asks for, once checked.
struct parsed_request {
  bool chat = false, stream = false, include_usage = false;
  std::string prompt;                      // completions
  std::vector<tlm::chat_message> messages;  // chat, as rendered (tool calls and results written as text)
  tlm::generation_options gen;
  std::optional<std::size_t> max_tokens;
  bool tools = false;  // the reply may be a tool call (tools given, tool_choice not none)
};

template <tlm::LlamaConfig C>
class server {
 public:
  server(const options& o) : o_(o) {
    // The options are checked before the file is mapped.
    if (o_.ctx > C::context)
      fail(fmt::format("--ctx {} is more than the context of {} ({} positions)", o_.ctx, tlm::config_name<C>(), C::context));
    if (o_.max_tokens >= o_.ctx)
      fail(fmt::format("--max-tokens {} leaves no room for a prompt in --ctx {}; lower it or raise --ctx", o_.max_tokens, o_.ctx));
    m_ = std::make_unique<tlm::model<C>>(tlm::model<C>::load(o.model, {.threads = o.threads}));
    for (const auto& [file, scale] : o.loras) m_->add_lora(file, scale);
    tok_ = std::make_unique<tlm::tokenizer>(tlm::tokenizer::from_gguf(m_->file()));
    // Renders chat requests into tokens and counts them; it never runs the model (its
    // cache of one position is never used).
    counter_ = std::make_unique<tlm::chat_session<C>>(*m_, *tok_,
                                                      tlm::chat_options{.capacity = 1, .chat_template = o_.chat_template});
    sched_ = std::make_unique<tlm::scheduler<C>>(
        *m_, *tok_,
        tlm::scheduler_options{.parallel = o_.slots,
                               .kv_budget = o_.kv_budget_mib << 20,
                               .kv = o_.kv,
                               .prefill_chunk = o_.prefill_chunk,
                               .queue = o_.queue,
                               .prefix_cache = o_.prefix_cache});
    created_ = static_cast<std::int64_t>(std::time(nullptr));
  }

  // Ends the running generations at their next step, and refuses the queued requests.
  void stop() { sched_->stop(); }

  // httplib answers some requests without reading their body (the API key's refusal
  // before routing, a path no route has, a body over --max-body) and then reads the
  // connection's next request starting inside that unread body: a keep-alive client
  // (the openai package, a browser) would get 400 for its next, valid request. An
  // error answer to a request that came with a body therefore asks the client to
  // close; which refusals left the body unread is httplib's business, and an error's
  // reconnect costs little.
  static void close_if_body_may_be_unread(const httplib::Request& req, httplib::Response& res) {
    const bool has_body = req.has_header("Transfer-Encoding") ||
                          (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
    if (has_body && res.status >= 400) res.set_header("Connection", "close");
  }

  void routes(httplib::Server& svr) {
    // A body with a Content-Length over the limit is refused by httplib; chunked and
    // length-less bodies are counted while they are read (read_body).
    svr.set_payload_max_length(o_.max_body);
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // A browser's preflight carries no credentials, so OPTIONS needs no key.
      if (o_.api_key.empty() || req.path == "/health" || req.method == "OPTIONS")
        return httplib::Server::HandlerResponse::Unhandled;
      const std::string auth = req.get_header_value("Authorization");  // outlives the view bearer_token returns
      const auto key = bearer_token(auth);
      if (key && same_key(*key, o_.api_key)) return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, api_error(401, "missing or wrong API key; send the header 'Authorization: Bearer KEY' with the key "
                                     "the server was started with (--api-key)",
                                {}, "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    });
    // Statuses httplib sets itself (404 for a path no route has, 413 for a body over
    // the limit, 400 for a request it cannot parse) get an OpenAI-style body too.
    svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string message = fmt::format("HTTP {}", res.status);
      std::string code;
      if (res.status == 404) {
        message = fmt::format("no endpoint {} {}; the endpoints are POST /v1/chat/completions, POST /v1/completions, "
                              "POST /v1/embeddings, GET /v1/models, GET /health, GET /metrics and GET /slots",
                              req.method, req.path);
        code = "not_found";
      } else if (res.status == 413) {
        message = "the request body is larger than the server's limit (--max-body); send a shorter request";
        code = "request_too_large";
      } else if (res.status == 400) {
        message = "the HTTP request could not be parsed";
      }
      res.set_content(dump(error_body(message, "invalid_request_error", "", code)), "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, api_error(500, "internal error: " + what + "; please report it", {}, "internal_error", "server_error"));
    });
    // CORS on every response, refusals included, so that a browser shows the error body.
    // Requests are counted here because httplib calls this for every response it writes,
    // before writing it (refusals by the pre-routing handler, 404, 413 and unparsable
    // requests included): a client that has read an answer finds it counted.
    svr.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      count_request(req, res);
      add_cors(req, res);
      close_if_body_may_be_unread(req, res);
    });
    svr.Options(R"(/.*)", [](const httplib::Request&, httplib::Response& res) {
      res.status = 204;
      res.set_header("Allow", "GET, POST, OPTIONS");
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const auto st = sched_->status();
      res.set_content(dump({{"status", "ok"}, {"slots", o_.slots}, {"busy", st.active}, {"queued", st.queued}}),
                      "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    svr.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump(slots_json()), "application/json");
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump({{"object", "list"}, {"data", json::array({model_entry()})}}), "application/json");
    });
    svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string asked = req.matches[1];
      if (asked != o_.name)
        return send_error(res, api_error(404, fmt::format("the model '{}' does not exist; this server has '{}'", asked, o_.name),
                                         "model", "model_not_found"));
      res.set_content(dump(model_entry()), "application/json");
    });
    // The body is read by the handler (read_body), whatever its Content-Type: httplib
    // would otherwise parse a form-encoded body itself, and refuse one over 8 KiB.
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                            const httplib::ContentReader& reader) { handle(req, res, reader, true); });
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                       const httplib::ContentReader& reader) { handle(req, res, reader, false); });
    svr.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) { embeddings(req, res, reader); });
    // Any other request with a body is answered 404 (by the error handler) without reading
    // it: httplib would otherwise read a chunked body of any size into memory first.
    const auto unknown = [](const httplib::Request&, httplib::Response& res, const httplib::ContentReader&) {
      res.status = 404;
    };
    svr.Post(R"(/.*)", unknown);
    svr.Put(R"(/.*)", unknown);
    svr.Patch(R"(/.*)", unknown);
    svr.Delete(R"(/.*)", unknown);
  }

 private:
  // What the scheduler's thread hands to the thread that answers one request: the text of
  // each token as it comes, then how the request ended.
  struct channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> pieces;
    std::optional<tlm::sequence_outcome> outcome;
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    // Written by the scheduler's thread only.
    std::chrono::steady_clock::time_point arrived, first, last;
    std::size_t produced = 0;
  };

  void count_request(const httplib::Request& req, const httplib::Response& res) {
    const std::string endpoint = endpoint_label(req.path);
    std::lock_guard lock(stats_mu_);
    ++requests_[{endpoint, res.status}];
  }

  std::string metrics_text() {
    const auto st = sched_->status();
    std::lock_guard lock(stats_mu_);
    std::string out;
    const auto one = [&](std::string_view name, std::string_view type, std::string_view help, auto value) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
    };
    out += "# HELP tlm_requests_total HTTP requests answered, by endpoint and status code.\n"
           "# TYPE tlm_requests_total counter\n";
    for (const auto& [key, n] : requests_)
      out += fmt::format("tlm_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
    one("tlm_prompt_tokens_total", "counter", "Prompt tokens of the requests (usage.prompt_tokens), cached ones included.",
        prompt_tokens_);
    one("tlm_generated_tokens_total", "counter", "Tokens generated (usage.completion_tokens).", generated_tokens_);
    ttft_.write(out, "tlm_time_to_first_token_seconds",
                "Seconds from a request's arrival at its handler to its first generated token.");
    tpot_.write(out, "tlm_time_per_output_token_seconds",
                "Mean seconds between the generated tokens of a reply, once per reply of two tokens or more.");
    one("tlm_queue_length", "gauge", "Requests waiting for a sequence.", st.queued);
    one("tlm_active_sequences", "gauge", "Requests being generated.", st.active);
    one("tlm_slots", "gauge", "Sequences decoded together (--parallel).", o_.slots);
    one("tlm_kv_cache_bytes", "gauge", "Bytes of KV cache allocated across the sequences.", st.kv_bytes);
    one("tlm_prefix_cache_hits_total", "counter", "Requests that found part of their prompt in a cache.", st.prefix_hits);
    one("tlm_prefix_cache_tokens_total", "counter", "Prompt tokens taken from the prefix cache instead of run again.",
        st.reused_tokens);
    one("tlm_prefix_cache_running_copies_total", "counter",
        "Prefix cache hits copied from a sequence that was still running (requests sharing a prompt at once).",
        st.running_donations);
    one("tlm_decode_steps_total", "counter", "Batched decode steps.", st.steps);
    one("tlm_decode_rows_total", "counter", "Sequences advanced by those steps (rows / steps: the mean batch).",
        st.batched_rows);
    return out;
  }

  json slots_json() {
    const auto now = std::chrono::steady_clock::now();
    const auto st = sched_->status();
    json out = json::array();
    for (std::size_t i = 0; i < st.sequences.size(); ++i) {
      const auto& s = st.sequences[i];
      const bool idle = s.state == "idle";
      out.push_back({{"id", i},
                     {"state", s.state},
                     {"request_id", idle ? json(nullptr) : json(s.tag)},
                     {"prompt_tokens", s.prompt_tokens},
                     {"generated_tokens", s.generated_tokens},
                     {"cached_tokens", s.cached_tokens},
                     {"ctx", o_.ctx},
                     {"started", idle ? json(nullptr) : json(seconds_between(s.started, now))}});
    }
    return out;
  }

  void add_cors(const httplib::Request& req, httplib::Response& res) const {
    if (o_.cors.empty()) return;
    const std::string origin = req.get_header_value("Origin");
    const bool any = std::find(o_.cors.begin(), o_.cors.end(), "*") != o_.cors.end();
    if (!any && (origin.empty() || std::find(o_.cors.begin(), o_.cors.end(), origin) == o_.cors.end())) return;
    res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any) res.set_header("Vary", "Origin");
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "600");
    }
  }

  json model_entry() const { return {{"id", o_.name}, {"object", "model"}, {"created", created_}, {"owned_by", "tlm"}}; }

  static std::string text_of(const json& content, std::size_t i) {
    const std::string key = fmt::format("messages[{}].content", i);
    if (content.is_string()) return content.get<std::string>();
    if (content.is_array()) {
      std::string out;
      for (const auto& part : content) {
        if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string())
          throw api_error(400, fmt::format("'{}' parts must be {{\"type\": \"text\", \"text\": \"...\"}}; tlm reads text only", key),
                          key, "invalid_type");
        out += part["text"].get<std::string>();
      }
      return out;
    }
    throw api_error(400, fmt::format("'{}' must be a string or an array of text parts", key), key, "invalid_type");
  }

  // The messages as the template renders them: tool results become user turns of
  // <tool_response> blocks (consecutive ones in one turn), an assistant's tool calls are
  // written after its text.
  void read_messages(const json& msgs, parsed_request& p) const {
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      const json& m = msgs[i];
      const std::string key = fmt::format("messages[{}]", i);
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw api_error(400, fmt::format("'{}' must be an object with a string 'role'", key), key, "invalid_type");
      std::string role = m["role"].get<std::string>();
      if (role == "developer") role = "system";  // OpenAI's newer name for the system role
      if (role != "system" && role != "user" && role != "assistant" && role != "tool")
        throw api_error(400, fmt::format("'{}.role' is '{}'; tlm takes system, developer, user, assistant or tool", key, role),
                        key + ".role", "invalid_value");
      const bool calls = role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null();
      if ((!m.contains("content") || m["content"].is_null()) && !calls)
        throw api_error(400, fmt::format("'{}.content' is required", key), key + ".content", "missing");
      std::string content = m.contains("content") && !m["content"].is_null() ? text_of(m["content"], i) : std::string();
      if (role == "tool") {
        const std::string block = tlm::tools::response_block(content);
        if (!p.messages.empty() && p.messages.back().role == "user" && i > 0 && msgs[i - 1].value("role", "") == "tool")
          p.messages.back().content += "\n" + block;
        else
          p.messages.push_back({"user", block});
        continue;
      }
      if (calls) {
        const json& tc = m["tool_calls"];
        if (!tc.is_array()) throw api_error(400, fmt::format("'{}.tool_calls' must be an array", key), key + ".tool_calls", "invalid_type");
        for (std::size_t j = 0; j < tc.size(); ++j) {
          const std::string ck = fmt::format("{}.tool_calls[{}]", key, j);
          const json* f = tc[j].is_object() && tc[j].contains("function") ? &tc[j]["function"] : nullptr;
          if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
            throw api_error(400, fmt::format("'{}' must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}", ck),
                            ck, "invalid_type");
          json args = json::object();
          if (f->contains("arguments") && !(*f)["arguments"].is_null()) {
            const json& a = (*f)["arguments"];
            if (a.is_string()) {
              try {
                args = json::parse(a.get<std::string>());
              } catch (const json::exception&) {
                throw api_error(400, fmt::format("'{}.function.arguments' is not valid JSON; give the arguments as a JSON "
                                                 "object in a string, as the call returned them", ck),
                                ck, "invalid_value");
              }
            } else {
              args = a;
            }
          }
          if (!content.empty()) content += "\n";
          content += tlm::tools::call_text((*f)["name"].get<std::string>(), args);
        }
      }
      p.messages.push_back({role, std::move(content)});
    }
  }

  // `tools`, `tool_choice` and `parallel_tool_calls` read into tools::apply, which puts the
  // signatures in the system message and holds the reply to calls of the tools with
  // arguments valid against their schemas (required, or a named function), or to words or
  // such calls (auto); several calls, newline-separated, unless parallel_tool_calls is false.
  void read_tools(const request_reader& r, parsed_request& p) const {
    using tlm::tools::choice;
    choice c;
    if (const json* given = r.find("tool_choice")) {
      if (given->is_string()) {
        const std::string s = given->get<std::string>();
        if (s == "none") c.k = choice::kind::none;
        else if (s == "required") c.k = choice::kind::required;
        else if (s != "auto")
          throw api_error(400, fmt::format("'tool_choice' is '{}'; give none, auto, required or "
                                           "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", s),
                          "tool_choice", "invalid_value");
      } else if (given->is_object() && given->contains("function") && (*given)["function"].is_object() &&
                 (*given)["function"].contains("name") && (*given)["function"]["name"].is_string()) {
        c = {choice::kind::named, (*given)["function"]["name"].get<std::string>()};
      } else {
        r.wrong("tool_choice", "must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
    }
    bool parallel = true;  // OpenAI's default
    if (const json* pc = r.find("parallel_tool_calls")) {
      if (!pc->is_boolean()) r.wrong("parallel_tool_calls", "must be true or false");
      parallel = pc->get<bool>();
    }
    const json* t = r.find("tools");
    const json none = json::array();
    try {
      p.tools = tlm::tools::apply(t ? *t : none, c, parallel, p.messages, counter_->format().default_system(), p.gen);
    } catch (const tlm::tools::grammar_conflict&) {
      throw api_error(400, "'response_format' and 'tools' cannot hold one reply together; give one of them",
                      "response_format", "unsupported");
    } catch (const tlm::tools::tool_error& e) {
      throw api_error(400, e.what(), e.field, e.wrong_type ? "invalid_type" : "invalid_value");
    }
  }

  parsed_request read(const json& body, bool chat) const {
    if (!body.is_object()) throw api_error(400, "the request body must be a JSON object", {}, "invalid_type");
    const request_reader r{body};
    parsed_request p;
    p.chat = chat;
    if (const json* m = r.find("model"); m && !m->is_string()) r.wrong("model", "must be a string");
    if (chat) {
      const json* msgs = r.find("messages");
      if (!msgs) throw api_error(400, "'messages' is required: an array of {\"role\", \"content\"} objects", "messages", "missing");
      if (!msgs->is_array() || msgs->empty())
        throw api_error(400, "'messages' must be a non-empty array of {\"role\", \"content\"} objects", "messages", "invalid_type");
      read_messages(*msgs, p);
    } else {
      const json* pr = r.find("prompt");
      if (!pr) throw api_error(400, "'prompt' is required: a string", "prompt", "missing");
      if (pr->is_array() && pr->size() == 1 && (*pr)[0].is_string()) p.prompt = (*pr)[0].get<std::string>();
      else if (pr->is_string()) p.prompt = pr->get<std::string>();
      else if (pr->is_array())
        throw api_error(400, "'prompt' as an array must hold exactly one string (n and batches of prompts are not supported)",
                        "prompt", "invalid_value");
      else r.wrong("prompt", "must be a string");
      if (p.prompt.empty()) throw api_error(400, "'prompt' is empty; give some text", "prompt", "invalid_value");
      if (r.boolean("echo", false)) throw api_error(400, "'echo' is not supported; leave it out", "echo", "unsupported");
      if (const json* s = r.find("suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
        throw api_error(400, "'suffix' is not supported; leave it out", "suffix", "unsupported");
      if (const auto b = r.whole("best_of", 1, 1); b && *b != 1)
        throw api_error(400, "'best_of' must be 1", "best_of", "unsupported");
    }
    if (const auto n = r.whole("n", 0, std::numeric_limits<std::uint32_t>::max()); n && *n != 1)
      throw api_error(400, fmt::format("'n' is {}; tlm's server generates one choice per request, so n must be 1", *n), "n",
                      "unsupported");
    if (const json* lp = r.find("logprobs"); lp && !(lp->is_boolean() && !lp->get<bool>()))
      throw api_error(400, "'logprobs' is not supported; leave it out or give false", "logprobs", "unsupported");
    p.stream = r.boolean("stream", false);
    if (const json* so = r.find("stream_options")) {
      if (!so->is_object()) r.wrong("stream_options", "must be an object");
      const request_reader sr{*so};
      p.include_usage = sr.boolean("include_usage", false);
    }
    const char* mt_key = chat && r.find("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (const auto mt = r.whole(mt_key, 1, o_.max_tokens)) p.max_tokens = static_cast<std::size_t>(*mt);
    else if (!chat) p.max_tokens = std::min<std::size_t>(16, o_.max_tokens);
    p.gen.sample = read_sampling<C>(r);
    if (const json* st = r.find("stop")) {
      const auto add = [&](const json& v) {
        if (!v.is_string()) r.wrong("stop", "must be a string or an array of strings");
        if (v.get<std::string>().empty()) throw api_error(400, "'stop' strings must not be empty", "stop", "invalid_value");
        p.gen.stop.push_back(v.get<std::string>());
      };
      if (st->is_array()) {
        if (st->size() > 4) throw api_error(400, "'stop' takes at most 4 strings", "stop", "invalid_value");
        for (const auto& v : *st) add(v);
      } else {
        add(*st);
      }
    }
    if (const json* rf = r.find("response_format")) {
      if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
        r.wrong("response_format", "must be an object with a string 'type' (text, json_object or json_schema)");
      const std::string type = (*rf)["type"];
      if (type == "json_object") {
        p.gen.grammar = std::make_shared<const tlm::json_grammar>();
      } else if (type == "json_schema") {
        const auto js = rf->find("json_schema");
        if (js == rf->end() || !js->is_object() || !js->contains("schema"))
          throw api_error(400, "'response_format.json_schema' must be an object with a 'schema'", "response_format",
                          "invalid_value");
        try {
          // Compiled from the parsed value: its depth and size are checked first, without recursion.
          p.gen.grammar = std::make_shared<const tlm::json_grammar>(tlm::json_schema::from_json((*js)["schema"]));
        } catch (const tlm::error& e) {
          throw api_error(400, fmt::format("'response_format.json_schema.schema': {}", e.what()), "response_format",
                          "invalid_value");
        }
      } else if (type != "text") {
        throw api_error(400, fmt::format("'response_format.type' is '{}'; give text, json_object or json_schema", type),
                        "response_format", "invalid_value");
      }
    }
    if (chat) read_tools(r, p);  // after response_format, which it may not join
    if (const std::string problem = tlm::sampling_problem(p.gen.sample); !problem.empty())
      throw api_error(400, "sampling: " + problem, {}, "invalid_value");
    return p;
  }

  // Tokenizes the prompt as the generator and the chat session do, checks it fits, and
  // settles max_tokens.
  std::vector<std::int32_t> prompt_ids(parsed_request& p) const {
    std::vector<std::int32_t> ids;
    try {
      if (p.chat) {
        // The session's own tokens: a "<|im_end|>" typed in a message is text to it, not
        // the one special token a rendered template would give.
        ids = counter_->prompt_for(p.messages);
      } else {
        ids = tok_->encode(p.prompt, {.parse_special = false});  // as the generator does
      }
    } catch (const tlm::error& e) {
      throw api_error(400, fmt::format("the prompt cannot be tokenized: {}", e.what()), p.chat ? "messages" : "prompt",
                      "invalid_value");
    }
    const std::size_t n = ids.size();
    if (n == 0) throw api_error(400, "the prompt is empty after tokenization; give some text", "prompt", "invalid_value");
    if (n >= o_.ctx)
      throw api_error(400, fmt::format("the prompt has {} tokens; this server takes at most {} per request (--ctx), "
                                       "prompt and completion together; shorten it",
                                       n, o_.ctx - 1),
                      p.chat ? "messages" : "prompt", "context_length_exceeded");
    if (!p.max_tokens) p.max_tokens = std::min(o_.max_tokens, o_.ctx - n);
    if (n + *p.max_tokens > o_.ctx)
      throw api_error(400, fmt::format("the prompt has {} tokens and max_tokens is {}: {} positions, more than this server's "
                                       "{} per request (--ctx); lower max_tokens or shorten the prompt",
                                       n, *p.max_tokens, n + *p.max_tokens, o_.ctx),
                      "max_tokens", "context_length_exceeded");
    p.gen.max_tokens = *p.max_tokens;
    // A grammar that binds the whole reply needs room for its shortest document (a token
    // writes at least one character, and the last is the end): refused before the prefill.
    if (p.gen.grammar && p.gen.grammar_trigger.empty()) {
      const std::size_t need = p.gen.grammar->min_to_finish(p.gen.grammar->start());
      if (need + 1 > p.gen.max_tokens)
        throw api_error(400, fmt::format("the shortest reply {} allows has {} characters, and max_tokens {} leaves room for "
                                         "{}; raise max_tokens to at least {}",
                                         p.tools ? "a call of these tools" : "'response_format'", need, p.gen.max_tokens,
                                         p.gen.max_tokens - 1, need + 1),
                        "max_tokens", "invalid_value");
    }
    return ids;
  }

  // Hands the request to the scheduler; its text and its end arrive through the channel.
  std::shared_ptr<channel> submit(const parsed_request& p, std::vector<std::int32_t> ids, const std::string& id,
                                  std::chrono::steady_clock::time_point arrived) {
    auto ch = std::make_shared<channel>();
    ch->arrived = arrived;
    tlm::sequence_request r;
    r.prompt = std::move(ids);
    r.options = p.gen;
    r.stop_ids = p.chat ? counter_->stop_ids()
                        : std::vector<std::int32_t>(tok_->end_of_generation().begin(), tok_->end_of_generation().end());
    r.cancelled = ch->cancelled;
    r.tag = id;
    // Both run on the scheduler's thread: they only count and hand over.
    r.on_token = [this, ch](std::int32_t token, std::string_view text) {
      // Every generated token but a final end-of-sequence one (which usage.completion_tokens
      // leaves out too) comes here; id -1 is text released at the end.
      if (token >= 0) {
        const auto now = std::chrono::steady_clock::now();
        std::lock_guard lock(stats_mu_);
        if (ch->produced == 0) {
          ch->first = now;
          ttft_.observe(seconds_between(ch->arrived, now));
        }
        ch->last = now;
        ++ch->produced;
        ++generated_tokens_;
      }
      if (!text.empty()) {
        std::lock_guard lock(ch->mu);
        ch->pieces.emplace_back(text);
        ch->cv.notify_all();
      }
      return tlm::step::go_on;
    };
    const std::size_t n = r.prompt.size();
    r.on_done = [this, ch, n](tlm::sequence_outcome& out) {
      {
        std::lock_guard lock(stats_mu_);
        prompt_tokens_ += n;
        if (ch->produced >= 2) tpot_.observe(seconds_between(ch->first, ch->last) / static_cast<double>(ch->produced - 1));
      }
      std::lock_guard lock(ch->mu);
      ch->outcome = std::move(out);
      ch->cv.notify_all();
    };
    tlm::admission a;
    try {
      a = sched_->submit(std::move(r));
    } catch (const tlm::capacity_error& e) {
      throw api_error(400, fmt::format("the request does not fit this server's KV cache budget (--kv-budget): {}", e.what()),
                      {}, "context_length_exceeded");
    }
    if (a == tlm::admission::queue_full) {
      const auto st = sched_->status();
      throw api_error(503, fmt::format("all {} sequences are busy and {} requests are waiting (--queue); retry later",
                                       o_.slots, st.queued),
                      {}, "server_busy", "server_error");
    }
    if (a == tlm::admission::stopping) throw shutting_down();
    return ch;
  }

  static api_error shutting_down() {
    return api_error(503, "the server is shutting down and takes no more requests; send it again once it is back", {},
                     "server_shutting_down", "server_error");
  }

  // Waits for the end of a request that streams nothing, watching its connection: a
  // client that leaves ends its request at the scheduler's next step.
  static tlm::sequence_outcome wait_for_end(channel& ch, const httplib::Request& req) {
    const int fd = connection_socket(req);
    std::unique_lock lock(ch.mu);
    while (!ch.cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return ch.outcome.has_value(); }))
      if (fd >= 0 && !ch.cancelled->load() && peer_left(fd)) ch.cancelled->store(true);
    return std::move(*ch.outcome);
  }

  // What a failed generation tells an HTTP client: tlm's own message for a conversation
  // that does not fit advises a C++ caller (reset(), chat_options), which means nothing here.
  static std::string client_message(const std::exception& e) {
    if (dynamic_cast<const tlm::capacity_error*>(&e))
      return "the conversation does not fit this server's positions per request (--ctx); shorten it or lower max_tokens";
    return e.what();
  }

  static api_error cut_short(const tlm::generation_result& r) {
    if (r.ids.empty()) return shutting_down();  // it waited in the queue, or was still in its prefill
    return api_error(503, fmt::format("the server is shutting down: the reply was cut short after {} token{}; send the "
                                      "request again once it is back", r.ids.size(), r.ids.size() == 1 ? "" : "s"),
                     {}, "server_shutting_down", "server_error");
  }

  // Reads the body whatever its Content-Type, counting while it arrives: a chunked or
  // length-less body over --max-body is refused at the limit rather than read whole.
  std::string read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) const {
    if (req.is_multipart_form_data())
      throw api_error(415, "the body is multipart/form-data; send the request as JSON (Content-Type: application/json)", {},
                      "unsupported_media_type");
    std::string body;
    bool too_large = false;
    const bool read = reader([&](const char* data, std::size_t n) {
      if (n > o_.max_body - body.size()) {
        too_large = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    // httplib sets 413 itself for a Content-Length over the limit.
    if (too_large || res.status == 413)
      throw api_error(413, fmt::format("the request body is larger than this server's limit of {} bytes (--max-body); send "
                                       "a shorter request", o_.max_body),
                      {}, "request_too_large");
    if (!read)
      throw api_error(400, "the request body could not be read: the connection broke, or its chunked encoding is "
                           "malformed; send it again", {}, "invalid_body");
    return body;
  }

  // The body read (read_body), its nesting checked before it is parsed, and parsed.
  json json_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) const {
    const std::string raw = read_body(req, res, reader);
    if (tlm::json_nesting_depth(raw, max_body_depth) > max_body_depth)
      throw api_error(400, fmt::format("the request body nests arrays and objects more than {} deep; no request field "
                                       "needs that, so flatten it", max_body_depth),
                      {}, "invalid_json");
    try {
      return json::parse(raw);
    } catch (const json::exception& e) {
      throw api_error(400, fmt::format("the request body is not valid JSON: {}", e.what()), {}, "invalid_json");
    }
  }

  // The texts of an embeddings request as token ids: `input` is a string, an array of
  // strings, an array of token ids, or an array of arrays of token ids, as OpenAI takes.
  std::vector<std::vector<std::int32_t>> embedding_inputs(const json& body) const {
    if (!body.is_object()) throw api_error(400, "the request body must be a JSON object", {}, "invalid_type");
    const request_reader r{body};
    if (const json* m = r.find("model"); m && !m->is_string()) r.wrong("model", "must be a string");
    if (const json* u = r.find("user"); u && !u->is_string()) r.wrong("user", "must be a string");
    if (const auto d = r.whole("dimensions", 1, std::numeric_limits<std::uint32_t>::max()); d && *d != tlm::dim<C>)
      throw api_error(400, fmt::format("'dimensions' is {}; this model's embeddings have {} (its hidden size), and tlm "
                                       "does not shorten them: leave 'dimensions' out or give {}",
                                       *d, tlm::dim<C>, tlm::dim<C>),
                      "dimensions", "unsupported");
    const json* in = r.find("input");
    if (!in) throw api_error(400, "'input' is required: a string, an array of strings or an array of token ids", "input",
                             "missing");
    const auto text = [&](const json& v, std::size_t i) {
      std::vector<std::int32_t> ids;
      try {
        // The file's BOS rule, as the generator's prompts: an embedding of a text is the
        // same whether it came as text or as the ids a client tokenized itself.
        ids = tok_->encode(v.get<std::string>(), {.parse_special = false});
      } catch (const tlm::error& e) {
        throw api_error(400, fmt::format("'input[{}]' cannot be tokenized: {}", i, e.what()), "input", "invalid_value");
      }
      return ids;
    };
    const auto token_ids = [&](const json& v, std::size_t i) {
      std::vector<std::int32_t> ids;
      for (const auto& t : v) {
        if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= static_cast<std::int64_t>(C::vocab))
          throw api_error(400, fmt::format("'input[{}]' holds {}, which is not a token id of this model (0 to {})", i,
                                           t.dump(), C::vocab - 1),
                          "input", "invalid_value");
        ids.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
      }
      return ids;
    };
    std::vector<std::vector<std::int32_t>> out;
    if (in->is_string()) {
      out.push_back(text(*in, 0));
    } else if (in->is_array() && !in->empty() && (*in)[0].is_number()) {
      out.push_back(token_ids(*in, 0));
    } else if (in->is_array() && !in->empty()) {
      if (in->size() > max_embedding_inputs)
        throw api_error(400, fmt::format("'input' holds {} texts; a request takes at most {}: send them in several requests",
                                         in->size(), max_embedding_inputs),
                        "input", "invalid_value");
      for (std::size_t i = 0; i < in->size(); ++i) {
        const json& v = (*in)[i];
        if (v.is_string()) out.push_back(text(v, i));
        else if (v.is_array()) out.push_back(token_ids(v, i));
        else
          throw api_error(400, fmt::format("'input[{}]' must be a string or an array of token ids", i), "input",
                          "invalid_type");
      }
    } else {
      r.wrong("input", "must be a non-empty string, array of strings or array of token ids");
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (out[i].empty())
        throw api_error(400, fmt::format("'input[{}]' is empty; every text needs at least one token", i), "input",
                        "invalid_value");
      if (out[i].size() > o_.ctx)
        throw api_error(400, fmt::format("'input[{}]' has {} tokens; this server takes at most {} per text (--ctx); "
                                         "shorten it or split it", i, out[i].size(), o_.ctx),
                        "input", "context_length_exceeded");
    }
    return out;
  }

  // POST /v1/embeddings: each text runs through the scheduler as an embedding request, up
  // to --parallel of one request's texts at a time, so that a request of many texts
  // interleaves with the others instead of filling the queue.
  void embeddings(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    try {
      const json body = json_body(req, res, reader);
      const auto inputs = embedding_inputs(body);
      const request_reader r{body};
      std::string format = "float";
      if (const json* f = r.find("encoding_format")) {
        if (!f->is_string() || (f->get<std::string>() != "float" && f->get<std::string>() != "base64"))
          r.wrong("encoding_format", "must be \"float\" or \"base64\"");
        format = f->get<std::string>();
      }
      struct gathered {
        std::mutex mu;
        std::condition_variable cv;
        std::vector<std::optional<tlm::sequence_outcome>> outcomes;
        std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
      };
      auto g = std::make_shared<gathered>();
      g->outcomes.resize(inputs.size());
      const std::string id = random_id("embd");
      const int fd = connection_socket(req);
      std::size_t next = 0, finished = 0, tokens = 0;
      // On an early exit the texts still queued or running end at their next step.
      struct cancel_on_exit {
        std::atomic<bool>& flag;
        ~cancel_on_exit() { flag.store(true); }
      } guard{*g->cancelled};
      std::unique_lock lock(g->mu);
      while (finished < inputs.size()) {
        while (next < inputs.size() && next - finished < o_.slots) {
          tlm::sequence_request sr;
          sr.prompt = inputs[next];
          sr.embed = o_.pooling;
          sr.cancelled = g->cancelled;
          sr.tag = fmt::format("{}/{}", id, next);
          sr.on_done = [g, i = next](tlm::sequence_outcome& out) {
            std::lock_guard l(g->mu);
            g->outcomes[i] = std::move(out);
            g->cv.notify_all();
          };
          lock.unlock();
          tlm::admission a;
          try {
            a = sched_->submit(std::move(sr));
          } catch (const tlm::capacity_error& e) {
            throw api_error(400, fmt::format("'input[{}]' does not fit this server's KV cache budget (--kv-budget): {}",
                                             next, e.what()),
                            "input", "context_length_exceeded");
          }
          lock.lock();
          if (a == tlm::admission::stopping) throw shutting_down();
          if (a == tlm::admission::queue_full) {
            if (next > finished) break;  // ours take the places: wait for one to end
            throw api_error(503, fmt::format("all {} sequences are busy and the queue (--queue) is full; retry later",
                                             o_.slots),
                            {}, "server_busy", "server_error");
          }
          tokens += inputs[next].size();
          ++next;
        }
        // The outcomes arrive in any order: count the ones in.
        g->cv.wait_for(lock, std::chrono::milliseconds(100));
        finished = static_cast<std::size_t>(
            std::count_if(g->outcomes.begin(), g->outcomes.end(), [](const auto& o) { return o.has_value(); }));
        if (fd >= 0 && peer_left(fd)) {
          g->cancelled->store(true);
          // Nobody reads the answer; /metrics counts it under nginx's "client closed request".
          res.status = 499;
          return;
        }
        for (const auto& o : g->outcomes) {
          if (!o) continue;
          if (o->error) std::rethrow_exception(o->error);
          if (o->cut) throw shutting_down();
        }
      }
      lock.unlock();
      {
        std::lock_guard l(stats_mu_);
        prompt_tokens_ += tokens;
      }
      json data = json::array();
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        const auto& e = g->outcomes[i]->embedding;
        json item = {{"object", "embedding"}, {"index", i}};
        if (format == "base64") item["embedding"] = base64_of_floats(e);
        else item["embedding"] = e;
        data.push_back(std::move(item));
      }
      res.set_content(dump({{"object", "list"},
                            {"data", std::move(data)},
                            {"model", o_.name},
                            {"pooling", tlm::pooling_name(o_.pooling)},
                            {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}}),
                      "application/json");
    } catch (const api_error& e) {
      send_error(res, e);
    } catch (const tlm::capacity_error& e) {
      send_error(res, api_error(400, client_message(e), "input", "context_length_exceeded"));
    } catch (const tlm::error& e) {
      send_error(res, api_error(400, e.what(), "input", "invalid_value"));
    }
  }

  // OpenAI's base64 encoding of an embedding: its float32 values' little-endian bytes.
  static std::string base64_of_floats(std::span<const float> v) {
    static_assert(std::endian::native == std::endian::little, "the bytes are sent as they are in memory");
    static constexpr char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const auto* b = reinterpret_cast<const unsigned char*>(v.data());
    const std::size_t n = v.size_bytes();
    std::string out;
    out.reserve((n + 2) / 3 * 4);
    for (std::size_t i = 0; i < n; i += 3) {
      const unsigned w = (unsigned{b[i]} << 16) | (i + 1 < n ? unsigned{b[i + 1]} << 8 : 0u) | (i + 2 < n ? unsigned{b[i + 2]} : 0u);
      out += digits[(w >> 18) & 63];
      out += digits[(w >> 12) & 63];
      out += i + 1 < n ? digits[(w >> 6) & 63] : '=';
      out += i + 2 < n ? digits[w & 63] : '=';
    }
    return out;
  }

  static std::string finish_reason(tlm::stop_reason r) {
    return r == tlm::stop_reason::max_tokens || r == tlm::stop_reason::context_full ? "length" : "stop";
  }

  // A reply that is whole tool calls, as OpenAI's tool_calls (arguments as JSON strings),
  // in order; nothing for words, or for calls that max_tokens cut short (whose text is
  // returned as it is, with finish_reason length).
  static std::optional<json> tool_calls_of(const std::string& text) {
    const auto calls = tlm::tools::parse_calls(text);
    if (!calls) return std::nullopt;
    json out = json::array();
    for (const auto& c : *calls)
      out.push_back({{"id", random_id("call")},
                     {"type", "function"},
                     {"function", {{"name", c.name}, {"arguments", dump(c.arguments)}}}});
    return out;
  }

  static std::size_t completion_tokens(const tlm::generation_result& r) {
    return r.reason == tlm::stop_reason::eos && !r.ids.empty() ? r.ids.size() - 1 : r.ids.size();
  }

  // prompt_tokens: the whole prompt, of which cached_tokens came from the prefix cache.
  static json usage_of(std::size_t prompt_tokens, const tlm::sequence_outcome& o) {
    const std::size_t c = completion_tokens(o.result);
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", c},
            {"total_tokens", prompt_tokens + c},
            {"prompt_tokens_details", {{"cached_tokens", o.reused_tokens}}}};
  }

  json chunk(const std::string& id, bool chat, const std::string& text, const json& finish, bool first) const {
    json choice = {{"index", 0}, {"finish_reason", finish}};
    if (chat) {
      json delta = json::object();
      if (first) delta["role"] = "assistant";
      if (!text.empty() || first) delta["content"] = text;
      choice["delta"] = delta;
      choice["logprobs"] = nullptr;
    } else {
      choice["text"] = text;
      choice["logprobs"] = nullptr;
    }
    return {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", static_cast<std::int64_t>(std::time(nullptr))},
            {"model", o_.name},
            {"system_fingerprint", "tlm"},
            {"choices", json::array({choice})}};
  }

  void handle(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader, bool chat) {
    const auto arrived = std::chrono::steady_clock::now();
    try {
      auto p = std::make_shared<parsed_request>(read(json_body(req, res, reader), chat));
      auto ids = prompt_ids(*p);
      const std::size_t n = ids.size();
      const std::string id = random_id(chat ? "chatcmpl" : "cmpl");
      auto ch = submit(*p, std::move(ids), id, arrived);
      if (!p->stream) {
        auto out = wait_for_end(*ch, req);
        if (out.error) std::rethrow_exception(out.error);
        if (out.cut) throw cut_short(out.result);
        const auto& r = out.result;
        json choice = {{"index", 0}, {"finish_reason", finish_reason(r.reason)}, {"logprobs", nullptr}};
        if (chat) choice["message"] = {{"role", "assistant"}, {"content", r.text}, {"refusal", nullptr}};
        if (auto calls = p->tools ? tool_calls_of(r.text) : std::nullopt) {
          choice["message"]["content"] = nullptr;
          choice["message"]["tool_calls"] = std::move(*calls);
          choice["finish_reason"] = "tool_calls";
        }
        else choice["text"] = r.text;
        res.set_content(dump({{"id", id},
                              {"object", chat ? "chat.completion" : "text_completion"},
                              {"created", static_cast<std::int64_t>(std::time(nullptr))},
                              {"model", o_.name},
                              {"system_fingerprint", "tlm"},
                              {"choices", json::array({choice})},
                              {"usage", usage_of(n, out)}}),
                        "application/json");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      // The provider runs the whole stream in its first call; a later call (there is none
      // after sink.done()) finds nothing to do.
      auto started = std::make_shared<bool>(false);
      res.set_chunked_content_provider(
          "text/event-stream", [this, p, n, id, ch, started](std::size_t, httplib::DataSink& sink) {
            if (*started) return false;
            *started = true;
            const auto send = [&](const json& j) {
              const std::string event = "data: " + dump(j) + "\n\n";
              return sink.write(event.data(), event.size());
            };
            // A client that went away ends its request at the scheduler's next step.
            const auto left = [&] {
              ch->cancelled->store(true);
              return false;
            };
            if (!send(chunk(id, p->chat, "", nullptr, true))) return left();
            std::optional<tlm::sequence_outcome> out;
            // With tools, a reply is held while it may still become a call: it is sent as
            // words once it leaves "<tool_call>" behind, and as one tool_calls delta at its end
            // (its calls at index 0, 1, ...).
            enum class shape { undecided, words, call } form = p->tools ? shape::undecided : shape::words;
            std::string held;
            while (!out) {
              std::deque<std::string> pieces;
              {
                std::unique_lock lock(ch->mu);
                ch->cv.wait(lock, [&] { return !ch->pieces.empty() || ch->outcome.has_value(); });
                pieces.swap(ch->pieces);
                if (ch->outcome) out = std::move(ch->outcome);
              }
              for (const auto& text : pieces) {
                if (form != shape::words) {
                  held += text;
                  if (form == shape::call || held.starts_with("<tool_call>")) {
                    form = shape::call;
                    continue;
                  }
                  if (std::string_view("<tool_call>").starts_with(held)) continue;
                  form = shape::words;
                  if (!send(chunk(id, p->chat, std::exchange(held, {}), nullptr, false))) return left();
                  continue;
                }
                if (!send(chunk(id, p->chat, text, nullptr, false))) return left();
              }
            }
            std::optional<json> call;
            if (form == shape::call && !out->error && !out->cut) call = tool_calls_of(held);
            if (call) {
              json c = chunk(id, true, "", nullptr, false);
              for (std::size_t i = 0; i < call->size(); ++i) (*call)[i]["index"] = i;
              c["choices"][0]["delta"] = {{"tool_calls", *call}};
              if (!send(c)) return left();
            } else if (!held.empty() && !out->error && !out->cut) {
              if (!send(chunk(id, p->chat, held, nullptr, false))) return left();  // a call cut short: its text
            }
            bool connected = true;
            if (out->error) {
              // The status line is gone already: the error travels as an event.
              std::string message = "internal error";
              try {
                std::rethrow_exception(out->error);
              } catch (const std::exception& e) {
                message = client_message(e);
              } catch (...) {
              }
              connected = send(error_body(message, "server_error", "", "generation_failed"));
            } else if (out->cut) {
              // Neither a finish_reason nor [DONE]: the reply is not complete, and the
              // client is told why.
              const api_error e = cut_short(out->result);
              send(error_body(e.what(), e.type, e.param, e.code));
              sink.done();
              return true;
            } else {
              connected = send(chunk(id, p->chat, "", call ? json("tool_calls") : json(finish_reason(out->result.reason)), false));
              if (connected && p->include_usage) {
                json u = chunk(id, p->chat, "", nullptr, false);
                u["choices"] = json::array();
                u["usage"] = usage_of(n, *out);
                connected = send(u);
              }
            }
            if (!connected) return false;
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            return true;
          });
    } catch (const api_error& e) {
      send_error(res, e);
    } catch (const tlm::capacity_error& e) {
      send_error(res, api_error(400, client_message(e), {}, "context_length_exceeded"));
    } catch (const tlm::error& e) {
      send_error(res, api_error(400, e.what(), {}, "invalid_value"));
    }
  }

  options o_;
  std::unique_ptr<tlm::model<C>> m_;
  std::unique_ptr<tlm::tokenizer> tok_;
  std::unique_ptr<tlm::chat_session<C>> counter_;
  std::int64_t created_ = 0;
  // The metrics.
  std::mutex stats_mu_;
  std::map<std::pair<std::string, int>, std::uint64_t> requests_;  // (endpoint, status) -> count
  std::uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  // Buckets from a few milliseconds (a short prompt on a fast machine) to a minute (a
  // long prompt or a wait in the queue); per token, from a millisecond to seconds.
  histogram ttft_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  histogram tpot_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  // Last: made once everything its callbacks touch is, and stopped (its thread joined)
  // before any of that goes.
  std::unique_ptr<tlm::scheduler<C>> sched_;
};

// httplib's task queue: a thread per open connection, up to a limit, made when needed and
// kept for later connections. A fixed pool (slots + queue + 4 threads, as before) let 40
// clients that each send a header line every few seconds hold every worker, and /health
// and completions waited behind them; here such a client holds only its own thread.
class connection_threads : public httplib::TaskQueue {
 public:
  explicit connection_threads(std::size_t limit) : limit_(limit) {}
  connection_threads(const connection_threads&) = delete;
  connection_threads& operator=(const connection_threads&) = delete;
  ~connection_threads() override = default;

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(fn));
      if (idle_ < jobs_.size() && threads_.size() < limit_) threads_.emplace_back([this] { work(); });
    }
    ready_.notify_one();
  }

  // Called once the accept loop has ended (no enqueue after it): the connections still
  // open are served to their end, then the threads are joined.
  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_;
      ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();  // serves one connection and closes its socket
      lock.lock();
    }
  }

  std::size_t limit_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;
  bool stopping_ = false;
};

template <tlm::LlamaConfig C>
int run(const options& o) {
  // SIGINT and SIGTERM are waited for by one thread, which stops the server cleanly;
  // blocked here so that httplib's threads inherit the mask and never take them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that disconnects is an error return, not a signal

  server<C> s(o);
  httplib::Server svr;
  svr.new_task_queue = [limit = o.max_connections] { return new connection_threads(limit); };
  // An idle keep-alive connection is closed after 2 s, and one that sends nothing for
  // --read-timeout while its request is read, or reads nothing of its answer for 30 s, is dropped.
  svr.set_keep_alive_timeout(2);
  svr.set_read_timeout(static_cast<time_t>(o.read_timeout));
  svr.set_write_timeout(30);
  s.routes(svr);
  int port = static_cast<int>(o.port);
  if (port == 0) port = svr.bind_to_any_port(o.host);
  else if (!svr.bind_to_port(o.host, port)) port = -1;
  if (port <= 0)
    fail(fmt::format("cannot listen on {}:{}; is the port taken? give another with --port, or 0 for a free one", o.host, o.port));
  widen_backlog(port, static_cast<int>(std::min<std::size_t>(o.max_connections, std::numeric_limits<int>::max())));
  // An IPv6 address is written in brackets in a URL (RFC 3986), so the line can be pasted.
  const std::string shown_host = o.host.find(':') == std::string::npos ? o.host : "[" + o.host + "]";
  fmt::print("serve: listening on http://{}:{} ({}, {} requests at once, {} threads)\n", shown_host, port, tlm::config_name<C>(),
             o.slots, o.threads);
  std::fflush(stdout);
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    s.stop();
    svr.stop();
  });
  svr.listen_after_bind();
  // Stopped by a signal: the watcher has returned. Stopped otherwise: wake it.
  pthread_kill(watcher.native_handle(), SIGTERM);
  watcher.join();
  return 0;
}

// As generate chooses (tlm::choose_config): with no --model, smollm2_135m, whose file is
// the default.
std::string chosen_config(const options& o) {
  return o.model_given ? tlm::choose_config(o.config, o.model, stderr) : o.config.empty() ? "smollm2_135m" : o.config;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    return tlm::with_config(chosen_config(o), [&](auto c) { return run<typename decltype(c)::type>(o); });
  } catch (const std::exception& e) {
    fmt::print(stderr, "serve: {}\n", e.what());
    return 1;
  }
}
