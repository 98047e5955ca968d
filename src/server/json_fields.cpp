// Typed body-field reads (see json_fields.h).
#include "server/json_fields.h"

#include "server/api_error.h"

#include <cmath>

namespace moet::server {

bool json_has(const Json& body, const char* key) {
  const auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

double json_number(const Json& body, const char* key, double fallback) {
  if (!json_has(body, key)) return fallback;
  const Json& v = body.at(key);
  if (!v.is_number()) bad_request(key, "'{}' must be a number (got {})", key, v.type_name());
  return v.get<double>();
}

int64_t json_int(const Json& body, const char* key, int64_t fallback) {
  if (!json_has(body, key)) return fallback;
  const Json& v = body.at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9e15)
    return int64_t(v.get<double>());
  bad_request(key, "'{}' must be an integer (got {})", key, v.type_name());
}

bool json_bool(const Json& body, const char* key, bool fallback) {
  if (!json_has(body, key)) return fallback;
  const Json& v = body.at(key);
  if (!v.is_boolean()) bad_request(key, "'{}' must be a boolean (got {})", key, v.type_name());
  return v.get<bool>();
}

std::string json_string(const Json& body, const char* key, const std::string& fallback) {
  if (!json_has(body, key)) return fallback;
  const Json& v = body.at(key);
  if (!v.is_string()) bad_request(key, "'{}' must be a string (got {})", key, v.type_name());
  return v.get<std::string>();
}

std::vector<std::string> json_string_or_list(const Json& body, const char* key) {
  if (!json_has(body, key)) return {};
  const Json& v = body.at(key);
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array()) bad_request(key, "'{}' must be a string or an array of strings", key);
  std::vector<std::string> out;
  for (const Json& item : v) {
    if (!item.is_string()) bad_request(key, "'{}' must be a string or an array of strings", key);
    out.push_back(item.get<std::string>());
  }
  return out;
}

const Json* json_object(const Json& body, const char* key) {
  if (!json_has(body, key)) return nullptr;
  const Json& v = body.at(key);
  if (!v.is_object()) bad_request(key, "'{}' must be an object (got {})", key, v.type_name());
  return &v;
}

const Json* json_array(const Json& body, const char* key) {
  if (!json_has(body, key)) return nullptr;
  const Json& v = body.at(key);
  if (!v.is_array()) bad_request(key, "'{}' must be an array (got {})", key, v.type_name());
  return &v;
}

}  // namespace moet::server
