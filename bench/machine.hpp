#pragma once
// What the benchmarks record about the machine they ran on, next to their figures,
// and the median of rounds that the kernel benchmarks report.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

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

// The process's peak resident set so far, MiB.
inline double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// A flag's value as a whole number >= 1, or an error naming the program and the flag.
inline std::size_t positive_number(const std::string& program, const std::string& flag, const char* v) {
  try {
    std::size_t pos = 0;
    const long long n = std::stoll(v, &pos);
    if (pos == std::string(v).size() && n > 0) return static_cast<std::size_t>(n);
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(program + ": " + flag + " takes a whole number >= 1, not '" + v + "'");
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The median time of `reps` calls of f, in microseconds.
template <class F>
double median_us(std::size_t reps, F&& f) {
  std::vector<double> t;
  for (std::size_t r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  return median(std::move(t));
}

// Prints a finished markdown report and, with a path, writes it there too. Returns the
// benchmark's exit status: 1 when the file cannot be written.
inline int publish(const std::string& markdown, const std::string& out_path) {
  std::cout << markdown;
  if (out_path.empty()) return 0;
  std::ofstream out(out_path);
  out << markdown;
  if (!out) {
    std::cerr << "cannot write " << out_path << "; check that its folder exists and is writable\n";
    return 1;
  }
  return 0;
}

}  // namespace tlm_bench
