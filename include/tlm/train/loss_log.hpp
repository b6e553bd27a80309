#pragma once
// The trainer's loss log: loss.csv, one row per step (the losses with 17 digits, so two
// runs compare bit for bit), and loss.svg, the training loss as a line and the held-out
// loss as dots on axes with round ticks. Both are rewritten whole, atomically, before
// each checkpoint; a resume reads the rows back up to the checkpoint's step.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <tlm/train/checkpoint.hpp>
#include <tlm/train/progress.hpp>

namespace tlm {

// One step of the log.
struct loss_log_row {
  std::size_t step;
  double loss, held_out, lr, grad_norm, tokens_per_s;  // held_out: NaN when not measured
};

// The rows of loss.csv up to `up_to_step`: the log is written before its checkpoint, so
// after a kill between the two it runs ahead of the checkpoint a resume starts from.
inline std::vector<loss_log_row> read_loss_log(const std::filesystem::path& p, std::size_t up_to_step) {
  std::vector<loss_log_row> rows;
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    loss_log_row r{};
    std::string held;
    std::istringstream s(line);
    char c = 0;
    if (!(s >> r.step >> c >> r.loss >> c) || !std::getline(s, held, ',') || !(s >> r.lr >> c >> r.grad_norm >> c >> r.tokens_per_s)) continue;
    r.held_out = held.empty() ? NAN : std::stod(held);
    if (r.step <= up_to_step) rows.push_back(r);
  }
  return rows;
}

// Rewrites loss.csv and loss.svg in `dir` from all rows of the run so far.
inline void write_loss_log(const std::filesystem::path& dir, const std::vector<loss_log_row>& rows) {
  std::string csv = "step,loss,held_out_loss,lr,grad_norm,tokens_per_s\n";
  for (const auto& r : rows)
    csv += fmt::format("{},{:.17g},{},{:.9g},{:.9g},{:.1f}\n", r.step, r.loss, std::isnan(r.held_out) ? "" : fmt::format("{:.17g}", r.held_out), r.lr,
                       r.grad_norm, r.tokens_per_s);
  detail::write_file_atomic(dir / "loss.csv", csv);
  // The plot: training loss as a line, held-out loss as dots on the same axes.
  const double w = 800, h = 400, m = 50;
  double lo = INFINITY, hi = -INFINITY;
  std::size_t s0 = rows.empty() ? 0 : rows.front().step, s1 = rows.empty() ? 1 : rows.back().step;
  if (s1 == s0) s1 = s0 + 1;
  for (const auto& r : rows) {
    lo = std::min({lo, r.loss, std::isnan(r.held_out) ? r.loss : r.held_out});
    hi = std::max({hi, r.loss, std::isnan(r.held_out) ? r.loss : r.held_out});
  }
  if (!(hi > lo)) { lo -= 1; hi += 1; }
  const auto X = [&](std::size_t s) { return m + (w - 2 * m) * static_cast<double>(s - s0) / static_cast<double>(s1 - s0); };
  const auto Y = [&](double l) { return h - m - (h - 2 * m) * (l - lo) / (hi - lo); };
  // Ticks at round values on both axes, with faint grid lines, so a reader can tell
  // where the loss was at a step without the extremes alone.
  std::string ticks;
  for (const double v : nice_ticks(lo, hi, 4))
    ticks += fmt::format("<line x1=\"{m}\" y1=\"{y:.1f}\" x2=\"{r}\" y2=\"{y:.1f}\" stroke=\"#ddd\"/>"
                         "<text class=\"y-tick\" x=\"{tx}\" y=\"{ty:.1f}\" text-anchor=\"end\">{v:.6g}</text>\n",
                         fmt::arg("m", m), fmt::arg("r", w - m), fmt::arg("y", Y(v)), fmt::arg("tx", m - 4), fmt::arg("ty", Y(v) + 4), fmt::arg("v", v));
  for (const double v : nice_ticks(static_cast<double>(s0), static_cast<double>(s1), 4)) {
    if (v != std::floor(v)) continue;  // steps are whole
    const double x = X(static_cast<std::size_t>(v));
    ticks += fmt::format("<line x1=\"{x:.1f}\" y1=\"{b}\" x2=\"{x:.1f}\" y2=\"{b5}\" stroke=\"black\"/>"
                         "<text class=\"x-tick\" x=\"{x:.1f}\" y=\"{ty}\" text-anchor=\"middle\">{v:.0f}</text>\n",
                         fmt::arg("x", x), fmt::arg("b", h - m), fmt::arg("b5", h - m + 5), fmt::arg("ty", h - m + 18), fmt::arg("v", v));
  }
  std::string svg = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
                                "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
                                "<line x1=\"{m}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/><line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{b}\" stroke=\"black\"/>\n"
                                "<text x=\"{cx}\" y=\"{ty}\" text-anchor=\"middle\">step</text>\n"
                                "<text x=\"12\" y=\"{cy}\" transform=\"rotate(-90 12 {cy})\" text-anchor=\"middle\">loss</text>\n"
                                "<text x=\"{r}\" y=\"20\" text-anchor=\"end\"><tspan fill=\"steelblue\">training loss</tspan> <tspan fill=\"darkorange\">held-out loss</tspan></text>\n",
                                w, h, fmt::arg("m", m), fmt::arg("b", h - m), fmt::arg("r", w - m), fmt::arg("ty", h - m + 36), fmt::arg("cx", w / 2),
                                fmt::arg("cy", h / 2));
  svg += ticks;
  svg += "<polyline fill=\"none\" stroke=\"steelblue\" points=\"";
  for (const auto& r : rows) svg += fmt::format("{:.1f},{:.1f} ", X(r.step), Y(r.loss));
  svg += "\"/>\n";
  for (const auto& r : rows)
    if (!std::isnan(r.held_out)) svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"darkorange\"/>\n", X(r.step), Y(r.held_out));
  svg += "</svg>\n";
  detail::write_file_atomic(dir / "loss.svg", svg);
}

}  // namespace tlm
