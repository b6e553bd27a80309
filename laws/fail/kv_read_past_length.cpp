// Must not compile: reading position T from a kv<Cap, T>, one past the written ones.
// law-expect: position_written<P, T>.*\[with P = 2; T = 2\]
#include <tlm/kv.hpp>

#include <utility>

float peek() {
  auto k = std::move(std::move(tlm::kv<tlm::tiny_gqa, 4>{}).push()).push();
#ifdef TLM_LAW_TWIN
  return k.key_at<1>(0, 0)[0];
#else
  return k.key_at<2>(0, 0)[0];
#endif
}
