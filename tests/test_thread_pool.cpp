// The fork-join pool: coverage of [0, n) exactly once, chunk bounds, grain, inline
// cases (n = 0, one chunk, nested calls, concurrent callers), exceptions, reuse.
#include <doctest/doctest.h>

#include <tlm/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_thread_pool {

namespace {

// Runs one parallel_for and checks that every index is visited exactly once, by
// contiguous chunks of at least `grain` items (except possibly when n < grain).
void check_cover(tlm::thread_pool& pool, std::size_t n, std::size_t grain) {
  std::vector<std::atomic<int>> hits(n);
  std::mutex m;
  std::vector<std::pair<std::size_t, std::size_t>> chunks;
  pool.parallel_for(n, grain, [&](std::size_t b, std::size_t e) {
    {
      std::lock_guard<std::mutex> g(m);
      chunks.emplace_back(b, e);
    }
    for (std::size_t i = b; i < e; ++i) hits[i].fetch_add(1);
  });
  INFO("threads " << pool.size() << " n " << n << " grain " << grain);
  int wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += hits[i].load() != 1;
  CHECK(wrong == 0);
  for (auto [b, e] : chunks) {
    CHECK(b < e);
    CHECK(e <= n);
    if (n >= grain && grain > 0) CHECK(e - b >= grain);
  }
  if (n == 0) CHECK(chunks.empty());
}

}  // namespace

TEST_CASE("size counts the calling thread; zero threads is an error") {
  tlm::thread_pool p1(1), p3(3);
  CHECK(p1.size() == 1);
  CHECK(p3.size() == 3);
  CHECK_THROWS_AS(tlm::thread_pool(0), tlm::error);
}

TEST_CASE("every index exactly once, for many sizes, grains and pool sizes") {
  for (std::size_t threads : {1, 2, 3, 4}) {
    tlm::thread_pool pool(threads);
    for (std::size_t n : {0, 1, 2, 3, 5, 7, 16, 100, 1000, 4097}) {
      for (std::size_t grain : {0, 1, 2, 3, 10, 64, 5000}) check_cover(pool, n, grain);
    }
  }
}

TEST_CASE("n smaller than the thread count, and n = 0 never calls f") {
  tlm::thread_pool pool(4);
  int calls = 0;
  pool.parallel_for(0, 1, [&](std::size_t, std::size_t) { ++calls; });
  CHECK(calls == 0);
  check_cover(pool, 2, 1);
  check_cover(pool, 3, 1);
}

TEST_CASE("many small jobs in a row: every one completes before parallel_for returns") {
  tlm::thread_pool pool(3);
  std::atomic<std::size_t> total{0};
  std::size_t expected = 0;
  for (std::size_t job = 0; job < 20000; ++job) {
    const std::size_t n = 1 + job % 13;
    std::atomic<std::size_t> here{0};
    pool.parallel_for(n, 1, [&](std::size_t b, std::size_t e) {
      here.fetch_add(e - b);
      total.fetch_add(e - b);
    });
    // All chunks of this job are done once the call returns.
    if (here.load() != n) {
      CHECK(here.load() == n);
      break;
    }
    expected += n;
  }
  CHECK(total.load() == expected);
}

TEST_CASE("work really runs on more than one thread when the pool has several") {
  tlm::thread_pool pool(2);
  std::set<std::thread::id> ids;  // guarded by m
  std::mutex m;
  std::atomic<std::size_t> distinct{0};
  // Each chunk waits until another thread has joined in, or gives up after a while;
  // the worker may be slow to start on a loaded machine, so try several jobs.
  for (int attempt = 0; attempt < 50 && distinct.load() < 2; ++attempt) {
    std::atomic<int> started{0};
    pool.parallel_for(8, 1, [&](std::size_t, std::size_t) {
      started.fetch_add(1);
      {
        std::lock_guard<std::mutex> g(m);
        ids.insert(std::this_thread::get_id());
        distinct.store(ids.size());
      }
      for (int i = 0; i < 2000 && distinct.load() < 2; ++i) std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
    CHECK(started.load() == 8);
  }
  CHECK(distinct.load() == 2);
}

TEST_CASE("an exception in any chunk reaches the caller, and the pool stays usable") {
  for (std::size_t threads : {1, 2, 3}) {
    tlm::thread_pool pool(threads);
    for (std::size_t bad : {std::size_t{0}, std::size_t{57}, std::size_t{99}}) {
      CHECK_THROWS_WITH_AS(pool.parallel_for(100, 1,
                                             [&](std::size_t b, std::size_t e) {
                                               if (b <= bad && bad < e) throw std::runtime_error("chunk failed");
                                             }),
                           "chunk failed", std::runtime_error);
    }
    // Still works afterwards.
    check_cover(pool, 1000, 7);
  }
}

TEST_CASE("nested parallel_for on the same pool runs inline instead of deadlocking") {
  tlm::thread_pool pool(3);
  std::vector<std::atomic<int>> hits(40 * 30);
  pool.parallel_for(40, 1, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      pool.parallel_for(30, 1, [&](std::size_t b2, std::size_t e2) {
        for (std::size_t j = b2; j < e2; ++j) hits[i * 30 + j].fetch_add(1);
      });
    }
  });
  int wrong = 0;
  for (auto& h : hits) wrong += h.load() != 1;
  CHECK(wrong == 0);
}

TEST_CASE("two threads sharing one pool both get complete results") {
  tlm::thread_pool pool(2);
  std::atomic<int> bad{0};
  auto user = [&] {
    for (int job = 0; job < 2000; ++job) {
      std::atomic<std::size_t> sum{0};
      pool.parallel_for(64, 1, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) sum.fetch_add(i);
      });
      if (sum.load() != 64 * 63 / 2) bad.fetch_add(1);
    }
  };
  std::thread a(user), b(user);
  a.join();
  b.join();
  CHECK(bad.load() == 0);
}

TEST_CASE("a pool is destroyed cleanly right after a job, and with workers that never ran one") {
  std::size_t jobs_done = 0;
  for (int i = 0; i < 50; ++i) {
    tlm::thread_pool pool(3);
    if (i % 2) {
      std::atomic<std::size_t> sum{0};
      pool.parallel_for(10, 1, [&](std::size_t b, std::size_t e) { sum.fetch_add(e - b); });
      jobs_done += sum.load() == 10;
    }
  }
  CHECK(jobs_done == 25);
}

TEST_CASE("run_on_each_thread runs f exactly once on every thread, the caller included") {
  for (std::size_t threads : {1, 2, 3, 5}) {
    tlm::thread_pool pool(threads);
    for (int round = 0; round < 20; ++round) {
      std::mutex m;
      std::vector<std::thread::id> ids;  // guarded by m
      pool.run_on_each_thread([&] {
        std::lock_guard<std::mutex> g(m);
        ids.push_back(std::this_thread::get_id());
      });
      const std::set<std::thread::id> distinct(ids.begin(), ids.end());
      CHECK(ids.size() == threads);
      CHECK(distinct.size() == threads);
      CHECK(distinct.count(std::this_thread::get_id()) == 1);
    }
    check_cover(pool, 1000, 3);  // and parallel_for still works after
  }
}

TEST_CASE("run_on_each_thread: an exception reaches the caller; a call from inside a job is refused") {
  tlm::thread_pool pool(3);
  std::atomic<int> calls{0};
  CHECK_THROWS_WITH_AS(pool.run_on_each_thread([&] {
    if (calls.fetch_add(1) == 1) throw std::runtime_error("init failed");
  }),
                       "init failed", std::runtime_error);
  CHECK(calls.load() == 3);  // the others still ran: a failure does not strand the barrier
  std::atomic<int> refused{0};
  pool.parallel_for(4, 1, [&](std::size_t, std::size_t) {
    try {
      pool.run_on_each_thread([] {});
    } catch (const tlm::error& e) {
      if (std::string(e.what()).find("inside a job") != std::string::npos) refused.fetch_add(1);
    }
  });
  CHECK(refused.load() == 4);
  check_cover(pool, 100, 1);
}

}  // namespace test_thread_pool
