// Reading the tokenizer-related files of a model folder: whole files (transparently gunzipped when
// the name ends in .gz), JSON documents, and the special-token fields of tokenizer_config.json,
// which are either a string or an AddedToken object {"content": ...}. Errors name the file.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace moet::tok {

std::string read_file(const std::string& path);
bool file_exists(const std::string& path);
// Parses path as JSON with key order preserved; an empty object when the file is absent and
// optional is true.
nlohmann::ordered_json read_json(const std::string& path, bool optional = false);
// "bos_token": "<s>" or {"content": "<s>", ...} -> "<s>"; nullopt for null/absent.
std::optional<std::string> config_token(const nlohmann::ordered_json& config, const std::string& key);

}  // namespace moet::tok
