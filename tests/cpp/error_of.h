// The message of the moet::Error that f() throws, or "" when it throws none: for tests of clear
// errors on bad input (included as "../error_of.h").
#pragma once

#include "core/error.h"

#include <functional>
#include <string>

namespace moet {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace moet
