#pragma once
// Writer for GGUF version 3 files: metadata of every value type, and tensors given as
// raw encoded bytes, as float32 data quantized on the way in, or produced by a
// callback at write time (so a large model need not sit in memory twice).
//
// Writing is atomic: the file is written to `<path>.tmp-<pid>`, flushed with fsync,
// then renamed over `path`; on any error the temporary file is removed and `path`
// is left as it was.
#include <tlm/error.hpp>
#include <tlm/format/encoding.hpp>
#include <tlm/format/gguf.hpp>
#include <tlm/format/quant.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace tlm::gguf {

namespace detail {

template <class T>
constexpr value_type value_type_of() {
  if constexpr (std::is_same_v<T, bool>) return value_type::boolean;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return value_type::u8;
  else if constexpr (std::is_same_v<T, std::int8_t>) return value_type::i8;
  else if constexpr (std::is_same_v<T, std::uint16_t>) return value_type::u16;
  else if constexpr (std::is_same_v<T, std::int16_t>) return value_type::i16;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return value_type::u32;
  else if constexpr (std::is_same_v<T, std::int32_t>) return value_type::i32;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return value_type::u64;
  else if constexpr (std::is_same_v<T, std::int64_t>) return value_type::i64;
  else if constexpr (std::is_same_v<T, float>) return value_type::f32;
  else if constexpr (std::is_same_v<T, double>) return value_type::f64;
  else static_assert(sizeof(T) == 0, "no GGUF value type for this C++ type; use a fixed-width integer, float, double or bool");
}

class byte_buffer {
 public:
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  template <class T>
  void put(T v) {
    raw(&v, sizeof v);
  }
  void str(std::string_view s) {
    put<std::uint64_t>(s.size());
    raw(s.data(), s.size());
  }
  std::vector<std::byte> bytes;
};

}  // namespace detail

class writer {
 public:
  // ---- metadata (a second set of the same key replaces the value, keeping its position)
  template <class T>
    requires(std::is_arithmetic_v<T>)
  void set(std::string_view key, T v) {
    detail::byte_buffer b;
    b.put(static_cast<std::uint32_t>(detail::value_type_of<T>()));
    if constexpr (std::is_same_v<T, bool>) b.put<std::uint8_t>(v ? 1 : 0);
    else b.put(v);
    put_meta(key, std::move(b.bytes));
  }
  void set(std::string_view key, std::string_view v) {
    detail::byte_buffer b;
    b.put(static_cast<std::uint32_t>(value_type::string));
    b.str(v);
    put_meta(key, std::move(b.bytes));
  }
  void set(std::string_view key, const char* v) { set(key, std::string_view(v)); }
  void set(std::string_view key, const std::string& v) { set(key, std::string_view(v)); }

  template <class T>
    requires(std::is_arithmetic_v<T>)
  void set_array(std::string_view key, std::span<const T> v) {
    detail::byte_buffer b;
    b.put(static_cast<std::uint32_t>(value_type::array));
    b.put(static_cast<std::uint32_t>(detail::value_type_of<T>()));
    b.put<std::uint64_t>(v.size());
    for (const T& x : v) {
      if constexpr (std::is_same_v<T, bool>) b.put<std::uint8_t>(x ? 1 : 0);
      else b.put(x);
    }
    put_meta(key, std::move(b.bytes));
  }
  template <class T>
    requires(std::is_arithmetic_v<T>)
  void set_array(std::string_view key, const std::vector<T>& v) {
    set_array(key, std::span<const T>(v));
  }
  template <class S>
    requires(std::is_convertible_v<const S&, std::string_view>)
  void set_string_array(std::string_view key, std::span<const S> v) {
    detail::byte_buffer b;
    b.put(static_cast<std::uint32_t>(value_type::array));
    b.put(static_cast<std::uint32_t>(value_type::string));
    b.put<std::uint64_t>(v.size());
    for (const S& s : v) b.str(std::string_view(s));
    put_meta(key, std::move(b.bytes));
  }
  template <class S>
  void set_string_array(std::string_view key, const std::vector<S>& v) {
    set_string_array(key, std::span<const S>(v));
  }

  // Copies a value read from another file unchanged (for example the tokenizer keys).
  void set_value(std::string_view key, const value& v) {
    detail::byte_buffer b;
    b.put(static_cast<std::uint32_t>(v.type));
    if (v.type == value_type::string) {
      b.str(v.str());
    } else {
      if (v.is_array()) {
        b.put(static_cast<std::uint32_t>(v.element_type));
        b.put<std::uint64_t>(v.count);
      }
      b.raw(v.payload.data(), v.payload.size());
    }
    put_meta(key, std::move(b.bytes));
  }

  // Sets the data alignment (a power of two) and records it as general.alignment.
  void set_alignment(std::uint32_t a) {
    if (a == 0 || (a & (a - 1)) != 0) {
      throw format_error("gguf::writer: alignment " + std::to_string(a) + " is not a power of two; use 32 (the GGUF default) or another power of two");
    }
    set("general.alignment", a);
  }

  // ---- tensors. dims are GGUF dims: dims[0] is the row length (contiguous).
  void add_tensor(std::string_view name, std::vector<std::uint64_t> dims, encoding enc, std::span<const std::byte> raw) {
    const std::uint64_t bytes = check_tensor(name, dims, enc);
    if (raw.size() != bytes) {
      throw shape_error("gguf::writer: tensor '" + std::string(name) + "' needs " + std::to_string(bytes) + " bytes of " +
                        std::string(traits(enc).name) + " data, got " + std::to_string(raw.size()) + "; check its dims and encoding");
    }
    tensors_.push_back({std::string(name), std::move(dims), enc, bytes, std::vector<std::byte>(raw.begin(), raw.end()), {}, {}});
  }

  // Like add_tensor, without a copy: the bytes are read when the file is written, so
  // they must stay alive and unchanged until then (a checkpoint's optimizer moments,
  // 1 GB at 135M, would otherwise sit in memory twice and be copied once more).
  void add_tensor_view(std::string_view name, std::vector<std::uint64_t> dims, encoding enc, std::span<const std::byte> raw) {
    const std::uint64_t bytes = check_tensor(name, dims, enc);
    if (raw.size() != bytes) {
      throw shape_error("gguf::writer: tensor '" + std::string(name) + "' needs " + std::to_string(bytes) + " bytes of " +
                        std::string(traits(enc).name) + " data, got " + std::to_string(raw.size()) + "; check its dims and encoding");
    }
    tensors_.push_back({std::string(name), std::move(dims), enc, bytes, {}, {}, raw});
  }

  // float32 values in row-major order ([rows, dims[0]]), encoded as `enc` now.
  void add_tensor_f32(std::string_view name, std::vector<std::uint64_t> dims, encoding enc, std::span<const float> values) {
    const std::uint64_t bytes = check_tensor(name, dims, enc);
    const std::uint64_t elements = bytes / traits(enc).block_bytes * traits(enc).block_values;
    if (values.size() != elements) {
      throw shape_error("gguf::writer: tensor '" + std::string(name) + "' has " + std::to_string(elements) + " elements, got " +
                        std::to_string(values.size()) + " values; check its dims");
    }
    std::vector<std::byte> data(static_cast<std::size_t>(bytes));
    const std::size_t cols = static_cast<std::size_t>(dims[0]);
    const std::size_t rb = row_bytes(enc, cols);
    for (std::size_t r = 0; r < values.size() / cols; ++r) quantize_row(enc, values.data() + r * cols, data.data() + r * rb, cols);
    tensors_.push_back({std::string(name), std::move(dims), enc, bytes, std::move(data), {}, {}});
  }

  // The callback fills the tensor's encoded bytes when the file is written.
  using fill_fn = std::function<void(std::span<std::byte>)>;
  void add_tensor_generated(std::string_view name, std::vector<std::uint64_t> dims, encoding enc, fill_fn fill) {
    const std::uint64_t bytes = check_tensor(name, dims, enc);
    tensors_.push_back({std::string(name), std::move(dims), enc, bytes, {}, std::move(fill), {}});
  }

  std::size_t tensor_count() const { return tensors_.size(); }

  // The whole file in memory (for tests and fuzz seeds).
  std::vector<std::byte> to_bytes() const {
    std::vector<std::byte> out;
    emit([&](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      out.insert(out.end(), b, b + n);
    });
    return out;
  }

  // Writes atomically (temporary file, fsync, rename). Small pieces (the header, the
  // padding) are gathered in a buffer; a tensor's bytes go to write(2) straight from
  // memory in chunks of 64 MB, so the time is the disk's, proportional to the bytes,
  // with one fsync per file. `cancelled`, when given, is asked before every chunk: when
  // it says true the temporary file is removed and `path` is left as it was (a second
  // Ctrl-C during a 1.6 GB checkpoint need not wait for the disk).
  void write(const std::filesystem::path& path, const std::function<bool()>& cancelled = {}) const {
    const std::string target = path.string();
    const std::string tmp = target + ".tmp-" + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw error(tmp + ": cannot create: " + std::strerror(errno) + "; check that the directory exists and is writable");
    constexpr std::size_t buffer_bytes = std::size_t{1} << 20, chunk_bytes = std::size_t{64} << 20;
    std::vector<std::byte> buf;
    buf.reserve(buffer_bytes);
    // Writeback is started after every chunk and awaited four chunks (256 MB) later:
    // the disk works while later chunks are copied, with a queue deep enough to keep it
    // busy, and at most 256 MB are dirty, so the final fsync has little left to do and
    // `cancelled` is asked at the pace of the disk, not of page-cache copies (which would
    // leave a long fsync at the end that a second Ctrl-C could not interrupt). Measured
    // on 1.6 GB: waiting one chunk behind took 4.5 s, never waiting 3.0-3.9 s, four
    // chunks behind 2.5-2.8 s (the old buffered writer: 4.3-6.6 s).
    off_t written = 0, started = 0, waited = 0;
    const off_t lag = 4 * static_cast<off_t>(chunk_bytes);
    const auto put = [&](const std::byte* p, std::size_t n) {
      while (n > 0) {
        if (cancelled && cancelled()) throw error(tmp + ": write cancelled; " + target + " is unchanged");
        const ssize_t w = ::write(fd, p, std::min(n, chunk_bytes));
        if (w < 0) {
          if (errno == EINTR) continue;  // a signal (Ctrl-C) arrived: ask `cancelled` again
          throw error(tmp + ": write failed: " + std::strerror(errno) + "; check free disk space");
        }
        p += w;
        n -= static_cast<std::size_t>(w);
        written += w;
        if (written - started >= static_cast<off_t>(chunk_bytes)) {
          // Errors are not checked here: the fsync at the end reports them.
          ::sync_file_range(fd, started, written - started, SYNC_FILE_RANGE_WRITE);
          if (written - waited > lag) {
            ::sync_file_range(fd, waited, written - lag - waited, SYNC_FILE_RANGE_WAIT_BEFORE);
            waited = written - lag;
          }
          started = written;
        }
      }
    };
    const auto flush = [&] {
      put(buf.data(), buf.size());
      buf.clear();
    };
    try {
      emit([&](const void* p, std::size_t n) {
        const auto* b = static_cast<const std::byte*>(p);
        if (n >= buffer_bytes) {  // large: no copy through the buffer
          flush();
          put(b, n);
          return;
        }
        if (buf.size() + n > buffer_bytes) flush();
        buf.insert(buf.end(), b, b + n);
      });
      flush();
      if (::fsync(fd) != 0) throw error(tmp + ": fsync failed: " + std::strerror(errno));
      if (::close(fd) != 0) {
        ::unlink(tmp.c_str());
        throw error(tmp + ": close failed: " + std::strerror(errno));
      }
    } catch (...) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw error(target + ": cannot rename " + tmp + " into place: " + std::strerror(err));
    }
    // Make the rename itself durable; failure here leaves a complete file, so it is not an error.
    const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    const int dfd = ::open(dir.string().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  struct pending_tensor {
    std::string name;
    std::vector<std::uint64_t> dims;
    encoding enc;
    std::uint64_t bytes;
    std::vector<std::byte> data;  // owned bytes; empty when `fill` or `view` gives them
    fill_fn fill;
    std::span<const std::byte> view;  // bytes owned by the caller (add_tensor_view)
  };

  void put_meta(std::string_view key, std::vector<std::byte> bytes) {
    // The data layout follows general.alignment however it is set, so the file never
    // declares one alignment and uses another.
    if (key == "general.alignment") {
      std::uint32_t type = 0, a = 0;
      if (bytes.size() == 8) {
        std::memcpy(&type, bytes.data(), 4);
        std::memcpy(&a, bytes.data() + 4, 4);
      }
      if (type != static_cast<std::uint32_t>(value_type::u32) || a == 0 || (a & (a - 1)) != 0) {
        throw format_error("gguf::writer: general.alignment must be a u32 power of two; use set_alignment()");
      }
      alignment_ = a;
    }
    if (const auto it = meta_index_.find(std::string(key)); it != meta_index_.end()) {
      meta_[it->second].second = std::move(bytes);
      return;
    }
    meta_index_.emplace(std::string(key), meta_.size());
    meta_.emplace_back(std::string(key), std::move(bytes));
  }

  std::uint64_t check_tensor(std::string_view name, const std::vector<std::uint64_t>& dims, encoding enc) const {
    const std::string n(name);
    if (n.empty()) throw format_error("gguf::writer: a tensor name is empty; give every tensor a name");
    for (const auto& t : tensors_) {
      if (t.name == n) throw format_error("gguf::writer: tensor '" + n + "' was added twice; tensor names must be unique");
    }
    if (dims.empty() || dims.size() > 4) {
      throw shape_error("gguf::writer: tensor '" + n + "' has " + std::to_string(dims.size()) + " dims, GGUF allows 1 to 4");
    }
    std::uint64_t elements = 1;
    for (const auto d : dims) {
      if (d == 0) throw shape_error("gguf::writer: tensor '" + n + "' has a dim of 0; every dim must be at least 1");
      if (d > (std::uint64_t{1} << 62) / elements) throw shape_error("gguf::writer: tensor '" + n + "' is too large");
      elements *= d;
    }
    const auto tr = traits(enc);
    if (tr.block_values == 0 || !known_encoding(static_cast<std::uint32_t>(enc))) {
      throw shape_error("gguf::writer: tensor '" + n + "' has an unknown encoding");
    }
    if (dims[0] % tr.block_values != 0) {
      throw shape_error("gguf::writer: tensor '" + n + "' has rows of " + std::to_string(dims[0]) + " values, not a multiple of the " +
                        std::string(tr.name) + " block size " + std::to_string(tr.block_values) + "; pick another encoding (F16 or Q8_0)");
    }
    return elements / tr.block_values * tr.block_bytes;
  }

  template <class Sink>
  void emit(Sink&& sink) const {
    detail::byte_buffer h;
    h.raw("GGUF", 4);
    h.put<std::uint32_t>(3);
    h.put<std::uint64_t>(tensors_.size());
    h.put<std::uint64_t>(meta_.size());
    for (const auto& [key, bytes] : meta_) {
      h.str(key);
      h.raw(bytes.data(), bytes.size());
    }
    std::uint64_t offset = 0;
    std::vector<std::uint64_t> offsets;
    for (const auto& t : tensors_) {
      h.str(t.name);
      h.put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
      for (const auto d : t.dims) h.put<std::uint64_t>(d);
      h.put<std::uint32_t>(static_cast<std::uint32_t>(t.enc));
      offset = align(offset);
      offsets.push_back(offset);
      h.put<std::uint64_t>(offset);
      offset += t.bytes;
    }
    h.bytes.resize(static_cast<std::size_t>(align(h.bytes.size())), std::byte{0});
    sink(h.bytes.data(), h.bytes.size());
    std::uint64_t pos = 0;
    const std::vector<std::byte> zeros(alignment_, std::byte{0});
    std::unique_ptr<std::byte[]> scratch;
    std::uint64_t scratch_bytes = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      sink(zeros.data(), static_cast<std::size_t>(offsets[i] - pos));
      if (t.fill) {
        // One scratch buffer for all generated tensors, grown to the largest and not
        // zeroed: a fresh zero-filled vector per tensor cost a memset of every byte.
        if (scratch_bytes < t.bytes) {
          scratch.reset(new std::byte[static_cast<std::size_t>(t.bytes)]);
          scratch_bytes = t.bytes;
        }
        const std::span<std::byte> data(scratch.get(), static_cast<std::size_t>(t.bytes));
        t.fill(data);
        sink(data.data(), data.size());
      } else if (!t.view.empty()) {
        sink(t.view.data(), t.view.size());
      } else {
        sink(t.data.data(), t.data.size());
      }
      pos = offsets[i] + t.bytes;
    }
    // gguf-py pads the last tensor to the alignment as well; do the same so files match.
    if (!tensors_.empty()) sink(zeros.data(), static_cast<std::size_t>(align(pos) - pos));
  }

  std::uint64_t align(std::uint64_t x) const { return (x + alignment_ - 1) / alignment_ * alignment_; }

  std::uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, std::vector<std::byte>>> meta_;
  std::unordered_map<std::string, std::size_t> meta_index_;
  std::vector<pending_tensor> tensors_;
};

}  // namespace tlm::gguf
