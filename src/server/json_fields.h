// Typed reads of request-body fields with OpenAI-style errors: a field of the wrong type or out of
// range is a 400 naming the field (`param`). Absent or null fields give the default. Unknown fields
// are never looked at, so they are ignored, as OpenAI does.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace moet::server {

using Json = nlohmann::ordered_json;  // keeps the order of object keys (schema properties, tool parameters)

bool json_has(const Json& body, const char* key);  // present and not null
double json_number(const Json& body, const char* key, double fallback);
int64_t json_int(const Json& body, const char* key, int64_t fallback);
bool json_bool(const Json& body, const char* key, bool fallback);
std::string json_string(const Json& body, const char* key, const std::string& fallback);
// A string or an array of strings (OpenAI "stop"); empty when absent.
std::vector<std::string> json_string_or_list(const Json& body, const char* key);
const Json* json_object(const Json& body, const char* key);  // nullptr when absent
const Json* json_array(const Json& body, const char* key);   // nullptr when absent

}  // namespace moet::server
