// ApiError: a client-visible failure with its HTTP status, rendered as OpenAI's error JSON
// {"error": {"message", "type", "param", "code"}}. Handlers throw it; the server's exception
// handler turns it (and a moet::Error from validation below the server, as a 400) into a response.
#pragma once

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <string>

namespace moet::server {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : Error(message), status_(status), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  nlohmann::ordered_json body() const;

 private:
  int status_;
  std::string param_;
  std::string code_;
};

// The OpenAI error type for a status: invalid_request_error, authentication_error, ...
std::string api_error_type(int status);
nlohmann::ordered_json api_error_body(int status, const std::string& message, const std::string& param = {},
                              const std::string& code = {});

template <typename... Args>
[[noreturn]] void bad_request(const std::string& param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, fmt::format(format, std::forward<Args>(args)...), param);
}

}  // namespace moet::server
