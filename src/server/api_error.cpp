// ApiError implementation (see api_error.h).
#include "server/api_error.h"

namespace moet::server {

std::string api_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "internal_server_error" : "invalid_request_error";
  }
}

nlohmann::ordered_json api_error_body(int status, const std::string& message, const std::string& param,
                              const std::string& code) {
  using json = nlohmann::ordered_json;
  return {{"error",
           {{"message", message},
            {"type", api_error_type(status)},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(status) : json(code)}}}};
}

nlohmann::ordered_json ApiError::body() const { return api_error_body(status_, what(), param_, code_); }

}  // namespace moet::server
