#pragma once
// UTF-8 helpers for the tokenizer: strict validation of input text, and the lossy
// conversion used when token bytes are turned back into text.
//
// The lossy rule is the one Unicode recommends ("maximal subparts", Unicode 15
// section 3.9, table 3-7), which is also what Rust's String::from_utf8_lossy and
// therefore Hugging Face's ByteLevel decoder do: each maximal prefix of a valid
// sequence that cannot be completed becomes one U+FFFD, and every byte that cannot
// start a sequence becomes one U+FFFD.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tlm::utf8 {

inline constexpr std::string_view replacement = "\xEF\xBF\xBD";  // U+FFFD

// The allowed range of the second byte after a lead byte; later bytes are 0x80..0xBF.
struct lead_info {
  int length = 0;  // 0 when the byte cannot start a sequence
  std::uint8_t lo = 0x80, hi = 0xBF;
};

inline constexpr lead_info classify_lead(std::uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {};  // continuation bytes and the overlong leads C0, C1
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};  // excludes overlongs
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes surrogates
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};  // excludes overlongs
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // excludes code points above U+10FFFF
  return {};
}

// What is at position i: a whole character (status::complete, n bytes), a prefix
// of a valid sequence that the data ends in the middle of (status::truncated, n bytes),
// or an invalid maximal subpart (status::invalid, n >= 1 bytes to replace by one U+FFFD).
enum class status { complete, truncated, invalid };
struct scan_result {
  status st;
  std::size_t n;
};

inline scan_result scan(std::string_view s, std::size_t i) {
  const auto b = static_cast<std::uint8_t>(s[i]);
  const lead_info li = classify_lead(b);
  if (li.length == 0) return {status::invalid, 1};
  if (li.length == 1) return {status::complete, 1};
  std::size_t k = 1;
  for (; k < static_cast<std::size_t>(li.length); ++k) {
    if (i + k >= s.size()) return {status::truncated, k};
    const auto c = static_cast<std::uint8_t>(s[i + k]);
    const std::uint8_t lo = k == 1 ? li.lo : 0x80, hi = k == 1 ? li.hi : 0xBF;
    if (c < lo || c > hi) return {status::invalid, k};
  }
  return {status::complete, k};
}

// The byte offset of the first invalid or truncated sequence, or npos if s is valid.
inline std::size_t first_invalid(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path: most text is mostly ASCII.
    if (static_cast<std::uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const scan_result r = scan(s, i);
    if (r.st != status::complete) return i;
    i += r.n;
  }
  return std::string_view::npos;
}

// Appends the valid UTF-8 form of s to out. If keep_tail, a truncated (but so far
// valid) sequence at the very end is not converted; its length is returned so the
// caller can keep it for later. Otherwise it becomes one U+FFFD and 0 is returned.
inline std::size_t append_lossy(std::string& out, std::string_view s, bool keep_tail) {
  std::size_t i = 0;
  while (i < s.size()) {
    if (static_cast<std::uint8_t>(s[i]) < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    const scan_result r = scan(s, i);
    switch (r.st) {
      case status::complete: out.append(s.substr(i, r.n)); break;
      case status::invalid: out.append(replacement); break;
      case status::truncated:
        if (keep_tail) return s.size() - i;
        out.append(replacement);
        break;
    }
    i += r.n;
  }
  return 0;
}

inline std::string to_valid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_lossy(out, s, false);
  return out;
}

// Encodes one code point (the caller guarantees cp <= 0x10FFFF and not a surrogate).
inline void append_code_point(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes the code point at i of a string already known to be valid; advances i.
inline std::uint32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<std::uint8_t>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const int len = classify_lead(b0).length;
  std::uint32_t cp = b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<std::uint8_t>(s[i + static_cast<std::size_t>(k)]) & 0x3F);
  i += static_cast<std::size_t>(len);
  return cp;
}

}  // namespace tlm::utf8
