// The KV cache: flat layout, typed pushes, and the run-time form's bound checks.
#include <doctest/doctest.h>

#include <tlm/kv.hpp>

#include <string>
#include <utility>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_kv {

using tlm::tiny_gqa;
using C = tiny_gqa;
constexpr std::size_t E = tlm::head_dim<C>;

TEST_CASE("typed cache: pushes claim positions and reads see exactly the written ones") {
  tlm::kv<C, 3> empty;
  CHECK(empty.storage().key_values() == C::layers * 3 * tlm::kv_dim<C>);
  CHECK(empty.storage().value_values() == C::layers * 3 * tlm::kv_dim<C>);
  auto one = std::move(empty).push();
  for (std::size_t l = 0; l < C::layers; ++l)
    for (std::size_t g = 0; g < C::kv_heads; ++g) {
      auto k = one.newest_key(l, g);
      auto v = one.newest_value(l, g);
      for (std::size_t i = 0; i < E; ++i) {
        k[i] = static_cast<float>(100 * l + 10 * g + i);
        v[i] = -k[i];
      }
    }
  auto two = std::move(one).push();
  two.newest_key(1, 1)[0] = 42.0f;
  CHECK(two.keys(1, 1).size() == 2 * E);
  CHECK(two.key_at<0>(1, 1)[0] == doctest::Approx(110.0));
  CHECK(two.key_at<1>(1, 1)[0] == doctest::Approx(42.0));
  CHECK(two.value_at<0>(0, 1)[3] == doctest::Approx(-13.0));
  // Per kv head, positions are contiguous with head_dim as the stride.
  CHECK(two.keys(1, 1)[E] == doctest::Approx(42.0));
}

TEST_CASE("run-time cache: the same bound, checked at run time with a clear error") {
  tlm::kv_cache<C> cache(2);
  CHECK(cache.capacity() == 2);
  CHECK(cache.length() == 0);
  CHECK_THROWS_AS(cache.newest_key(0, 0), tlm::capacity_error);
  cache.push();
  cache.newest_key(0, 1)[0] = 7.0f;
  cache.push();
  CHECK(cache.keys(0, 1).size() == 2 * E);
  CHECK(cache.keys(0, 1)[0] == doctest::Approx(7.0));
  CHECK(cache.room() == 0);
  try {
    cache.push();
    FAIL("push into a full cache must throw");
  } catch (const tlm::capacity_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("KV cache full") != std::string::npos);
    CHECK(msg.find("2 positions") != std::string::npos);
    CHECK(msg.find("larger capacity") != std::string::npos);
  }
  CHECK(cache.length() == 2);  // a failed push loses nothing
  CHECK(cache.keys(0, 1)[0] == doctest::Approx(7.0));
  cache.truncate(1);
  CHECK(cache.length() == 1);
  CHECK_THROWS_AS(cache.truncate(2), tlm::capacity_error);
  cache.clear();
  CHECK(cache.length() == 0);
}

TEST_CASE("run-time cache: capacity must be within the context") {
  CHECK_THROWS_AS(tlm::kv_cache<C>(0), tlm::capacity_error);
  CHECK_THROWS_AS(tlm::kv_cache<C>(C::context + 1), tlm::capacity_error);
  CHECK_NOTHROW(tlm::kv_cache<C>{C::context});
  try {
    tlm::kv_cache<C> too_big(C::context + 1);
  } catch (const tlm::error& e) {
    CHECK(std::string(e.what()).find("context length") != std::string::npos);
  }
}

TEST_CASE("layers and kv heads do not overlap in the flat storage") {
  tlm::kv_cache<C> cache(4);
  for (std::size_t p = 0; p < 4; ++p) {
    cache.push();
    for (std::size_t l = 0; l < C::layers; ++l)
      for (std::size_t g = 0; g < C::kv_heads; ++g)
        for (std::size_t i = 0; i < E; ++i) cache.newest_value(l, g)[i] = static_cast<float>(1000 * l + 100 * g + 10 * p + i);
  }
  for (std::size_t l = 0; l < C::layers; ++l)
    for (std::size_t g = 0; g < C::kv_heads; ++g) {
      auto v = cache.values(l, g);
      REQUIRE(v.size() == 4 * E);
      for (std::size_t p = 0; p < 4; ++p)
        for (std::size_t i = 0; i < E; ++i) CHECK(v[p * E + i] == doctest::Approx(1000 * l + 100 * g + 10 * p + i));
    }
}

}  // namespace test_kv
