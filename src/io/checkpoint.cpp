// Checkpoint folder opening and lookups (see checkpoint.h).
#include "io/checkpoint.h"

#include "core/error.h"
#include "core/log.h"

#include <xxhash.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace moet {
namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MOET_CHECK(in.good(), "{}: cannot open", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::filesystem::path> shard_paths(const std::filesystem::path& dir,
                                               std::string* index_text,
                                               nlohmann::json* weight_map) {
  const auto index_path = dir / "model.safetensors.index.json";
  std::vector<std::filesystem::path> paths;
  if (std::filesystem::exists(index_path)) {
    *index_text = read_text(index_path);
    const nlohmann::json index = json_read_file(index_path);
    MOET_CHECK(index.contains("weight_map") && index["weight_map"].is_object(),
               "{}: no 'weight_map' object", index_path.string());
    *weight_map = index["weight_map"];
    std::set<std::string> files;
    for (const auto& [name, file] : weight_map->items()) {
      MOET_CHECK(file.is_string(), "{}: weight_map['{}'] is not a file name", index_path.string(), name);
      files.insert(file.get<std::string>());
    }
    for (const auto& file : files) paths.push_back(dir / file);
    return paths;
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors") paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());
  MOET_CHECK(!paths.empty(), "{}: no *.safetensors files and no model.safetensors.index.json",
             dir.string());
  return paths;
}

}  // namespace

nlohmann::json json_read_file(const std::filesystem::path& path) {
  try {
    return nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", path.string(), e.what());
  }
}

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  MOET_CHECK(std::filesystem::is_directory(dir), "{}: not a model folder", dir.string());
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const auto config_path = dir / "config.json";
  MOET_CHECK(std::filesystem::exists(config_path), "{}: config.json is missing", dir.string());
  const std::string config_text = read_text(config_path);
  ckpt.config_ = json_read_file(config_path);

  std::string index_text;
  nlohmann::json weight_map = nlohmann::json::object();
  // Owned, so that a check failing in the loop below does not leak it.
  const std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
  XXH3_state_t* hash = state.get();
  XXH3_128bits_reset(hash);
  XXH3_128bits_update(hash, config_text.data(), config_text.size());
  for (const auto& path : shard_paths(dir, &index_text, &weight_map)) {
    MOET_CHECK(std::filesystem::exists(path), "{}: shard listed in the index is missing",
               path.string());
    std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(path);
    const std::string& header = file->header_json();
    XXH3_128bits_update(hash, header.data(), header.size());
    for (const auto& info : file->tensors()) {
      const auto [it, inserted] = ckpt.by_name_.emplace(info.name, &info);
      MOET_CHECK(inserted, "tensor '{}' appears in both {} and {}", info.name, it->second->file,
                 info.file);
      if (!weight_map.empty()) {
        const auto mapped = weight_map.find(info.name);
        MOET_CHECK(mapped != weight_map.end(), "{}: tensor '{}' is not in the index",
                   info.file, info.name);
        MOET_CHECK(path.filename() == mapped->get<std::string>(),
                   "tensor '{}': index says {} but it is in {}", info.name,
                   mapped->get<std::string>(), info.file);
      }
    }
    ckpt.files_.push_back(std::move(file));
  }
  for (const auto& [name, file] : weight_map.items())
    MOET_CHECK(ckpt.by_name_.count(name), "tensor '{}': the index lists it in {} but that shard "
               "does not hold it", name, file.get<std::string>());
  XXH3_128bits_update(hash, index_text.data(), index_text.size());
  const XXH128_hash_t digest = XXH3_128bits_digest(hash);
  ckpt.identity_ = fmt::format("{:016x}{:016x}", digest.high64, digest.low64);
  for (const auto& [name, info] : ckpt.by_name_) ckpt.names_.push_back(name);
  MOET_LOG_DEBUG("{}: {} tensors in {} file(s), identity {}", dir.string(), ckpt.names_.size(),
                 ckpt.files_.size(), ckpt.identity_);
  return ckpt;
}

const HostTensor* Checkpoint::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const HostTensor& Checkpoint::get(std::string_view name) const {
  const HostTensor* info = find(name);
  MOET_CHECK(info != nullptr, "{}: tensor '{}' is missing from the checkpoint", dir_.string(), name);
  return *info;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, info] : by_name_) total += info->bytes;
  return total;
}

}  // namespace moet
