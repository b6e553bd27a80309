#pragma once
// What the benchmarks record about the machine they ran on, next to their figures.
#include <fstream>
#include <string>

namespace tlm_bench {

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  }
  return "unknown";
}

// The 1, 5 and 15 minute load averages: a benchmark on a loaded machine says so.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace tlm_bench
