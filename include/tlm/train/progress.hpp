#pragma once
// What the trainer shows while it runs: the one live line of a terminal, fitted to the
// terminal's width, and the tick values of the loss plot's axes.
//
// The live line is rewritten in place with "\r"; a line wider than the terminal wraps,
// and every later "\r" then rewrites only its last row, leaving a trail of stale rows.
// So the fields are dropped in reverse order of importance until the line fits, and the
// sparkline takes whatever room is left (up to its full width).
#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tlm {

// Columns of the terminal on `fd`: TIOCGWINSZ, else $COLUMNS (a whole number from 1
// up), else 80.
inline std::size_t terminal_width(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const std::string_view v(c);
    if (!v.empty() && v.size() <= 6 && v.find_first_not_of("0123456789") == std::string_view::npos) {
      const auto n = static_cast<std::size_t>(std::strtoul(c, nullptr, 10));
      if (n > 0) return n;
    }
  }
  return 80;
}

// Columns a UTF-8 string takes: one per code point (the line holds ASCII and the
// sparkline's block characters, each one column wide).
inline std::size_t display_width(std::string_view s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// A sparkline of the last `width` values, scaled between their minimum and maximum.
inline std::string sparkline(std::span<const double> values, std::size_t width) {
  static const char* bars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  const std::size_t start = values.size() > width ? values.size() - width : 0;
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t i = start; i < values.size(); ++i) lo = std::min(lo, values[i]), hi = std::max(hi, values[i]);
  std::string s;
  for (std::size_t i = start; i < values.size(); ++i) s += bars[hi > lo ? static_cast<int>(7.0 * (values[i] - lo) / (hi - lo) + 0.5) : 3];
  return s;
}

// The live line's parts, most important first: `fields[0]` (the step) always shows;
// later fields are dropped from the end until the line fits.
struct live_line_parts {
  std::vector<std::string> fields;  // e.g. "step 3/20", "loss 2.3456", "ETA 0m12s", ...
  std::span<const double> losses;   // for the sparkline, which takes the room left over
  std::size_t sparkline_max = 40;
};

// The line, at most `width - 1` columns: a terminal with automatic margins may wrap a
// line that fills its last column.
inline std::string live_line(const live_line_parts& p, std::size_t width) {
  const std::size_t room = width > 1 ? width - 1 : 1;
  constexpr std::string_view gap = "  ";
  std::size_t shown = p.fields.size();
  const auto text_width = [&](std::size_t n) {
    std::size_t w = 0;
    for (std::size_t i = 0; i < n; ++i) w += (i ? gap.size() : 0) + display_width(p.fields[i]);
    return w;
  };
  while (shown > 1 && text_width(shown) > room) --shown;
  std::string line;
  for (std::size_t i = 0; i < shown; ++i) line += (i ? std::string(gap) : std::string()) + p.fields[i];
  if (display_width(line) > room) {  // the step field alone is too wide: cut it (ASCII)
    line.resize(room);
    return line;
  }
  const std::size_t used = display_width(line);
  if (!p.losses.empty() && used + gap.size() + 4 <= room)  // a sparkline under 4 bars says nothing
    line += std::string(gap) + sparkline(p.losses, std::min(p.sparkline_max, room - used - gap.size()));
  return line;
}

// Round tick values for an axis over [lo, hi]: multiples of 1, 2 or 5 times a power of
// ten, the largest step that gives at least `min_ticks` of them inside the range, so a
// reader sees 2.0, 2.5, 3.0 rather than only the extremes 1.937 and 3.112.
inline std::vector<double> nice_ticks(double lo, double hi, std::size_t min_ticks = 4) {
  std::vector<double> ticks;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return ticks;
  double step = std::pow(10.0, std::ceil(std::log10(hi - lo)));
  const double shrink[] = {2, 2.5, 2};  // 10 -> 5 -> 2 -> 1 (times the power of ten)
  for (std::size_t k = 0;; ++k) {
    const double first = std::ceil(lo / step - 1e-9) * step;
    const double span = std::floor((hi - first) / step + 1e-9);  // negative: no multiple in range
    const std::size_t count = span < 0 ? 0 : static_cast<std::size_t>(span) + 1;
    if (count >= min_ticks || k > 30) {
      for (std::size_t i = 0; i < count; ++i) {
        const double t = first + static_cast<double>(i) * step;
        ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
      }
      return ticks;
    }
    step /= shrink[k % 3];
  }
}

}  // namespace tlm
