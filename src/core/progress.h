// Progress bars for long work (loading, quantizing, packing): one line on stderr with percent,
// throughput and ETA, redrawn in place on a terminal and printed every ~10% otherwise, so logs
// stay readable. Thread-safe: workers may call advance() concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace moet {

class Progress {
 public:
  // unit_bytes: when true, totals are bytes and throughput prints as MB/s or GB/s.
  Progress(std::string label, uint64_t total, bool unit_bytes = false);
  ~Progress();
  void advance(uint64_t amount);
  void finish();

 private:
  void draw(bool final_line);

  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool unit_bytes_;
  bool tty_;
  bool finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  std::mutex mutex_;
};

}  // namespace moet
