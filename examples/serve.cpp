// An OpenAI-compatible HTTP server over tlm's generator and chat session.
//
//   serve [--model PATH] [--config NAME] [--host ADDR] [--port N] [--slots N] [--threads T]
//         [--queue N] [--ctx N] [--max-tokens N] [--max-body BYTES] [--api-key KEY] [--name ID]
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions (both with "stream": true as
// server-sent events), GET /v1/models, GET /health. Requests run on a fixed number of
// slots; each slot is a model of its own over the same memory-mapped file (the OS keeps
// one copy of the weights) with its own workspace and KV cache, because a model's
// forward pass reuses its workspace and so serves one sequence at a time. Requests
// beyond the slots wait in a bounded queue; beyond that they get 503.
#include <tlm/chat.hpp>
#include <tlm/configs.hpp>
#include <tlm/generate.hpp>
#include <tlm/json_schema.hpp>
#include <tlm/model.hpp>
#include <tlm/sampler.hpp>
#include <tlm/tokenizer.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <signal.h>

#include <fmt/core.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
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
  --config NAME      config type to bind the file to (default smollm2_135m):
                     {configs}
  --host ADDR        address to listen on (default 127.0.0.1: this machine only)
  --port N           TCP port (default 8080; 0 picks a free one, printed on the first line)
  --slots N          requests generated at once, each with its own KV cache (default 2)
  --threads T        matrix-kernel threads per slot (default: cores / slots, at least 1)
  --queue N          requests that may wait for a slot; more get 503 (default 32)
  --ctx N            positions per request, prompt plus max_tokens (default 4096; at most the context)
  --max-tokens N     the largest max_tokens a request may ask for, and the default of a chat
                     request (default 1024; a completion request defaults to 16, as OpenAI's)
  --max-body BYTES   the largest request body (default 1048576); larger ones get 413
  --api-key KEY      require "Authorization: Bearer KEY" on every endpoint but /health (else 401);
                     also read from $TLM_API_KEY
  --name ID          the model id reported by /v1/models and in responses (default: the file's stem)
  -h, --help         this text
Sampling defaults follow OpenAI's: temperature 1, top_p 1, no penalties, a random seed.
Extensions accepted in a request: top_k, min_p, repeat_penalty.
)";

std::string usage() { return fmt::format(fmt::runtime(usage_format), fmt::arg("configs", tlm::config_names_text())); }

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& msg) { throw usage_error(msg); }

struct options {
  std::string model, config = "smollm2_135m", host = "127.0.0.1", api_key, name;
  std::size_t port = 8080, slots = 2, threads = 0, queue = 32, ctx = 4096, max_tokens = 1024, max_body = 1 << 20;
};

std::uint64_t to_whole(std::string_view flag, const std::string& v, std::uint64_t lo, std::uint64_t hi) {
  const auto bad = [&] { fail(fmt::format("{} takes a whole number from {} to {}, got '{}'", flag, lo, hi, v)); };
  if (v.empty() || v.size() > 19) bad();
  std::uint64_t n = 0;
  for (const char c : v) {
    if (c < '0' || c > '9') bad();
    n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (n < lo || n > hi) bad();
  return n;
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
    } else if (a == "--model") o.model = value();
    else if (a == "--config") o.config = value();
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
    else fail(fmt::format("unknown option '{}'\n{}", a, usage()));
  }
  if (!tlm::shipped_configs::contains(o.config))
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

// The fields of a request, checked one by one so that a wrong type names its field.
struct request_reader {
  const json& body;

  const json* find(const char* key) const {
    const auto it = body.find(key);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] static void wrong(const char* key, const std::string& what) {
    throw api_error(400, fmt::format("'{}' {}", key, what), key, "invalid_type");
  }
  std::optional<double> number(const char* key, double lo, double hi) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong(key, "must be a number");
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi)
      throw api_error(400, fmt::format("'{}' is {}; it must be from {} to {}", key, v->dump(), lo, hi), key, "invalid_value");
    return d;
  }
  std::optional<std::uint64_t> whole(const char* key, std::uint64_t lo, std::uint64_t hi) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) wrong(key, "must be a whole number");
    const bool negative = !v->is_number_unsigned() && v->get<std::int64_t>() < 0;
    const std::uint64_t n = negative ? 0 : v->get<std::uint64_t>();
    if (negative || n < lo || n > hi)
      throw api_error(400, fmt::format("'{}' is {}; it must be from {} to {}", key, v->dump(), lo, hi), key, "invalid_value");
    return n;
  }
  bool boolean(const char* key, bool dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_boolean()) wrong(key, "must be true or false");
    return v->get<bool>();
  }
};

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
      slots_.push_back(std::move(s));
    }
    tok_ = std::make_unique<tlm::tokenizer>(tlm::tokenizer::from_gguf(slots_[0]->m.file()));
    const auto& f = slots_[0]->m.file();
    template_ = f.has("tokenizer.chat_template") ? f.get_string("tokenizer.chat_template") : std::string();
    created_ = static_cast<std::int64_t>(std::time(nullptr));
  }

  // Ends the running generations at their next token.
  void stop() { stopping_ = true; }

  void routes(httplib::Server& svr) {
    svr.set_payload_max_length(o_.max_body);
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (o_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      const std::string auth = req.get_header_value("Authorization");
      const std::string_view prefix = "Bearer ";
      const bool ok = auth.size() >= prefix.size() && std::string_view(auth).substr(0, prefix.size()) == prefix &&
                      same_key(std::string_view(auth).substr(prefix.size()), o_.api_key);
      if (ok) return httplib::Server::HandlerResponse::Unhandled;
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
                              "GET /v1/models and GET /health", req.method, req.path);
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
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard lock(mu_);
      res.set_content(dump({{"status", "ok"}, {"slots", slots_.size()}, {"busy", busy_}, {"queued", waiting_}}),
                      "application/json");
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
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, true); });
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, false); });
  }

 private:
  struct slot {
    explicit slot(tlm::model<C> model) : m(std::move(model)) {}
    tlm::model<C> m;
    bool busy = false;
  };

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
      }
      s_->freed_.notify_one();
    }
    slot& get() { return *slot_; }

   private:
    server* s_;
    slot* slot_;
  };

  std::shared_ptr<lease> acquire() {
    std::unique_lock lock(mu_);
    const auto free_slot = [&]() -> slot* {
      for (auto& s : slots_)
        if (!s->busy) return s.get();
      return nullptr;
    };
    if (!free_slot()) {
      if (waiting_ >= o_.queue)
        throw api_error(503, fmt::format("all {} slots are busy and {} requests are waiting (--queue); retry later",
                                         slots_.size(), waiting_),
                        {}, "server_busy", "server_error");
      ++waiting_;
      freed_.wait(lock, [&] { return free_slot() != nullptr; });
      --waiting_;
    }
    slot* s = free_slot();
    s->busy = true;
    ++busy_;
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
    auto& s = p.gen.sample;
    s.temperature = static_cast<float>(r.number("temperature", 0.0, 2.0).value_or(1.0));
    s.top_p = static_cast<float>(r.number("top_p", 0.0, 1.0).value_or(1.0));
    if (s.top_p <= 0.0f) throw api_error(400, "'top_p' must be above 0 (1 keeps every token)", "top_p", "invalid_value");
    s.top_k = static_cast<std::size_t>(r.whole("top_k", 0, C::vocab).value_or(0));
    s.min_p = static_cast<float>(r.number("min_p", 0.0, 1.0).value_or(0.0));
    s.repeat_penalty = static_cast<float>(r.number("repeat_penalty", 0.01, 100.0).value_or(1.0));
    s.presence_penalty = static_cast<float>(r.number("presence_penalty", -2.0, 2.0).value_or(0.0));
    s.frequency_penalty = static_cast<float>(r.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
    if (const json* seed = r.find("seed")) {
      if (!seed->is_number_integer()) r.wrong("seed", "must be a whole number");
      s.seed = seed->is_number_unsigned() ? seed->get<std::uint64_t>() : static_cast<std::uint64_t>(seed->get<std::int64_t>());
    } else {
      s.seed = std::random_device{}();
    }
    if (const json* lb = r.find("logit_bias")) {
      if (!lb->is_object()) r.wrong("logit_bias", "must be an object mapping token ids to numbers from -100 to 100");
      for (const auto& [key, v] : lb->items()) {
        std::size_t used = 0;
        unsigned long id = 0;
        try {
          id = std::stoul(key, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != key.size() || key[0] < '0' || key[0] > '9' || id >= C::vocab)
          throw api_error(400, fmt::format("'logit_bias' key '{}' is not a token id from 0 to {}", key, C::vocab - 1),
                          "logit_bias", "invalid_value");
        const double bias = v.is_number() ? v.template get<double>() : std::nan("");
        if (!std::isfinite(bias) || bias < -100 || bias > 100)
          throw api_error(400, fmt::format("'logit_bias' for token {} must be a number from -100 to 100", key), "logit_bias",
                          "invalid_value");
        s.logit_bias.emplace_back(static_cast<std::int32_t>(id), static_cast<float>(bias));
      }
    }
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
          p.gen.grammar = std::make_shared<const tlm::json_grammar>(tlm::json_schema::from_text(dump((*js)["schema"])));
        } catch (const tlm::error& e) {
          throw api_error(400, fmt::format("'response_format.json_schema.schema': {}", e.what()), "response_format",
                          "invalid_value");
        }
      } else if (type != "text") {
        throw api_error(400, fmt::format("'response_format.type' is '{}'; give text, json_object or json_schema", type),
                        "response_format", "invalid_value");
      }
    }
    if (const std::string problem = tlm::sampling_problem(s); !problem.empty())
      throw api_error(400, "sampling: " + problem, {}, "invalid_value");
    return p;
  }

  // Tokenizes the prompt as the generation will, checks it fits, and settles max_tokens.
  std::size_t prompt_tokens(parsed_request& p) const {
    std::size_t n = 0;
    try {
      if (p.chat) {
        // The chat session tokenizes the text between markers on its own; the markers are
        // one token each, so this count is the session's up to a token or two per message.
        n = tok_->encode(tlm::apply_chat_template(template_, p.messages, true), {.add_bos = false, .parse_special = true})
                .size();
      } else {
        n = tok_->encode(p.prompt, {.add_bos = false, .parse_special = false}).size();
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

  // Runs one generation on a slot, calling on_text with each piece of text.
  tlm::generation_result run(slot& s, const parsed_request& p, std::size_t estimated_prompt, tlm::token_callback on_text) {
    // On shutdown every generation ends at its next token, so that stopping never waits
    // for a long reply.
    on_text = [this, inner = std::move(on_text)](std::int32_t id, std::string_view text) {
      if (stopping_.load(std::memory_order_relaxed)) return tlm::step::stop;
      return inner ? inner(id, text) : tlm::step::go_on;
    };
    if (p.chat) {
      // A few positions of slack over the estimate: the session's own count may differ by the markers.
      const std::size_t capacity = std::min(o_.ctx + 8, estimated_prompt + p.gen.max_tokens + 8 + 2 * p.messages.size());
      tlm::chat_session<C> session(s.m, *tok_, std::min(capacity, C::context));
      for (const auto& m : p.messages) session.add(m.role, m.content);
      return session.reply(p.gen, std::move(on_text));
    }
    tlm::generator<C> gen(s.m, *tok_);
    return gen.generate(p.prompt, p.gen, std::move(on_text));
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

  void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    try {
      json body;
      try {
        body = json::parse(req.body);
      } catch (const json::exception& e) {
        throw api_error(400, fmt::format("the request body is not valid JSON: {}", e.what()), {}, "invalid_json");
      }
      auto p = std::make_shared<parsed_request>(read(body, chat));
      const std::size_t n = prompt_tokens(*p);
      const std::string id = fmt::format("{}-{:x}", chat ? "chatcmpl" : "cmpl", ++requests_);
      auto held = acquire();
      if (!p->stream) {
        const auto r = run(held->get(), *p, n, {});
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
          "text/event-stream", [this, p, n, id, held](std::size_t, httplib::DataSink& sink) mutable {
            if (!held) return false;  // called once: the generation ran already
            const auto send = [&](const json& j) {
              const std::string event = "data: " + dump(j) + "\n\n";
              return sink.write(event.data(), event.size());
            };
            bool connected = send(chunk(id, p->chat, "", nullptr, true));
            try {
              const auto r = run(held->get(), *p, n, tlm::make_token_callback([&](std::int32_t, std::string_view text) {
                                   // A client that went away stops its generation, which frees the slot.
                                   if (connected && !text.empty()) connected = send(chunk(id, p->chat, std::string(text), nullptr, false));
                                   return connected;
                                 }));
              held.reset();
              if (!connected) return false;
              connected = send(chunk(id, p->chat, "", finish_reason(r.reason), false));
              if (connected && p->include_usage) {
                json u = chunk(id, p->chat, "", nullptr, false);
                u["choices"] = json::array();
                u["usage"] = usage_of(r);
                connected = send(u);
              }
            } catch (const std::exception& e) {
              // The status line is gone already: the error travels as an event.
              if (connected) connected = send(error_body(e.what(), "server_error", "", "generation_failed"));
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
      send_error(res, api_error(400, e.what(), {}, "context_length_exceeded"));
    } catch (const tlm::error& e) {
      send_error(res, api_error(400, e.what(), {}, "invalid_value"));
    }
  }

  options o_;
  std::vector<std::unique_ptr<slot>> slots_;
  std::unique_ptr<tlm::tokenizer> tok_;
  std::string template_;
  std::int64_t created_ = 0;
  std::mutex mu_;
  std::condition_variable freed_;
  std::size_t busy_ = 0, waiting_ = 0;
  std::atomic<std::uint64_t> requests_{0};
  std::atomic<bool> stopping_{false};
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
  // Enough workers for every slot, every queued request and a few health checks; idle
  // keep-alive connections give their worker back after a few seconds.
  const std::size_t workers = o.slots + o.queue + 4;
  svr.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  svr.set_keep_alive_timeout(2);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);
  s.routes(svr);
  int port = static_cast<int>(o.port);
  if (port == 0) port = svr.bind_to_any_port(o.host);
  else if (!svr.bind_to_port(o.host, port)) port = -1;
  if (port <= 0)
    fail(fmt::format("cannot listen on {}:{}; is the port taken? give another with --port, or 0 for a free one", o.host, o.port));
  fmt::print("serve: listening on http://{}:{} ({}, {} slots x {} threads)\n", o.host, port, tlm::type_name<C>(), o.slots,
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

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    return tlm::with_config(o.config, [&](auto c) { return run<typename decltype(c)::type>(o); });
  } catch (const std::exception& e) {
    fmt::print(stderr, "serve: {}\n", e.what());
    return 1;
  }
}
