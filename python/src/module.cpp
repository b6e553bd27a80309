// tlm._tlm: the Python face of tlm's model, tokenizer, generator and chat session.
// A thin layer: every token is produced by the library's own decoding loop.
//
// The GIL is released whenever the model runs, so Python threads (and two models)
// run at the same time. One model serves one call at a time (its forward pass reuses
// its workspace), so each model has a mutex, taken only after the GIL is released;
// whoever waits for it polls a give-up test, so a dropped stream or Ctrl-C does not
// wait for another call to finish.
#include <tlm/config_match.hpp>
#include <tlm/configs.hpp>
#include <tlm/generate.hpp>
#include <tlm/generation/json_schema.hpp>
#include <tlm/generation/sampler.hpp>
#include <tlm/generation/sampling_options.hpp>
#include <tlm/generation/tools.hpp>
#include <tlm/model.hpp>
#include <tlm/text/chat.hpp>
#include <tlm/text/tokenizer.hpp>
#include <tlm/train/trainer.hpp>
#include <tlm/train/training_options.hpp>

#include <fmt/core.h>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// What one generate() or chat() call asks for.
struct request {
  enum class kind { text, ids, chat } k = kind::text;
  std::string prompt;
  std::vector<std::int32_t> ids;
  std::vector<tlm::chat_message> messages;
  std::string chat_template;           // a template form by name; empty: the file's
  std::size_t chat_prompt_tokens = 0;  // of the rendered conversation, set by prepare()
  tlm::generation_options options;
  // chat(tools=...): the tools as a JSON array, tool_choice (auto, required, none, or a
  // function's name) and parallel_tool_calls. prepare() puts them on the request with
  // tools::apply: the section into the messages, the grammar into the options.
  std::optional<tlm::tools::json> tools;
  std::string tool_choice = "auto";
  bool parallel_tool_calls = true;
  bool may_call = false;  // set by prepare(): a reply may be tool calls
};

// Asked while waiting for the model's lock: true abandons the call.
using give_up_test = std::function<bool()>;

// A LoRA adapter file and its scale (lora=).
using lora_file = std::pair<std::string, float>;

class model_base {
 public:
  virtual ~model_base() = default;
  // Everything about a request that can fail before the model runs: called before a
  // stream's thread starts, so that its errors come from generate() itself. Text
  // prompts become ids here.
  virtual void prepare(request& r) const = 0;
  virtual tlm::generation_result generate(const request& r, tlm::token_callback on_text, const give_up_test& give_up) = 0;
  virtual std::vector<float> logits(std::span<const std::int32_t> ids) = 0;
  // The tokens a chat request runs before the reply, as the chat session tokenizes them
  // (each message on its own, the template's markers as special tokens).
  virtual std::vector<std::int32_t> chat_tokens(const request& r) = 0;
  virtual std::vector<float> embed(std::span<const std::int32_t> ids, tlm::pooling p) = 0;
  virtual std::size_t dim() const = 0;
  virtual std::size_t vocab() const = 0;
  virtual std::size_t context() const = 0;
  virtual std::string config_name() const = 0;
  virtual const tlm::tokenizer& tokenizer() const = 0;
};

template <tlm::LlamaConfig C>
class model_impl final : public model_base {
 public:
  model_impl(const std::string& path, std::size_t threads, const std::vector<lora_file>& loras)
      : m_(tlm::model<C>::load(path, {.threads = threads})), tok_(tlm::tokenizer::from_gguf(m_.file())) {
    for (const auto& [file, scale] : loras) m_.add_lora(file, scale);
    const auto& f = m_.file();
    template_ = f.has("tokenizer.chat_template") ? f.get_string("tokenizer.chat_template") : std::string();
    // The template's BOS/EOS texts are the vocabulary's, as in the chat session.
    if (tok_.bos() >= 0) render_.bos_token = tok_.decode(std::vector<std::int32_t>{tok_.bos()});
    if (tok_.eos() >= 0) render_.eos_token = tok_.decode(std::vector<std::int32_t>{tok_.eos()});
  }

  void prepare(request& r) const override {
    tlm::detail::check_options(r.options);
    if (r.k == request::kind::chat && r.tools) add_tools(r);
    if (r.k == request::kind::chat) {
      const std::size_t prompt =
          tok_.encode(tlm::chat_template::of(template_, r.chat_template).render(r.messages, true, render_),
                      {.add_bos = false, .parse_special = true})
              .size();
      if (prompt > C::context)
        throw tlm::capacity_error("chat: the conversation has " + std::to_string(prompt) +
                                  " tokens, more than the context of " + std::to_string(C::context) + " positions; shorten it");
      r.chat_prompt_tokens = prompt;
    } else {
      if (r.k == request::kind::text) {
        // As the generator tokenizes a text prompt.
        r.ids = tok_.encode(r.prompt, {.parse_special = false});
        r.k = request::kind::ids;
      }
      if (r.ids.empty()) throw tlm::error("generate: the prompt is empty after tokenization; give some text");
      if (r.ids.size() > C::context)
        throw tlm::capacity_error("generate: the prompt has " + std::to_string(r.ids.size()) +
                                  " tokens, more than the context of " + std::to_string(C::context) + " positions; shorten it");
      for (const auto id : r.ids)
        if (id < 0 || static_cast<std::size_t>(id) >= C::vocab)
          throw tlm::error("generate: token id " + std::to_string(id) + " is outside the vocabulary (ids 0 to " +
                           std::to_string(C::vocab - 1) + ")");
    }
    // The generator's own check, made early: a grammar whose shortest document does
    // not fit in max_tokens.
    if (r.options.grammar) {
      const std::size_t budget = r.options.max_tokens > 0 ? r.options.max_tokens - 1 : 0;
      if (const std::size_t need = r.options.grammar->min_to_finish(r.options.grammar->start()); need > budget)
        throw tlm::error("constrained output: the shortest document of the grammar has " + std::to_string(need) +
                         " characters, more than max_tokens - 1 = " + std::to_string(budget) +
                         "; raise max_tokens to at least " + std::to_string(need + 1));
    }
  }

  // chat(tools=...) through tools::apply, as examples/serve reads OpenAI's fields: a
  // tool_choice other than auto, required and none names a function.
  void add_tools(request& r) const {
    namespace tools = tlm::tools;
    const std::string& given = r.tool_choice;
    tools::choice c;
    if (given == "none") c.k = tools::choice::kind::none;
    else if (given == "required") c.k = tools::choice::kind::required;
    else if (given != "auto") c = {tools::choice::kind::named, given};
    try {
      r.may_call = tools::apply(*r.tools, c, r.parallel_tool_calls, r.messages,
                                tlm::chat_template::of(template_, r.chat_template).default_system(), r.options);
    } catch (const tools::grammar_conflict&) {
      throw tlm::error("chat: json_schema and tools cannot hold one reply together; give one of them");
    } catch (const tools::tool_error& e) {
      throw tlm::error(std::string("chat: ") + e.what());
    }
  }

  tlm::generation_result generate(const request& r, tlm::token_callback on_text, const give_up_test& give_up) override {
    std::unique_lock lock(mu_, std::defer_lock);
    while (!lock.try_lock_for(std::chrono::milliseconds(20)))
      if (give_up && give_up()) {
        tlm::generation_result abandoned;
        abandoned.reason = tlm::stop_reason::callback;
        return abandoned;
      }
    if (r.k == request::kind::chat) {
      // The cache is sized to this conversation rather than to the whole context: the
      // positions the session itself counts for it (chat_session::positions_for, which
      // tokenizes as add() and reply() do) plus the reply.
      const tlm::chat_session<C> counter(m_, tok_, tlm::chat_options{.capacity = 1, .chat_template = r.chat_template});
      const std::size_t capacity = std::min(C::context, counter.positions_for(r.messages) + r.options.max_tokens);
      tlm::chat_session<C> session(m_, tok_, tlm::chat_options{.capacity = capacity, .chat_template = r.chat_template});
      for (const auto& msg : r.messages) session.add(msg.role, msg.content);
      return session.reply(r.options, std::move(on_text));
    }
    tlm::generator<C> gen(m_, tok_);
    return gen.generate(std::span<const std::int32_t>(r.ids), r.options, std::move(on_text));
  }

  std::vector<std::int32_t> chat_tokens(const request& given) override {
    request r = given;
    if (r.tools) add_tools(r);
    // Capacity 1: the session only renders and tokenizes; it never runs the model.
    const tlm::chat_session<C> counter(m_, tok_, tlm::chat_options{.capacity = 1, .chat_template = r.chat_template});
    return counter.prompt_for(r.messages);
  }

  std::vector<float> logits(std::span<const std::int32_t> ids) override {
    std::lock_guard lock(mu_);  // no give-up: a logits call is one prefill, not a generation
    if (ids.empty()) throw tlm::error("logits: no token ids; give at least one");
    if (ids.size() > C::context)
      throw tlm::capacity_error("logits: " + std::to_string(ids.size()) + " ids are more than the context of " +
                                std::to_string(C::context) + " positions; give fewer");
    tlm::kv_cache<C> cache(ids.size());
    std::vector<float> all;
    m_.prefill(ids, cache, &all);
    return all;
  }

  std::vector<float> embed(std::span<const std::int32_t> ids, tlm::pooling p) override {
    std::lock_guard lock(mu_);
    return m_.embed(ids, p);
  }

  std::size_t dim() const override { return tlm::dim<C>; }
  std::size_t vocab() const override { return C::vocab; }
  std::size_t context() const override { return C::context; }
  std::string config_name() const override { return std::string(tlm::config_name<C>()); }
  const tlm::tokenizer& tokenizer() const override { return tok_; }

 private:
  std::timed_mutex mu_;  // timed: a waiter polls its give-up test
  tlm::model<C> m_;
  tlm::tokenizer tok_;
  std::string template_;
  tlm::chat_render_options render_;
};

std::shared_ptr<model_base> load(const std::string& path, const std::string& config, std::size_t threads,
                                 const std::vector<lora_file>& loras) {
  if (threads > 1024) throw tlm::error("threads=" + std::to_string(threads) + " is more than 1024; give 0 for every core");
  // No config: the shipped config whose hyperparameters the file has (Model.config says which).
  const std::string name = tlm::choose_config(config, path);
  return tlm::with_config(name, [&](auto c) -> std::shared_ptr<model_base> {
    return std::make_shared<model_impl<typename decltype(c)::type>>(path, threads, loras);
  });
}

// Text from the model may end inside a character (detokenize of a partial sequence);
// such bytes become U+FFFD rather than an exception.
nb::str to_str(std::string_view s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw nb::python_error();
  return nb::steal<nb::str>(o);
}

std::string_view reason_name(tlm::stop_reason r) {
  switch (r) {
    case tlm::stop_reason::eos: return "eos";
    case tlm::stop_reason::stop_string: return "stop";
    case tlm::stop_reason::max_tokens: return "length";
    case tlm::stop_reason::callback: return "cancelled";
    case tlm::stop_reason::context_full: return "context_full";
  }
  return "?";
}

// details=True's dict, and a finished stream's result.
nb::dict result_dict(const tlm::generation_result& g, bool may_call = false) {
  nb::dict d;
  d["text"] = to_str(g.text);
  d["ids"] = nb::cast(g.ids);
  d["finish_reason"] = nb::str(std::string(reason_name(g.reason)).c_str());
  if (may_call) {
    // A reply that is whole calls: [{'name', 'arguments'}, ...] in order, arguments as JSON text.
    if (const auto parsed = tlm::tools::parse_calls(g.text)) {
      nb::list calls;
      for (const auto& c : *parsed) {
        nb::dict call;
        call["name"] = nb::str(c.name.c_str());
        call["arguments"] = nb::str(c.arguments.dump(-1, ' ', false, tlm::tools::json::error_handler_t::replace).c_str());
        calls.append(call);
      }
      d["tool_calls"] = calls;
      d["finish_reason"] = "tool_calls";
    } else {
      d["tool_calls"] = nb::none();
    }
  }
  d["prompt_tokens"] = g.prompt_tokens;
  d["completion_tokens"] = g.ids.size();
  return d;
}

// Pieces of text from a generation that runs on a thread of its own; the Python side
// waits for each with the GIL released. Dropping the iterator stops the generation.
class text_stream {
 public:
  text_stream(std::shared_ptr<model_base> m, request r) : m_(std::move(m)), r_(std::move(r)) {
    worker_ = std::thread([this] {
      try {
        auto g = m_->generate(
            r_,
            tlm::make_token_callback([this](std::int32_t, std::string_view text) {
              std::lock_guard lock(mu_);
              if (cancelled_) return false;
              if (!text.empty()) pieces_.emplace_back(text);
              ready_.notify_one();
              return true;
            }),
            [this] { return cancelled_.load(); });
        std::lock_guard lock(mu_);
        result_ = std::move(g);
      } catch (...) {
        std::lock_guard lock(mu_);
        error_ = std::current_exception();
      }
      std::lock_guard lock(mu_);
      finished_ = true;
      ready_.notify_one();
    });
  }
  text_stream(const text_stream&) = delete;
  text_stream& operator=(const text_stream&) = delete;
  ~text_stream() {
    cancelled_ = true;
    // The worker ends at its next token, or within a poll if it still waits for the
    // model's lock; the GIL is let go meanwhile, as any wait for the model lets it go.
    nb::gil_scoped_release unlocked;
    if (worker_.joinable()) worker_.join();
  }

  nb::str next() {
    std::optional<std::string> piece;
    std::exception_ptr error;
    // The wait may be long (the model busy with another call), so it looks for Ctrl-C
    // every 50 ms, as a non-streaming generation does.
    for (bool ready = false; !ready;) {
      {
        nb::gil_scoped_release unlocked;
        std::unique_lock lock(mu_);
        ready = ready_.wait_for(lock, std::chrono::milliseconds(50), [&] { return !pieces_.empty() || finished_; });
        if (ready && !pieces_.empty()) {
          piece = std::move(pieces_.front());
          pieces_.pop_front();
        } else if (ready) {
          error = std::exchange(error_, nullptr);
        }
      }
      if (!ready && PyErr_CheckSignals() != 0) throw nb::python_error();
    }
    if (piece) return to_str(*piece);
    if (error) std::rethrow_exception(error);
    throw nb::stop_iteration();
  }

  // Once the stream is exhausted: the generation's dict as details=True gives it (text,
  // ids, finish_reason, token counts); before that, or after an error, None.
  nb::object result() {
    std::lock_guard lock(mu_);
    if (!finished_ || !result_ || !pieces_.empty()) return nb::none();
    return result_dict(*result_, r_.may_call);
  }

 private:
  std::shared_ptr<model_base> m_;
  request r_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::string> pieces_;
  bool finished_ = false;
  std::atomic<bool> cancelled_{false};  // read by the worker's give-up test without mu_
  std::exception_ptr error_;
  std::optional<tlm::generation_result> result_;
  std::thread worker_;  // last: started once everything it touches exists
};

std::vector<tlm::chat_message> messages_from(const nb::handle& given);
tlm::tools::json json_of(const nb::handle& v, const std::string& where);

// The chat request of chat() and chat_tokens(): the messages, the template form and the tools.
request chat_request(const nb::handle& messages, const std::optional<std::string>& chat_template,
                     const nb::object& tools, const std::string& tool_choice, bool parallel_tool_calls = true) {
  request r;
  r.k = request::kind::chat;
  r.messages = messages_from(messages);
  if (chat_template) r.chat_template = *chat_template;
  if (!tools.is_none()) r.tools = json_of(tools, "tools");
  r.tool_choice = tool_choice;
  r.parallel_tool_calls = parallel_tool_calls;
  return r;
}

class py_model {
 public:
  py_model(const std::string& path, const std::string& config, std::size_t threads, const nb::object& lora) {
    const std::vector<lora_file> loras = lora_files(lora);
    nb::gil_scoped_release unlocked;
    m_ = load(path, config, threads, loras);
  }

  // lora= is a path, a (path, scale) pair, or a list of those; None: no adapter.
  static std::vector<lora_file> lora_files(const nb::object& lora) {
    std::vector<lora_file> out;
    if (lora.is_none()) return out;
    const nb::object fspath = nb::module_::import_("os").attr("fspath");
    auto one = [&](const nb::handle& item) {
      if (nb::isinstance<nb::tuple>(item) && nb::len(item) == 2 && !nb::isinstance<nb::str>(item[1])) {
        const double scale = nb::cast<double>(item[1]);
        if (!std::isfinite(scale)) throw tlm::error("lora: the scale of an adapter must be a finite number");
        out.emplace_back(nb::cast<std::string>(fspath(item[0])), static_cast<float>(scale));
      } else {
        out.emplace_back(nb::cast<std::string>(fspath(item)), 1.0f);
      }
    };
    if (nb::isinstance<nb::list>(lora)) {
      for (const nb::handle item : lora) one(item);
    } else {
      one(lora);
    }
    return out;
  }

  std::vector<std::int32_t> tokenize(const std::string& text, bool special, bool add_bos) const {
    if (add_bos) return m_->tokenizer().encode(text, {.parse_special = special});  // the file's BOS/EOS rule
    return m_->tokenizer().encode(text, {.add_bos = false, .parse_special = special});
  }

  std::vector<std::int32_t> chat_tokens(const nb::handle& messages, const std::optional<std::string>& chat_template,
                                        const nb::object& tools, const std::string& tool_choice) {
    request r = chat_request(messages, chat_template, tools, tool_choice);
    nb::gil_scoped_release unlocked;
    return m_->chat_tokens(r);
  }

  nb::str detokenize(const std::vector<std::int32_t>& ids, bool special) const {
    for (const auto id : ids)
      if (id < 0 || static_cast<std::size_t>(id) >= m_->vocab())
        throw tlm::error("detokenize: token id " + std::to_string(id) + " is outside the vocabulary (ids 0 to " +
                         std::to_string(m_->vocab() - 1) + ")");
    if (special) return to_str(m_->tokenizer().decode(ids));
    // As llama.cpp's detokenizer without special: control tokens (BOS, EOS, chat
    // markers) have no text.
    std::vector<std::int32_t> kept;
    for (const auto id : ids)
      if (m_->tokenizer().type(id) != tlm::token_type::control) kept.push_back(id);
    return to_str(m_->tokenizer().decode(kept));
  }

  nb::object logits(const std::vector<std::int32_t>& ids) {
    auto* all = new std::vector<float>();
    nb::capsule owner(all, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    {
      nb::gil_scoped_release unlocked;
      *all = m_->logits(ids);
    }
    // The array views the vector's memory, which the capsule frees with the array.
    return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<2>>(all->data(), {ids.size(), m_->vocab()}, owner));
  }

  // A text, a list of token ids, or a list of those; the texts tokenized as the server
  // does (the file's BOS rule, special-token strings as text).
  nb::object embed(const nb::object& input, const std::string& pooling_name) {
    tlm::pooling p;
    if (pooling_name == "mean") p = tlm::pooling::mean;
    else if (pooling_name == "last") p = tlm::pooling::last;
    else throw tlm::error("embed: pooling is '" + pooling_name + "'; give 'mean' or 'last'");
    std::vector<std::vector<std::int32_t>> texts;
    bool single = true;
    const auto one = [&](const nb::handle& item, std::size_t i) {
      if (nb::isinstance<nb::str>(item)) {
        texts.push_back(m_->tokenizer().encode(nb::cast<std::string>(item), {.parse_special = false}));
      } else {
        std::vector<std::int32_t> ids;
        if (!nb::try_cast(item, ids))
          throw tlm::error("embed: input " + std::to_string(i) + " is neither a str nor a list of token ids");
        texts.push_back(std::move(ids));
      }
    };
    const bool is_list = nb::isinstance<nb::list>(input) || nb::isinstance<nb::tuple>(input);
    if (is_list && nb::len(input) > 0 && !nb::isinstance<nb::int_>(input[0])) {
      single = false;
      std::size_t i = 0;
      for (const nb::handle item : input) one(item, i++);
    } else {
      one(input, 0);
    }
    auto* all = new std::vector<float>();
    nb::capsule owner(all, [](void* q) noexcept { delete static_cast<std::vector<float>*>(q); });
    {
      nb::gil_scoped_release unlocked;
      all->reserve(texts.size() * m_->dim());
      for (const auto& ids : texts) {
        const auto e = m_->embed(ids, p);
        all->insert(all->end(), e.begin(), e.end());
      }
    }
    if (single) return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<1>>(all->data(), {m_->dim()}, owner));
    return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<2>>(all->data(), {texts.size(), m_->dim()}, owner));
  }

  nb::object run(request r, bool stream, bool details) {
    if (stream && details)
      throw tlm::error("details=True describes a finished generation; it does not combine with stream=True");
    {
      nb::gil_scoped_release unlocked;  // tokenizing a long prompt takes a while
      m_->prepare(r);
    }
    if (stream) return nb::cast(new text_stream(m_, std::move(r)), nb::rv_policy::take_ownership);
    // Python runs a signal's handler only when it runs Python code, so the generation
    // takes the GIL back now and then to let Ctrl-C raise KeyboardInterrupt.
    const auto every = std::chrono::milliseconds(50);
    auto due = std::chrono::steady_clock::now() + every;
    bool interrupted = false;
    const auto check_signals = [&] {
      if (const auto now = std::chrono::steady_clock::now(); now >= due) {
        due = now + every;
        nb::gil_scoped_acquire held;
        // Non-zero leaves the handler's exception set on this thread, raised below.
        interrupted = PyErr_CheckSignals() != 0;
      }
      return interrupted;
    };
    tlm::generation_result g;
    {
      nb::gil_scoped_release unlocked;
      g = m_->generate(r, tlm::make_token_callback([&](std::int32_t, std::string_view) { return !check_signals(); }),
                       check_signals);
    }
    if (interrupted) throw nb::python_error();
    if (!details) return to_str(g.text);
    return result_dict(g, r.may_call);
  }

  std::size_t vocab() const { return m_->vocab(); }
  std::size_t context() const { return m_->context(); }
  std::string config() const { return m_->config_name(); }
  std::int32_t eos() const { return m_->tokenizer().eos(); }
  std::int32_t bos() const { return m_->tokenizer().bos(); }
  // A list, not only eos: a Llama 3 reply ends at <|eot_id|> while the file's EOS is
  // <|end_of_text|>, so a caller stopping its own loop needs the whole set.
  std::vector<std::int32_t> end_of_generation() const {
    const auto ids = m_->tokenizer().end_of_generation();
    return {ids.begin(), ids.end()};
  }

 private:
  std::shared_ptr<model_base> m_;
};

// The sampling keywords of generate() and chat(), read by tlm's option table (the names,
// ranges and defaults of generate's flags and the server's fields): an option added to the
// table is a keyword here. An omitted one keeps the library default, except the seed: as
// the server does, a fresh random seed unless one is given, which reproduces.
tlm::sampling sampling_from(const nb::kwargs& kw, std::size_t vocab) {
  tlm::sampling s;
  std::random_device rd;
  s.seed = (std::uint64_t{rd()} << 32) ^ rd();
  for (const auto& [key, value] : kw) {
    const std::string name = nb::cast<std::string>(key);
    const tlm::sampling_option* o = tlm::find_sampling_option(name);
    if (!o) {
      std::string known;
      for (const auto& k : tlm::sampling_options) known += (known.empty() ? "" : ", ") + std::string(k.name);
      throw nb::type_error(("unexpected keyword argument '" + name + "'; the sampling keywords are " + known).c_str());
    }
    if (value.is_none()) continue;  // the default, as if omitted
    const auto number = [&](nb::handle v, const std::string& what) {
      if (nb::isinstance<nb::bool_>(v) || !(nb::isinstance<nb::float_>(v) || nb::isinstance<nb::int_>(v)))
        throw nb::type_error((what + " must be a number").c_str());
      return nb::cast<double>(v);
    };
    switch (o->kind) {
      case tlm::option_kind::real: {
        const double x = number(value, name);
        if (!o->accepts(x)) throw tlm::error(o->out_of_range(name, nb::cast<std::string>(nb::repr(value))));
        o->set_real(s, x);
        break;
      }
      case tlm::option_kind::whole:
      case tlm::option_kind::seed: {
        if (nb::isinstance<nb::bool_>(value) || !nb::isinstance<nb::int_>(value))
          throw nb::type_error((name + " must be a whole number (an int)").c_str());
        const unsigned long long n = PyLong_AsUnsignedLongLong(value.ptr());  // -1 and an error when negative or too big
        const bool overflow = n == static_cast<unsigned long long>(-1) && PyErr_Occurred();
        if (overflow) PyErr_Clear();
        if (overflow || (o->kind == tlm::option_kind::whole && static_cast<double>(n) > o->hi))
          throw tlm::error(o->out_of_range(name, nb::cast<std::string>(nb::repr(value))));
        o->set_whole(s, n);
        break;
      }
      case tlm::option_kind::token_bias: {
        if (!nb::isinstance<nb::dict>(value)) throw nb::type_error((name + " must be a dict {token id: bias}").c_str());
        for (const auto& [id, bias] : nb::borrow<nb::dict>(value)) {
          if (nb::isinstance<nb::bool_>(id) || !nb::isinstance<nb::int_>(id))
            throw nb::type_error((name + " keys must be token ids (ints)").c_str());
          const long long i = nb::cast<long long>(id);
          if (i < 0 || static_cast<std::size_t>(i) >= vocab)
            throw tlm::error(name + " names token id " + std::to_string(i) + ", outside the vocabulary (ids 0 to " +
                             std::to_string(vocab - 1) + ")");
          const double b = number(bias, name + " values");
          if (!o->accepts(b)) throw tlm::error(o->out_of_range(name + " for token " + std::to_string(i), nb::cast<std::string>(nb::repr(bias))));
          s.logit_bias.emplace_back(static_cast<std::int32_t>(i), static_cast<float>(b));
        }
        break;
      }
    }
  }
  return s;
}

tlm::generation_options options_from(std::size_t max_tokens, const nb::kwargs& sampling, std::size_t vocab,
                                     const nb::object& stop, bool ignore_eos, const nb::object& json_schema) {
  tlm::generation_options o;
  o.max_tokens = max_tokens;
  o.sample = sampling_from(sampling, vocab);
  o.stop_at_eos = !ignore_eos;
  if (nb::isinstance<nb::str>(stop)) o.stop.push_back(nb::cast<std::string>(stop));
  else if (!stop.is_none()) o.stop = nb::cast<std::vector<std::string>>(stop);
  if (nb::isinstance<nb::str>(json_schema)) {
    o.grammar = std::make_shared<const tlm::json_grammar>(tlm::json_schema::from_text(nb::cast<std::string>(json_schema)));
  } else if (nb::isinstance<nb::bool_>(json_schema) && nb::cast<bool>(json_schema)) {
    o.grammar = std::make_shared<const tlm::json_grammar>();  // any JSON value
  } else if (!json_schema.is_none() && !nb::isinstance<nb::bool_>(json_schema)) {
    throw nb::type_error("json_schema takes the schema as JSON text (json.dumps(schema)), or True for any JSON value");
  }
  return o;
}

// The table as Python sees it: tlm._sampling_options(), one dict per keyword.
nb::list sampling_option_list() {
  nb::list out;
  const tlm::sampling defaults;
  for (const auto& o : tlm::sampling_options) {
    nb::dict d;
    d["name"] = nb::str(std::string(o.name).c_str());
    d["help"] = nb::str(std::string(o.help).c_str());
    d["range"] = nb::str(o.range_text().c_str());
    switch (o.kind) {
      case tlm::option_kind::real:
        d["kind"] = "real";
        d["default"] = o.get_real(defaults);
        d["min"] = o.lo;
        d["max"] = o.hi;
        d["min_open"] = o.lo_open;
        break;
      case tlm::option_kind::whole:
        d["kind"] = "whole";
        d["default"] = o.get_whole(defaults);
        d["min"] = static_cast<std::uint64_t>(o.lo);
        d["max"] = static_cast<std::uint64_t>(o.hi);
        break;
      case tlm::option_kind::seed:
        d["kind"] = "seed";
        d["default"] = nb::none();  // a fresh random seed per call
        d["min"] = 0;
        d["max"] = std::numeric_limits<std::uint64_t>::max();
        break;
      case tlm::option_kind::token_bias:
        d["kind"] = "token_bias";
        d["default"] = nb::dict();
        d["min"] = o.lo;
        d["max"] = o.hi;
        break;
    }
    out.append(d);
  }
  return out;
}

// The docstring of generate() or chat(): `head`, then a line per sampling keyword.
std::string sampling_doc(std::string_view head) {
  std::string doc(head);
  doc += "\n\nSampling keywords (the options of generate's flags and the server's fields, tlm/generation/sampling_options.hpp):";
  for (const auto& o : tlm::sampling_options) {
    doc += "\n  " + std::string(o.name) + ": " + std::string(o.help) + "; range " + o.range_text() + ", default " +
           (o.kind == tlm::option_kind::seed ? std::string("None (a fresh random seed)")
            : o.kind == tlm::option_kind::token_bias ? std::string("None (a dict {token id: bias})")
                                                     : o.default_text());
  }
  return doc;
}

// A Python value as JSON, through json.dumps (which keeps a dict's order); a str is
// taken as JSON text already.
tlm::tools::json json_of(const nb::handle& v, const std::string& where) {
  const std::string text = nb::isinstance<nb::str>(v)
                               ? nb::cast<std::string>(v)
                               : nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(v));
  tlm::tools::json j = tlm::tools::json::parse(text, nullptr, false);
  if (j.is_discarded()) throw tlm::error("chat: " + where + " is not valid JSON");
  return j;
}

std::vector<tlm::chat_message> messages_from(const nb::handle& given) {
  // Any sequence of dicts: a list or a tuple. A str or a dict is a sequence (or
  // iterable) of something else, so they are named as mistakes rather than walked.
  if (nb::isinstance<nb::str>(given) || nb::isinstance<nb::bytes>(given) || nb::isinstance<nb::dict>(given) ||
      !PySequence_Check(given.ptr()))
    throw nb::type_error("messages must be a list (or tuple) of dicts {'role': ..., 'content': ...}");
  PyObject* as_list = PySequence_List(given.ptr());
  if (!as_list) throw nb::python_error();
  const nb::list messages = nb::steal<nb::list>(as_list);
  std::vector<tlm::chat_message> out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    nb::handle m = messages[i];
    if (!nb::isinstance<nb::dict>(m)) throw nb::type_error((where + " must be a dict with 'role' and 'content'").c_str());
    nb::dict d = nb::borrow<nb::dict>(m);
    if (!d.contains("role") || !nb::isinstance<nb::str>(d["role"]))
      throw nb::type_error((where + " needs a string 'role' (system, user or assistant)").c_str());
    const bool calls = d.contains("tool_calls") && !d["tool_calls"].is_none();
    if (!d.contains("content") && !calls) throw nb::type_error((where + " needs a 'content'").c_str());
    std::string content;
    nb::object c = d.contains("content") ? nb::object(d["content"]) : nb::none();
    if (c.is_none() && calls) {
      // an assistant's message that only calls tools
    } else if (nb::isinstance<nb::str>(c)) {
      content = nb::cast<std::string>(c);
    } else if (nb::isinstance<nb::list>(c)) {  // OpenAI's list of parts; text parts only
      for (nb::handle part : nb::borrow<nb::list>(c)) {
        if (!nb::isinstance<nb::dict>(part) || !nb::borrow<nb::dict>(part).contains("text"))
          throw nb::type_error((where + ".content parts must be {'type': 'text', 'text': ...}").c_str());
        content += nb::cast<std::string>(nb::borrow<nb::dict>(part)["text"]);
      }
    } else {
      throw nb::type_error((where + ".content must be a string or a list of text parts").c_str());
    }
    std::string role = nb::cast<std::string>(d["role"]);
    if (role == "developer") role = "system";  // OpenAI's newer name for it
    // ChatML would render any one-line role, but the models' templates speak of these
    // three only (and tool results, written as user turns): another role is most likely a
    // typo, which would pass unnoticed.
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      throw tlm::error("chat: " + where + " has role '" + role +
                       "'; the chat template knows system, user, assistant and tool (developer reads as system)");
    if (role == "tool") {
      // Results in the tools' form: consecutive ones join one user turn.
      const std::string block = tlm::tools::response_block(content);
      const bool after_tool = i > 0 && nb::cast<std::string>(nb::borrow<nb::dict>(messages[i - 1])["role"]) == "tool";
      if (after_tool) out.back().content += "\n" + block;
      else out.push_back({"user", block});
      continue;
    }
    if (calls) {
      if (role != "assistant") throw tlm::error("chat: " + where + " has tool_calls; only an assistant's message calls tools");
      const nb::object list = d["tool_calls"];
      if (!nb::isinstance<nb::list>(list) && !nb::isinstance<nb::tuple>(list))
        throw nb::type_error((where + ".tool_calls must be a list of {'type': 'function', 'function': {'name', 'arguments'}}").c_str());
      std::size_t j = 0;
      for (nb::handle call : list) {
        const std::string cw = where + ".tool_calls[" + std::to_string(j++) + "]";
        nb::object f = nb::isinstance<nb::dict>(call) && nb::borrow<nb::dict>(call).contains("function")
                           ? nb::object(nb::borrow<nb::dict>(call)["function"])
                           : nb::none();
        if (!nb::isinstance<nb::dict>(f) || !nb::borrow<nb::dict>(f).contains("name") ||
            !nb::isinstance<nb::str>(nb::borrow<nb::dict>(f)["name"]))
          throw nb::type_error((cw + " must be {'type': 'function', 'function': {'name': ..., 'arguments': ...}}").c_str());
        const nb::dict fd = nb::borrow<nb::dict>(f);
        tlm::tools::json args = tlm::tools::json::object();
        if (fd.contains("arguments") && !fd["arguments"].is_none()) args = json_of(fd["arguments"], cw + ".function.arguments");
        if (!content.empty()) content += "\n";
        content += tlm::tools::call_text(nb::cast<std::string>(fd["name"]), args);
      }
    }
    out.push_back({std::move(role), std::move(content)});
  }
  if (out.empty()) throw tlm::error("chat: no messages; give at least one {'role': 'user', 'content': ...}");
  return out;
}

// ---- training: tlm::trainer behind tlm.Trainer, its options read by the table of
// examples/train's flags (tlm/train/training_options.hpp).

class trainer_base {
 public:
  virtual ~trainer_base() = default;
  virtual tlm::step_report step() = 0;
  virtual bool done() const = 0;
  virtual tlm::finish_report finish() = 0;
  virtual double held_out_loss() = 0;
  virtual std::size_t steps() const = 0;
  virtual std::size_t total_steps() const = 0;
  virtual std::size_t steps_this_run() const = 0;
  virtual const tlm::dataset& data() const = 0;
  virtual std::string kernel_level() const = 0;
  virtual double load_seconds() const = 0;
  virtual const std::vector<tlm::loss_log_row>& log() const = 0;
};

template <tlm::LlamaConfig C, class Adapter>
class trainer_impl final : public trainer_base {
 public:
  trainer_impl(const tlm::training_request& r, const std::string& config, tlm::trainer_hooks hooks) {
    if (!r.model.empty()) {
      source_ = std::make_unique<tlm::gguf::file>(r.model);
      (void)tlm::bind<C>(*source_);  // a file of another shape is refused before anything else is read
    }
    t_.emplace(tlm::to_trainer_options(r, config), tlm::training_data<C>(r, config, source_.get()), source_.get(), std::move(hooks));
  }
  tlm::step_report step() override { return t_->step(); }
  bool done() const override { return t_->done(); }
  tlm::finish_report finish() override { return t_->finish(); }
  double held_out_loss() override { return t_->held_out_loss(); }
  std::size_t steps() const override { return t_->steps(); }
  std::size_t total_steps() const override { return t_->total_steps(); }
  std::size_t steps_this_run() const override { return t_->steps_this_run(); }
  const tlm::dataset& data() const override { return t_->data(); }
  std::string kernel_level() const override { return t_->kernel_level(); }
  double load_seconds() const override { return t_->load_seconds(); }
  const std::vector<tlm::loss_log_row>& log() const override { return t_->log(); }

 private:
  std::unique_ptr<tlm::gguf::file> source_;  // the trainer's source outlives it: declared first
  std::optional<tlm::trainer<C, Adapter>> t_;
};

nb::object nan_as_none(double x) { return std::isnan(x) ? nb::none() : nb::cast(x); }

nb::dict step_dict(const tlm::step_report& r) {
  nb::dict d;
  d["step"] = r.step;
  d["total"] = r.total;
  d["loss"] = r.loss;
  d["held_out"] = nan_as_none(r.held_out);
  d["last_held_out"] = nan_as_none(r.last_held_out);
  d["lr"] = r.lr;
  d["grad_norm"] = r.grad_norm;
  d["tokens_per_s"] = r.tokens_per_s;
  d["eta_seconds"] = r.eta_seconds;
  return d;
}

nb::dict finish_dict(const tlm::finish_report& f, std::size_t step, std::size_t total) {
  nb::dict d;
  d["step"] = step;
  d["total"] = total;
  d["saved"] = f.saved;
  d["checkpoint"] = f.checkpoint.empty() ? nb::none() : nb::cast(f.checkpoint);
  d["save_seconds"] = f.save_seconds;
  d["exported"] = f.exported;
  d["model"] = f.model.empty() ? nb::none() : nb::cast(f.model.string());
  d["merged"] = f.merged.empty() ? nb::none() : nb::cast(f.merged.string());
  d["merge_kept"] = nan_as_none(f.merge_kept);
  return d;
}

// The keywords of tlm.Trainer, each a row of the table; a value of the wrong type is a
// TypeError, one out of range tlm.Error with the range, as the flag's message gives it.
tlm::training_request training_request_from(const nb::kwargs& kw) {
  tlm::training_request r;
  const nb::object fspath = nb::module_::import_("os").attr("fspath");
  for (const auto& [key, value] : kw) {
    const std::string name = nb::cast<std::string>(key);
    const tlm::training_option* o = tlm::find_training_option(name);
    if (!o)
      throw nb::type_error(("tlm.Trainer: unexpected keyword argument '" + name + "'; the keywords are " + tlm::training_option_names()).c_str());
    if (value.is_none()) continue;  // the default, as if omitted
    const std::string shown = name + "=" + nb::cast<std::string>(nb::repr(value));
    switch (o->kind) {
      case tlm::training_option_kind::flag:
        if (!nb::isinstance<nb::bool_>(value)) throw nb::type_error((name + " is a switch: pass True or False, not " + shown).c_str());
        r.*(o->flag) = nb::cast<bool>(value);
        break;
      case tlm::training_option_kind::whole: {
        if (nb::isinstance<nb::bool_>(value) || !nb::isinstance<nb::int_>(value))
          throw nb::type_error((name + " must be a whole number (an int), not " + shown).c_str());
        const long long n = PyLong_AsLongLong(value.ptr());  // -1 and an error when too big
        if (n == -1 && PyErr_Occurred()) PyErr_Clear();
        else if (n >= 0 && static_cast<double>(n) >= o->lo && static_cast<double>(n) <= o->hi) {
          r.*(o->whole) = static_cast<std::uint64_t>(n);
          break;
        }
        throw tlm::error(fmt::format("{} takes a whole number from {} to {}, got {}", name, o->lo, o->hi, nb::cast<std::string>(nb::repr(value))));
      }
      case tlm::training_option_kind::real: {
        if (nb::isinstance<nb::bool_>(value) || !(nb::isinstance<nb::float_>(value) || nb::isinstance<nb::int_>(value)))
          throw nb::type_error((name + " must be a number, not " + shown).c_str());
        const double x = nb::cast<double>(value);
        if (!o->accepts(x)) throw tlm::error(o->out_of_range(name, nb::cast<std::string>(nb::repr(value))));
        r.*(o->real) = x;
        break;
      }
      case tlm::training_option_kind::text:
        if (!nb::isinstance<nb::str>(value) && !nb::hasattr(value, "__fspath__"))
          throw nb::type_error((name + " must be a string or a path, not " + shown).c_str());
        r.*(o->text) = nb::cast<std::string>(fspath(value));
        break;
    }
  }
  return r;
}

// tlm.Trainer: one run of tlm::trainer. Each step runs with the GIL released; run()
// looks for Ctrl-C between steps, as examples/train's stop flag is read, and then writes
// the checkpoint examples/train writes on Ctrl-C before raising KeyboardInterrupt.
class py_trainer {
 public:
  explicit py_trainer(const nb::kwargs& kw) : r_(training_request_from(kw)) {
    tlm::check_request(r_);
    if (!r_.config.empty() && !tlm::program_configs::contains(r_.config))
      throw tlm::error(tlm::unknown_config(r_.config));
    tlm::trainer_hooks hooks;
    hooks.warn = [this](const std::string& m) {
      std::lock_guard lock(messages_mu_);
      pending_.push_back(m);
    };
    {
      nb::gil_scoped_release unlocked;
      config_ = tlm::choose_config<tlm::program_configs>(r_.config, r_.model);
      t_ = tlm::with_training_types<tlm::program_configs>(r_, config_, [&]<class C, class Adapter>() -> std::unique_ptr<trainer_base> {
        if constexpr (std::is_void_v<Adapter>) tlm::refuse_beyond_memory<C>(config_);
        return std::make_unique<trainer_impl<C, Adapter>>(r_, config_, hooks);
      });
    }
    flush_messages();
  }

  nb::dict step() {
    const std::unique_lock lock = claim();
    if (finished_) throw tlm::error("tlm.Trainer: finish() ended this run; continue it with a new Trainer(..., resume=True)");
    tlm::step_report rep;
    {
      nb::gil_scoped_release unlocked;
      rep = t_->step();
    }
    flush_messages();
    return step_dict(rep);
  }

  nb::dict finish() {
    const std::unique_lock lock = claim();
    return finish_locked();
  }

  nb::dict run(const nb::object& on_step) {
    std::unique_lock lock = claim();
    if (finished_) throw tlm::error("tlm.Trainer: finish() ended this run; continue it with a new Trainer(..., resume=True)");
    while (!t_->done()) {
      tlm::step_report rep;
      {
        nb::gil_scoped_release unlocked;
        rep = t_->step();
      }
      flush_messages();
      try {
        if (!on_step.is_none()) on_step(step_dict(rep));
        if (PyErr_CheckSignals() != 0) throw nb::python_error();
      } catch (nb::python_error&) {
        // Ctrl-C (or the callback's exception) ends the run at this step with its
        // checkpoint, which resume=True continues; the exception goes on to the caller.
        finish_locked();
        messages_.append(nb::str(fmt::format("stopped at step {} of {}; continue with resume=True", t_->steps(), t_->total_steps()).c_str()));
        throw;
      }
    }
    return finish_locked();
  }

  double held_out_loss() {
    const std::unique_lock lock = claim();
    nb::gil_scoped_release unlocked;
    return t_->held_out_loss();
  }

  nb::object next() {
    if (t_->done()) throw nb::stop_iteration();
    return step();
  }

  std::size_t steps() const { return t_->steps(); }
  std::size_t total_steps() const { return t_->total_steps(); }
  std::size_t steps_this_run() const { return t_->steps_this_run(); }
  bool done() const { return t_->done(); }
  bool finished() const { return finished_; }
  std::string config() const { return config_; }
  std::string out() const { return r_.out; }
  std::string kernel_level() const { return t_->kernel_level(); }
  double load_seconds() const { return t_->load_seconds(); }
  std::size_t train_windows() const { return t_->data().train.size(); }
  std::size_t held_out_windows() const { return t_->data().held_out.size(); }
  std::size_t tokens() const { return t_->data().tokens; }
  nb::list messages() const { return messages_; }
  nb::list log() const {
    nb::list rows;
    for (const auto& x : t_->log()) {
      nb::dict d;
      d["step"] = x.step;
      d["loss"] = x.loss;
      d["held_out"] = nan_as_none(x.held_out);
      d["lr"] = x.lr;
      d["grad_norm"] = x.grad_norm;
      d["tokens_per_s"] = x.tokens_per_s;
      rows.append(d);
    }
    return rows;
  }

 private:
  // One call at a time: a step from a second thread would race the first on the
  // trainer's buffers.
  std::unique_lock<std::mutex> claim() {
    std::unique_lock lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) throw tlm::error("tlm.Trainer: another thread is running this trainer; one call at a time");
    return lock;
  }

  nb::dict finish_locked() {
    if (finished_) throw tlm::error("tlm.Trainer: finish() already ended this run; continue it with a new Trainer(..., resume=True)");
    tlm::finish_report f;
    {
      nb::gil_scoped_release unlocked;
      f = t_->finish();
    }
    finished_ = true;
    flush_messages();
    return finish_dict(f, t_->steps(), t_->total_steps());
  }

  // The trainer's warnings and notes (a changed option on resume, what earlier runs
  // left), kept in Trainer.messages and written to stderr as examples/train writes them.
  void flush_messages() {
    std::vector<std::string> now;
    {
      std::lock_guard lock(messages_mu_);
      now.swap(pending_);
    }
    if (now.empty()) return;
    const nb::object err = nb::module_::import_("sys").attr("stderr");
    for (const auto& m : now) {
      messages_.append(nb::str(m.c_str()));
      err.attr("write")(nb::str(("tlm.Trainer: " + m + "\n").c_str()));
    }
  }

  tlm::training_request r_;
  std::string config_;
  std::unique_ptr<trainer_base> t_;
  std::mutex busy_, messages_mu_;
  std::vector<std::string> pending_;
  nb::list messages_;
  bool finished_ = false;
};

// The table as Python sees it: tlm._training_options(), one dict per keyword.
nb::list training_option_list() {
  nb::list out;
  const tlm::training_request defaults;
  for (const auto& o : tlm::training_options) {
    nb::dict d;
    d["name"] = nb::str(std::string(o.name).c_str());
    d["flag"] = nb::str(o.flag_name().c_str());
    d["help"] = nb::str(o.help_text().c_str());
    switch (o.kind) {
      case tlm::training_option_kind::whole:
        d["kind"] = "whole";
        d["default"] = defaults.*(o.whole);
        d["min"] = static_cast<std::uint64_t>(o.lo);
        d["max"] = static_cast<std::uint64_t>(o.hi);
        break;
      case tlm::training_option_kind::real:
        d["kind"] = "real";
        d["default"] = defaults.*(o.real);
        d["min"] = o.lo;
        d["max"] = o.hi;
        d["min_open"] = o.lo_open;
        break;
      case tlm::training_option_kind::text:
        d["kind"] = "text";
        d["default"] = nb::str((defaults.*(o.text)).c_str());
        break;
      case tlm::training_option_kind::flag:
        d["kind"] = "flag";
        d["default"] = defaults.*(o.flag);
        break;
    }
    out.append(d);
  }
  return out;
}

std::string trainer_doc() {
  std::string doc =
      "tlm.Trainer(**options): one training run of tlm::trainer, with examples/train's options as keywords "
      "(flag --min-lr is min_lr=; switches take True). step() runs one optimizer step and returns its report; "
      "run(on_step=None) steps to the end and returns finish()'s report; iterating yields each step's report "
      "(call finish() after). Ctrl-C during run() stops at the next step boundary, writes a checkpoint and raises "
      "KeyboardInterrupt; resume=True continues.\n\nKeywords (tlm/train/training_options.hpp):";
  for (const auto& o : tlm::training_options) {
    doc += "\n  " + std::string(o.name) + ": " + o.help_text();
    if (o.kind == tlm::training_option_kind::whole) doc += fmt::format("; {} to {}", o.lo, o.hi);
    if (o.kind == tlm::training_option_kind::real) doc += "; range " + o.range_text();
  }
  return doc;
}

}  // namespace

NB_MODULE(_tlm, m) {
  m.doc() = "tlm: typed Llama models (C++20), from Python";
  nb::exception<tlm::error>(m, "Error", PyExc_RuntimeError);
  m.def("_sampling_options", &sampling_option_list,
        "The sampling keywords of Model.generate and Model.chat: name, kind, default, min, max, range, help.");
  // Static: nanobind keeps the pointer to a docstring.
  static const std::string generate_doc = sampling_doc(
      "Continues the prompt (text, or a list of token ids). Returns the text; with stream=True an iterator of "
      "text pieces; with details=True a dict of text, ids, finish_reason and token counts.");
  static const std::string chat_doc = sampling_doc(
      "The assistant's reply to OpenAI-style messages [{'role': ..., 'content': ...}], in the model's chat template "
      "(or the template form named by chat_template, as generate --chat-template NAME). tools: OpenAI's list of "
      "{'type': 'function', 'function': {'name', 'description', 'parameters'}}, in Qwen2.5's (Hermes) form; "
      "tool_choice 'auto' (words or calls), 'required', 'none' or a tool's name; the reply is held to calls with "
      "arguments valid against the tools' schemas (up to 16, newline-separated; one with parallel_tool_calls=False), "
      "and details=True gives them as tool_calls [{'name', 'arguments'}, ...] with finish_reason 'tool_calls'. "
      "Messages may be tool results (role 'tool') and an assistant's tool_calls.");

  nb::class_<text_stream>(m, "TextStream", "The pieces of a generation as they come; dropping it stops the generation.")
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &text_stream::next)
      .def_prop_ro("result", &text_stream::result,
                   "Once every piece has been read: a dict of text, ids, finish_reason and token counts, as "
                   "details=True gives; None before.");

  nb::class_<py_model>(m, "Model",
                        "A GGUF file bound to one of tlm's config types: config=NAME, or by default the shipped "
                        "config whose hyperparameters the file has (Model.config names it).")
      .def(nb::init<const std::string&, const std::string&, std::size_t, const nb::object&>(), "path"_a,
           "config"_a = "", "threads"_a = 2, "lora"_a = nb::none(),
           "lora: LoRA adapters (llama.cpp's adapter GGUF) over the model: a path, a (path, scale) pair, or a "
           "list of those; each adds scale * alpha / rank * B A to the matrices it targets (scale 1 by default).")
      .def("tokenize", &py_model::tokenize, "text"_a, "special"_a = false, "add_bos"_a = false,
           "Token ids of the text; special=True makes markers like <|im_start|> tokens; add_bos=True adds BOS (and "
           "EOS) as the file's add_bos_token / add_eos_token say, as generate() does for a text prompt.")
      .def("chat_tokens", &py_model::chat_tokens, "messages"_a, "chat_template"_a = nb::none(), "tools"_a = nb::none(),
           "tool_choice"_a = "auto",
           "The token ids chat() runs before the reply: the conversation in the chat template, each message tokenized "
           "as the chat session tokenizes it, and the assistant's header; len() of it is the prompt's positions.")
      .def("detokenize", &py_model::detokenize, "ids"_a, "special"_a = true,
           "The text of the ids; special=False leaves out control tokens (BOS, EOS, chat markers).")
      .def("logits", &py_model::logits, "ids"_a, "The logits of every position, a float32 array [len(ids), vocab].")
      .def("embed", &py_model::embed, "input"_a, "pooling"_a = "mean",
           "The embedding of a text (a str or a list of token ids): its final hidden states pooled, their mean or "
           "(pooling='last') the last position's, at unit length; a float32 array [dim]. A list of texts gives "
           "[len(input), dim]. Each text runs alone from position 0, as /v1/embeddings does.")
      .def(
          "generate",
          [](py_model& self, const nb::object& prompt, std::size_t max_tokens, const nb::object& stop, bool stream,
             bool ignore_eos, const nb::object& json_schema, bool details, const nb::kwargs& sampling) {
            request r;
            r.options = options_from(max_tokens, sampling, self.vocab(), stop, ignore_eos, json_schema);
            if (nb::isinstance<nb::str>(prompt)) {
              r.k = request::kind::text;
              r.prompt = nb::cast<std::string>(prompt);
            } else {
              r.k = request::kind::ids;
              r.ids = nb::cast<std::vector<std::int32_t>>(prompt);
            }
            return self.run(std::move(r), stream, details);
          },
          "prompt"_a, "max_tokens"_a = 256, "stop"_a = nb::none(), "stream"_a = false, "ignore_eos"_a = false,
          "json_schema"_a = nb::none(), "details"_a = false, "sampling"_a, generate_doc.c_str())
      .def(
          "chat",
          [](py_model& self, const nb::handle& messages, std::size_t max_tokens, const nb::object& stop, bool stream,
             const nb::object& json_schema, bool details, const std::optional<std::string>& chat_template,
             const nb::object& tools, const std::string& tool_choice, bool parallel_tool_calls,
             const nb::kwargs& sampling) {
            request r = chat_request(messages, chat_template, tools, tool_choice, parallel_tool_calls);
            r.options = options_from(max_tokens, sampling, self.vocab(), stop, false, json_schema);
            return self.run(std::move(r), stream, details);
          },
          "messages"_a, "max_tokens"_a = 256, "stop"_a = nb::none(), "stream"_a = false, "json_schema"_a = nb::none(),
          "details"_a = false, "chat_template"_a = nb::none(), "tools"_a = nb::none(), "tool_choice"_a = "auto",
          "parallel_tool_calls"_a = true, "sampling"_a, chat_doc.c_str())
      .def_prop_ro("vocab_size", &py_model::vocab)
      .def_prop_ro("context", &py_model::context)
      .def_prop_ro("config", &py_model::config)
      .def_prop_ro("eos", &py_model::eos, "The file's end-of-sequence id (-1 if it has none).")
      .def_prop_ro("bos", &py_model::bos, "The file's beginning-of-sequence id (-1 if it has none).")
      .def_prop_ro("end_of_generation", &py_model::end_of_generation,
                   "The sorted ids that end a generated reply (EOS and the file's end-of-turn tokens).");
  m.def("_training_options", &training_option_list,
        "The keywords of tlm.Trainer and tlm.train (examples/train's flags): name, flag, kind, default, min, max, help.");
  static const std::string train_doc = trainer_doc();
  nb::class_<py_trainer>(m, "Trainer", train_doc.c_str())
      .def(nb::init<const nb::kwargs&>(), "options"_a)
      .def("step", &py_trainer::step, "One optimizer step (and the held-out loss and checkpoint at their cadence): a dict of step, "
           "total, loss, held_out (None unless measured at this step), last_held_out, lr, grad_norm, tokens_per_s, eta_seconds.")
      .def("run", &py_trainer::run, "on_step"_a = nb::none(),
           "Steps to the end (on_step receives each step's dict), then finish(). Ctrl-C stops at the next step "
           "boundary with a checkpoint and raises KeyboardInterrupt.")
      .def("finish", &py_trainer::finish,
           "Ends the run: a checkpoint of the last step, and at the total out/model.gguf (LoRA: adapter.gguf). A dict of "
           "step, total, saved, checkpoint, save_seconds, exported, model, merged, merge_kept.")
      .def("held_out_loss", &py_trainer::held_out_loss, "The mean loss over the held-out windows (NaN without any).")
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &py_trainer::next)
      .def_prop_ro("steps", &py_trainer::steps, "Optimizer steps done, counting a resumed run's.")
      .def_prop_ro("total_steps", &py_trainer::total_steps)
      .def_prop_ro("steps_this_run", &py_trainer::steps_this_run)
      .def_prop_ro("done", &py_trainer::done)
      .def_prop_ro("finished", &py_trainer::finished)
      .def_prop_ro("config", &py_trainer::config)
      .def_prop_ro("out", &py_trainer::out)
      .def_prop_ro("kernel_level", &py_trainer::kernel_level)
      .def_prop_ro("load_seconds", &py_trainer::load_seconds, "Seconds the resumed checkpoint took to load.")
      .def_prop_ro("train_windows", &py_trainer::train_windows)
      .def_prop_ro("held_out_windows", &py_trainer::held_out_windows)
      .def_prop_ro("tokens", &py_trainer::tokens, "Tokens read from the data.")
      .def_prop_ro("messages", &py_trainer::messages, "The trainer's warnings and notes, also written to stderr.")
      .def_prop_ro("log", &py_trainer::log, "The loss log (loss.csv's rows, a resumed run's earlier ones too).");
}
