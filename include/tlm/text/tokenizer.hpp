#pragma once
// The tokenizers of Llama-family GGUF files, token-for-token identical to Hugging Face
// `tokenizers`. The algorithm is chosen at run time from the file:
//   - tokenizer.ggml.model = "gpt2": byte-level BPE, with tokenizer.ggml.pre
//       "smollm" (SmolLM2, described in detail below),
//       "llama-bpe" (Llama 3: HF's Split with Llama 3's pattern, digits in groups of up to
//         three, then ignore_merges: a pre-token that is a vocabulary entry is one token),
//       "qwen2" (Qwen2/2.5: the same pattern with single digits, merges as usual);
//   - tokenizer.ggml.model = "llama": SentencePiece BPE (Llama 2, TinyLlama, Mistral,
//     Phi-3), as HF's conversion of it: spaces become U+2581, a U+2581 is put before each
//     stretch of text between special tokens (add_space_prefix), the pair whose merge has
//     the highest score merges first, a character without a piece falls back to its bytes'
//     <0xXX> tokens or else the unknown token. decode removes the one leading space the
//     prefix gave. Not implemented: Qwen2's NFC normalizer (llama.cpp skips it as well), so
//     text not in NFC may differ from HF.
// BOS and EOS follow the file's add_bos_token / add_eos_token unless encode_options says
// otherwise; end_of_generation() is the set of ids that end a reply.
//
// SmolLM2's pipeline (what its tokenizer.json declares; there is no normalizer):
//   1. Special tokens: with encode_options::parse_special, occurrences of control and
//      user-defined tokens (leftmost, then longest) are cut out and emitted as their id.
//      Without it they are ordinary text.
//   2. Digits(individual_digits): every character with a Unicode numeric general
//      category (Nd, Nl, No; Rust's char::is_numeric) is its own pre-token.
//   3. ByteLevel, no prefix space: each stretch between digits is split with the GPT-2
//      pattern, each piece's bytes are mapped to the 256 byte symbols.
//   4. BPE: repeatedly merge the adjacent pair of lowest merge rank, leftmost on ties.
//
// Behaviour chosen to match Hugging Face exactly, and documented here because it
// loses information:
//   - A byte whose symbol has no token in the vocabulary is dropped before merging
//     (HF's BPE without byte fallback and without an unknown token does that). For
//     SmolLM2 these are 0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5..0xFF,
//     so for instance every character in U+40000..U+BFFFF loses its lead byte, and
//     decode(encode(t)) != t for such text.
//   - Unicode classes come from PCRE2 (Unicode 14 in Debian's 10.42). Two differences
//     from HF are handled explicitly (details at the patterns below): whitespace is
//     \p{White_Space} as in Oniguruma, not PCRE2's \s (which adds U+180E); and the
//     digits assigned in Unicode 15-17, which HF's Rust already treats as numeric.
//     tests/reference/check_tokenizer.py compares every code point of planes 0-3 and 14.
//
// Speed: runs of ASCII are split without PCRE2 (the same decisions, checked against
// PCRE2 alone by encode_without_fast_path in the tests and the fuzzer), and pre-tokens
// of up to 64 bytes are cached (bounded, shared by copies, thread-safe). encode is
// const and may be called from several threads at once.
//
// Invalid UTF-8 given to encode throws tlm::text_error with the byte offset; the
// tokenizer never guesses at what such bytes meant (convert the text with
// utf8::to_valid first if replacement characters are acceptable).
// decode never fails on valid ids: invalid byte sequences formed by the tokens become
// U+FFFD exactly as in HF's ByteLevel decoder (Rust from_utf8_lossy).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tlm/error.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/text/unicode.hpp>

namespace tlm {

struct encode_options {
  // Put the BOS id first / the EOS id last. Unset means what the file says
  // (tokenizer.ggml.add_bos_token / add_eos_token, see tokenizer::add_bos_default).
  std::optional<bool> add_bos = std::nullopt;
  bool parse_special = false;  // match special-token strings in the text
  std::optional<bool> add_eos = std::nullopt;
};

// llama.cpp / GGUF token types (tokenizer.ggml.token_type).
enum class token_type : std::int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

struct special_token_ids {
  std::int32_t bos = -1, eos = -1, unknown = -1, padding = -1;  // -1: absent
  bool add_bos = false;                                         // the file's tokenizer.ggml.add_bos_token
  std::int32_t eot = -1, eom = -1;                              // end of turn, end of message (Llama 3)
  bool add_eos = false;                                         // the file's tokenizer.ggml.add_eos_token
};

// The algorithm, from tokenizer.ggml.model: byte-level BPE ("gpt2") or SentencePiece
// BPE ("llama").
enum class tokenizer_model : std::uint8_t { bpe, spm };
// The byte-level BPE's pre-tokenizer, from tokenizer.ggml.pre.
enum class pre_tokenizer : std::uint8_t { smollm, llama3, qwen2 };

namespace detail {

// The GPT-2 byte <-> symbol map: printable Latin-1 bytes stand for themselves, the
// other 68 bytes take code points 256, 257, ... in byte order.
inline std::array<std::uint32_t, 256> byte_to_code_point() {
  std::array<std::uint32_t, 256> m{};
  std::uint32_t next = 256;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    m[b] = printable ? b : next++;
  }
  return m;
}

struct pcre2_code_deleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct pcre2_match_data_deleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using pcre2_code_ptr = std::unique_ptr<pcre2_code, pcre2_code_deleter>;
using pcre2_match_data_ptr = std::unique_ptr<pcre2_match_data, pcre2_match_data_deleter>;

inline pcre2_code_ptr compile_regex(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
  if (!c) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(err, msg.data(), msg.size());
    throw error("tokenizer: PCRE2 rejected the pre-tokenizer pattern at offset " + std::to_string(err_off) + ": " +
                reinterpret_cast<const char*>(msg.data()) + " (is libpcre2-8 built with Unicode support?)");
  }
  // JIT is an optimisation only; without it (unsupported CPU, or no executable memory)
  // pcre2_match falls back to the interpreter with the same results.
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
  return pcre2_code_ptr(c);
}

// The patterns below write {L} and {N} inside a class for what Hugging Face counts as a
// letter and as a number; expand_classes spells them out for PCRE2. HF's regex engine
// and Rust follow a newer Unicode than PCRE2 10.42 (14.0): they know the letters and
// digits added in Unicode 15.0-17.0 (CJK Extension H, Kawi, Kaktovik numerals, Garay,
// Sunuwar, Tulu-Tigalari, ...), which PCRE2 has unassigned. The extra ranges are exactly
// the code points of planes 0-3 and 14 that Unicode 14 leaves unassigned and HF's Split
// takes as a letter (next to "a", one pre-token) or as a number; for the code points
// Unicode 14 assigns, HF and PCRE2 agree on every one. Without them a pre-token boundary
// next to such a letter differed (check_tokenizer_families.py --seed 1450893593 found
// a Qwen2 text; a scan of lone code points cannot see it, a lone character encodes the
// same either way). A newer PCRE2 already knows these characters, and the union stays
// correct.
inline constexpr std::string_view newer_letters =
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65})"
    R"(\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B}\x{1138E})"
    R"(\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02}\x{11F04}-\x{11F10})"
    R"(\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446}\x{13460}-\x{143FA}\x{16100}-\x{1611D})"
    R"(\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A}\x{1E030}-\x{1E06D})"
    R"(\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739}\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
inline constexpr std::string_view newer_numbers =
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11DE0}-\x{11DE9}\x{11F50}-\x{11F59})"
    R"(\x{16130}-\x{16139}\x{16D70}-\x{16D79}\x{16FF4}-\x{16FF6}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3})"
    R"(\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";

// `pattern` with each {L} and {N} replaced by the class contents above.
inline std::string expand_classes(std::string_view pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const std::string_view rest = pattern.substr(i);
    if (rest.starts_with("{L}")) {
      out += R"(\p{L})";
      out += newer_letters;
      i += 2;
    } else if (rest.starts_with("{N}")) {
      out += R"(\p{N})";
      out += newer_numbers;
      i += 2;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// GPT-2's pattern, in PCRE2 terms. Oniguruma's \s is the Unicode White_Space property;
// PCRE2's \s (with UCP) also has U+180E, so the pattern names \p{White_Space} instead.
// Possessive repeats where nothing follows in the alternative give the same matches as
// greedy ones but keep PCRE2's JIT stack flat on long runs (a 300k-character run of
// punctuation otherwise exceeds it).
inline constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?[{L}]++| ?[{N}]++| ?[^\p{White_Space}{L}{N}]++)"
    R"(|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";
// Digits(individual_digits) uses Rust's char::is_numeric: {N} as above.
inline constexpr std::string_view numeric_pattern = "[{N}]";

// SentencePiece's stand-in for a space, U+2581 LOWER ONE EIGHTH BLOCK.
inline constexpr std::string_view spm_space = "\xE2\x96\x81";

// Llama 3's pattern (tokenizer.ggml.pre = "llama-bpe"), HF's Split on the whole text with
// every match and every gap a pre-token; \s spelt \p{White_Space} as above. Letters
// may take one leading non-letter, non-digit, non-newline character; digits go in groups
// of up to three; punctuation keeps its trailing newlines. The contractions are
// case-insensitive here, unlike GPT-2's.
inline constexpr std::string_view llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n{L}{N}]?+[{L}]++|[{N}]{1,3}+)"
    R"(| ?[^\p{White_Space}{L}{N}]++[\r\n]*+|\p{White_Space}*[\r\n]++)"
    R"(|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";
// Qwen2's: Llama 3's with every digit a pre-token of its own.
inline constexpr std::string_view qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n{L}{N}]?+[{L}]++|[{N}])"
    R"(| ?[^\p{White_Space}{L}{N}]++[\r\n]*+|\p{White_Space}*[\r\n]++)"
    R"(|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

// Open-addressing map from a pair of token ids to (rank, merged id).
class merge_table {
 public:
  struct entry {
    std::uint64_t key = empty_key;
    std::int32_t rank = 0, id = 0;
  };
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};

  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, entry{});
    mask_ = cap - 1;
  }
  static std::uint64_t key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }
  // Keeps the first (lowest) rank if a pair repeats.
  void insert(std::int32_t a, std::int32_t b, std::int32_t rank, std::int32_t id) {
    const std::uint64_t k = key(a, b);
    for (std::size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return;
      if (slots_[i].key == empty_key) {
        slots_[i] = {k, rank, id};
        return;
      }
    }
  }
  const entry* find(std::int32_t a, std::int32_t b) const {
    const std::uint64_t k = key(a, b);
    for (std::size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i];
      if (slots_[i].key == empty_key) return nullptr;
    }
  }

 private:
  static std::size_t hash(std::uint64_t k) {
    k ^= k >> 29;
    k *= 0xbf58476d1ce4e5b9ULL;
    k ^= k >> 32;
    return static_cast<std::size_t>(k);
  }
  std::vector<entry> slots_;
  std::size_t mask_ = 0;
};

// Pre-token bytes -> ids, an open-addressing table over two arenas. Bounded: once full
// it stops growing (like HF's cache), so memory stays bounded on adversarial input
// (at most max_entries keys of max_key_bytes). Shared by copies of a tokenizer and
// guarded by a mutex; the lock is held only for a probe or an insert.
class bpe_cache {
 public:
  static constexpr std::size_t max_entries = 1 << 16;
  static constexpr std::size_t max_key_bytes = 64;

  bpe_cache() : slots_(2 * max_entries) {}

  bool find(std::string_view key, std::vector<std::int32_t>& out) {
    const std::uint64_t h = hash(key);
    std::lock_guard lock(mu_);
    for (std::size_t i = h & mask; slots_[i].hash != 0; i = (i + 1) & mask) {
      const slot& sl = slots_[i];
      if (sl.hash == h && sl.key_len == key.size() &&
          std::string_view(keys_).substr(sl.key_off, sl.key_len) == key) {
        out.insert(out.end(), ids_.begin() + sl.ids_off, ids_.begin() + sl.ids_off + sl.n_ids);
        ++hits_;
        return true;
      }
    }
    return false;
  }

  // Pieces stored, and lookups answered, so far (for tests, which check that the
  // cache is used and bounded).
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return count_;
  }
  std::size_t hits() const {
    std::lock_guard lock(mu_);
    return hits_;
  }

  void insert(std::string_view key, std::span<const std::int32_t> ids) {
    if (key.size() > max_key_bytes || ids.size() > max_key_bytes) return;
    const std::uint64_t h = hash(key);
    std::lock_guard lock(mu_);
    if (count_ >= max_entries) return;
    std::size_t i = h & mask;
    for (; slots_[i].hash != 0; i = (i + 1) & mask)
      if (slots_[i].hash == h && std::string_view(keys_).substr(slots_[i].key_off, slots_[i].key_len) == key) return;
    slots_[i] = {h, static_cast<std::uint32_t>(keys_.size()), static_cast<std::uint32_t>(ids_.size()),
                 static_cast<std::uint16_t>(key.size()), static_cast<std::uint16_t>(ids.size())};
    keys_.append(key);
    ids_.insert(ids_.end(), ids.begin(), ids.end());
    ++count_;
  }

 private:
  static constexpr std::size_t mask = 2 * max_entries - 1;
  struct slot {
    std::uint64_t hash = 0;  // 0 marks an empty slot
    std::uint32_t key_off = 0, ids_off = 0;
    std::uint16_t key_len = 0, n_ids = 0;
  };
  static std::uint64_t hash(std::string_view s) {
    std::uint64_t h = 0x9E3779B97F4A7C15ULL ^ s.size();
    std::size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      std::uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
      h ^= h >> 31;
    }
    std::uint64_t tail = 0;
    std::memcpy(&tail, s.data() + i, s.size() - i);
    h = (h ^ tail) * 0x94d049bb133111ebULL;
    h ^= h >> 29;
    return h | 1;
  }
  mutable std::mutex mu_;
  std::vector<slot> slots_;
  std::string keys_;
  std::vector<std::int32_t> ids_;
  std::size_t count_ = 0;
  std::size_t hits_ = 0;
};

struct tokenizer_state {
  tokenizer_model model = tokenizer_model::bpe;
  pre_tokenizer pre = pre_tokenizer::smollm;
  bool add_space_prefix = true;           // SentencePiece: a "\u2581" before the text
  bool spm_words = false;                 // SentencePiece: the text may be cut into words (from_spm_vocab)
  std::vector<std::string> tokens;        // raw vocabulary strings (byte symbols)
  std::unordered_map<std::string_view, std::int32_t> index;  // tokens -> id (views into tokens)
  std::array<std::int32_t, 256> byte_token{};  // SentencePiece: the <0xXX> token of each byte, -1 if none
  std::vector<std::int32_t> end_of_generation;  // sorted ids that end a generated reply
  std::vector<std::string> token_bytes;   // what each token decodes to
  std::vector<token_type> types;
  std::array<std::int32_t, 256> byte_id{};  // token of each byte's symbol, -1 if none
  merge_table merges;
  std::vector<std::pair<std::string, std::int32_t>> specials;  // matched with parse_special
  special_token_ids ids;
  pcre2_code_ptr split_re, numeric_re;
};

}  // namespace detail

// The vocabulary of a model trained on raw bytes (examples/train --config): token b
// (0..255) is byte b, spelt as its GPT-2 byte symbol, so byte-level BPE without merges
// encodes any text to exactly its bytes, as the trainer's byte_tokens does; then
// <|endoftext|> (the end-of-text token), <|im_start|>, <|im_end|> and unused tokens,
// as far as `vocab` has room. Written into from-scratch model files so that they run in
// generate and llama.cpp like any other.
struct byte_vocabulary {
  std::vector<std::string> tokens;  // [vocab]
  std::vector<std::int32_t> types;  // [vocab] token_type values
  std::int32_t eos = -1;            // <|endoftext|>, or -1 when vocab is 256
};

inline byte_vocabulary make_byte_vocabulary(std::size_t vocab) {
  if (vocab < 256) {
    throw error("byte vocabulary: " + std::to_string(vocab) + " tokens cannot hold the 256 bytes; use a config with a vocabulary of at least 256");
  }
  byte_vocabulary v;
  v.tokens.reserve(vocab);
  const auto b2cp = detail::byte_to_code_point();
  for (std::size_t b = 0; b < 256; ++b) {
    std::string s;
    utf8::append_code_point(s, b2cp[b]);
    v.tokens.push_back(std::move(s));
    v.types.push_back(static_cast<std::int32_t>(token_type::normal));
  }
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    if (v.tokens.size() == vocab) break;
    if (v.eos < 0) v.eos = static_cast<std::int32_t>(v.tokens.size());
    v.tokens.emplace_back(special);
    v.types.push_back(static_cast<std::int32_t>(token_type::control));
  }
  while (v.tokens.size() < vocab) {
    v.tokens.push_back("<|unused_" + std::to_string(v.tokens.size()) + "|>");
    v.types.push_back(static_cast<std::int32_t>(token_type::unused));
  }
  return v;
}

class tokenizer {
 public:
  // Builds a byte-level BPE tokenizer from plain vectors (the GGUF arrays). merges are
  // "left right" strings whose index is the rank; pre names the pre-tokenizer as
  // tokenizer.ggml.pre does. Throws tlm::format_error on inconsistent data and
  // tlm::model_mismatch on an unknown pre-tokenizer.
  static tokenizer from_vocab(std::vector<std::string> tokens, std::vector<std::int32_t> types,
                              std::vector<std::string> merges, special_token_ids ids, std::string_view pre = "smollm") {
    auto s = std::make_shared<detail::tokenizer_state>();
    s->model = tokenizer_model::bpe;
    s->pre = parse_pre(pre);
    init_common(*s, std::move(tokens), types, ids);
    const std::size_t n = s->tokens.size();

    // Reverse byte map, for decoding and for finding each byte's symbol token.
    const auto b2cp = detail::byte_to_code_point();
    std::unordered_map<std::uint32_t, std::uint8_t> cp2b;
    for (int b = 0; b < 256; ++b) {
      std::string sym;
      utf8::append_code_point(sym, b2cp[static_cast<std::size_t>(b)]);
      auto it = s->index.find(sym);
      s->byte_id[static_cast<std::size_t>(b)] = it == s->index.end() ? -1 : it->second;
      cp2b.emplace(b2cp[static_cast<std::size_t>(b)], static_cast<std::uint8_t>(b));
    }
    s->token_bytes.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string_view t = s->tokens[i];
      // As HF's ByteLevel decoder: a token made only of byte symbols decodes to those
      // bytes; any other token (say an added token with a raw space) decodes to itself.
      std::string bytes;
      bool all_mapped = true;
      for (std::size_t j = 0; j < t.size();) {
        auto it = cp2b.find(utf8::next_code_point(t, j));
        if (it == cp2b.end()) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(it->second));
      }
      s->token_bytes[i] = all_mapped ? std::move(bytes) : std::string(t);
    }

    s->merges.reserve(merges.size());
    std::string merged;
    for (std::size_t r = 0; r < merges.size(); ++r) {
      const std::string_view m = merges[r];
      const auto sp = m.find(' ', 1);  // a symbol is never empty, so skip position 0
      if (sp == std::string_view::npos)
        throw format_error("tokenizer: merge " + std::to_string(r) + " (\"" + std::string(m) +
                           "\") is not \"left right\"; the GGUF file is corrupt");
      const std::string_view left = m.substr(0, sp), right = m.substr(sp + 1);
      const auto l = s->index.find(left), rr = s->index.find(right);
      merged.assign(left);
      merged += right;
      const auto out = s->index.find(merged);
      if (l == s->index.end() || rr == s->index.end() || out == s->index.end())
        throw format_error("tokenizer: merge " + std::to_string(r) + " (\"" + std::string(m) +
                           "\") names a token missing from the vocabulary; the GGUF file is corrupt");
      s->merges.insert(l->second, rr->second, static_cast<std::int32_t>(r), out->second);
    }
    const std::string_view pattern = s->pre == pre_tokenizer::llama3  ? detail::llama3_pattern
                                     : s->pre == pre_tokenizer::qwen2 ? detail::qwen2_pattern
                                                                      : detail::gpt2_pattern;
    s->split_re = detail::compile_regex(detail::expand_classes(pattern));
    s->numeric_re = detail::compile_regex(detail::expand_classes(detail::numeric_pattern));
    return tokenizer(std::move(s));
  }

  // Builds a SentencePiece BPE tokenizer (tokenizer.ggml.model = "llama": Llama 2,
  // TinyLlama, Mistral, Phi-3). SentencePiece merges the adjacent pair whose
  // concatenation is the vocabulary entry of highest score; that is BPE with one merge
  // per way of cutting each token in two, ranked by the token's score (then by id, and
  // by the left part's id, the order Hugging Face's conversion gives equal scores).
  static tokenizer from_spm_vocab(std::vector<std::string> tokens, std::vector<std::int32_t> types,
                                  std::span<const float> scores, special_token_ids ids, bool add_space_prefix = true) {
    auto s = std::make_shared<detail::tokenizer_state>();
    s->model = tokenizer_model::spm;
    s->add_space_prefix = add_space_prefix;
    if (scores.size() != tokens.size())
      throw format_error("tokenizer: tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                         " entries but tokenizer.ggml.tokens has " + std::to_string(tokens.size()) +
                         "; the file is inconsistent");
    init_common(*s, std::move(tokens), types, ids);
    const std::size_t n = s->tokens.size();
    s->byte_token.fill(-1);
    s->byte_id.fill(-1);
    s->token_bytes.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string_view t = s->tokens[i];
      if (s->types[i] == token_type::byte) {
        // "<0xXX>": the token stands for that one byte.
        const auto hex_digit = [](char c) -> int {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          return -1;
        };
        const int hi = t.size() == 6 ? hex_digit(t[3]) : -1, lo = t.size() == 6 ? hex_digit(t[4]) : -1;
        if (!t.starts_with("<0x") || t.back() != '>' || hi < 0 || lo < 0)
          throw format_error("tokenizer: byte token " + std::to_string(i) + " is \"" + std::string(t) +
                             "\", not <0xXX>; the GGUF file is corrupt");
        const auto b = static_cast<std::uint8_t>(hi * 16 + lo);
        if (s->byte_token[b] < 0) s->byte_token[b] = static_cast<std::int32_t>(i);
        s->token_bytes[i] = std::string(1, static_cast<char>(b));
        continue;
      }
      // U+2581 stands for a space (HF's Replace decoder; llama.cpp does the same).
      std::string text;
      for (std::size_t j = 0; j < t.size();) {
        if (t.substr(j).starts_with(detail::spm_space)) {
          text.push_back(' ');
          j += detail::spm_space.size();
        } else {
          text.push_back(t[j++]);
        }
      }
      s->token_bytes[i] = std::move(text);
    }

    // Merging the whole text at once costs a priority queue over all of it, with a
    // random probe of the merge table per step (about 1 MB/s). When no token has
    // U+2581 after another character, no merge can join a character to a following
    // U+2581, so the text can be cut before each such U+2581 and the words merged one by
    // one, and cached, with the same result. "\u2581" itself must be a token, or unknown
    // characters on both sides of a cut could be fused into one unknown token.
    s->spm_words = s->index.contains(detail::spm_space);
    for (std::size_t i = 0; i < n && s->spm_words; ++i) {
      const std::string_view t = s->tokens[i];
      for (std::size_t j = t.find(detail::spm_space, 1); j != std::string_view::npos && s->spm_words;
           j = t.find(detail::spm_space, j + 1)) {
        const bool after_space = j >= detail::spm_space.size() &&
                                 t.compare(j - detail::spm_space.size(), detail::spm_space.size(), detail::spm_space) == 0;
        if (!after_space) s->spm_words = false;
      }
    }

    // Every cut of every token into two tokens is a merge; its rank orders by score.
    struct cut {
      float score;
      std::int32_t merged, left, right;
    };
    std::vector<cut> cuts;
    cuts.reserve(n * 4);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string_view t = s->tokens[i];
      for (std::size_t j = 0; j < t.size();) {
        utf8::next_code_point(t, j);
        if (j >= t.size()) break;
        const auto l = s->index.find(t.substr(0, j));
        if (l == s->index.end()) continue;
        const auto r = s->index.find(t.substr(j));
        if (r == s->index.end()) continue;
        cuts.push_back({scores[i], static_cast<std::int32_t>(i), l->second, r->second});
      }
    }
    std::sort(cuts.begin(), cuts.end(), [](const cut& a, const cut& b) {
      if (a.score != b.score) return a.score > b.score;
      if (a.merged != b.merged) return a.merged < b.merged;
      if (a.left != b.left) return a.left < b.left;
      return a.right < b.right;
    });
    s->merges.reserve(cuts.size());
    for (std::size_t r = 0; r < cuts.size(); ++r)
      s->merges.insert(cuts[r].left, cuts[r].right, static_cast<std::int32_t>(r), cuts[r].merged);
    return tokenizer(std::move(s));
  }

  // Reads the tokenizer section of a GGUF file: byte-level BPE ("gpt2") with the
  // "smollm", "llama-bpe" or "qwen2" pre-tokenizer, or SentencePiece ("llama").
  // Anything else is refused with a tlm::model_mismatch naming what is supported.
  static tokenizer from_gguf(const gguf::file& f) {
    const std::string model(f.get_string("tokenizer.ggml.model"));
    if (model != "gpt2" && model != "llama")
      throw model_mismatch("tokenizer: tokenizer.ggml.model is \"" + model +
                           "\"; tlm supports \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece BPE)");
    // A file without the key predates it; the files tlm writes itself name "smollm".
    std::string pre = model == "gpt2" ? "smollm" : "default";
    if (f.has("tokenizer.ggml.pre")) pre = std::string(f.get_string("tokenizer.ggml.pre"));
    if (model == "llama" && pre != "default")
      throw model_mismatch("tokenizer: tokenizer.ggml.pre is \"" + pre +
                           "\"; with tokenizer.ggml.model \"llama\" (SentencePiece) tlm supports only \"default\"");
    const pre_tokenizer pre_kind = model == "gpt2" ? parse_pre(pre) : pre_tokenizer::smollm;
    std::vector<std::string> tokens, merges;
    for (auto t : f.get_string_array("tokenizer.ggml.tokens")) tokens.emplace_back(t);
    std::vector<std::int32_t> types;
    if (f.has("tokenizer.ggml.token_type")) {
      for (auto t : f.get_int_array("tokenizer.ggml.token_type")) types.push_back(static_cast<std::int32_t>(t));
    } else {
      types.assign(tokens.size(), static_cast<std::int32_t>(token_type::normal));
    }
    special_token_ids ids;
    const auto opt_id = [&](const char* key) -> std::int32_t {
      if (!f.has(key)) return -1;
      const auto v = f.get_uint(key);
      if (v >= tokens.size())
        throw format_error(std::string("tokenizer: ") + key + " = " + std::to_string(v) +
                           " is outside the vocabulary of " + std::to_string(tokens.size()) + " tokens");
      return static_cast<std::int32_t>(v);
    };
    const auto opt_bool = [&](const char* key, bool fallback) { return f.has(key) ? f.get_bool(key) : fallback; };
    ids.bos = opt_id("tokenizer.ggml.bos_token_id");
    ids.eos = opt_id("tokenizer.ggml.eos_token_id");
    ids.unknown = opt_id("tokenizer.ggml.unknown_token_id");
    ids.padding = opt_id("tokenizer.ggml.padding_token_id");
    ids.eot = opt_id("tokenizer.ggml.eot_token_id");
    ids.eom = opt_id("tokenizer.ggml.eom_token_id");
    // Without the key, llama.cpp adds BOS for SentencePiece and Llama 3 and not for the
    // others; tlm follows it so that a prompt means the same to both.
    ids.add_bos = opt_bool("tokenizer.ggml.add_bos_token", model == "llama" || pre_kind == pre_tokenizer::llama3);
    ids.add_eos = opt_bool("tokenizer.ggml.add_eos_token", false);
    if (model == "llama") {
      std::vector<float> scores;
      for (const double v : f.get_float_array("tokenizer.ggml.scores")) scores.push_back(static_cast<float>(v));
      return from_spm_vocab(std::move(tokens), std::move(types), scores, ids,
                            opt_bool("tokenizer.ggml.add_space_prefix", true));
    }
    for (auto m : f.get_string_array("tokenizer.ggml.merges")) merges.emplace_back(m);
    return from_vocab(std::move(tokens), std::move(types), std::move(merges), ids, pre);
  }

  std::vector<std::int32_t> encode(std::string_view text, encode_options opt = {}) const {
    return encode_impl(text, opt, true);
  }

  // The same as encode, but every split decision is taken by PCRE2 (encode decides
  // runs of ASCII itself, which is faster). For tests and the fuzzer, which check that
  // the two agree.
  std::vector<std::int32_t> encode_without_fast_path(std::string_view text, encode_options opt = {}) const {
    return encode_impl(text, opt, false);
  }

  // The text of ids, special tokens included (as HF's decode with
  // skip_special_tokens=False). Throws tlm::error on an id outside the vocabulary.
  // SentencePiece: the one space that add_space_prefix put before the text is removed
  // again (HF's Strip decoder, llama.cpp likewise), so decode(encode(t)) == t.
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string bytes;
    for (const std::int32_t id : ids) bytes += token_bytes(id);
    if (s_->model == tokenizer_model::spm && s_->add_space_prefix && !bytes.empty() && bytes[0] == ' ')
      bytes.erase(0, 1);
    return utf8::to_valid(bytes);
  }

  // The raw vocabulary string (byte symbols, e.g. "Ġworld").
  std::string_view piece(std::int32_t id) const {
    check_id(id);
    return s_->tokens[static_cast<std::size_t>(id)];
  }
  // The bytes the token stands for (may be an incomplete UTF-8 sequence).
  std::string_view token_bytes(std::int32_t id) const {
    check_id(id);
    return s_->token_bytes[static_cast<std::size_t>(id)];
  }
  token_type type(std::int32_t id) const {
    check_id(id);
    return s_->types[static_cast<std::size_t>(id)];
  }
  // Control and user-defined tokens: matched only with parse_special.
  bool is_special(std::int32_t id) const {
    const token_type t = type(id);
    return t == token_type::control || t == token_type::user_defined;
  }
  // False for the bytes HF drops when encoding (their byte symbol has no token).
  bool byte_has_token(std::uint8_t b) const { return s_->byte_id[b] >= 0; }
  std::int32_t bos() const { return s_->ids.bos; }
  std::int32_t eos() const { return s_->ids.eos; }
  // Whether encode adds BOS / EOS when encode_options leaves it unset: the file's
  // tokenizer.ggml.add_bos_token / add_eos_token, or llama.cpp's default without them.
  bool add_bos_default() const { return s_->ids.add_bos; }
  bool add_eos_default() const { return s_->ids.add_eos; }
  // The ids that end a generated reply (see init_common for which and why), sorted.
  std::span<const std::int32_t> end_of_generation() const { return s_->end_of_generation; }
  bool is_end_of_generation(std::int32_t id) const {
    return std::binary_search(s_->end_of_generation.begin(), s_->end_of_generation.end(), id);
  }
  tokenizer_model model() const { return s_->model; }
  pre_tokenizer pre() const { return s_->pre; }
  std::size_t vocab_size() const { return s_->tokens.size(); }
  // Distinct pre-tokens whose BPE result is cached (shared by copies); for tests.
  std::size_t cached_pieces() const { return cache_->size(); }
  std::size_t cache_hits() const { return cache_->hits(); }

 private:
  explicit tokenizer(std::shared_ptr<detail::tokenizer_state> s)
      : s_(std::move(s)), cache_(std::make_shared<detail::bpe_cache>()) {}

  static pre_tokenizer parse_pre(std::string_view pre) {
    if (pre == "smollm") return pre_tokenizer::smollm;
    if (pre == "llama-bpe") return pre_tokenizer::llama3;
    if (pre == "qwen2") return pre_tokenizer::qwen2;
    throw model_mismatch("tokenizer: tokenizer.ggml.pre is \"" + std::string(pre) +
                         "\"; with tokenizer.ggml.model \"gpt2\" tlm supports \"smollm\", \"llama-bpe\" and \"qwen2\"");
  }

  // What both algorithms share: the checks, the vocabulary and its index, the types,
  // the special tokens and the end-of-generation set.
  static void init_common(detail::tokenizer_state& s, std::vector<std::string> tokens,
                          const std::vector<std::int32_t>& types, const special_token_ids& ids) {
    const std::size_t n = tokens.size();
    if (n == 0 || n > 0x7FFFFFFF)
      throw format_error("tokenizer: the vocabulary has " + std::to_string(n) +
                         " tokens; expected 1 .. 2^31-1 (check tokenizer.ggml.tokens)");
    if (types.size() != n)
      throw format_error("tokenizer: tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                         " entries but tokenizer.ggml.tokens has " + std::to_string(n) + "; the file is inconsistent");
    for (const auto& [name, id] : {std::pair{"bos", ids.bos}, {"eos", ids.eos}, {"unknown", ids.unknown},
                                  {"padding", ids.padding}, {"eot", ids.eot}, {"eom", ids.eom}})
      if (id < -1 || id >= static_cast<std::int64_t>(n))
        throw format_error(std::string("tokenizer: the ") + name + " token id " + std::to_string(id) +
                           " is outside the vocabulary of " + std::to_string(n) + " tokens");
    s.ids = ids;
    s.tokens = std::move(tokens);
    s.index.reserve(n);
    s.types.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string_view t = s.tokens[i];
      if (utf8::first_invalid(t) != std::string_view::npos)
        throw format_error("tokenizer: token " + std::to_string(i) + " is not valid UTF-8; the GGUF file is corrupt");
      s.index.emplace(t, static_cast<std::int32_t>(i));  // the first of duplicates wins
      s.types[i] = static_cast<token_type>(types[i]);
      // Control, user-defined and unknown tokens are the ones matched in the text with
      // parse_special (llama.cpp's set; HF's added tokens are the same ones).
      if (s.types[i] == token_type::control || s.types[i] == token_type::user_defined ||
          s.types[i] == token_type::unknown) {
        if (t.empty())
          throw format_error("tokenizer: special token " + std::to_string(i) + " is empty; the GGUF file is corrupt");
        s.specials.emplace_back(std::string(t), static_cast<std::int32_t>(i));
      }
    }
    // End of generation. The file's ids: eos ends a sequence; eot ends a turn (Llama 3
    // Instruct's <|eot_id|>); eom ends a message that awaits a tool's answer (Llama 3.1).
    // Older files name only eos, though their chat models end a reply with another
    // token, so these control tokens count too: <|eot_id|> and <|eom_id|> (Llama 3),
    // <|im_end|> (ChatML: Qwen2, SmolLM2), <|end|> (Phi-3), </s> (Llama 2, Mistral,
    // TinyLlama, Zephyr) and <|endoftext|> (Qwen2 base, Phi-3, SmolLM2). Only control
    // tokens: as plain text these strings are not an end.
    auto& eog = s.end_of_generation;
    for (const std::int32_t id : {ids.eos, ids.eot, ids.eom})
      if (id >= 0) eog.push_back(id);
    for (const char* text : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "</s>", "<|endoftext|>"}) {
      const auto it = s.index.find(text);
      if (it != s.index.end() && s.types[static_cast<std::size_t>(it->second)] == token_type::control)
        eog.push_back(it->second);
    }
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  }

  static std::string hex(std::uint8_t b) {
    constexpr char digits[] = "0123456789ABCDEF";
    return {digits[b >> 4], digits[b & 15]};
  }

  void check_id(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= s_->tokens.size())
      throw error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(s_->tokens.size()) + " tokens (valid ids are 0.." +
                  std::to_string(s_->tokens.size() - 1) + ")");
  }

  std::vector<std::int32_t> encode_impl(std::string_view text, encode_options opt, bool fast) const {
    if (const auto bad = utf8::first_invalid(text); bad != std::string_view::npos)
      throw text_error("tokenizer: the text is not valid UTF-8 at byte offset " + std::to_string(bad) + " (byte 0x" +
                       hex(static_cast<std::uint8_t>(text[bad])) +
                       "); convert it to UTF-8, or replace invalid bytes with tlm::utf8::to_valid");
    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 2);
    // Asked for explicitly, a missing BOS/EOS is an error; by the file's flag, it is skipped.
    if (opt.add_bos.value_or(s_->ids.add_bos)) {
      if (s_->ids.bos >= 0)
        out.push_back(s_->ids.bos);
      else if (opt.add_bos)
        throw error("tokenizer: add_bos was requested but the vocabulary has no BOS token");
    }
    scratch sc(*s_);
    sc.fast = fast;
    encode_text(text, opt.parse_special, out, sc);
    if (opt.add_eos.value_or(s_->ids.add_eos)) {
      if (s_->ids.eos >= 0)
        out.push_back(s_->ids.eos);
      else if (opt.add_eos)
        throw error("tokenizer: add_eos was requested but the vocabulary has no EOS token");
    }
    return out;
  }

  // Per-call buffers, so encode is const and thread-safe without locking the hot loop.
  struct scratch {
    explicit scratch(const detail::tokenizer_state& st)
        : split_md(st.split_re ? pcre2_match_data_create_from_pattern(st.split_re.get(), nullptr) : nullptr),
          numeric_md(st.numeric_re ? pcre2_match_data_create_from_pattern(st.numeric_re.get(), nullptr) : nullptr) {
      // SentencePiece has no patterns, so no match data either.
      if ((st.split_re && !split_md) || (st.numeric_re && !numeric_md)) throw std::bad_alloc();
    }
    detail::pcre2_match_data_ptr split_md, numeric_md;
    std::vector<std::int32_t> sym;             // symbol ids
    std::vector<std::int32_t> prev, next;      // linked list over symbol positions
    struct cand {
      std::int32_t rank, left, right_id, left_id;
    };
    std::vector<cand> heap;
    std::vector<std::int32_t> merged;  // SentencePiece: symbols after merging
    std::string normalized;            // SentencePiece: the text with U+2581 for spaces
    std::string piece;                 // llama-bpe: a pre-token as byte symbols
    bool fast = true;
  };

  void encode_text(std::string_view text, bool parse_special, std::vector<std::int32_t>& out, scratch& sc) const {
    if (!parse_special || s_->specials.empty()) {
      encode_plain(text, out, sc);
      return;
    }
    // Leftmost match, longest on ties (HF's added-vocabulary matcher).
    std::vector<std::size_t> next(s_->specials.size());
    const auto find_from = [&](std::size_t k, std::size_t pos) { next[k] = text.find(s_->specials[k].first, pos); };
    for (std::size_t k = 0; k < next.size(); ++k) find_from(k, 0);
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t best = std::string_view::npos, best_k = 0;
      for (std::size_t k = 0; k < next.size(); ++k) {
        if (next[k] != std::string_view::npos && next[k] < pos) find_from(k, pos);
        if (next[k] == std::string_view::npos) continue;
        if (best == std::string_view::npos || next[k] < best ||
            (next[k] == best && s_->specials[k].first.size() > s_->specials[best_k].first.size())) {
          best = next[k];
          best_k = k;
        }
      }
      if (best == std::string_view::npos) {
        encode_plain(text.substr(pos), out, sc);
        break;
      }
      encode_plain(text.substr(pos, best - pos), out, sc);
      out.push_back(s_->specials[best_k].second);
      pos = best + s_->specials[best_k].first.size();
    }
  }

  // Text without special tokens. smollm: digits split, then the GPT-2 pattern on each
  // stretch; llama-bpe, qwen2: their pattern; SentencePiece: no pre-tokenizer.
  void encode_plain(std::string_view text, std::vector<std::int32_t>& out, scratch& sc) const {
    if (s_->model == tokenizer_model::spm) {
      spm(text, out, sc);
      return;
    }
    if (s_->pre != pre_tokenizer::smollm) {
      split(text, out, sc);
      return;
    }
    std::size_t pos = 0;
    while (pos < text.size()) {
      const auto [digit, digit_end] = next_numeric(text, pos, sc);
      split(text.substr(pos, digit - pos), out, sc);
      if (digit < text.size()) bpe(text.substr(digit, digit_end - digit), out, sc);
      pos = digit_end;
    }
  }

  // The next numeric character at or after pos: [begin, end), or [size, size).
  std::pair<std::size_t, std::size_t> next_numeric(std::string_view text, std::size_t pos, scratch& sc) const {
    if (sc.fast) {
      // ASCII decides itself; PCRE2 takes over from the first non-ASCII byte.
      for (; pos < text.size(); ++pos) {
        const auto b = static_cast<std::uint8_t>(text[pos]);
        if (b >= 0x80) break;
        if (b >= '0' && b <= '9') return {pos, pos + 1};
      }
      if (pos == text.size()) return {pos, pos};
    }
    const int rc = pcre2_match(s_->numeric_re.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                               PCRE2_NO_UTF_CHECK, sc.numeric_md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return {text.size(), text.size()};
    if (rc < 0) throw_match_error(rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.numeric_md.get());
    return {ov[0], ov[1]};
  }

  // The character classes of the GPT-2 pattern, for ASCII only. Digits never reach
  // split (they were cut out before), and \s in ASCII is exactly \t \n \v \f \r and space
  // in both Oniguruma and PCRE2.
  enum class ascii_class : std::uint8_t { letter, space, other };
  static ascii_class classify(std::uint8_t b) {
    if ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') return ascii_class::letter;
    if (b == ' ' || (b >= '\t' && b <= '\r')) return ascii_class::space;
    return ascii_class::other;
  }

  // The length of the GPT-2 pattern's match at pos when ASCII alone decides it, or 0
  // when a non-ASCII byte could change the answer (then PCRE2 decides).
  static std::size_t ascii_match(std::string_view t, std::size_t pos) {
    const std::size_t n = t.size();
    const auto at = [&](std::size_t i) { return static_cast<std::uint8_t>(t[i]); };
    const auto run = [&](std::size_t i, ascii_class c) {  // end of the run of class c from i, or 0 if non-ASCII ends it
      while (i < n && at(i) < 0x80 && classify(at(i)) == c) ++i;
      return i < n && at(i) >= 0x80 ? std::size_t{0} : i;
    };
    const std::uint8_t b = at(pos);
    if (b >= 0x80) return 0;
    if (b == '\'' && pos + 1 < n) {  // 's 't 're 've 'm 'll 'd (case-sensitive)
      const std::uint8_t c = at(pos + 1);
      if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
      if (pos + 2 < n) {
        const std::uint8_t d = at(pos + 2);
        if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return 3;
      }
    }
    std::size_t start = pos;
    if (b == ' ' && pos + 1 < n) {  // " ?" before a letter or "other" run
      const std::uint8_t c = at(pos + 1);
      if (c >= 0x80) return 0;
      if (classify(c) != ascii_class::space) start = pos + 1;
    }
    const ascii_class cls = classify(at(start));
    const std::size_t end = run(start, cls);
    if (end == 0) return 0;
    if (cls != ascii_class::space) return end - pos;
    // Whitespace: \s+(?!\S) takes the run up to its end of text, else all but its last
    // character (which then starts the next piece); a single character is \s+.
    if (end == n || end - pos == 1) return end - pos;
    return end - pos - 1;
  }

  // The GPT-2 pattern; the stretch is the whole subject, so (?!\S) sees its end as the
  // end of text, as HF does after the Digits split.
  void split(std::string_view text, std::vector<std::int32_t>& out, scratch& sc) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t pos = 0;
    while (pos < text.size()) {
      if (sc.fast && s_->pre == pre_tokenizer::smollm) {  // the ASCII decisions are GPT-2's pattern's
        if (const std::size_t len = ascii_match(text, pos)) {
          bpe(text.substr(pos, len), out, sc);
          pos += len;
          continue;
        }
      }
      const int rc = pcre2_match(s_->split_re.get(), subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                                 sc.split_md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) {  // cannot happen (the classes cover everything); keep text anyway
        bpe(text.substr(pos), out, sc);
        return;
      }
      if (rc < 0) throw_match_error(rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.split_md.get());
      if (ov[0] > pos) bpe(text.substr(pos, ov[0] - pos), out, sc);  // a gap is a piece of its own
      std::size_t end = ov[1];
      if (end <= ov[0]) {  // an empty match would loop forever; consume one character
        end = ov[0];
        utf8::next_code_point(text, end);
      }
      bpe(text.substr(ov[0], end - ov[0]), out, sc);
      pos = end;
    }
  }

  [[noreturn]] static void throw_match_error(int rc) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(rc, msg.data(), msg.size());
    throw error(std::string("tokenizer: PCRE2 matching failed: ") + reinterpret_cast<const char*>(msg.data()) +
                " (try splitting the text into smaller pieces)");
  }

  void bpe(std::string_view piece, std::vector<std::int32_t>& out, scratch& sc) const {
    const bool cacheable = piece.size() <= detail::bpe_cache::max_key_bytes;
    if (cacheable && cache_->find(piece, out)) return;
    const std::size_t first = out.size();
    bpe_uncached(piece, out, sc);
    if (cacheable) cache_->insert(piece, std::span<const std::int32_t>(out).subspan(first));
  }

  void bpe_uncached(std::string_view piece, std::vector<std::int32_t>& out, scratch& sc) const {
    if (s_->pre == pre_tokenizer::llama3) {
      // Llama 3's ignore_merges: a pre-token that is itself a vocabulary entry is
      // emitted whole, even where the merges would have split it differently.
      auto& symbols = sc.piece;
      symbols.clear();
      for (const char c : piece) utf8::append_code_point(symbols, byte_symbol(static_cast<std::uint8_t>(c)));
      if (const auto it = s_->index.find(symbols); it != s_->index.end()) {
        out.push_back(it->second);
        return;
      }
    }
    auto& sym = sc.sym;
    sym.clear();
    for (const char c : piece) {
      const std::int32_t id = s_->byte_id[static_cast<std::uint8_t>(c)];
      if (id >= 0) sym.push_back(id);  // bytes without a token are dropped (see top)
    }
    merge_symbols(out, sc);
  }

  static std::uint32_t byte_symbol(std::uint8_t b) {
    static const auto map = detail::byte_to_code_point();
    return map[b];
  }

  // SentencePiece on text without special tokens: the whole text is one piece.
  void spm(std::string_view text, std::vector<std::int32_t>& out, scratch& sc) const {
    if (text.empty()) return;  // HF's Prepend normalizer leaves empty text empty
    auto& norm = sc.normalized;
    norm.clear();
    if (s_->add_space_prefix) norm += detail::spm_space;
    for (const char c : text) {
      if (c == ' ')
        norm += detail::spm_space;
      else
        norm.push_back(c);
    }
    if (!s_->spm_words) {
      spm_piece(norm, out, sc);
      return;
    }
    // Cut before each U+2581 that follows another character: no merge can cross such a
    // cut (see spm_words), so the words merge alone, are short, and are cached.
    const std::string_view all = norm;
    std::size_t start = 0;
    for (std::size_t p = 1; p + detail::spm_space.size() <= all.size(); ++p) {
      if (all.compare(p, detail::spm_space.size(), detail::spm_space) != 0) continue;
      if (p >= detail::spm_space.size() &&
          all.compare(p - detail::spm_space.size(), detail::spm_space.size(), detail::spm_space) == 0)
        continue;
      spm_piece(all.substr(start, p - start), out, sc);
      start = p;
    }
    spm_piece(all.substr(start), out, sc);
  }

  // SentencePiece BPE on one stretch of normalized text, with byte fallback.
  void spm_piece(std::string_view norm, std::vector<std::int32_t>& out, scratch& sc) const {
    const bool cacheable = norm.size() <= detail::bpe_cache::max_key_bytes;
    if (cacheable && cache_->find(norm, out)) return;
    const std::size_t first = out.size();
    // Symbols are characters: a character's token, or for one without a token, -2 minus
    // its byte offset, which merges with nothing and falls back to bytes at the end.
    auto& sym = sc.sym;
    sym.clear();
    for (std::size_t i = 0; i < norm.size();) {
      const std::size_t start = i;
      utf8::next_code_point(norm, i);
      const auto it = s_->index.find(std::string_view(norm).substr(start, i - start));
      sym.push_back(it != s_->index.end() ? it->second : -2 - static_cast<std::int32_t>(start));
    }
    sc.merged.clear();
    merge_symbols(sc.merged, sc);
    bool last_unknown = false;
    for (const std::int32_t id : sc.merged) {
      if (id >= 0) {
        out.push_back(id);
        last_unknown = false;
        continue;
      }
      // Byte fallback (HF's byte_fallback, llama.cpp likewise): the character's bytes as
      // <0xXX> tokens when all of them exist, else the unknown token, consecutive
      // unknowns fused into one (HF's fuse_unk, as the Llama 2 tokenizer sets it).
      std::size_t at = static_cast<std::size_t>(-2 - id), end = at;
      utf8::next_code_point(norm, end);
      bool all = true;
      for (std::size_t k = at; k < end; ++k) all = all && s_->byte_token[static_cast<std::uint8_t>(norm[k])] >= 0;
      if (all) {
        for (; at < end; ++at) out.push_back(s_->byte_token[static_cast<std::uint8_t>(norm[at])]);
        last_unknown = false;
      } else if (s_->ids.unknown >= 0 && !last_unknown) {
        out.push_back(s_->ids.unknown);
        last_unknown = true;
      }
    }
    if (cacheable) cache_->insert(norm, std::span<const std::int32_t>(out).subspan(first));
  }

  // Merges sc.sym (lowest rank first, leftmost on ties) and appends the result to out.
  void merge_symbols(std::vector<std::int32_t>& out, scratch& sc) const {
    auto& sym = sc.sym;
    const auto n = static_cast<std::int32_t>(sym.size());
    if (n <= 1) {
      out.insert(out.end(), sym.begin(), sym.end());
      return;
    }
    if (n <= 16) {
      // Few symbols: rescanning all pairs is cheaper than a heap.
      std::int32_t len = n;
      for (;;) {
        std::int32_t best_rank = INT32_MAX, best = -1, best_id = 0;
        for (std::int32_t i = 0; i + 1 < len; ++i) {
          const auto* e = s_->merges.find(sym[static_cast<std::size_t>(i)], sym[static_cast<std::size_t>(i) + 1]);
          if (e && e->rank < best_rank) {
            best_rank = e->rank;
            best = i;
            best_id = e->id;
          }
        }
        if (best < 0) break;
        sym[static_cast<std::size_t>(best)] = best_id;
        sym.erase(sym.begin() + best + 1);
        --len;
      }
      out.insert(out.end(), sym.begin(), sym.end());
      return;
    }
    // Long pieces: linked list plus a min-heap of candidate pairs ordered by
    // (rank, position); stale candidates are skipped when popped.
    auto& prev = sc.prev;
    auto& next = sc.next;
    prev.resize(static_cast<std::size_t>(n));
    next.resize(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) {
      prev[static_cast<std::size_t>(i)] = i - 1;
      next[static_cast<std::size_t>(i)] = i + 1 < n ? i + 1 : -1;
    }
    auto& heap = sc.heap;
    heap.clear();
    const auto worse = [](const scratch::cand& a, const scratch::cand& b) {
      return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    };
    const auto push_pair = [&](std::int32_t left) {
      const std::int32_t right = next[static_cast<std::size_t>(left)];
      if (left < 0 || right < 0) return;
      const std::int32_t a = sym[static_cast<std::size_t>(left)], b = sym[static_cast<std::size_t>(right)];
      if (const auto* e = s_->merges.find(a, b)) {
        heap.push_back({e->rank, left, b, a});
        std::push_heap(heap.begin(), heap.end(), worse);
      }
    };
    for (std::int32_t i = 0; i + 1 < n; ++i) push_pair(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      const scratch::cand c = heap.back();
      heap.pop_back();
      const auto li = static_cast<std::size_t>(c.left);
      const std::int32_t right = next[li];
      // Stale if the left symbol was merged away or changed, or its right neighbour changed.
      if (sym[li] != c.left_id || right < 0 || sym[static_cast<std::size_t>(right)] != c.right_id) continue;
      const auto* e = s_->merges.find(c.left_id, c.right_id);
      sym[li] = e->id;
      sym[static_cast<std::size_t>(right)] = -1;
      const std::int32_t after = next[static_cast<std::size_t>(right)];
      next[li] = after;
      if (after >= 0) prev[static_cast<std::size_t>(after)] = c.left;
      if (prev[li] >= 0) push_pair(prev[li]);
      push_pair(c.left);
    }
    for (std::int32_t i = 0; i >= 0; i = next[static_cast<std::size_t>(i)]) out.push_back(sym[static_cast<std::size_t>(i)]);
  }

  std::shared_ptr<const detail::tokenizer_state> s_;
  std::shared_ptr<detail::bpe_cache> cache_;  // shared by copies; internally locked
};

// Turns generated ids into text piece by piece without ever cutting a UTF-8 character:
// push returns only whole characters, and a character split across tokens comes out
// once its last byte arrives. Bytes that can never form a character come out as U+FFFD
// exactly where tokenizer::decode would put them, so the concatenation of all push
// results and flush equals decode of the whole sequence.
class stream_decoder {
 public:
  explicit stream_decoder(const tokenizer& tok) : tok_(&tok) {}

  std::string push(std::int32_t id) {
    pending_ += tok_->token_bytes(id);
    std::string out;
    const std::size_t keep = utf8::append_lossy(out, pending_, true);
    pending_.erase(0, pending_.size() - keep);
    return out;
  }

  std::string flush() {
    std::string out = utf8::to_valid(pending_);
    pending_.clear();
    return out;
  }

 private:
  const tokenizer* tok_;
  std::string pending_;
};

}  // namespace tlm
