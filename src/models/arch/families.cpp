// The supported families and config.json -> ModelConfig (see arch.h).
#include "core/error.h"
#include "models/arch/arch.h"

#include <fmt/ranges.h>

#include <algorithm>

namespace moet {
namespace {

using nlohmann::json;
using namespace config_json;

const std::vector<const ArchSpec*>& all_archs() {
  static const std::vector<const ArchSpec*> specs = {&deepseek_v3_arch(), &deepseek_v4_arch(), &glm4_moe_arch(),
                                                     &glm_moe_dsa_arch(), &mixtral_arch(), &qwen3_moe_arch()};
  return specs;
}

}  // namespace

std::vector<std::string> read_layer_types(const json& c, const char* key, int64_t layers,
                                          const std::vector<std::string>& allowed) {
  MOET_CHECK(c[key].is_array() && int64_t(c[key].size()) >= layers,
             "config.json: '{}' must list one entry per layer ({})", key, layers);
  std::vector<std::string> types;
  for (const auto& entry : c[key]) {
    if (int64_t(types.size()) == layers) break;  // longer lists: the first layers' (transformers truncates)
    MOET_CHECK(entry.is_string() && std::count(allowed.begin(), allowed.end(), entry.get<std::string>()),
               "config.json: '{}' entry {} is not one of {}", key, entry.dump(), fmt::join(allowed, ", "));
    types.push_back(entry.get<std::string>());
  }
  return types;
}

const ArchSpec& arch_for_family(const std::string& family) {
  for (const ArchSpec* spec : all_archs())
    if (spec->family == family) return *spec;
  fail("no architecture implementation for family '{}'", family);
}

const ArchSpec& arch_for_config(const json& c) {
  const std::string model_type = opt_str(c, "model_type", "");
  for (const ArchSpec* spec : all_archs())
    if (spec->family == model_type) return *spec;
  if (present(c, "architectures") && c["architectures"].is_array()) {
    for (const auto& arch : c["architectures"]) {
      if (!arch.is_string()) continue;
      for (const ArchSpec* spec : all_archs())
        if (std::count(spec->architectures.begin(), spec->architectures.end(), arch.get<std::string>())) return *spec;
    }
  }
  fail("config.json: unsupported model_type '{}' (architectures {}); supported: {}", model_type,
       present(c, "architectures") ? c["architectures"].dump() : "[]", fmt::join(model_config_supported(), ", "));
}

const std::vector<std::string>& model_config_supported() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const ArchSpec* spec : all_archs()) out.push_back(spec->family);
    for (const ArchSpec* spec : all_archs())
      if (!spec->also_for.empty()) out.push_back(fmt::format("{} (as {})", spec->also_for, spec->family));
    return out;
  }();
  return names;
}

ModelConfig model_config_parse(const json& config) {
  MOET_CHECK(config.is_object(), "config.json: not a JSON object");
  const ArchSpec& spec = arch_for_config(config);
  ModelConfig m;
  m.family = spec.family;
  m.model_type = opt_str(config, "model_type", m.family);
  try {
    spec.read_config(config, m);
  } catch (const json::exception& e) {
    fail("config.json: {}", e.what());
  }
  config_check(m);
  return m;
}

}  // namespace moet
