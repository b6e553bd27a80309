// inspect: print what a GGUF file holds.
//
//   inspect FILE.gguf                  version, alignment, llama.* hyperparameters, tensor table, totals
//   inspect FILE.gguf --metadata       also every metadata pair (long arrays summarized)
//   inspect FILE.gguf --verify         decode every value of every tensor; name those that are
//                                      not finite (a corrupt block scale), exit 1 if any
//   inspect FILE.gguf --dump TENSOR OUT.f32
//                                      write TENSOR dequantized to float32 (raw little-endian, row-major)
//   inspect FILE.gguf --requantize ENC OUT.gguf
//                                      copy the file with gguf::writer, re-encoding every F32 tensor
//                                      with two or more dims to ENC (any writable encoding of tlm/format/encoding.hpp; a
//                                      tensor whose rows do not fit ENC is copied as it is)
//
// Errors (missing file, not a GGUF file, unknown tensor) print the tlm::error message
// and exit with code 1.
#include <tlm/format/gguf.hpp>
#include <tlm/format/gguf_writer.hpp>
#include <tlm/format/quant.hpp>
#include <tlm/format/verify.hpp>

#include <fmt/core.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::string scalar_text(const tlm::gguf::value& v, std::size_t i) {
  using tlm::gguf::value_type;
  const value_type t = v.is_array() ? v.element_type : v.type;
  if (t == value_type::boolean) return v.integer(i).magnitude != 0 ? "true" : "false";
  // An f32 printed as a float shows the value the file holds, not its double expansion.
  if (t == value_type::f32) return fmt::format("{}", static_cast<float>(v.number(i)));
  if (t == value_type::f64) return fmt::format("{}", v.number(i));
  const auto n = v.integer(i);
  return n.negative ? fmt::format("-{}", n.magnitude) : fmt::format("{}", n.magnitude);
}

std::string quoted(std::string_view s, std::size_t max_len = 80) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < max_len; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') out += "\\n";
    else if (c == '"') out += "\\\"";
    else if (c < 0x20) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (s.size() > max_len) out += fmt::format("...\" ({} bytes)", s.size());
  else out += "\"";
  return out;
}

std::string value_text(const tlm::gguf::value& v) {
  using tlm::gguf::value_type;
  if (v.type == value_type::string) return quoted(v.str());
  if (!v.is_array()) return scalar_text(v, 0);
  constexpr std::size_t shown = 5;
  std::string out = fmt::format("[{} x {}]", v.count, tlm::gguf::type_name(v.element_type));
  std::vector<std::string> items;
  if (v.element_type == value_type::string) {
    const auto strings = v.strings();
    for (std::size_t i = 0; i < strings.size() && i < shown; ++i) items.push_back(quoted(strings[i], 24));
  } else {
    for (std::size_t i = 0; i < v.count && i < shown; ++i) items.push_back(scalar_text(v, i));
  }
  out += " {";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  if (v.count > shown) out += ", ...";
  return out + "}";
}

std::string dims_text(const tlm::gguf::tensor_info& t) {
  std::string s = "{";
  for (std::uint32_t d = 0; d < t.n_dims; ++d) s += fmt::format("{}{}", d ? ", " : "", t.dims[d]);
  return s + "}";
}

int dump(const tlm::gguf::file& f, std::string_view tensor, const std::string& out_path) {
  const auto* t = f.find_tensor(tensor);
  if (t == nullptr) {
    throw tlm::error(fmt::format("{}: no tensor named '{}'; run `inspect {}` to list the tensors", f.name(), tensor, f.name()));
  }
  std::FILE* out = std::fopen(out_path.c_str(), "wb");
  if (out == nullptr) throw tlm::error(fmt::format("{}: cannot create the output file; check the directory", out_path));
  const std::size_t cols = static_cast<std::size_t>(t->row_length());
  const std::size_t rb = tlm::row_bytes(t->enc, cols);
  std::vector<float> row(cols);
  for (std::uint64_t r = 0; r < t->rows(); ++r) {
    tlm::dequantize_row(t->enc, t->data.data() + r * rb, row.data(), cols);
    if (std::fwrite(row.data(), sizeof(float), cols, out) != cols) {
      std::fclose(out);
      throw tlm::error(fmt::format("{}: write failed; check free disk space", out_path));
    }
  }
  if (std::fclose(out) != 0) throw tlm::error(fmt::format("{}: write failed; check free disk space", out_path));
  fmt::print("wrote {} ({} values, {} from {}) to {}\n", t->name, t->elements, tlm::name(t->enc), dims_text(*t), out_path);
  return 0;
}

// tlm::non_finite_values (tlm/format/verify.hpp): names every tensor holding NaN or infinity.
// Exit status 1 when there is one.
int verify(const tlm::gguf::file& f) {
  const auto bad = tlm::non_finite_values(f);
  for (const auto& b : bad) {
    const auto* t = f.find_tensor(b.name);
    fmt::print("{}: {} of {} values are not finite; the first at row {}, column {} ({}), in the {} block at byte {} of "
               "the tensor's data\n",
               b.name, b.count, t->elements, b.row, b.column, b.value, tlm::name(t->enc), b.byte);
  }
  if (!bad.empty()) {
    fmt::print("{}: {} of {} tensors hold values that are not finite: the file is corrupt; download or convert it again\n",
               f.name(), bad.size(), f.tensors().size());
    return 1;
  }
  std::uint64_t values = 0;
  for (const auto& t : f.tensors()) values += t.elements;
  fmt::print("{}: {} tensors, {} values, all finite\n", f.name(), f.tensors().size(), values);
  return 0;
}

tlm::encoding parse_encoding(std::string_view s) {
  if (const auto* r = tlm::parse_writable_encoding(s)) return r->enc;
  throw tlm::error(fmt::format("unknown target encoding '{}'; use one of {}", s, tlm::writable_encodings_list()));
}

int requantize(const tlm::gguf::file& f, tlm::encoding enc, const std::string& out_path) {
  tlm::gguf::writer w;
  for (const auto& e : f.metadata()) {
    if (e.key == "general.alignment") w.set_alignment(static_cast<std::uint32_t>(f.alignment()));
    else w.set_value(e.key, e.val);
  }
  std::size_t converted = 0;
  for (const auto& t : f.tensors()) {
    std::vector<std::uint64_t> dims(t.dims.begin(), t.dims.begin() + t.n_dims);
    const std::size_t cols = static_cast<std::size_t>(t.row_length());
    if (t.enc == tlm::encoding::f32 && t.n_dims >= 2 && tlm::row_bytes(enc, cols) != 0) {
      // The source bytes stay mapped until write() returns, so the callback may read them.
      w.add_tensor_generated(t.name, dims, enc, [&t, enc, cols](std::span<std::byte> out) {
        const std::size_t rb = tlm::row_bytes(enc, cols);
        std::vector<float> row(cols);
        for (std::uint64_t r = 0; r < t.rows(); ++r) {
          std::memcpy(row.data(), t.data.data() + r * cols * sizeof(float), cols * sizeof(float));
          tlm::quantize_row(enc, row.data(), out.data() + r * rb, cols);
        }
      });
      ++converted;
    } else {
      w.add_tensor(t.name, dims, t.enc, t.data);
    }
  }
  w.write(out_path);
  fmt::print("wrote {} ({} tensors, {} re-encoded as {})\n", out_path, f.tensors().size(), converted, tlm::name(enc));
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: inspect FILE.gguf [--metadata] [--verify] [--dump TENSOR OUT.f32] [--requantize ENC OUT.gguf]\n");
    return 2;
  }
  bool show_metadata = false, verify_values = false;
  std::string dump_tensor, dump_out, requant_enc, requant_out;
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--metadata") {
      show_metadata = true;
    } else if (a == "--verify") {
      verify_values = true;
    } else if (a == "--dump" && i + 2 < argc) {
      dump_tensor = argv[i + 1];
      dump_out = argv[i + 2];
      i += 2;
    } else if (a == "--requantize" && i + 2 < argc) {
      requant_enc = argv[i + 1];
      requant_out = argv[i + 2];
      i += 2;
    } else {
      fmt::print(stderr, "inspect: unknown or incomplete option '{}'\nusage: inspect FILE.gguf [--metadata] [--verify] [--dump TENSOR OUT.f32] [--requantize ENC OUT.gguf]\n", a);
      return 2;
    }
  }
  const tlm::gguf::file f(argv[1]);
  if (!dump_tensor.empty()) return dump(f, dump_tensor, dump_out);
  if (!requant_out.empty()) return requantize(f, parse_encoding(requant_enc), requant_out);
  if (verify_values) return verify(f);

  fmt::print("file       {}\n", f.name());
  fmt::print("size       {} bytes\n", f.bytes().size());
  fmt::print("version    {}\n", f.version());
  fmt::print("alignment  {}\n", f.alignment());
  fmt::print("data at    byte {}\n", f.data_offset());
  fmt::print("metadata   {} pairs\n", f.metadata().size());
  fmt::print("tensors    {}\n", f.tensors().size());
  if (f.has("general.architecture") && f.find("general.architecture")->type == tlm::gguf::value_type::string) {
    const std::string arch(f.get_string("general.architecture"));
    fmt::print("\narchitecture {}\n", arch);
    for (const auto& e : f.metadata()) {
      if (e.key.starts_with(arch + ".")) fmt::print("  {:<48} {}\n", e.key, value_text(e.val));
    }
  }
  if (show_metadata) {
    fmt::print("\nmetadata\n");
    for (const auto& e : f.metadata()) {
      std::string type(tlm::gguf::type_name(e.val.type));
      if (e.val.is_array()) type = fmt::format("{}[{}]", tlm::gguf::type_name(e.val.element_type), e.val.count);
      fmt::print("  {:<44} {:<12} {}\n", e.key, type, value_text(e.val));
    }
  }
  fmt::print("\n{:<32} {:<20} {:<6} {:>12} {:>12}\n", "tensor", "dims", "enc", "bytes", "offset");
  struct total {
    std::size_t count = 0;
    std::uint64_t elements = 0, bytes = 0;
  };
  std::map<std::string, total> totals;
  total all;
  for (const auto& t : f.tensors()) {
    fmt::print("{:<32} {:<20} {:<6} {:>12} {:>12}\n", t.name, dims_text(t), tlm::name(t.enc), t.data.size(), t.offset);
    auto& e = totals[std::string(tlm::name(t.enc))];
    for (total* x : {&e, &all}) {
      ++x->count;
      x->elements += t.elements;
      x->bytes += t.data.size();
    }
  }
  fmt::print("\n{:<8} {:>8} {:>14} {:>14} {:>8}\n", "enc", "tensors", "elements", "bytes", "bits/w");
  for (const auto& [enc, x] : totals) {
    fmt::print("{:<8} {:>8} {:>14} {:>14} {:>8.3f}\n", enc, x.count, x.elements, x.bytes, 8.0 * static_cast<double>(x.bytes) / static_cast<double>(x.elements));
  }
  if (all.count > 0) {
    fmt::print("{:<8} {:>8} {:>14} {:>14} {:>8.3f}\n", "total", all.count, all.elements, all.bytes,
               8.0 * static_cast<double>(all.bytes) / static_cast<double>(all.elements));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tlm::error& e) {
    fmt::print(stderr, "inspect: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "inspect: unexpected error: {}\n", e.what());
    return 1;
  }
}
