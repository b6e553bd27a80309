// libFuzzer target for the GGUF reader: any byte string either opens or throws
// tlm::format_error, and for a file that opens every metadata value and every byte
// of every tensor span can be read without leaving the input.
#include <tlm/format/gguf.hpp>
#include <tlm/format/quant.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  try {
    const auto f = tlm::gguf::file::from_memory(bytes, "fuzz.gguf");
    volatile std::uint64_t sink = f.version() + f.alignment();
    for (const auto& e : f.metadata()) {
      const auto& v = e.val;
      sink = sink + e.key.size() + v.payload.size();
      using tlm::gguf::value_type;
      if (v.type == value_type::string) {
        sink = sink + static_cast<std::uint8_t>(v.str().empty() ? 0 : v.str().back());
      } else if (v.is_array() && v.element_type == value_type::string) {
        for (const auto s : v.strings()) sink = sink + s.size();
      } else if (v.is_array()) {
        for (std::uint64_t i = 0; i < v.count; ++i) sink = sink + static_cast<std::uint64_t>(v.number(i) != 0);
      } else {
        sink = sink + static_cast<std::uint64_t>(v.number() != 0);
      }
      // The typed getters must either return or throw format_error.
      try { (void)f.get_uint(e.key); } catch (const tlm::format_error&) {}
      try { (void)f.get_float(e.key); } catch (const tlm::format_error&) {}
      try { (void)f.get_string_array(e.key); } catch (const tlm::format_error&) {}
      try { (void)f.get_int_array(e.key); } catch (const tlm::format_error&) {}
    }
    std::vector<float> row;
    for (const auto& t : f.tensors()) {
      for (const std::byte b : t.data) sink = sink + std::to_integer<std::uint8_t>(b);
      // Decode the first row: the reader promised a whole number of blocks.
      const std::size_t cols = static_cast<std::size_t>(t.row_length());
      if (cols <= (1u << 16) && t.enc != tlm::encoding::q8_1 && t.enc != tlm::encoding::q8_k) {
        row.resize(cols);
        tlm::dequantize_row(t.enc, t.data.data(), row.data(), cols);
      }
      if (f.find_tensor(t.name) != &t) __builtin_trap();
    }
  } catch (const tlm::format_error&) {
  }
  return 0;
}
