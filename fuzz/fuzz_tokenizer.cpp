// libFuzzer over the tokenizer built from the real model: encode (with and without
// parse_special and BOS), decode, and the stream decoder. Besides memory errors it traps
// on broken contracts:
//   - encode throws tlm::text_error exactly when the input is not valid UTF-8;
//   - decode(encode(t)) == t when every byte of t has a token;
//   - every id from encode is in the vocabulary;
//   - encode's ASCII fast path gives the same ids as PCRE2 alone;
//   - the stream decoder's output equals decode, and each piece is valid UTF-8;
//   - decode refuses out-of-range ids with tlm::error and accepts all others.
// The model path comes from TLM_MODEL_PATH, else the repository's models/ folder.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <tlm/format/gguf.hpp>
#include <tlm/text/tokenizer.hpp>

namespace {

const tlm::tokenizer& the_tokenizer() {
  static const std::unique_ptr<tlm::tokenizer> tok = [] {
    const char* env = std::getenv("TLM_MODEL_PATH");
    const std::filesystem::path path =
        env ? std::filesystem::path(env)
            : std::filesystem::path(__FILE__).parent_path().parent_path() / "models" /
                  "SmolLM2-135M-Instruct.Q4_1.gguf";
    const tlm::gguf::file f(path);
    return std::make_unique<tlm::tokenizer>(tlm::tokenizer::from_gguf(f));
  }();
  return *tok;
}

void require(bool ok) {
  if (!ok) __builtin_trap();
}

void check_encode(const tlm::tokenizer& tok, std::string_view text, tlm::encode_options opt) {
  const bool valid = tlm::utf8::first_invalid(text) == std::string_view::npos;
  std::vector<std::int32_t> ids;
  try {
    ids = tok.encode(text, opt);
  } catch (const tlm::text_error&) {
    require(!valid);
    return;
  }
  require(valid);
  for (const auto id : ids) require(id >= 0 && static_cast<std::size_t>(id) < tok.vocab_size());
  require(ids == tok.encode_without_fast_path(text, opt));  // the ASCII fast path changes nothing
  // Unset options mean what the file says.
  const bool bos = opt.add_bos.value_or(tok.add_bos_default()) && tok.bos() >= 0;
  const bool eos = opt.add_eos.value_or(tok.add_eos_default()) && tok.eos() >= 0;
  require(ids.size() >= (bos ? 1u : 0u) + (eos ? 1u : 0u));
  const std::span<const std::int32_t> body(ids.data() + (bos ? 1 : 0), ids.size() - (bos ? 1 : 0) - (eos ? 1 : 0));
  if (bos) require(ids[0] == tok.bos());
  if (eos) require(ids.back() == tok.eos());
  bool all_mapped = true;
  for (const char c : text) all_mapped = all_mapped && tok.byte_has_token(static_cast<std::uint8_t>(c));
  if (all_mapped) require(tok.decode(body) == text);
}

void check_decode(const tlm::tokenizer& tok, const std::vector<std::int32_t>& ids) {
  bool in_range = true;
  for (const auto id : ids) in_range = in_range && id >= 0 && static_cast<std::size_t>(id) < tok.vocab_size();
  std::string text;
  try {
    text = tok.decode(ids);
  } catch (const tlm::error&) {
    require(!in_range);
    return;
  }
  require(in_range);
  require(tlm::utf8::first_invalid(text) == std::string_view::npos);
  tlm::stream_decoder sd(tok);
  std::string streamed;
  for (const auto id : ids) {
    const std::string part = sd.push(id);
    require(tlm::utf8::first_invalid(part) == std::string_view::npos);
    streamed += part;
  }
  streamed += sd.flush();
  require(streamed == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const tlm::tokenizer& tok = the_tokenizer();
  const std::uint8_t mode = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (mode % 4) {
    case 0: check_encode(tok, rest, {}); break;
    case 1: check_encode(tok, rest, {.add_bos = true, .parse_special = true}); break;
    case 2: {
      // Two bytes per id over a range a bit larger than the vocabulary, so some are invalid.
      std::vector<std::int32_t> ids;
      for (std::size_t i = 0; i + 1 < rest.size(); i += 2) {
        std::uint16_t v = 0;
        std::memcpy(&v, rest.data() + i, 2);
        ids.push_back(static_cast<std::int32_t>(v % 49200));
      }
      check_decode(tok, ids);
      break;
    }
    default: {
      // Any 32-bit ids, including negative ones.
      std::vector<std::int32_t> ids(rest.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      for (auto& id : ids)
        if ((id & 0x70000000) != 0x70000000) id = static_cast<std::int32_t>(static_cast<std::uint32_t>(id) % 49152u);
      check_decode(tok, ids);
      break;
    }
  }
  return 0;
}
