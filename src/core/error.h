// Errors: moet reports failures as moet::Error (a std::runtime_error with a one-line message that
// names the file, tensor or field at fault). Code at the edge (cli/, server/) catches it and turns
// it into an exit code or an HTTP error; nothing below the edge prints and exits on its own.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moet {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace moet

// MOET_CHECK(cond, "fmt", args...): throws moet::Error with the formatted message when cond is false.
#define MOET_CHECK(cond, ...)           \
  do {                                  \
    if (!(cond)) ::moet::fail(__VA_ARGS__); \
  } while (0)
