// The trainer's live line fits the terminal; the terminal's width is found or defaulted;
// the loss plot's ticks are round values spread over the range.
#include <doctest/doctest.h>

#include <tlm/train/progress.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

// The file's own names, apart from the other files compiled with it (tests/CMakeLists.txt).
namespace test_train_progress {

namespace {

// The fields the trainer shows, at their widest realistic values.
tlm::live_line_parts wide_parts(const std::vector<double>& losses) {
  return {.fields = {"step 12345/100000", "loss 10.8677", "ETA 12h34m", "held-out 10.8795", "lr 3.00e-04", "12345 tok/s"}, .losses = losses};
}

}  // namespace

TEST_CASE("live line: everything on a wide terminal, and never wider than the terminal less one column") {
  std::vector<double> losses;
  for (int i = 0; i < 100; ++i) losses.push_back(10.0 - 0.05 * i + (i % 3) * 0.1);
  const auto parts = wide_parts(losses);
  const std::string wide = tlm::live_line(parts, 200);
  CHECK(wide.find("12345 tok/s") != std::string::npos);
  CHECK(tlm::display_width(wide) == 17 + 12 + 10 + 16 + 11 + 11 + 6 * 2 + 40);  // fields, gaps, a 40-bar sparkline
  for (std::size_t width = 1; width <= 200; ++width) {
    const std::string line = tlm::live_line(parts, width);
    CHECK(tlm::display_width(line) <= (width > 1 ? width - 1 : 1));
  }
  // 80 columns: the old line was ~120 and wrapped. The step, loss and ETA stay.
  const std::string line80 = tlm::live_line(parts, 80);
  CHECK(line80.starts_with("step 12345/100000  loss 10.8677  ETA 12h34m  held-out 10.8795  lr 3.00e-04"));
  CHECK(tlm::display_width(line80) <= 79);
  const std::string line40 = tlm::live_line(parts, 40);
  CHECK(line40.starts_with("step 12345/100000  loss 10.8677"));
  CHECK(line40.find("ETA") == std::string::npos);
}

TEST_CASE("terminal width: TIOCGWINSZ, else COLUMNS, else 80") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);  // a pipe has no window size
  ::setenv("COLUMNS", "57", 1);
  CHECK(tlm::terminal_width(fds[1]) == 57);
  ::setenv("COLUMNS", "wide", 1);
  CHECK(tlm::terminal_width(fds[1]) == 80);
  ::setenv("COLUMNS", "0", 1);
  CHECK(tlm::terminal_width(fds[1]) == 80);
  ::unsetenv("COLUMNS");
  CHECK(tlm::terminal_width(fds[1]) == 80);
  ::close(fds[0]);
  ::close(fds[1]);
  // A pseudo-terminal set to 123 columns: its size wins over COLUMNS.
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  const int tty = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  REQUIRE(tty >= 0);
  winsize ws{};
  ws.ws_row = 24;
  ws.ws_col = 123;
  REQUIRE(::ioctl(tty, TIOCSWINSZ, &ws) == 0);
  ::setenv("COLUMNS", "57", 1);
  CHECK(tlm::terminal_width(tty) == 123);
  ::unsetenv("COLUMNS");
  ::close(tty);
  ::close(master);
}

TEST_CASE("plot ticks: round values inside the range, at least four") {
  const auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
    bool ok = got.size() == want.size();
    for (std::size_t i = 0; ok && i < got.size(); ++i) ok = std::abs(got[i] - want[i]) < 1e-9;
    return ok;
  };
  CHECK(near(tlm::nice_ticks(1.937, 3.112), {2.0, 2.2, 2.4, 2.6, 2.8, 3.0}));
  CHECK(near(tlm::nice_ticks(0, 20), {0, 5, 10, 15, 20}));
  CHECK(near(tlm::nice_ticks(1, 100), {20, 40, 60, 80, 100}));
  CHECK(near(tlm::nice_ticks(-0.3, 0.3), {-0.3, -0.2, -0.1, 0, 0.1, 0.2, 0.3}));
  CHECK(tlm::nice_ticks(2, 2).empty());
}

}  // namespace test_train_progress
