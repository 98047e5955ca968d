// The confidence gate's settings and its run-time threshold (the gate itself is a step hook,
// engine/confidence_gate.h). tau is read by the step loop and changed while serving by other
// threads (POST /admin/gate) or by editing a file (--gate-tau-file, re-read when its time stamp
// changes, at most every kTauFilePollSeconds), so it is an atomic; the rest is fixed at start.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace moet {

enum class GateSignal { maxprob, margin };
GateSignal gate_signal_parse(const std::string& name);  // "maxprob" | "margin"
const char* gate_signal_name(GateSignal signal);

struct GateOptions {
  double tau = 0.0;        // a step whose confidence is <= tau runs again at FP4; 0: off
  GateSignal signal = GateSignal::maxprob;
  int64_t rounds = 1;      // gate replays of one step at most
  int64_t budget = 64;     // experts force-promoted per gated step at most
  std::string tau_file;    // empty: none
};

// Throws moet::Error naming `what` unless 0 <= tau <= 1.
void gate_tau_check(double tau, const std::string& what);

class GateControl {
 public:
  static constexpr double kTauFilePollSeconds = 0.25;

  // Checks the options; a tau file must hold a tau now (it then overrides options.tau).
  explicit GateControl(const GateOptions& options);

  double tau() const { return tau_.load(std::memory_order_relaxed); }
  // Throws moet::Error outside [0, 1].
  void set_tau(double tau);
  // Re-reads the tau file when it changed (a bad file is logged and ignored; tau stays).
  void poll_file();
  const GateOptions& options() const { return options_; }

 private:
  // The tau the file holds (nullopt and `error` when it cannot be read or is not one in [0, 1]).
  std::optional<double> read_file(std::string& error) const;

  GateOptions options_;
  std::atomic<double> tau_;
  std::filesystem::file_time_type seen_{};
  std::chrono::steady_clock::time_point next_poll_{};
};

}  // namespace moet
