// scheduler: many requests through one model in batched steps, against each request run
// alone by the generator; the prefix cache, cancellation, stop, the queue and the KV budget.
#include <doctest/doctest.h>

#include <tlm/generate.hpp>
#include <tlm/serving/scheduler.hpp>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fixture.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_scheduler {

using C = tlm::smollm2_135m;

namespace {

// The scheduler runs its model on its own thread: a model of its own over the same file.
tlm::model<C>& scheduled_model() {
  static tlm::model<C> m = tlm::model<C>::load(TLM_MODEL_PATH);
  return m;
}
tlm::model<C>& alone_model() { return tlm_test::shared_model<tlm::model<C>>(); }
const tlm::tokenizer& tok() { return tlm_test::shared_tokenizer<tlm::model<C>>(); }

// Waits for every request's on_done and keeps its outcome and streamed text.
struct collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<tlm::sequence_outcome> outcomes;
  std::vector<std::string> streamed;
  std::vector<bool> done;
  std::size_t left = 0;

  explicit collector(std::size_t n) : outcomes(n), streamed(n), done(n, false), left(n) {}

  tlm::sequence_request request(std::size_t i, std::vector<std::int32_t> prompt, tlm::generation_options o) {
    tlm::sequence_request r;
    r.prompt = std::move(prompt);
    r.options = std::move(o);
    r.stop_ids.assign(tok().end_of_generation().begin(), tok().end_of_generation().end());
    r.on_token = [this, i](std::int32_t, std::string_view text) {
      std::lock_guard lock(mu);
      streamed[i] += text;
      return tlm::step::go_on;
    };
    r.on_done = [this, i](tlm::sequence_outcome& out) {
      std::lock_guard lock(mu);
      outcomes[i] = std::move(out);
      done[i] = true;
      --left;
      cv.notify_all();
    };
    r.tag = "request-" + std::to_string(i);
    return r;
  }
  void wait() {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return left == 0; }));
  }
};

std::vector<std::int32_t> ids(const std::string& text) { return tok().encode(text); }

const std::vector<std::string> texts = {
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
    "In 1492,",
    "Water boils at",
    "A haiku about the sea:",
    "The quick brown fox",
    "To make bread you need",
    "The largest planet in the solar system is",
    "Hello! My name is",
    "List of prime numbers: 2, 3, 5,",
    "The opposite of hot is",
    "Photosynthesis is the process by which plants",
    "SELECT * FROM",
    "Translate to French: good morning ->"};

}  // namespace

TEST_CASE("16 concurrent greedy requests give each the text it gets alone") {
  tlm::generator<C> alone(alone_model(), tok());
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 16, .prefill_chunk = 4});
  collector c(texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i)
    REQUIRE(s.submit(c.request(i, ids(texts[i]), {.max_tokens = 6 + i % 5 * 3})) == tlm::admission::accepted);
  c.wait();
  for (std::size_t i = 0; i < texts.size(); ++i) {
    CAPTURE(texts[i]);
    const auto want = alone.generate(texts[i], {.max_tokens = 6 + i % 5 * 3});
    const auto& got = c.outcomes[i];
    CHECK(!got.error);
    CHECK(!got.cut);
    CHECK(got.result.ids == want.ids);
    CHECK(got.result.text == want.text);
    CHECK(c.streamed[i] == want.text);
    CHECK(got.result.reason == want.reason);
    CHECK(got.result.prompt_tokens == want.prompt_tokens);
  }
  const auto st = s.status();
  CHECK(st.active == 0);
  CHECK(st.queued == 0);
  // The decode steps ran several sequences at once.
  CHECK(st.batched_rows > st.steps);
}

TEST_CASE("more requests than sequences wait in the queue and all complete") {
  tlm::generator<C> alone(alone_model(), tok());
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 3, .queue = 16, .prefix_cache = false});
  collector c(8);
  for (std::size_t i = 0; i < 8; ++i)
    REQUIRE(s.submit(c.request(i, ids(texts[i]), {.max_tokens = 8})) == tlm::admission::accepted);
  c.wait();
  for (std::size_t i = 0; i < 8; ++i) CHECK(c.outcomes[i].result.ids == alone.generate(texts[i], {.max_tokens = 8}).ids);
}

TEST_CASE("the prefix cache runs only what a new prompt adds, and replies as a cold run does") {
  tlm::generator<C> alone(alone_model(), tok());
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 2});
  const std::string system = "You are a helpful assistant who answers in one short sentence. Question: ";
  collector first(1);
  REQUIRE(s.submit(first.request(0, ids(system + "What is the capital of France?"), {.max_tokens = 8})) ==
          tlm::admission::accepted);
  first.wait();
  CHECK(first.outcomes[0].reused_tokens == 0);
  collector second(1);
  const auto prompt = ids(system + "What is the capital of Spain?");
  REQUIRE(s.submit(second.request(0, prompt, {.max_tokens = 8})) == tlm::admission::accepted);
  second.wait();
  const std::size_t shared = ids(system).size();
  CHECK(second.outcomes[0].reused_tokens >= shared - 1);
  CHECK(second.outcomes[0].result.prompt_tokens == prompt.size() - second.outcomes[0].reused_tokens);
  CHECK(second.outcomes[0].result.ids == alone.generate(system + "What is the capital of Spain?", {.max_tokens = 8}).ids);
  const auto st = s.status();
  CHECK(st.prefix_hits >= 1);
  CHECK(st.reused_tokens == second.outcomes[0].reused_tokens);
  // The same prompt again reuses all of it but its last token, which must run for its logits.
  collector third(1);
  REQUIRE(s.submit(third.request(0, prompt, {.max_tokens = 8})) == tlm::admission::accepted);
  third.wait();
  CHECK(third.outcomes[0].reused_tokens == prompt.size() - 1);
  CHECK(third.outcomes[0].result.ids == second.outcomes[0].result.ids);
}

TEST_CASE("a request copies a shared prefix from a sequence that is still running") {
  tlm::generator<C> alone(alone_model(), tok());
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 2, .prefill_chunk = 16});
  const std::string system =
      "You are a helpful assistant who answers in one short sentence, politely and without lists. Question: ";
  collector c(2);
  REQUIRE(s.submit(c.request(0, ids(system + "What is the capital of France?"), {.max_tokens = 60, .stop_at_eos = false})) ==
          tlm::admission::accepted);
  // The first is decoding (its prompt is in its cache) when the second arrives; the other
  // sequence is idle and has no cache.
  const auto generating = [&] {
    const auto st = s.status();
    return std::any_of(st.sequences.begin(), st.sequences.end(), [](const auto& q) { return q.state == "generating"; });
  };
  for (int i = 0; i < 2000 && !generating(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(generating());
  REQUIRE(s.status().active == 1);
  REQUIRE(s.submit(c.request(1, ids(system + "What is the largest ocean?"), {.max_tokens = 8})) == tlm::admission::accepted);
  c.wait();
  CHECK(c.outcomes[1].reused_tokens >= 16);
  CHECK(s.status().running_donations == 1);
  CHECK(c.outcomes[1].result.ids == alone.generate(system + "What is the largest ocean?", {.max_tokens = 8}).ids);
  CHECK(c.outcomes[0].result.ids ==
        alone.generate(system + "What is the capital of France?", {.max_tokens = 60, .stop_at_eos = false}).ids);
}

TEST_CASE("a request that outgrows its sequence's cache keeps the shared prefix in a larger one") {
  tlm::generator<C> alone(alone_model(), tok());
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 1});
  const std::string system = "You are a helpful assistant who answers in one short sentence. Question: ";
  collector first(1);
  REQUIRE(s.submit(first.request(0, ids(system + "What is 2 + 2?"), {.max_tokens = 8})) == tlm::admission::accepted);
  first.wait();
  REQUIRE(s.status().sequences[0].kv_bytes == 256 * tlm::kv_storage<C>::bytes_per_position(tlm::kv_type::f32));
  // 300 more tokens: the cache of 256 positions is remade with 512, and the prefix moves.
  const std::string longer = system + "What is the capital of France?";
  collector second(1);
  REQUIRE(s.submit(second.request(0, ids(longer), {.max_tokens = 300})) == tlm::admission::accepted);
  second.wait();
  REQUIRE(!second.outcomes[0].error);
  CHECK(second.outcomes[0].reused_tokens > 10);
  CHECK(s.status().sequences[0].kv_bytes == 512 * tlm::kv_storage<C>::bytes_per_position(tlm::kv_type::f32));
  CHECK(second.outcomes[0].result.ids == alone.generate(longer, {.max_tokens = 300}).ids);
}

TEST_CASE("a cancelled request ends at the next step and frees its sequence") {
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 1, .queue = 4});
  collector c(2);
  auto r = c.request(0, ids(texts[1]), {.max_tokens = 200});
  auto flag = std::make_shared<std::atomic<bool>>(false);
  r.cancelled = flag;
  auto inner = r.on_token;
  std::size_t seen = 0;
  r.on_token = [&, inner](std::int32_t id, std::string_view text) {
    if (++seen == 3) flag->store(true);
    return inner(id, text);
  };
  REQUIRE(s.submit(std::move(r)) == tlm::admission::accepted);
  REQUIRE(s.submit(c.request(1, ids(texts[0]), {.max_tokens = 4})) == tlm::admission::accepted);
  c.wait();
  CHECK(c.outcomes[0].result.reason == tlm::stop_reason::callback);
  CHECK(c.outcomes[0].result.ids.size() <= 4);
  CHECK(!c.outcomes[0].cut);
  CHECK(c.outcomes[1].result.ids.size() == 4);
}

TEST_CASE("a full queue is refused, and stop() cuts what runs and what waits") {
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 1, .queue = 1});
  collector c(2);
  // The first request holds the scheduler's thread in its callback until the others are
  // submitted, so that it is running while they arrive.
  std::promise<void> entered, release;
  auto released = release.get_future().share();
  bool once = false;
  auto r = c.request(0, ids(texts[0]), {.max_tokens = 100});
  auto inner = r.on_token;
  r.on_token = [&, inner, released](std::int32_t id, std::string_view text) {
    if (!once) {
      once = true;
      entered.set_value();
      released.wait();
    }
    return inner(id, text);
  };
  REQUIRE(s.submit(std::move(r)) == tlm::admission::accepted);
  entered.get_future().wait();
  CHECK(s.submit(c.request(1, ids(texts[1]), {.max_tokens = 4})) == tlm::admission::accepted);
  collector refused(1);
  CHECK(s.submit(refused.request(0, ids(texts[2]), {.max_tokens = 4})) == tlm::admission::queue_full);
  s.stop();
  release.set_value();
  c.wait();
  CHECK(c.outcomes[0].cut);
  CHECK(c.outcomes[0].result.ids.size() < 100);
  CHECK(c.outcomes[1].cut);
  CHECK(c.outcomes[1].result.ids.empty());
  collector late(1);
  CHECK(s.submit(late.request(0, ids(texts[3]), {.max_tokens = 4})) == tlm::admission::stopping);
}

TEST_CASE("under a KV budget for one sequence, requests take turns and reply as alone") {
  tlm::generator<C> alone(alone_model(), tok());
  // One sequence's rounded cache (256 positions) fits; two do not.
  const std::size_t budget = 300 * tlm::kv_storage<C>::bytes_per_position(tlm::kv_type::f32);
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 3, .kv_budget = budget, .queue = 8});
  collector c(3);
  for (std::size_t i = 0; i < 3; ++i)
    REQUIRE(s.submit(c.request(i, ids(texts[i]), {.max_tokens = 6})) == tlm::admission::accepted);
  c.wait();
  for (std::size_t i = 0; i < 3; ++i) CHECK(c.outcomes[i].result.ids == alone.generate(texts[i], {.max_tokens = 6}).ids);
  CHECK(s.status().kv_bytes <= budget);
  // A request that cannot fit the budget even alone is refused at once.
  collector big(1);
  CHECK_THROWS_AS((void)s.submit(big.request(0, ids(texts[0]), {.max_tokens = 400})), tlm::capacity_error);
}

TEST_CASE("int8 caches and constrained output run in the batch as they do alone") {
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 4, .kv = tlm::kv_type::q8});
  auto json = std::make_shared<const tlm::json_grammar>();
  collector c(4);
  for (std::size_t i = 0; i < 4; ++i) {
    tlm::generation_options o{.max_tokens = 12};
    if (i % 2) o.grammar = json;
    REQUIRE(s.submit(c.request(i, ids(texts[i]), o)) == tlm::admission::accepted);
  }
  c.wait();
  for (std::size_t i = 0; i < 4; ++i) {
    // The generator with an int8 cache of its own.
    tlm::generator<C> g(alone_model(), tok(), tlm::kv_type::q8);
    tlm::generation_options o{.max_tokens = 12};
    if (i % 2) o.grammar = json;
    CHECK(c.outcomes[i].result.ids == g.generate(texts[i], o).ids);
  }
}

TEST_CASE("embedding requests run in chunks among generations and give what model::embed gives") {
  tlm::generator<C> alone(alone_model(), tok());
  tlm::scheduler<C> s(scheduled_model(), tok(), {.parallel = 3, .prefill_chunk = 8, .queue = 8});
  // The long text takes several chunks; the generations keep decoding between them.
  std::string long_text;
  for (int i = 0; i < 6; ++i) long_text += texts[static_cast<std::size_t>(i)] + " ";
  const std::vector<std::string> inputs = {texts[0], long_text, texts[5]};
  collector c(5);
  for (std::size_t i = 0; i < 2; ++i)
    REQUIRE(s.submit(c.request(i, ids(texts[i + 7]), {.max_tokens = 10})) == tlm::admission::accepted);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto r = c.request(2 + i, ids(inputs[i]), {});
    r.embed = i == 2 ? tlm::pooling::last : tlm::pooling::mean;
    REQUIRE(s.submit(std::move(r)) == tlm::admission::accepted);
  }
  c.wait();
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(c.outcomes[i].result.ids == alone.generate(texts[i + 7], {.max_tokens = 10}).ids);
    CHECK(c.outcomes[i].embedding.empty());
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    CAPTURE(inputs[i]);
    const auto& got = c.outcomes[2 + i];
    REQUIRE(!got.error);
    CHECK(!got.cut);
    CHECK(got.result.ids.empty());
    CHECK(c.streamed[2 + i].empty());
    CHECK(got.result.prompt_tokens == ids(inputs[i]).size());
    const auto want = alone_model().embed(ids(inputs[i]), i == 2 ? tlm::pooling::last : tlm::pooling::mean);
    REQUIRE(got.embedding.size() == want.size());
    double worst = 0;
    for (std::size_t j = 0; j < want.size(); ++j)
      worst = std::max(worst, static_cast<double>(std::fabs(got.embedding[j] - want[j])));
    CHECK(worst < 1e-5);  // both unit length: an absolute bound is a relative one
  }
  CHECK(ids(long_text).size() > 3 * 8);

  // An embedding never starts from a cached prefix (it needs every position's hidden
  // state), but what it leaves in its cache is a prefix for a generation.
  tlm::scheduler<C> one(scheduled_model(), tok(), {.parallel = 1});
  collector d(3);
  auto e1 = d.request(0, ids(long_text), {});
  e1.embed = tlm::pooling::mean;
  REQUIRE(one.submit(std::move(e1)) == tlm::admission::accepted);
  auto e2 = d.request(1, ids(long_text), {});
  e2.embed = tlm::pooling::mean;
  REQUIRE(one.submit(std::move(e2)) == tlm::admission::accepted);
  REQUIRE(one.submit(d.request(2, ids(long_text + "and then"), {.max_tokens = 6})) == tlm::admission::accepted);
  d.wait();
  CHECK(d.outcomes[0].reused_tokens == 0);
  CHECK(d.outcomes[1].reused_tokens == 0);
  CHECK(d.outcomes[0].embedding == d.outcomes[1].embedding);
  CHECK(d.outcomes[2].reused_tokens > 0);
  CHECK(d.outcomes[2].result.ids == alone.generate(long_text + "and then", {.max_tokens = 6}).ids);
}

}  // namespace test_scheduler
