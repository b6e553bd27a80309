// An OpenAI-compatible HTTP server over tlm's generator and chat session.
//
//   serve [--model PATH] [--config NAME] [--lora FILE [--lora-scale S]]... [--host ADDR] [--port N] [--slots N] [--threads T]
//         [--queue N] [--ctx N] [--max-tokens N] [--max-body BYTES] [--api-key KEY] [--name ID]
//         [--cors ORIGIN] [--max-connections N] [--read-timeout S] [--chat-template NAME]
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions (both with "stream": true as
// server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus' text format),
// GET /slots (what each slot is doing). Requests run on a fixed number of
// slots; each slot is a model of its own over the same memory-mapped file (the OS keeps
// one copy of the weights) with its own workspace and KV cache, because a model's
// forward pass reuses its workspace and so serves one sequence at a time. Requests
// beyond the slots wait in a bounded queue; beyond that they get 503.
#include <tlm/chat.hpp>
#include <tlm/config_match.hpp>
#include <tlm/configs.hpp>
#include <tlm/generate.hpp>
#include <tlm/json_schema.hpp>
#include <tlm/model.hpp>
#include <tlm/sampler.hpp>
#include <tlm/tokenizer.hpp>

#include "cli.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
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
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
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
  --slots N          requests generated at once, each with its own KV cache (default 2)
  --threads T        matrix-kernel threads per slot (default: cores / slots, at least 1)
  --queue N          requests that may wait for a slot; more get 503 (default 32)
  --lora FILE        apply a LoRA adapter (llama.cpp's adapter GGUF) to every slot; repeatable
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
                     wait until one closes
  --read-timeout S   a connection that sends nothing for S seconds while its request is
                     read is closed (default 10)
  --chat-template NAME  render chat requests with this template instead of the file's
                     ({templates})
  -h, --help         this text
A request's sampling fields are generate's sampling options (tlm/sampling_options.hpp), by the
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
  std::size_t port = 8080, slots = 2, threads = 0, queue = 32, ctx = 4096, max_tokens = 1024, max_body = 1 << 20,
              max_connections = 256, read_timeout = 10;
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
    else if (a == "--slots") o.slots = to_whole(a, value(), 1, 256);
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
    fail(fmt::format("unknown --config '{}'; known: {}", o.config, tlm::config_names_text()));
  if (o.threads == 0) o.threads = std::max<std::size_t>(1, std::thread::hardware_concurrency() / o.slots);
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

// Requests nest a few levels (messages, content parts, a schema of up to 8 levels);
// deeper JSON is refused before it is parsed, so nothing later recurses over it.
constexpr std::size_t max_body_depth = 64;

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
  static constexpr std::string_view known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                               "/metrics", "/slots"};
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
  std::vector<tlm::chat_message> messages;  // chat
  tlm::generation_options gen;
  std::optional<std::size_t> max_tokens;
};

template <tlm::LlamaConfig C>
class server {
 public:
  server(const options& o) : o_(o) {
    // The options are checked before the file is mapped or a slot made.
    if (o_.ctx > C::context)
      fail(fmt::format("--ctx {} is more than the context of {} ({} positions)", o_.ctx, tlm::type_name<C>(), C::context));
    if (o_.max_tokens >= o_.ctx)
      fail(fmt::format("--max-tokens {} leaves no room for a prompt in --ctx {}; lower it or raise --ctx", o_.max_tokens, o_.ctx));
    for (std::size_t i = 0; i < o.slots; ++i) {
      // Each load maps the same file: the pages are shared, the workspaces are not.
      auto s = std::make_unique<slot>(tlm::model<C>::load(o.model, {.threads = o.threads}));
      for (const auto& [file, scale] : o.loras) s->m.add_lora(file, scale);
      slots_.push_back(std::move(s));
    }
    tok_ = std::make_unique<tlm::tokenizer>(tlm::tokenizer::from_gguf(slots_[0]->m.file()));
    for (auto& sl : slots_) {
      sl->gen.emplace(sl->m, *tok_);
      sl->kv_bytes = kv_bytes_of(*sl);
    }
    // Counts a conversation's positions before a slot is taken; it never runs the model
    // (its cache of one position is never used).
    counter_ = std::make_unique<tlm::chat_session<C>>(slots_[0]->m, *tok_,
                                                      tlm::chat_options{.capacity = 1, .chat_template = o_.chat_template});
    created_ = static_cast<std::int64_t>(std::time(nullptr));
  }

  // Ends the running generations at their next token, and refuses the queued requests.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    freed_.notify_all();
  }

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
                              "GET /v1/models, GET /health, GET /metrics and GET /slots", req.method, req.path);
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
      std::lock_guard lock(mu_);
      res.set_content(dump({{"status", "ok"}, {"slots", slots_.size()}, {"busy", busy_}, {"queued", waiting_}}),
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
  // A slot's model, generator and chat session live as long as the server: their KV
  // caches are reused by every request, and grow only when one needs more. A cache of
  // its own per request (46 MB for 1000 positions) was freed after it and kept by the
  // allocator, so the server's memory grew with every request.
  struct slot {
    explicit slot(tlm::model<C> model) : m(std::move(model)) {}
    tlm::model<C> m;
    std::optional<tlm::generator<C>> gen;
    std::unique_ptr<tlm::chat_session<C>> chat;
    bool busy = false;  // guarded by mu_
    // What /slots and /metrics show, guarded by stats_mu_: written by the thread running
    // the slot's generation, read by the threads answering those routes.
    std::string state = "idle", request_id;
    std::size_t prompt_tokens = 0, generated_tokens = 0, kv_bytes = 0;
    std::chrono::steady_clock::time_point started;
  };

  // The KV cache memory a slot holds: its generator's cache and its chat session's.
  // Called only by the thread that owns the slot (or before the server starts), since
  // a generation reallocates the caches.
  static std::size_t kv_bytes_of(const slot& s) {
    return (s.gen ? s.gen->cache().bytes() : 0) + (s.chat ? s.chat->cache().bytes() : 0);
  }

  void count_request(const httplib::Request& req, const httplib::Response& res) {
    const std::string endpoint = endpoint_label(req.path);
    std::lock_guard lock(stats_mu_);
    ++requests_[{endpoint, res.status}];
  }

  std::string metrics_text() {
    std::size_t queued = 0, busy = 0;
    {
      std::lock_guard lock(mu_);  // never held together with stats_mu_ here: mu_ is taken first elsewhere
      queued = waiting_;
      busy = busy_;
    }
    std::lock_guard lock(stats_mu_);
    std::string out;
    const auto one = [&](std::string_view name, std::string_view type, std::string_view help, auto value) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
    };
    out += "# HELP tlm_requests_total HTTP requests answered, by endpoint and status code.\n"
           "# TYPE tlm_requests_total counter\n";
    for (const auto& [key, n] : requests_)
      out += fmt::format("tlm_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
    one("tlm_prompt_tokens_total", "counter", "Prompt tokens run through prefill (usage.prompt_tokens).", prompt_tokens_);
    one("tlm_generated_tokens_total", "counter", "Tokens generated (usage.completion_tokens).", generated_tokens_);
    ttft_.write(out, "tlm_time_to_first_token_seconds",
                "Seconds from a request's arrival at its handler to its first generated token.");
    tpot_.write(out, "tlm_time_per_output_token_seconds",
                "Mean seconds between the generated tokens of a reply, once per reply of two tokens or more.");
    one("tlm_queue_length", "gauge", "Requests waiting for a slot.", queued);
    one("tlm_active_sequences", "gauge", "Slots running a request.", busy);
    one("tlm_slots", "gauge", "Slots (--slots).", slots_.size());
    std::size_t kv = 0;
    for (const auto& s : slots_) kv += s->kv_bytes;
    one("tlm_kv_cache_bytes", "gauge", "Bytes of KV cache allocated across the slots.", kv);
    return out;
  }

  json slots_json() {
    const auto now = std::chrono::steady_clock::now();
    json out = json::array();
    std::lock_guard lock(stats_mu_);
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const slot& s = *slots_[i];
      const bool idle = s.state == "idle";
      out.push_back({{"id", i},
                     {"state", s.state},
                     {"request_id", idle ? json(nullptr) : json(s.request_id)},
                     {"prompt_tokens", s.prompt_tokens},
                     {"generated_tokens", s.generated_tokens},
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

  // Holds a slot for one request; gives it back when the last copy goes (for a stream,
  // when httplib drops the content provider: after the last chunk, or on a disconnect).
  class lease {
   public:
    lease(server& s, slot& sl) : s_(&s), slot_(&sl) {}
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() {
      {
        std::lock_guard lock(s_->mu_);
        slot_->busy = false;
        --s_->busy_;
        std::lock_guard stats(s_->stats_mu_);  // always taken after mu_, never before
        slot_->state = "idle";
        slot_->request_id.clear();
        slot_->prompt_tokens = slot_->generated_tokens = 0;
      }
      s_->freed_.notify_one();
    }
    slot& get() { return *slot_; }

   private:
    server* s_;
    slot* slot_;
  };

  // Takes a slot for the request `id` with a prompt of `prompt_tokens` positions.
  std::shared_ptr<lease> acquire(const std::string& id, std::size_t prompt_tokens) {
    std::unique_lock lock(mu_);
    const auto free_slot = [&]() -> slot* {
      for (auto& s : slots_)
        if (!s->busy) return s.get();
      return nullptr;
    };
    const auto shutting_down = [] {
      return api_error(503, "the server is shutting down and takes no more requests; send it again once it is back",
                       {}, "server_shutting_down", "server_error");
    };
    if (stopping_) throw shutting_down();
    if (!free_slot()) {
      if (waiting_ >= o_.queue)
        throw api_error(503, fmt::format("all {} slots are busy and {} requests are waiting (--queue); retry later",
                                         slots_.size(), waiting_),
                        {}, "server_busy", "server_error");
      ++waiting_;
      freed_.wait(lock, [&] { return stopping_ || free_slot() != nullptr; });
      --waiting_;
      if (stopping_) throw shutting_down();
    }
    slot* s = free_slot();
    s->busy = true;
    ++busy_;
    {
      std::lock_guard stats(stats_mu_);  // after mu_, as in ~lease
      s->state = "prefill";
      s->request_id = id;
      s->prompt_tokens = prompt_tokens;
      s->generated_tokens = 0;
      s->started = std::chrono::steady_clock::now();
    }
    return std::make_shared<lease>(*this, *s);
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
      for (std::size_t i = 0; i < msgs->size(); ++i) {
        const json& m = (*msgs)[i];
        const std::string key = fmt::format("messages[{}]", i);
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
          throw api_error(400, fmt::format("'{}' must be an object with a string 'role'", key), key, "invalid_type");
        std::string role = m["role"].get<std::string>();
        if (role == "developer") role = "system";  // OpenAI's newer name for the system role
        if (role != "system" && role != "user" && role != "assistant")
          throw api_error(400, fmt::format("'{}.role' is '{}'; tlm takes system, developer, user or assistant", key, role),
                          key + ".role", "invalid_value");
        if (!m.contains("content") || m["content"].is_null())
          throw api_error(400, fmt::format("'{}.content' is required", key), key + ".content", "missing");
        p.messages.push_back({role, text_of(m["content"], i)});
      }
      if (const json* t = r.find("tools"); t && !(t->is_array() && t->empty()))
        throw api_error(400, "'tools' is not supported by tlm's server; leave it out", "tools", "unsupported");
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
    if (const std::string problem = tlm::sampling_problem(p.gen.sample); !problem.empty())
      throw api_error(400, "sampling: " + problem, {}, "invalid_value");
    return p;
  }

  // Tokenizes the prompt as the generation will, checks it fits, and settles max_tokens.
  std::size_t prompt_tokens(parsed_request& p) const {
    std::size_t n = 0;
    try {
      if (p.chat) {
        // The session's own count: a "<|im_end|>" typed in a message is text to it, not
        // the one special token a rendered template would give.
        n = counter_->positions_for(p.messages);
      } else {
        n = tok_->encode(p.prompt, {.parse_special = false}).size();  // as the generator does
      }
    } catch (const tlm::error& e) {
      throw api_error(400, fmt::format("the prompt cannot be tokenized: {}", e.what()), p.chat ? "messages" : "prompt",
                      "invalid_value");
    }
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
    return n;
  }

  // Runs one generation on a slot, calling on_text with each piece of text; `cut` tells
  // whether a shutdown ended it. positions: the prompt's positions as prompt_tokens
  // counted them (for a chat, the session's own count). arrived: when the request
  // reached its handler, from which the time to its first token is measured.
  tlm::generation_result run(slot& s, const parsed_request& p, std::size_t positions, tlm::token_callback on_text,
                             bool& cut, std::chrono::steady_clock::time_point arrived) {
    cut = false;
    std::chrono::steady_clock::time_point first, last;
    std::size_t produced = 0;
    // On shutdown every generation ends at its next token, so that stopping never waits
    // for a long reply.
    on_text = [this, &s, &cut, &first, &last, &produced, arrived, inner = std::move(on_text)](std::int32_t id,
                                                                                              std::string_view text) {
      // The callback hears every generated token but a final end-of-sequence one (which
      // usage.completion_tokens leaves out too); id -1 is text released at the end.
      if (id >= 0) {
        const auto now = std::chrono::steady_clock::now();
        std::lock_guard lock(stats_mu_);
        if (produced == 0) {
          first = now;
          ttft_.observe(seconds_between(arrived, now));
          s.state = "generating";
          s.kv_bytes = kv_bytes_of(s);  // sized for this request by the prefill
        }
        last = now;
        ++produced;
        ++s.generated_tokens;
        ++generated_tokens_;
      }
      if (stopping_.load(std::memory_order_relaxed)) {
        cut = true;
        return tlm::step::stop;
      }
      return inner ? inner(id, text) : tlm::step::go_on;
    };
    if (p.chat) {
      const std::size_t needed = positions + p.gen.max_tokens;
      if (!s.chat || s.chat->cache().capacity() < needed) {
        // Rounded up, so that a slot's session is remade only a few times as requests grow.
        const std::size_t capacity = std::min((needed + 255) / 256 * 256, std::max(o_.ctx, needed));
        s.chat.reset();  // the old cache is freed before the new one is made
        s.chat = std::make_unique<tlm::chat_session<C>>(s.m, *tok_,
                                                        tlm::chat_options{.capacity = capacity, .chat_template = o_.chat_template});
      } else {
        s.chat->reset();
      }
      {
        std::lock_guard lock(stats_mu_);
        s.kv_bytes = kv_bytes_of(s);  // the old session's cache is gone
      }
      for (const auto& m : p.messages) s.chat->add(m.role, m.content);
    }
    auto r = p.chat ? s.chat->reply(p.gen, std::move(on_text)) : s.gen->generate(p.prompt, p.gen, std::move(on_text));
    std::lock_guard lock(stats_mu_);
    prompt_tokens_ += r.prompt_tokens;
    if (produced >= 2) tpot_.observe(seconds_between(first, last) / static_cast<double>(produced - 1));
    s.kv_bytes = kv_bytes_of(s);
    return r;
  }

  // What a failed generation tells an HTTP client: tlm's own message for a conversation
  // that does not fit advises a C++ caller (reset(), chat_options), which means nothing here.
  static std::string client_message(const std::exception& e) {
    if (dynamic_cast<const tlm::capacity_error*>(&e))
      return "the conversation does not fit this server's positions per request (--ctx); shorten it or lower max_tokens";
    return e.what();
  }

  static api_error cut_short(const tlm::generation_result& r) {
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

  static std::string finish_reason(tlm::stop_reason r) {
    return r == tlm::stop_reason::max_tokens || r == tlm::stop_reason::context_full ? "length" : "stop";
  }

  static std::size_t completion_tokens(const tlm::generation_result& r) {
    return r.reason == tlm::stop_reason::eos && !r.ids.empty() ? r.ids.size() - 1 : r.ids.size();
  }

  json usage_of(const tlm::generation_result& r) const {
    const std::size_t c = completion_tokens(r);
    return {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", c}, {"total_tokens", r.prompt_tokens + c}};
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
      const std::string raw = read_body(req, res, reader);
      if (tlm::json_nesting_depth(raw, max_body_depth) > max_body_depth)
        throw api_error(400, fmt::format("the request body nests arrays and objects more than {} deep; no request field "
                                         "needs that, so flatten it", max_body_depth),
                        {}, "invalid_json");
      json body;
      try {
        body = json::parse(raw);
      } catch (const json::exception& e) {
        throw api_error(400, fmt::format("the request body is not valid JSON: {}", e.what()), {}, "invalid_json");
      }
      auto p = std::make_shared<parsed_request>(read(body, chat));
      const std::size_t n = prompt_tokens(*p);
      const std::string id = random_id(chat ? "chatcmpl" : "cmpl");
      auto held = acquire(id, n);
      if (!p->stream) {
        bool cut = false;
        const auto r = run(held->get(), *p, n, {}, cut, arrived);
        if (cut) throw cut_short(r);
        json choice = {{"index", 0}, {"finish_reason", finish_reason(r.reason)}, {"logprobs", nullptr}};
        if (chat) choice["message"] = {{"role", "assistant"}, {"content", r.text}, {"refusal", nullptr}};
        else choice["text"] = r.text;
        res.set_content(dump({{"id", id},
                              {"object", chat ? "chat.completion" : "text_completion"},
                              {"created", static_cast<std::int64_t>(std::time(nullptr))},
                              {"model", o_.name},
                              {"system_fingerprint", "tlm"},
                              {"choices", json::array({choice})},
                              {"usage", usage_of(r)}}),
                        "application/json");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream", [this, p, n, id, held, arrived](std::size_t, httplib::DataSink& sink) mutable {
            if (!held) return false;  // called once: the generation ran already
            const auto send = [&](const json& j) {
              const std::string event = "data: " + dump(j) + "\n\n";
              return sink.write(event.data(), event.size());
            };
            bool connected = send(chunk(id, p->chat, "", nullptr, true)), cut = false;
            try {
              const auto r = run(held->get(), *p, n, tlm::make_token_callback([&](std::int32_t, std::string_view text) {
                                   // A client that went away stops its generation, which frees the slot.
                                   if (connected && !text.empty()) connected = send(chunk(id, p->chat, std::string(text), nullptr, false));
                                   return connected;
                                 }), cut, arrived);
              held.reset();
              if (!connected) return false;
              if (cut) {
                // Neither a finish_reason nor [DONE]: the reply is not complete, and the
                // client is told why.
                const api_error e = cut_short(r);
                send(error_body(e.what(), e.type, e.param, e.code));
                sink.done();
                return true;
              }
              connected = send(chunk(id, p->chat, "", finish_reason(r.reason), false));
              if (connected && p->include_usage) {
                json u = chunk(id, p->chat, "", nullptr, false);
                u["choices"] = json::array();
                u["usage"] = usage_of(r);
                connected = send(u);
              }
            } catch (const std::exception& e) {
              // The status line is gone already: the error travels as an event.
              if (connected) connected = send(error_body(client_message(e), "server_error", "", "generation_failed"));
            }
            // The slot is free once the model is done, not when httplib drops the response
            // after the last write: a client that sends its next request on reading [DONE]
            // must find it free.
            held.reset();
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
  std::vector<std::unique_ptr<slot>> slots_;
  std::unique_ptr<tlm::tokenizer> tok_;
  std::unique_ptr<tlm::chat_session<C>> counter_;
  std::int64_t created_ = 0;
  std::mutex mu_;
  std::condition_variable freed_;
  std::size_t busy_ = 0, waiting_ = 0;
  std::atomic<bool> stopping_{false};
  // The metrics and the slots' status fields. Taken after mu_ when both are held.
  std::mutex stats_mu_;
  std::map<std::pair<std::string, int>, std::uint64_t> requests_;  // (endpoint, status) -> count
  std::uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  // Buckets from a few milliseconds (a short prompt on a fast machine) to a minute (a
  // long prompt or a wait in the queue); per token, from a millisecond to seconds.
  histogram ttft_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  histogram tpot_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
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
  // An IPv6 address is written in brackets in a URL (RFC 3986), so the line can be pasted.
  const std::string shown_host = o.host.find(':') == std::string::npos ? o.host : "[" + o.host + "]";
  fmt::print("serve: listening on http://{}:{} ({}, {} slots x {} threads)\n", shown_host, port, tlm::type_name<C>(), o.slots,
             o.threads);
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
