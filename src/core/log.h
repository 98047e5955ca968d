// Logging: leveled, timestamped lines on stderr. The level is set once at the edge (--log-level
// or MOET_LOG_LEVEL) and read by everyone; writing a line is thread-safe.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace moet {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

void log_set_level(LogLevel level);
LogLevel log_level();
// Parses "debug|info|warn|error|off"; throws moet::Error on anything else.
LogLevel log_level_parse(std::string_view name);
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_at(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < log_level()) return;
  log_write(level, fmt::format(format, std::forward<Args>(args)...));
}

#define MOET_LOG_DEBUG(...) ::moet::log_at(::moet::LogLevel::debug, __VA_ARGS__)
#define MOET_LOG_INFO(...) ::moet::log_at(::moet::LogLevel::info, __VA_ARGS__)
#define MOET_LOG_WARN(...) ::moet::log_at(::moet::LogLevel::warn, __VA_ARGS__)
#define MOET_LOG_ERROR(...) ::moet::log_at(::moet::LogLevel::error, __VA_ARGS__)

}  // namespace moet
