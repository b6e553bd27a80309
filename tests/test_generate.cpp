// The high-level API: generator and chat_session over the real model. The decoding
// loop against a hand-driven one, stop conditions, seeds across thread counts, and a
// chat whose second turn runs only its new tokens yet computes what a fresh prefill
// of the whole conversation computes.
#include <doctest/doctest.h>

#include <tlm/generate.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fixture.hpp"

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_generate {

using C = tlm::smollm2_135m;

namespace {

tlm::model<C>& shared() { return tlm_test::shared_model<tlm::model<C>>(); }
const tlm::tokenizer& shared_tokenizer() { return tlm_test::shared_tokenizer<tlm::model<C>>(); }

const std::vector<std::int32_t> prompt = {504, 3575, 282, 4649, 314};  // "The capital of France is"

}  // namespace

TEST_CASE("greedy generate equals the loop driven by hand, and streams the same text") {
  auto& m = shared();
  const auto& tok = shared_tokenizer();
  tlm::kv_cache<C> cache(64);
  auto logits = m.prefill(prompt, cache);
  std::vector<std::int32_t> want;
  for (int i = 0; i < 12; ++i) {
    want.push_back(tlm::argmax(logits));
    if (i + 1 < 12) logits = m.forward(want.back(), cache);
  }
  tlm::generator gen(m, tok);
  std::string streamed;
  std::size_t calls = 0;
  const auto r = gen.generate(prompt, {.max_tokens = 12}, tlm::make_token_callback([&](std::int32_t, std::string_view t) {
                                ++calls;
                                streamed += t;
                              }));
  CHECK(r.ids == want);
  CHECK(r.text == tok.decode(want));
  CHECK(streamed == r.text);
  CHECK(calls >= 12);
  CHECK(r.reason == tlm::stop_reason::max_tokens);
  CHECK(r.prompt_tokens == 5);
  CHECK(r.decoded_tokens == 11);
  CHECK(r.text.starts_with(" Paris"));
  // Text prompts are tokenized for you.
  CHECK(gen.generate("The capital of France is", {.max_tokens = 12}).ids == want);
  CHECK(gen.generate(prompt, {.max_tokens = 0}).ids.empty());
}

TEST_CASE("a stop string spanning a token boundary ends generation and is never released") {
  auto& m = shared();
  const auto& tok = shared_tokenizer();
  tlm::generator gen(m, tok);
  const auto full = gen.generate(prompt, {.max_tokens = 24});
  // The last two bytes of one token's text and the first two of the next one's.
  std::string stop;
  std::size_t where = 0;
  for (std::size_t i = 2; i + 1 < full.ids.size() && stop.empty(); ++i) {
    const std::string a(tok.token_bytes(full.ids[i])), b(tok.token_bytes(full.ids[i + 1]));
    if (a.size() < 2 || b.size() < 2) continue;
    const std::string s = a.substr(a.size() - 2) + b.substr(0, 2);
    const std::size_t at = full.text.find(s);
    if (at != std::string::npos && at + 2 == tok.decode(std::vector<std::int32_t>(full.ids.begin(), full.ids.begin() + static_cast<std::ptrdiff_t>(i) + 1)).size()) {
      stop = s;
      where = at;
    }
  }
  REQUIRE_MESSAGE(!stop.empty(), "no token boundary to test in: " << full.text);
  MESSAGE("stop string '" << stop << "' in '" << full.text << "'");
  std::string streamed;
  tlm::generation_options o{.max_tokens = 24};
  o.stop = {"never appears", stop};  // named: GCC 12 warns falsely about a temporary's vectors
  const auto r = gen.generate(prompt, o,
                              tlm::make_token_callback([&](std::int32_t, std::string_view t) { streamed += t; }));
  CHECK(r.reason == tlm::stop_reason::stop_string);
  CHECK(r.text == full.text.substr(0, where));
  CHECK(streamed == r.text);
  CHECK(streamed.find(stop) == std::string::npos);
  // A stop string that only begins to appear is released at the end.
  const std::string tail = full.text.substr(full.text.size() - 3) + "@@";
  o.stop = {tail};
  const auto r2 = gen.generate(prompt, o);
  CHECK(r2.reason == tlm::stop_reason::max_tokens);
  CHECK(r2.text == full.text);
}

namespace {

// What one run of a stop_filter released.
struct filtered {
  std::string released;
  int stopped_at = -1;
  std::vector<std::string> per_piece;  // what each push released
  std::string pushes() const {
    std::string joined;
    for (std::size_t i = 0; i < per_piece.size(); ++i) joined += (i ? "|" : "") + per_piece[i];
    return joined;
  }
};

// Feeds `pieces` to a stop_filter one at a time, as decode feeds it each token's text.
// Returns everything released (flush included) and the index of the piece that
// completed a stop string (-1: none); nothing is pushed after a stop, as in decode.
filtered run_stop_filter(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  tlm::detail::stop_filter filter(stops);
  filtered f;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    auto [text, stopped] = filter.push(pieces[i]);
    f.released += text;
    f.per_piece.push_back(text);
    if (stopped) {
      f.stopped_at = static_cast<int>(i);
      return f;
    }
  }
  f.released += filter.flush();
  return f;
}

}  // namespace

TEST_CASE("stop filter: a stop string spread over three or more pieces is held back whole and stops") {
  // "ris." arrives as "r", "i", "s.": the hold-back must cover every piece since the
  // possible start of the stop string, not only the newest one.
  const auto paris = run_stop_filter({"ris."}, {"Pa", "r", "i", "s.", " more"});
  CHECK(paris.released == "Pa");
  CHECK(paris.stopped_at == 3);
  // What each push released, joined by '|': "r" and "ri" might begin "ris.", so nothing.
  CHECK(paris.pushes() == "Pa|||");
  // One byte per piece, the stop string four pieces long.
  const auto bytes = run_stop_filter({"abcd"}, {"x", "a", "b", "c", "d", "y"});
  CHECK(bytes.released == "x");
  CHECK(bytes.stopped_at == 4);
  // A false start: "ab" + "ab" + "c" + "d" stops at "abcd" and releases the first "ab".
  const auto restart = run_stop_filter({"abcd"}, {"ab", "ab", "c", "d"});
  CHECK(restart.released == "ab");
  CHECK(restart.stopped_at == 3);
  // A held tail that never completes comes out unchanged at the end.
  const auto partial = run_stop_filter({"ris."}, {"Pa", "r", "i", "s"});
  CHECK(partial.stopped_at == -1);
  CHECK(partial.released == "Paris");
  // With two stop strings, the one that completes first wins, across pieces.
  const auto two = run_stop_filter({"xyz!", "ris."}, {"Pa", "r", "i", "s.", "xyz!"});
  CHECK(two.released == "Pa");
  CHECK(two.stopped_at == 3);
}

TEST_CASE("stop filter: \"\\n\\n\" arriving as two \"\\n\" tokens stops and is never released") {
  // "\n\n" as two "\n" tokens, the second one also carrying text after it.
  const auto blank = run_stop_filter({"\n\n"}, {"Hello", "\n", "\n", "World"});
  CHECK(blank.released == "Hello");
  CHECK(blank.stopped_at == 2);
  const auto blank_tail = run_stop_filter({"\n\n"}, {"Hi", "\n", "\nthere"});
  CHECK(blank_tail.released == "Hi");
  CHECK(blank_tail.stopped_at == 2);
  // A single "\n" that is not followed by another is released once it cannot begin one.
  const auto single = run_stop_filter({"\n\n"}, {"a", "\n", "b", "\n"});
  CHECK(single.stopped_at == -1);
  CHECK(single.pushes() == "a||\nb|");
  CHECK(single.released == "a\nb\n");  // the last "\n" comes out of flush
}

TEST_CASE("end-of-sequence, the callback and the token limit stop generation") {
  auto& m = shared();
  const auto& tok = shared_tokenizer();
  tlm::generator gen(m, tok);
  tlm::generation_options eos_first{.max_tokens = 8};
  eos_first.sample.logit_bias = {{tok.eos(), 100.0f}};
  const auto r = gen.generate(prompt, eos_first);
  CHECK(r.reason == tlm::stop_reason::eos);
  CHECK(r.ids == std::vector<std::int32_t>{tok.eos()});
  CHECK(r.text.empty());
  eos_first.stop_at_eos = false;
  CHECK(gen.generate(prompt, eos_first).ids.size() == 8);
  // Any end-of-generation token ends it, not only eos: SmolLM2's <|endoftext|> is a
  // control token other than its eos id.
  const std::int32_t endoftext = tok.encode("<|endoftext|>", {.parse_special = true}).at(0);
  REQUIRE(endoftext != tok.eos());
  REQUIRE(tok.is_end_of_generation(endoftext));
  tlm::generation_options other_end{.max_tokens = 8};
  other_end.sample.logit_bias = {{endoftext, 100.0f}};
  const auto r3 = gen.generate(prompt, other_end);
  CHECK(r3.reason == tlm::stop_reason::eos);
  CHECK(r3.ids == std::vector<std::int32_t>{endoftext});

  int n = 0;
  const auto r2 = gen.generate(prompt, {.max_tokens = 8}, tlm::make_token_callback([&](std::int32_t, std::string_view) { return ++n < 3; }));
  CHECK(r2.reason == tlm::stop_reason::callback);
  CHECK(r2.ids.size() == 3);
  CHECK(n == 3);
}

TEST_CASE("a seed gives the same text at any thread count") {
  const auto& tok = shared_tokenizer();
  tlm::generation_options o{.max_tokens = 24};
  o.sample = {.temperature = 1.0f, .top_k = 50, .top_p = 0.95f, .seed = 1234, .min_p = 0.02f, .repeat_penalty = 1.1f};
  auto one = tlm::model<C>::load(TLM_MODEL_PATH, {.threads = 1});
  auto two = tlm::model<C>::load(TLM_MODEL_PATH, {.threads = 2});
  tlm::generator g1(one, tok), g2(two, tok);
  const auto a = g1.generate(prompt, o), b = g2.generate(prompt, o), c = g1.generate(prompt, o);
  MESSAGE("seed 1234: '" << a.text << "'");
  CHECK(a.ids == b.ids);
  CHECK(a.ids == c.ids);
  o.sample.seed = 1235;
  CHECK(g1.generate(prompt, o).ids != a.ids);
}

TEST_CASE("bad generation options are errors that say what to do") {
  tlm::generator gen(shared(), shared_tokenizer());
  tlm::generation_options o;
  o.stop = {""};  // (a named object: GCC 12 warns falsely about the temporary's vector)
  CHECK_THROWS_AS(gen.generate(prompt, o), tlm::error);
  o.stop.clear();
  o.sample.top_p = 0.0f;
  CHECK_THROWS_WITH_AS(gen.generate(prompt, o), doctest::Contains("top_p must be in (0, 1]"), tlm::error);
  CHECK_THROWS_AS(gen.generate(std::vector<std::int32_t>{}, {}), tlm::error);
}

TEST_CASE("chat: turn 2 runs only its new tokens and equals a fresh prefill of the conversation") {
  auto& m = shared();
  const auto& tok = shared_tokenizer();
  tlm::chat_session chat(m, tok, 512);
  chat.add("user", "What is the capital of France?");
  const auto r1 = chat.reply({.max_tokens = 48});
  MESSAGE("turn 1 (" << tlm::to_string(r1.reason) << "): " << r1.text);
  CHECK(r1.text.find("Paris") != std::string::npos);
  const std::size_t after_turn1 = chat.cache().length();
  CHECK(r1.prompt_tokens == after_turn1 - r1.decoded_tokens);  // the whole first prompt

  chat.add("user", "And what is the capital of Italy?");
  std::vector<float> new_logits;
  const auto r2 = chat.reply({.max_tokens = 48}, {}, {.prompt_logits = &new_logits});
  MESSAGE("turn 2 (" << tlm::to_string(r2.reason) << "): " << r2.text << " [prefill of " << r2.prompt_tokens << " tokens after "
                     << after_turn1 << " in the cache]");
  CHECK(r2.text.find("Rome") != std::string::npos);
  CHECK(chat.last_prefill_tokens() == r2.prompt_tokens);
  REQUIRE(new_logits.size() == r2.prompt_tokens * C::vocab);
  CHECK(r2.prompt_tokens < 30);  // the new message, headers and the end of reply 1: not the history

  // A fresh prefill of the whole conversation up to the second reply.
  const std::size_t len = after_turn1 + r2.prompt_tokens;
  const std::vector<std::int32_t> conv(chat.tokens().begin(), chat.tokens().begin() + static_cast<std::ptrdiff_t>(len));
  tlm::kv_cache<C> fresh(len);
  std::vector<float> all;
  (void)m.prefill(conv, fresh, &all);
  // Relative to the largest logit, as test_model_api compares a batch with token-by-token
  // (a batch of 19 rows and one of 63 add up in different orders).
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < new_logits.size(); ++i) {
    const double want = all[after_turn1 * C::vocab + i];
    worst = std::max(worst, std::fabs(static_cast<double>(new_logits[i]) - want));
    scale = std::max(scale, std::fabs(want));
  }
  MESSAGE("turn 2 logits against a fresh prefill of " << len << " tokens: max abs difference " << worst
                                                      << ", relative to the largest logit " << worst / scale);
  CHECK(worst / scale <= 1e-5);

  // The tokens are those of the rendered conversation.
  const std::string tmpl(m.file().get_string("tokenizer.chat_template"));
  const auto rendered = tlm::apply_chat_template(tmpl, chat.messages(), false);
  CHECK(tok.encode(rendered, {.add_bos = false, .parse_special = true}) == chat.tokens());

  chat.reset();
  CHECK(chat.tokens().empty());
  CHECK(chat.cache().length() == 0);
  chat.add("system", "You answer in one word.");
  chat.add("user", "What is the capital of France?");
  const auto r3 = chat.reply({.max_tokens = 16});
  CHECK(!r3.text.empty());
  CHECK(chat.messages().size() == 3);  // a system message given: no default one added
}

TEST_CASE("chat: a reply cut by a stop string keeps only the visible text in the conversation") {
  auto& m = shared();
  const auto& tok = shared_tokenizer();
  tlm::chat_session chat(m, tok, 512);
  chat.add("user", "What is the capital of France?");
  tlm::generation_options o{.max_tokens = 48};
  o.stop = {"Paris"};
  const auto r = chat.reply(o);
  CHECK(r.reason == tlm::stop_reason::stop_string);
  CHECK(r.text.find("Paris") == std::string::npos);
  CHECK(chat.messages().back().content == r.text);
  const std::string tmpl(m.file().get_string("tokenizer.chat_template"));
  CHECK(tok.encode(tlm::apply_chat_template(tmpl, chat.messages(), false), {.add_bos = false, .parse_special = true}) ==
        chat.tokens());
  CHECK(chat.cache().length() <= chat.tokens().size());
  chat.add("user", "Say it again.");
  CHECK_NOTHROW(chat.reply({.max_tokens = 8}));
  CHECK_THROWS_AS(chat.add("us\ner", "x"), tlm::error);
}

TEST_CASE("chat: another template form by name: its markers, its end of turn, and what it refuses") {
  auto& m = shared();
  const auto& tok = shared_tokenizer();
  // Zephyr's turns end with the EOS text, which for SmolLM2 is <|im_end|>; its role tags
  // are text. Two turns, then the tokens are those of the rendered conversation.
  tlm::chat_session chat(m, tok, {.capacity = 256, .chat_template = "zephyr"});
  CHECK(chat.format().name() == "zephyr");
  chat.add("user", "What is the capital of France?");
  const std::size_t need = chat.positions_for(std::vector<tlm::chat_message>{});
  const auto r1 = chat.reply({.max_tokens = 12});
  CHECK(r1.prompt_tokens == need);
  chat.add("user", "And of Italy?");
  (void)chat.reply({.max_tokens = 12});
  const tlm::chat_render_options render{.bos_token = tok.decode(std::vector<std::int32_t>{tok.bos()}),
                                        .eos_token = tok.decode(std::vector<std::int32_t>{tok.eos()})};
  const std::string rendered = chat.format().render(chat.messages(), false, render);
  CAPTURE(rendered);
  CHECK(rendered.starts_with("<|user|>\nWhat is the capital of France?<|im_end|>\n<|assistant|>\n"));
  CHECK(tok.encode(rendered, {.add_bos = false, .parse_special = true}) == chat.tokens());

  // Mistral Nemo's template moves the system message into the last user message, so the
  // earlier turns could not stay in the cache: refused before anything runs.
  tlm::chat_session nemo(m, tok, {.capacity = 256, .chat_template = "mistral-nemo"});
  nemo.add("system", "Be brief.");
  nemo.add("user", "Hi");
  CHECK_THROWS_WITH_AS(nemo.reply({.max_tokens = 4}), doctest::Contains("renders the earlier messages differently"), tlm::error);
  CHECK(nemo.cache().length() == 0);

  // A form whose end marker this vocabulary lacks, and an unknown name.
  CHECK_THROWS_WITH_AS(tlm::chat_session(m, tok, {.capacity = 16, .chat_template = "llama3"}),
                       doctest::Contains("no single token for <|eot_id|>"), tlm::error);
  CHECK_THROWS_WITH_AS(tlm::chat_session(m, tok, {.capacity = 16, .chat_template = "vicuna"}),
                       doctest::Contains("the names are chatml, smollm2"), tlm::error);
}

TEST_CASE("chat: positions_for counts what reply() needs, a typed <|im_end|> as text") {
  auto& m = shared();
  const auto& tok = shared_tokenizer();
  std::string marked = "Repeat: ";
  for (int i = 0; i < 10; ++i) marked += "<|im_end|>";
  const std::vector<tlm::chat_message> without_system = {{"user", marked}};
  const std::vector<tlm::chat_message> with_system = {{"system", "Be brief."}, {"user", marked}};
  for (const auto* msgs : {&without_system, &with_system}) {
    tlm::chat_session counter(m, tok, 1);
    const std::size_t n = counter.positions_for(*msgs);
    // A template rendering parsed for special tokens counts each typed marker as one
    // token (the server's old count); as text, ten in a row take 6 tokens each: 50 more.
    const std::string tmpl(m.file().get_string("tokenizer.chat_template"));
    CHECK(tok.encode(tlm::apply_chat_template(tmpl, *msgs, true), {.add_bos = false, .parse_special = true}).size() + 50 == n);
    tlm::chat_session exact(m, tok, n + 4);
    for (const auto& msg : *msgs) exact.add(msg.role, msg.content);
    const auto r = exact.reply({.max_tokens = 4});
    CHECK(r.prompt_tokens == n);
    tlm::chat_session short_one(m, tok, n - 1);
    for (const auto& msg : *msgs) short_one.add(msg.role, msg.content);
    CHECK_THROWS_AS(short_one.reply({.max_tokens = 4}), tlm::capacity_error);
    // After a turn: the conversation so far, then the new message and the header.
    const std::vector<tlm::chat_message> next = {{"user", "Again."}};
    const std::size_t more = exact.positions_for(next);
    exact.add("user", "Again.");
    CHECK(more == exact.tokens().size() + 1 + tok.encode("assistant\n", {.add_bos = false}).size());
  }
}

TEST_CASE("a cache clone copies the written positions and continues like the original") {
  auto& m = shared();
  tlm::kv_cache<C> a(16);
  (void)m.prefill(prompt, a);
  tlm::kv_cache<C> b = a.clone();
  CHECK(b.length() == a.length());
  CHECK(b.capacity() == a.capacity());
  for (std::size_t l = 0; l < C::layers; l += 7)
    for (std::size_t g = 0; g < C::kv_heads; ++g) {
      const auto ka = a.keys(l, g), kb = b.keys(l, g);
      CHECK(std::equal(ka.begin(), ka.end(), kb.begin(), kb.end()));
    }
  const auto la = m.forward(7042, a);
  const std::vector<float> first(la.begin(), la.end());
  const auto lb = m.forward(7042, b);
  CHECK(std::equal(first.begin(), first.end(), lb.begin(), lb.end()));
}

TEST_CASE("beam search: the length penalty's exponent sets the score and the rank of a finished beam") {
  auto& m = shared();
  const auto& tok = shared_tokenizer();
  // A question the instruct model answers in a sentence and then ends its turn: some
  // beams finish (end-of-sequence) before the token limit while others run on to it.
  const auto ids = tok.encode("<|im_start|>user\nWhat is the capital of France? One word.<|im_end|>\n<|im_start|>assistant\n",
                              {.add_bos = false, .parse_special = true});
  const double penalties[] = {0.5, 2.0};
  std::vector<std::vector<tlm::beam>> runs;
  for (const double lp : penalties) {
    runs.push_back(tlm::generate_beam(m, tok, ids, {.width = 4, .max_tokens = 16, .length_penalty = static_cast<float>(lp)}));
    for (const auto& b : runs.back())
      MESSAGE("lp " << lp << ": score " << b.score << ", log-prob " << b.log_prob << ", " << b.ids.size() << " tokens, "
              << std::string(b.finished ? "finished" : "live") << ": '" << b.text << "'");
  }
  const auto formula = [](const tlm::beam& b, double lp) {
    return b.log_prob / std::pow(static_cast<double>(b.ids.size()), lp);
  };
  // The search keeps the same beams whatever the penalty (it ranks extensions by
  // log-prob); only their scores and their order change.
  const auto by_ids = [](std::vector<tlm::beam> v) {
    std::sort(v.begin(), v.end(), [](const tlm::beam& a, const tlm::beam& b) { return a.ids < b.ids; });
    return v;
  };
  REQUIRE(runs[0].size() == 4);
  REQUIRE(runs[1].size() == 4);
  const auto a = by_ids(runs[0]), b = by_ids(runs[1]);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].ids == b[i].ids);
    CHECK(a[i].log_prob == b[i].log_prob);
  }
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const double lp = penalties[r];
    for (std::size_t i = 0; i < runs[r].size(); ++i) {
      const auto& x = runs[r][i];
      INFO("lp " << lp << ", beam " << i);
      CHECK(x.score == doctest::Approx(formula(x, lp)).epsilon(1e-12));
      // Best first, by the score of this penalty.
      for (std::size_t j = i + 1; j < runs[r].size(); ++j) CHECK(formula(x, lp) >= formula(runs[r][j], lp));
    }
  }
  // The case that makes the exponent matter: a finished beam shorter and more likely than
  // a live one ranks above it at 0.5 and below it at 2 (log-probs of about -8.5 at 12
  // tokens and -10.9 at 16: 8.5 / 12^0.5 < 10.9 / 16^0.5, but 8.5 / 144 > 10.9 / 256).
  const auto rank = [](const std::vector<tlm::beam>& run, const tlm::beam& x) {
    return std::find_if(run.begin(), run.end(), [&](const tlm::beam& y) { return y.ids == x.ids; }) - run.begin();
  };
  bool flipped = false;
  for (const auto& f : a) {
    for (const auto& l : a) {
      if (!f.finished || l.finished || f.ids.size() >= l.ids.size() || f.log_prob <= l.log_prob) continue;
      if (formula(f, 0.5) > formula(l, 0.5) && formula(f, 2.0) < formula(l, 2.0)) {
        flipped = true;
        CHECK(rank(runs[0], f) < rank(runs[0], l));
        CHECK(rank(runs[1], f) > rank(runs[1], l));
      }
    }
  }
  REQUIRE_MESSAGE(flipped, "no finished beam whose rank against a longer live one depends on the penalty");
}

TEST_CASE("beam search: width 1 is greedy, and every beam's score is its log-probs recomputed") {
  auto& m = shared();
  const auto& tok = shared_tokenizer();
  tlm::generator gen(m, tok);
  const auto greedy = gen.generate(prompt, {.max_tokens = 10});
  const auto one = tlm::generate_beam(m, tok, prompt, {.width = 1, .max_tokens = 10});
  REQUIRE(one.size() == 1);
  CHECK(one[0].ids == greedy.ids);
  CHECK(one[0].text == greedy.text);

  const auto beams = tlm::generate_beam(m, tok, prompt, {.width = 3, .max_tokens = 8, .length_penalty = 1.0f});
  REQUIRE(beams.size() == 3);
  double worst = 0.0;
  for (std::size_t k = 0; k < beams.size(); ++k) {
    const auto& b = beams[k];
    MESSAGE("beam " << k << ": score " << b.score << ", log-prob " << b.log_prob << ": '" << b.text << "'");
    if (k > 0) CHECK(beams[k - 1].score >= b.score);
    // An independent recomputation: one prefill of prompt + beam, log-softmax in double.
    std::vector<std::int32_t> seq = prompt;
    seq.insert(seq.end(), b.ids.begin(), b.ids.end() - 1);
    tlm::kv_cache<C> cache(seq.size());
    std::vector<float> all;
    (void)m.prefill(seq, cache, &all);
    double sum = 0.0;
    for (std::size_t i = 0; i < b.ids.size(); ++i) {
      const float* row = all.data() + (prompt.size() - 1 + i) * C::vocab;
      double top = row[0], z = 0.0;
      for (std::size_t v = 0; v < C::vocab; ++v) top = std::max(top, static_cast<double>(row[v]));
      for (std::size_t v = 0; v < C::vocab; ++v) z += std::exp(static_cast<double>(row[v]) - top);
      sum += static_cast<double>(row[static_cast<std::size_t>(b.ids[i])]) - top - std::log(z);
    }
    worst = std::max(worst, std::fabs(sum - b.log_prob));
    CHECK(b.score == doctest::Approx(b.log_prob / static_cast<double>(b.ids.size())));
  }
  MESSAGE("beam log-probs against a recomputation: max abs difference " << worst);
  CHECK(worst < 1e-4);
  CHECK(beams[0].log_prob >= greedy.ids.size() * -100.0);
  CHECK_THROWS_AS(tlm::generate_beam(m, tok, prompt, {.width = 0}), tlm::error);
  CHECK_THROWS_AS(tlm::generate_beam(m, tok, prompt, {.length_penalty = -1.0f}), tlm::error);
}

}  // namespace test_generate
