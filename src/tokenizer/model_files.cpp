// Model-folder file helpers (see model_files.h).
#include "tokenizer/model_files.h"

#include "core/error.h"

#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace moet::tok {

bool file_exists(const std::string& path) { return std::filesystem::is_regular_file(path); }

std::string read_file(const std::string& path) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    gzFile gz = gzopen(path.c_str(), "rb");
    if (!gz) fail("cannot open {}", path);
    std::string out;
    char buffer[1 << 16];
    int n = 0;
    while ((n = gzread(gz, buffer, sizeof(buffer))) > 0) out.append(buffer, size_t(n));
    const bool ok = n == 0;
    gzclose(gz);
    if (!ok) fail("cannot decompress {}", path);
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

nlohmann::ordered_json read_json(const std::string& path, bool optional) {
  if (optional && !file_exists(path)) return nlohmann::ordered_json::object();
  try {
    return nlohmann::ordered_json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", path, e.what());
  }
}

std::optional<std::string> config_token(const nlohmann::ordered_json& config, const std::string& key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  fail("tokenizer_config.json field '{}' is neither a string nor an AddedToken", key);
}

}  // namespace moet::tok
