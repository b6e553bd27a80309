// Training data: text windows, chat rendering with assistant-only loss, the seeded
// order, and every bad-data error with the file, line and problem it names.
#include <doctest/doctest.h>

#include <tlm/train/data.hpp>

#include <filesystem>
#include <fstream>
#include <set>
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
  for (const auto& [n, fraction] : {std::pair<std::size_t, double>{3, 0.2}, {2, 0.05}, {9, 0.111}}) {
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
