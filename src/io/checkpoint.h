// A model folder as downloaded from a hub: config.json plus one safetensors file or several
// shards listed in model.safetensors.index.json. Opening maps every shard, checks that the index
// and the shards agree (each indexed tensor is in the shard the index names; no tensor twice),
// and computes the checkpoint identity used by pack files (a hash of the index, every shard
// header and config.json). Tensor lookups by hub name throw errors that name the tensor.
#pragma once

#include "io/safetensors.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moet {

class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);

  const HostTensor* find(std::string_view name) const;
  const HostTensor& get(std::string_view name) const;
  // All tensor names, sorted.
  const std::vector<std::string>& names() const { return names_; }
  const nlohmann::json& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }
  // Hex digest of index + shard headers + config.json: changes when any of them changes.
  const std::string& identity() const { return identity_; }
  uint64_t total_bytes() const;

 private:
  std::filesystem::path dir_;
  nlohmann::json config_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const HostTensor*, std::less<>> by_name_;
  std::vector<std::string> names_;
  std::string identity_;
};

// Reads and parses a JSON file; errors name the file.
nlohmann::json json_read_file(const std::filesystem::path& path);

}  // namespace moet
