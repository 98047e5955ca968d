// GateControl implementation (see gate_control.h).
#include "experts/gate_control.h"

#include "core/error.h"
#include "core/log.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace moet {

GateSignal gate_signal_parse(const std::string& name) {
  if (name == "maxprob") return GateSignal::maxprob;
  if (name == "margin") return GateSignal::margin;
  fail("unknown gate signal '{}' (expected maxprob or margin)", name);
}

const char* gate_signal_name(GateSignal signal) { return signal == GateSignal::maxprob ? "maxprob" : "margin"; }

void gate_tau_check(double tau, const std::string& what) {
  MOET_CHECK(tau >= 0.0 && tau <= 1.0, "{} must be in [0, 1] (got {})", what, tau);
}

GateControl::GateControl(const GateOptions& options) : options_(options), tau_(options.tau) {
  gate_tau_check(options.tau, "--gate-tau");
  MOET_CHECK(options.rounds >= 1, "--gate-rounds must be at least 1 (got {})", options.rounds);
  MOET_CHECK(options.budget >= 1, "--gate-budget must be at least 1 (got {})", options.budget);
  if (options_.tau_file.empty()) return;
  std::error_code ec;
  seen_ = std::filesystem::last_write_time(options_.tau_file, ec);
  MOET_CHECK(!ec, "--gate-tau-file {}: {}", options_.tau_file, ec.message());
  std::string error;
  const std::optional<double> tau = read_file(error);
  MOET_CHECK(tau.has_value(), "--gate-tau-file {}: {}", options_.tau_file, error);
  tau_.store(*tau, std::memory_order_relaxed);
}

void GateControl::set_tau(double tau) {
  gate_tau_check(tau, "tau");
  tau_.store(tau, std::memory_order_relaxed);
}

std::optional<double> GateControl::read_file(std::string& error) const {
  std::ifstream in(options_.tau_file);
  if (!in.good()) {
    error = "cannot read it";
    return std::nullopt;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream parse(text);
  double tau = -1.0;
  std::string rest;
  if (!(parse >> tau) || (parse >> rest) || tau < 0.0 || tau > 1.0) {
    error = fmt::format("'{}' is not a number in [0, 1]", text.substr(0, 40));
    return std::nullopt;
  }
  return tau;
}

void GateControl::poll_file() {
  if (options_.tau_file.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_poll_) return;
  next_poll_ = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(kTauFilePollSeconds));
  std::error_code ec;
  const auto stamp = std::filesystem::last_write_time(options_.tau_file, ec);
  if (ec || stamp == seen_) return;
  seen_ = stamp;
  std::string error;
  const std::optional<double> tau = read_file(error);
  if (!tau) {
    MOET_LOG_WARN("--gate-tau-file {}: {}; tau stays {}", options_.tau_file, error, this->tau());
  } else if (*tau != this->tau()) {
    MOET_LOG_INFO("gate: tau {} (from {})", *tau, options_.tau_file);
    tau_.store(*tau, std::memory_order_relaxed);
  }
}

}  // namespace moet
