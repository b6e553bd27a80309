#pragma once
// A small fork-join pool for the kernels.
//
// Decoding one token runs a few hundred matrix-vector products of a few hundred
// microseconds each, so waking the workers must cost far less than that. Workers
// spin briefly on an atomic before they block on it (std::atomic::wait, a futex on
// Linux), and a job is a function pointer plus a context pointer: no allocation per
// call.
//
// size() counts the calling thread: thread_pool(1) starts no thread at all and runs
// every job inline; thread_pool(2) starts one worker.
//
// Work is split into contiguous chunks that threads claim one at a time, so a
// worker the OS has descheduled (the machine may be shared) delays the job by at
// most one chunk. Which thread runs a chunk never changes what the chunk computes.
#include <tlm/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tlm {

// Sets flush-to-zero and denormals-are-zero (MXCSR FTZ and DAZ) on the calling
// thread for its lifetime, and restores the previous mode after. Training needs it:
// tiny gradients turn denormal deep in the stack, and x86 arithmetic on denormals
// is up to 100x slower. Every thread that computes must have the same mode, or
// results would depend on which thread ran a chunk.
class flush_denormals_guard {
 public:
  flush_denormals_guard() {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
#endif
  }
  ~flush_denormals_guard() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(saved_);
#endif
  }
  flush_denormals_guard(const flush_denormals_guard&) = delete;
  flush_denormals_guard& operator=(const flush_denormals_guard&) = delete;

 private:
  unsigned saved_ = 0;
};

namespace detail {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Waits until `a` no longer holds `old`: spins for up to `spin` (the next job or the
// last chunk usually arrives within microseconds), then sleeps in the kernel.
template <class T>
inline void spin_then_wait(const std::atomic<T>& a, T old, std::chrono::microseconds spin) {
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1;; ++i) {
    if (a.load(std::memory_order_acquire) != old) return;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() - start > spin) break;
  }
  while (a.load(std::memory_order_acquire) == old) a.wait(old, std::memory_order_acquire);
}
}  // namespace detail

// The threads an option of 0 means: every core the system reports (at least 1). The
// model's and training's `threads` options both read 0 so.
inline std::size_t threads_or_every_core(std::size_t threads) {
  return threads != 0 ? threads : std::max<std::size_t>(1, std::thread::hardware_concurrency());
}

class thread_pool {
 public:
  // With flush_denormals, every worker runs with FTZ and DAZ set (see
  // flush_denormals_guard); the calling thread sets its own mode.
  explicit thread_pool(std::size_t threads, bool flush_denormals = false) : flush_denormals_(flush_denormals) {
    if (threads == 0) {
      throw error("thread_pool: 0 threads requested; ask for at least 1 (the calling thread)");
    }
    if (threads > max_threads) {
      throw error("thread_pool: " + std::to_string(threads) + " threads requested, at most " +
                  std::to_string(max_threads) + " are supported");
    }
    workers_.reserve(threads - 1);
    try {
      for (std::size_t i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
    } catch (...) {
      shut_down();
      throw;
    }
  }

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  ~thread_pool() { shut_down(); }

  std::size_t size() const { return workers_.size() + 1; }

  // Runs f(begin, end) over [0, n) split into contiguous chunks of at least `grain`
  // items; the calling thread takes part, and the call returns when every chunk is
  // done. The first exception thrown by f is rethrown here (remaining chunks are
  // skipped). A call made from inside a job of this pool, or while another thread
  // is using the pool, runs inline on the calling thread: correct, not parallel.
  template <class F>
  void parallel_for(std::size_t n, std::size_t grain, F&& f) {
    if (n == 0) return;
    grain = std::max<std::size_t>(grain, 1);
    // Rounded down, so that every chunk holds at least `grain` items.
    const std::size_t pieces = std::max<std::size_t>(n / grain, 1);
    // More chunks than threads so that a late thread costs little; capped so the
    // claim counter fits its 16 bits.
    const std::size_t chunks = std::min<std::size_t>({pieces, size() * 4, max_chunks});
    if (chunks <= 1 || workers_.empty() || inside_ == this) {
      f(std::size_t{0}, n);
      return;
    }
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) {
      f(std::size_t{0}, n);
      return;
    }
    run_job(n, chunks, f);
  }

  // Runs f() once on every thread of the pool, the calling thread included, and
  // returns when all have. For per-thread state that a hot loop must find ready
  // (buffers sized up front, so that the loop allocates nothing): parallel_for
  // cannot promise that, since a thread claims chunks only when it is scheduled.
  // Each thread takes one chunk and holds it until all size() chunks are taken, so
  // no thread takes two. Waits for the pool if another thread is using it; must not
  // be called from inside a job of this pool (that would wait for itself).
  template <class F>
  void run_on_each_thread(F&& f) {
    if (inside_ == this) {
      throw error("thread_pool::run_on_each_thread was called from inside a job of the same pool, where it would "
                  "wait for itself; call it before or after the parallel work");
    }
    if (workers_.empty()) {
      f();
      return;
    }
    std::unique_lock<std::mutex> lock(busy_);
    const std::size_t n = size();
    std::atomic<std::size_t> arrived{0};
    auto each = [&](std::size_t, std::size_t) {
      // f runs only after the barrier: every chunk is then claimed and inside invoke,
      // so a throwing f cannot make a later chunk skip the barrier and hang the rest.
      arrived.fetch_add(1, std::memory_order_acq_rel);
      arrived.notify_all();
      for (std::size_t a = arrived.load(std::memory_order_acquire); a < n; a = arrived.load(std::memory_order_acquire)) {
        detail::spin_then_wait(arrived, a, spin_time);
      }
      f();
    };
    run_job(n, n, each);
  }

 private:
  static constexpr std::size_t max_threads = 1024;
  static constexpr std::size_t max_chunks = 0xffff;
  static constexpr std::chrono::microseconds spin_time{200};

  // Publishes job f over [0, n) in `chunks` chunks, takes part, and waits for every
  // chunk. The caller holds busy_.
  template <class F>
  void run_job(std::size_t n, std::size_t chunks, F& f) {
    using fn_type = std::remove_reference_t<F>;
    job_.invoke = [](void* ctx, std::size_t b, std::size_t e) { (*static_cast<fn_type*>(ctx))(b, e); };
    job_.ctx = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
    job_.n = n;
    job_.chunks = chunks;
    job_.failed.store(false, std::memory_order_relaxed);
    job_.failure = nullptr;
    done_.store(0, std::memory_order_relaxed);
    const std::uint32_t id = ++job_id_;
    // The job fields above become visible to a worker through this release store
    // and the acquire in its compare-exchange on claim_.
    claim_.store(pack(id, chunks, 0), std::memory_order_release);
    generation_.store(id, std::memory_order_release);
    generation_.notify_all();

    run_chunks(id);

    // Wait until every chunk has finished, spinning first because jobs are short.
    for (std::size_t d = done_.load(std::memory_order_acquire); d != chunks;
         d = done_.load(std::memory_order_acquire)) {
      detail::spin_then_wait(done_, d, spin_time);
    }
    if (job_.failure) std::rethrow_exception(job_.failure);
  }

  struct job {
    void (*invoke)(void*, std::size_t, std::size_t) = nullptr;
    void* ctx = nullptr;
    std::size_t n = 0;
    std::size_t chunks = 0;
    std::atomic<bool> failed{false};
    std::exception_ptr failure;
    std::mutex failure_lock;
  };

  // claim_ packs (job id: 32 bits, chunk count: 16, next chunk: 16) so that a claim
  // can only succeed for a real chunk of the job that is current at that instant.
  static constexpr std::uint64_t pack(std::uint32_t id, std::size_t chunks, std::size_t next) {
    return (std::uint64_t{id} << 32) | (std::uint64_t{chunks} << 16) | std::uint64_t{next};
  }

  // Claims and runs chunks of job `id` until none are left. Returns at once when the
  // current job is another one (a worker that woke late).
  void run_chunks(std::uint32_t id) {
    const thread_pool* outer = inside_;
    inside_ = this;
    for (;;) {
      std::uint64_t c = claim_.load(std::memory_order_acquire);
      std::size_t index = 0;
      for (;;) {
        if (static_cast<std::uint32_t>(c >> 32) != id) {
          inside_ = outer;
          return;
        }
        index = static_cast<std::size_t>(c & 0xffff);
        if (index >= static_cast<std::size_t>((c >> 16) & 0xffff)) {
          inside_ = outer;
          return;
        }
        if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) break;
      }
      // Read before the done_ increment below: once the last chunk is counted the
      // caller may return and overwrite job_ with the next job.
      const std::size_t chunks = job_.chunks;
      const std::size_t begin = job_.n * index / chunks;
      const std::size_t end = job_.n * (index + 1) / chunks;
      if (!job_.failed.load(std::memory_order_relaxed)) {
        try {
          job_.invoke(job_.ctx, begin, end);
        } catch (...) {
          std::lock_guard<std::mutex> g(job_.failure_lock);
          if (!job_.failure) job_.failure = std::current_exception();
          job_.failed.store(true, std::memory_order_relaxed);
        }
      }
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done_.notify_all();
    }
  }

  void worker_loop() {
#if defined(__x86_64__) || defined(__i386__)
    if (flush_denormals_) _mm_setcsr(_mm_getcsr() | 0x8040u);
#endif
    std::uint32_t seen = 0;
    for (;;) {
      detail::spin_then_wait(generation_, seen, spin_time);
      const std::uint32_t g = generation_.load(std::memory_order_acquire);
      seen = g;
      if (stop_.load(std::memory_order_acquire)) return;
      run_chunks(g);
    }
  }

  void shut_down() {
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    for (auto& t : workers_) {
      if (t.joinable()) t.join();
    }
    workers_.clear();
  }

  static inline thread_local const thread_pool* inside_ = nullptr;

  bool flush_denormals_ = false;
  std::vector<std::thread> workers_;
  std::mutex busy_;
  job job_;
  std::uint32_t job_id_ = 0;
  std::atomic<std::uint64_t> claim_{0};
  std::atomic<std::size_t> done_{0};
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tlm
