#pragma once
// A kernel's scratch buffer: cache-line aligned (64 bytes), kept for its owner's life and
// grown only when a call needs more, so steady-state calls allocate nothing. The contents
// are not kept when it grows, and are uninitialized: callers write before they read.
//
// Why aligned: a 64-byte row that straddles two cache lines costs two lines to load. For
// AMX tile loads (16 such rows) that made the amx prefill kernel 2-3x slower when its
// buffers came from std::vector, whose large blocks sit 16 bytes past a page boundary.
#include <cstddef>
#include <new>

namespace tlm::kernels {

template <class T>
class aligned_buffer {
 public:
  aligned_buffer() = default;
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  ~aligned_buffer() { release(); }

  // At least n elements.
  T* get(std::size_t n) {
    if (n > size_) {
      release();
      p_ = static_cast<T*>(::operator new(n * sizeof(T), alignment));
      size_ = n;
    }
    return p_;
  }

 private:
  static constexpr std::align_val_t alignment{64};
  void release() {
    if (p_ != nullptr) ::operator delete(p_, alignment);
    p_ = nullptr;
    size_ = 0;
  }
  T* p_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace tlm::kernels
