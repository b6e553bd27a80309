// Training data: text windows, chat rendering with assistant-only loss, the seeded
// order, and every bad-data error with the file, line and problem it names.
#include <doctest/doctest.h>

#include <tlm/train/data.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <span>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_data {

namespace {

std::string write_temp(const std::string& name, const std::string& content) {
  const auto dir = std::filesystem::path(TLM_BINARY_DIR) / "test_train_data";
  std::filesystem::create_directories(dir);
  const auto p = dir / name;
  std::ofstream(p, std::ios::binary) << content;
  return p.string();
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

const tlm::tokenize_fn bytes = tlm::byte_tokens;
constexpr std::string_view plain_template = tlm::detail::chatml_plain;

}  // namespace

TEST_CASE("text: windows of T+1 tokens at stride T, targets shifted by one, held-out at the end") {
  std::string text;
  for (int i = 0; i < 41; ++i) text.push_back(static_cast<char>('a' + i % 26));  // 41 bytes: 10 windows of 4+1 at stride 4
  const auto f = write_temp("text.txt", text);
  const tlm::dataset d = tlm::load_text(f, bytes, 4, 0.2);
  CHECK(d.tokens == 41);
  CHECK(d.train.size() == 8);
  CHECK(d.held_out.size() == 2);
  for (std::size_t w = 0; w < 8; ++w)
    for (std::size_t t = 0; t < 4; ++t) {
      CHECK(d.train.inputs[w * 4 + t] == static_cast<unsigned char>(text[w * 4 + t]));
      CHECK(d.train.targets[w * 4 + t] == static_cast<unsigned char>(text[w * 4 + t + 1]));
    }
  CHECK(d.held_out.inputs[0] == static_cast<unsigned char>(text[32]));
  CHECK(d.held_out.targets.back() == static_cast<unsigned char>(text[40]));
}

TEST_CASE("held-out split: a fraction of less than one window still holds out one, never the last one") {
  // n windows of T = 2 whose inputs number them, so which went where shows.
  const auto split = [](std::size_t n, double fraction) {
    tlm::dataset d;
    d.train.seq = 2;
    for (std::int32_t w = 0; w < static_cast<std::int32_t>(n); ++w) {
      const std::vector<std::int32_t> in{w, w}, tg{w + 1, w + 1};
      d.train.add(in, tg);
    }
    tlm::detail::split_held_out(d, fraction);
    return d;
  };
  // n × fraction below 1 (0.6, 0.1, 0.999): one window held out, the last one.
  for (const auto& c : {std::pair<std::size_t, double>{3, 0.2}, {2, 0.05}, {9, 0.111}}) {
    const std::size_t n = c.first;
    const double fraction = c.second;
    INFO(n << " windows, fraction " << fraction);
    const auto d = split(n, fraction);
    CHECK(d.held_out.size() == 1);
    CHECK(d.train.size() == n - 1);
    CHECK(d.held_out.seq == 2);
    CHECK(d.held_out.inputs == std::vector<std::int32_t>{static_cast<std::int32_t>(n - 1), static_cast<std::int32_t>(n - 1)});
    CHECK(d.train.inputs.back() == static_cast<std::int32_t>(n - 2));
  }
  // No window at all: nothing to split, and no wrap-around of "all but one".
  const auto none = split(0, 0.5);
  CHECK(none.train.size() == 0);
  CHECK(none.held_out.size() == 0);
  // One window: it is kept for training, whatever the fraction.
  const auto one = split(1, 0.5);
  CHECK(one.train.size() == 1);
  CHECK(one.held_out.size() == 0);
  // A fraction of 0 holds out nothing; one that would take every window leaves one to train on.
  CHECK(split(5, 0.0).held_out.size() == 0);
  CHECK(split(5, 0.0).train.size() == 5);
  CHECK(split(2, 0.9).held_out.size() == 1);
  CHECK(split(2, 0.9).train.size() == 1);
  // At or above one window the floor counts: 10 × 0.25 is 2.
  CHECK(split(10, 0.25).held_out.size() == 2);
  // The same through a real file: 13 bytes at --seq 4 are 3 windows, 3 × 0.2 = 0.6.
  const auto f = write_temp("three_windows.txt", "abcdefghijklm");
  const tlm::dataset d = tlm::load_text(f, bytes, 4, 0.2);
  CHECK(d.train.size() == 2);
  CHECK(d.held_out.size() == 1);
  CHECK(d.held_out.inputs == std::vector<std::int32_t>{'i', 'j', 'k', 'l'});
}

TEST_CASE("text: a text shorter than one window is an error naming the file and the sizes") {
  const auto f = write_temp("short.txt", "tiny");
  const std::string e = error_of([&] { tlm::load_text(f, bytes, 8, 0.1); });
  CHECK(e.find("short.txt: the text is 4 tokens, shorter than one window of 9 (--seq 8 plus one)") != std::string::npos);
}

TEST_CASE("text: invalid UTF-8 names the line") {
  const auto f = write_temp("bad_utf8.txt", "line one\nline two\nbad \xff here\n" + std::string(100, 'x'));
  const std::string e = error_of([&] { tlm::load_text(f, bytes, 8, 0.1); });
  CHECK(e.find("bad_utf8.txt:3: invalid UTF-8") != std::string::npos);
}

TEST_CASE("text: a missing file is an error naming it") {
  CHECK(error_of([] { tlm::load_text("/nonexistent/data.txt", bytes, 8, 0.1); }).find("/nonexistent/data.txt: cannot open") != std::string::npos);
}

TEST_CASE("chat: loss only on the assistant's content and its <|im_end|>") {
  const auto f = write_temp("chat.jsonl",
                            R"({"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]})"
                            "\n\n"
                            R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A!"}]})"
                            "\n");
  const tlm::dataset d = tlm::load_chat(f, bytes, plain_template, 0, 256, 0.0);
  REQUIRE(d.train.size() == 2);
  const auto trained = [&](std::size_t w) {
    std::string s;
    for (std::size_t t = 0; t < 256; ++t)
      if (d.train.targets[w * 256 + t] != tlm::ignore_target) s.push_back(static_cast<char>(d.train.targets[w * 256 + t]));
    return s;
  };
  CHECK(trained(0) == "Hello.<|im_end|>");
  CHECK(trained(1) == "A!<|im_end|>");
  // Inputs are the rendered conversation, padded after its end.
  const std::string rendered = "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n";
  for (std::size_t t = 0; t < rendered.size(); ++t) CHECK(d.train.inputs[t] == static_cast<unsigned char>(rendered[t]));
  CHECK(d.train.inputs[rendered.size()] == 0);
}

TEST_CASE("chat: Llama 3's template: loss on the content and <|eot_id|>, not on the header, dates or BOS") {
  const auto f = write_temp("llama3_chat.jsonl",
                            R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi?"}, {"role": "assistant", "content": " Hello. "}]})"
                            "\n");
  const auto form = tlm::chat_template::named("llama3");
  const tlm::dataset d = tlm::load_chat(f, bytes, form, 0, 512, 0.0);
  REQUIRE(d.train.size() == 1);
  std::string trained, inputs;
  for (std::size_t t = 0; t < 512; ++t) {
    if (d.train.targets[t] != tlm::ignore_target) trained.push_back(static_cast<char>(d.train.targets[t]));
    if (d.train.inputs[t] != 0) inputs.push_back(static_cast<char>(d.train.inputs[t]));
  }
  CHECK(trained == "Hello.<|eot_id|>");  // the template trims the content
  const std::vector<tlm::chat_message> msgs = {{"system", "S"}, {"user", "Hi?"}, {"assistant", " Hello. "}};
  CHECK(inputs == form.render(msgs, false));
}

TEST_CASE("chat: a template that re-renders earlier turns is an error naming the line") {
  const auto f = write_temp("nemo_chat.jsonl",
                            R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
                            "\n");
  const std::string e = error_of([&] { tlm::load_chat(f, bytes, tlm::chat_template::named("mistral-nemo"), 0, 64, 0.0); });
  CHECK(e.find("nemo_chat.jsonl:1: the mistral-nemo chat template renders the earlier messages differently") != std::string::npos);
  const auto g = write_temp("nemo_alternate.jsonl",
                            R"({"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a"}]})"
                            "\n");
  CHECK(error_of([&] { tlm::load_chat(g, bytes, tlm::chat_template::named("mistral-nemo"), 0, 64, 0.0); })
            .find("nemo_alternate.jsonl:1: chat template mistral-nemo: After the optional system message") != std::string::npos);
}

TEST_CASE("chat: a conversation longer than a window is cut into windows, none without loss") {
  const auto f = write_temp("long_chat.jsonl", R"({"messages": [{"role": "user", ")" + std::string("content") +
                                                   R"(": "question"}, {"role": "assistant", "content": ")" + std::string(100, 'z') + "\"}]}\n");
  const tlm::dataset d = tlm::load_chat(f, bytes, plain_template, 0, 16, 0.0);
  std::size_t counted = 0;
  for (const auto t : d.train.targets) counted += t != tlm::ignore_target;
  CHECK(counted == 100 + 10);
  CHECK(d.train.size() >= 7);
}

TEST_CASE("chat: every bad record is an error naming the file, line and problem") {
  const auto check = [](const std::string& name, const std::string& content, const std::string& want) {
    const auto f = write_temp(name, content);
    const std::string e = error_of([&] { tlm::load_chat(f, bytes, plain_template, 0, 64, 0.1); });
    INFO(e);
    CHECK(e.find(want) != std::string::npos);
  };
  const std::string good = R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})";
  check("no_messages.jsonl", good + "\n{\"msgs\": []}\n", "no_messages.jsonl:2: the record has no \"messages\"");
  check("empty_messages.jsonl", "{\"messages\": []}\n", "empty_messages.jsonl:1: \"messages\" is not a non-empty array");
  check("bad_role.jsonl", good + "\n" + good + "\n" + R"({"messages": [{"role": "wizard", "content": "q"}]})",
        "bad_role.jsonl:3: message 1: unknown role \"wizard\"; use system, user or assistant");
  check("bad_json.jsonl", "{\"messages\": [\n", "bad_json.jsonl:1: not valid JSON");
  check("no_content.jsonl", R"({"messages": [{"role": "user"}]})", "no_content.jsonl:1: message 1: needs a string \"role\" and a string \"content\"");
  check("no_assistant.jsonl", R"({"messages": [{"role": "user", "content": "q"}]})", "no_assistant.jsonl:1: no assistant message");
  check("bad_utf8.jsonl", good + "\n{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}\n", "bad_utf8.jsonl:2: invalid UTF-8");
  check("nothing.jsonl", "\n\n", "nothing.jsonl: no conversations");
}

TEST_CASE("pack: window_packer places examples first fit in order, marks where each starts, pads the rest with no loss") {
  // Examples numbered by their tokens: example k is tokens 100k, 100k+1, ..., targets +1.
  const auto ex = [](std::int32_t k, std::size_t len) {
    std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> e;
    for (std::size_t t = 0; t < len; ++t) {
      e.first.push_back(100 * k + static_cast<std::int32_t>(t));
      e.second.push_back(100 * k + static_cast<std::int32_t>(t) + 1);
    }
    return e;
  };
  constexpr std::size_t T = 12;
  constexpr std::int32_t pad = 7;
  tlm::window_packer pk(T, pad);
  for (const auto& [k, len] : {std::pair<std::int32_t, std::size_t>{0, 5}, {1, 4}, {2, 3}, {3, 7}, {4, 2}}) {
    const auto e = ex(k, len);
    pk.add(e.first, e.second);
  }
  CHECK(pk.windows() == 2);
  const tlm::window_set w = std::move(pk).finish();
  REQUIRE(w.size() == 2);
  REQUIRE(w.packed());
  // Window 0: examples 0 (0..4), 1 (5..8), 2 (9..11), full. Window 1: 3 (0..6), 4 (7..8), padding 9..11.
  const std::vector<std::uint32_t> starts = {0, 0, 0, 0, 0, 5, 5, 5, 5, 9, 9, 9, 0, 0, 0, 0, 0, 0, 0, 7, 7, 9, 9, 9};
  CHECK(w.starts == starts);
  const std::vector<std::int32_t> inputs = {0,   1,   2,   3,   4,   100, 101, 102, 103, 200, 201, 202,
                                            300, 301, 302, 303, 304, 305, 306, 400, 401, pad, pad, pad};
  CHECK(w.inputs == inputs);
  CHECK(w.targets[5] == 101);   // example 1's first target
  CHECK(w.targets[11] == 203);  // the last position of a full window trains
  for (std::size_t t = 21; t < 24; ++t) CHECK(w.targets[t] == tlm::ignore_target);  // padding: no loss

  // First fit, not next fit: an example goes back to the first window with room.
  tlm::window_packer ff(10, pad);
  for (const auto& [k, len] : {std::pair<std::int32_t, std::size_t>{0, 8}, {1, 8}, {2, 3}, {3, 4}, {4, 2}, {5, 2}, {6, 3}}) {
    const auto e = ex(k, len);
    ff.add(e.first, e.second);
  }
  const tlm::window_set f = std::move(ff).finish();
  REQUIRE(f.size() == 3);
  CHECK(f.inputs[8] == 400);       // example 4 (2 tokens) into window 0's last 2 positions
  CHECK(f.inputs[18] == 500);      // example 5 into window 1's
  CHECK(f.inputs[20 + 3] == 300);  // example 3 after example 2 in window 2
  CHECK(f.inputs[20 + 7] == 600);  // example 6 fills window 2
  CHECK(f.starts[20 + 9] == 7);
}

TEST_CASE("pack: an example of exactly the window length fills a window alone; a longer one is refused by the packer") {
  tlm::window_packer pk(6, 0);
  const std::vector<std::int32_t> six = {1, 2, 3, 4, 5, 6}, one = {9};
  pk.add(one, one);
  pk.add(six, six);  // no room beside the first: a window of its own
  pk.add(one, one);  // back into window 0
  const tlm::window_set w = std::move(pk).finish();
  REQUIRE(w.size() == 2);
  CHECK(std::vector<std::uint32_t>(w.starts.begin() + 6, w.starts.end()) == std::vector<std::uint32_t>(6, 0));
  CHECK(std::vector<std::int32_t>(w.inputs.begin() + 6, w.inputs.end()) == six);
  CHECK(std::vector<std::uint32_t>(w.starts.begin(), w.starts.begin() + 6) == std::vector<std::uint32_t>{0, 1, 2, 2, 2, 2});
  tlm::window_packer small(4, 0);
  CHECK(error_of([&] { small.add(six, six); }).find("an example of 6 inputs and 6 targets for windows of 4; give 1 to 4") != std::string::npos);
  CHECK(error_of([&] { small.add(std::span(six).first(0), std::span(six).first(0)); }).find("an example of 0 inputs") != std::string::npos);
}

TEST_CASE("pack: load_chat packs the same loss tokens into fewer windows; a long conversation is cut as unpacked") {
  // 9 short conversations of 64 to 72 bytes (ChatML's markers are text here), and one of
  // 463 bytes, longer than a window of 256: cut into pieces of 256 at stride 256, as unpacked.
  std::string lines;
  for (int i = 0; i < 9; ++i)
    lines += R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A)" +
             std::string(static_cast<std::size_t>(i + 1), 'x') + "\"}]}\n";
  lines += R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": ")" + std::string(400, 'z') + "\"}]}\n";
  const auto f = write_temp("pack_chat.jsonl", lines);
  const tlm::dataset u = tlm::load_chat(f, bytes, plain_template, 0, 256, 0.0);
  const tlm::dataset p = tlm::load_chat(f, bytes, plain_template, 0, 256, 0.0, true);
  CHECK(!u.train.packed());
  REQUIRE(p.train.packed());
  CHECK(p.tokens == u.tokens);
  // The (input, target) pairs that carry loss, with each one's position in its example:
  // the same sets, so the packed windows train exactly the unpacked ones' targets at the
  // same positions.
  const auto pairs = [](const tlm::window_set& w) {
    std::multiset<std::tuple<std::int32_t, std::int32_t, std::size_t>> out;
    for (std::size_t i = 0; i < w.inputs.size(); ++i)
      if (w.targets[i] != tlm::ignore_target) out.emplace(w.inputs[i], w.targets[i], i % w.seq - (w.packed() ? w.starts[i] : 0));
    return out;
  };
  CHECK(pairs(p.train) == pairs(u.train));
  CHECK(pairs(p.train).size() == (9 * 12 + 36) + (400 + 10));  // each answer and its <|im_end|>
  // Unpacked: a window for each short conversation and each of the long one's 2 pieces.
  CHECK(u.train.size() == 11);
  // Packed, first fit: the 9 short ones 3 to a window, the long one's pieces 256 and 206
  // (too long to share) one each.
  CHECK(p.train.size() == 5);
  // The long conversation's first piece fills a window from position 0, as unpacked.
  std::size_t full = 0;
  for (std::size_t w = 0; w < p.train.size(); ++w)
    full += std::all_of(p.train.starts.begin() + static_cast<std::ptrdiff_t>(w * 256), p.train.starts.begin() + static_cast<std::ptrdiff_t>((w + 1) * 256),
                        [](std::uint32_t s) { return s == 0; });
  CHECK(full == 1);
  MESSAGE("pack_chat.jsonl at --seq 256: ", u.train.size(), " windows unpacked, ", p.train.size(), " packed");
  // A held-out split keeps each window's starts with it.
  const tlm::dataset h = tlm::load_chat(f, bytes, plain_template, 0, 256, 0.3, true);
  CHECK(h.held_out.packed());
  CHECK(h.held_out.starts.size() == h.held_out.inputs.size());
  CHECK(h.train.starts.size() == h.train.inputs.size());
  CHECK(h.train.size() + h.held_out.size() == p.train.size());
}

TEST_CASE("window order: a permutation per epoch, fixed by the seed, different across epochs") {
  tlm::window_order a(10, 7), b(10, 7), c(10, 8);
  std::set<std::size_t> seen;
  std::vector<std::size_t> e0, e1, other;
  for (std::size_t i = 0; i < 10; ++i) {
    seen.insert(a.at(i));
    e0.push_back(a.at(i));
    other.push_back(c.at(i));
  }
  CHECK(seen.size() == 10);
  for (std::size_t i = 10; i < 20; ++i) e1.push_back(a.at(i));
  CHECK(e0 != e1);
  CHECK(e0 != other);
  // Random access gives the same as sequential access (what a resume relies on).
  for (std::size_t i = 19; i + 1 > 0; --i) CHECK(b.at(i) == (i < 10 ? e0[i] : e1[i - 10]));
}

}  // namespace test_train_data
