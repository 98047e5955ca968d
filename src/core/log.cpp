// Implementation of the leveled stderr logger (see log.h).
#include "core/log.h"

#include "core/error.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace moet {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("MOET_LOG_LEVEL");
  if (env == nullptr) return LogLevel::info;
  try {
    return log_level_parse(env);
  } catch (const Error&) {
    return LogLevel::info;
  }
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{initial_level()};
  return level;
}

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "D";
    case LogLevel::info: return "I";
    case LogLevel::warn: return "W";
    case LogLevel::error: return "E";
    case LogLevel::off: break;
  }
  return "?";
}

}  // namespace

void log_set_level(LogLevel level) { level_ref().store(level); }
LogLevel log_level() { return level_ref().load(std::memory_order_relaxed); }

LogLevel log_level_parse(std::string_view name) {
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warn") return LogLevel::warn;
  if (name == "error") return LogLevel::error;
  if (name == "off") return LogLevel::off;
  fail("unknown log level '{}' (expected debug, info, warn, error or off)", name);
}

void log_write(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  static const auto start = std::chrono::steady_clock::now();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "[%s %8.3f] %.*s\n", level_tag(level), seconds,
               static_cast<int>(message.size()), message.data());
}

}  // namespace moet
