#pragma once
// Replaces the global operator new/delete of the test program that includes it
// (include it in exactly one file of a program) with ones that count calls, so a
// test can assert that a hot path allocates nothing.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

// GCC sees std::free inlined into the replaced operator delete at call sites whose
// operator new it also inlined, and flags the pair as mismatched; they match (both
// are ours, over malloc), so the warning is off for the program that counts.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace tlm_test {
inline std::atomic<std::size_t> allocations{0};
}  // namespace tlm_test

void* operator new(std::size_t n) {
  tlm_test::allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  tlm_test::allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
