// Progress bar rendering (see progress.h).
#include "core/progress.h"

#include "core/log.h"

#include <fmt/format.h>

#include <cstdio>
#include <unistd.h>

namespace moet {
namespace {

std::string amount_text(double value, bool bytes) {
  if (!bytes) return fmt::format("{:.0f}", value);
  if (value >= 1e9) return fmt::format("{:.2f} GB", value / 1e9);
  return fmt::format("{:.1f} MB", value / 1e6);
}

}  // namespace

Progress::Progress(std::string label, uint64_t total, bool unit_bytes)
    : label_(std::move(label)),
      total_(total),
      unit_bytes_(unit_bytes),
      tty_(isatty(STDERR_FILENO) != 0 && log_level() <= LogLevel::info),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::advance(uint64_t amount) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_ += amount;
  const auto now = std::chrono::steady_clock::now();
  const int decile = total_ ? int(10 * done_ / total_) : 10;
  if (tty_ ? (now - last_draw_ > std::chrono::milliseconds(100)) : (decile != last_decile_ && decile < 10)) {
    last_draw_ = now;
    last_decile_ = decile;
    draw(false);
  }
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void Progress::draw(bool final_line) {
  if (log_level() > LogLevel::info) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double fraction = total_ ? double(done_) / double(total_) : 1.0;
  const double rate = seconds > 0 ? double(done_) / seconds : 0.0;
  const double eta = rate > 0 ? double(total_ - std::min(done_, total_)) / rate : 0.0;
  constexpr int kWidth = 24;
  const int filled = int(fraction * kWidth);
  std::string bar(size_t(filled), '#');
  bar.resize(kWidth, '.');
  const std::string rate_text =
      unit_bytes_ ? amount_text(rate, true) + "/s" : fmt::format("{:.1f}/s", rate);
  const std::string line =
      fmt::format("{} [{}] {:5.1f}% {} / {} {} {}", label_, bar, 100.0 * fraction,
                  amount_text(double(done_), unit_bytes_), amount_text(double(total_), unit_bytes_),
                  rate_text,
                  final_line ? fmt::format("in {:.1f}s", seconds) : fmt::format("ETA {:.0f}s", eta));
  if (tty_) {
    std::fprintf(stderr, "\r%s%s", line.c_str(), final_line ? "\n" : "");
  } else {
    log_write(LogLevel::info, line);
  }
  std::fflush(stderr);
}

}  // namespace moet
