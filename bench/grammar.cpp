// The cost of constrained decoding per generated token: json_grammar::allowed() (the
// mask of every token the grammar admits next) on SmolLM2's vocabulary, in the states a
// tool call passes through, against allowed() as it was before 2026-12-05 (a full copy
// of the state fed each token's bytes) in the same run. The masks must agree; the
// program exits 1 when they do not.
//
//   grammar [--model PATH] [--reps N] [--out FILE]
//
// The grammar is the one examples/serve builds for a request with 8 function tools
// (tools::apply), each with a string, an integer and an enum argument.
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <tlm/cpu.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/generation/grammar.hpp>
#include <tlm/generation/tools.hpp>
#include <tlm/text/tokenizer.hpp>

#include "machine.hpp"

namespace {

// allowed() as it was before 2026-12-05: each token fed from a full copy of the state,
// and the fewest characters to finish summed over all of its frames.
void allowed_plain(const tlm::json_grammar& g, const tlm::json_grammar::state& s, const tlm::tokenizer& tok,
                   std::size_t budget, std::vector<std::uint8_t>& out) {
  const std::size_t v = tok.vocab_size();
  out.assign(v, 0);
  std::array<bool, 256> first{};
  for (int c = 0; c < 256; ++c) {
    auto t = s;
    const char byte = static_cast<char>(c);
    first[static_cast<std::size_t>(c)] = g.feed(t, std::string_view(&byte, 1));
  }
  for (std::size_t id = 0; id < v; ++id) {
    const auto i = static_cast<std::int32_t>(id);
    if (const auto t = tok.type(i);
        t == tlm::token_type::control || t == tlm::token_type::unknown || t == tlm::token_type::unused)
      continue;
    const std::string_view bytes = tok.token_bytes(i);
    if (bytes.empty() || !first[static_cast<unsigned char>(bytes[0])] || s.chars + bytes.size() > budget) continue;
    auto t = s;
    if (g.feed(t, bytes) && t.chars + g.min_to_finish(t) <= budget) out[id] = 1;
  }
  if (g.can_end(s))
    for (const std::int32_t id : tok.end_of_generation()) out[static_cast<std::size_t>(id)] = 1;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf", out_path;
  std::size_t reps = 21;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = tlm_bench::positive_number("grammar", "--reps", argv[++i]);
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: grammar [--model PATH] [--reps N] [--out FILE]\n");
      return 2;
    }
  }
  if (!std::filesystem::exists(model)) {
    std::fprintf(stderr, "grammar bench: %s is missing; run scripts/fetch-model or pass --model\n", model.c_str());
    return 2;
  }
  const tlm::gguf::file f(model);
  const tlm::tokenizer tok = tlm::tokenizer::from_gguf(f);

  nlohmann::json tools = nlohmann::json::array();
  for (const char* name : {"search", "weather", "calendar", "email", "translate", "calculate", "reminder", "music"}) {
    tools.push_back({{"type", "function"},
                     {"function",
                      {{"name", name},
                       {"description", std::string("the ") + name + " tool"},
                       {"parameters",
                        {{"type", "object"},
                         {"properties",
                          {{"query", {{"type", "string"}}},
                           {"limit", {{"type", "integer"}}},
                           {"mode", {{"enum", {"fast", "full"}}}}}},
                         {"required", {"query", "limit", "mode"}}}}}}});
  }
  std::vector<tlm::chat_message> messages{{"user", "hi"}};
  tlm::generation_options o;
  tlm::tools::apply(tools, {tlm::tools::choice::kind::required, {}}, true, messages, "", o);
  const tlm::json_grammar& g = *o.grammar;

  // The grammar writes a call's arguments as compact JSON, properties in the schema's
  // order (nlohmann::json sorts them: limit, mode, query).
  const std::string head = tlm::tools::call_head("search");
  const std::string at_name = head.substr(0, head.find("\"search\"") + 1);
  const std::string in_number = head + "{\"limit\":12";
  const std::string in_string = head + "{\"limit\":12,\"mode\":\"fast\",\"query\":\"the weather in Par";
  const struct {
    const char* where;
    std::string prefix;
  } states[] = {{"start of the reply", ""},
                {"choosing the tool's name", at_name},
                {"inside a string argument", in_string},
                {"inside an integer argument", in_number}};

  const std::string load_before = tlm_bench::load_average();
  std::string table = "| state | allowed tokens | allowed() µs | plain µs | plain / allowed() |\n|---|---|---|---|---|\n";
  bool agree = true;
  std::vector<std::uint8_t> a, b;
  for (const auto& st : states) {
    auto s = g.start();
    if (!g.feed(s, st.prefix)) {
      std::fprintf(stderr, "grammar bench: the grammar refuses its own prefix '%s'\n", st.prefix.c_str());
      return 1;
    }
    const std::size_t budget = 4096;
    double fast = 0, plain = 0;
    // Interleaved, so that a busy moment of the machine falls on both.
    for (int round = 0; round < 3; ++round) {
      fast += tlm_bench::median_us(reps, [&] { g.allowed(s, tok, budget, a); });
      plain += tlm_bench::median_us(reps, [&] { allowed_plain(g, s, tok, budget, b); });
    }
    if (a != b) {
      agree = false;
      std::fprintf(stderr, "grammar bench: the masks differ at '%s'\n", st.where);
    }
    const auto n = std::count(a.begin(), a.end(), std::uint8_t{1});
    table += fmt::format("| {} | {} | {:.0f} | {:.0f} | {:.2f} |\n", st.where, n, fast / 3, plain / 3, plain / fast);
  }
  const std::string doc = fmt::format(
      "# Constrained decoding: json_grammar::allowed()\n\n- CPU: {} ({}); load average before: {}, after: {}\n"
      "- Vocabulary: {} tokens ({}); grammar: tools::apply with 8 function tools, tool_choice required.\n"
      "- Median of {} calls, 3 interleaved rounds averaged; one thread.\n- Produced by `bench/grammar.cpp`.\n\n{}",
      tlm_bench::cpu_model(), tlm::cpu_feature_string(), load_before, tlm_bench::load_average(), tok.vocab_size(), model, reps, table);
  const int written = tlm_bench::publish(doc, out_path);
  return agree ? written : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "grammar bench: %s\n", e.what());
  return 2;
}
