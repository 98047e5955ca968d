// Pack naming, slot layout, sidecar (de)serialisation and the staleness check (pack_format.h).
#include "io/pack_format.h"

#include "core/error.h"

#include <xxhash.h>

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace moet {
namespace {

uint64_t round_up(uint64_t n, uint64_t align) { return (n + align - 1) / align * align; }

std::string body_checksum(const nlohmann::json& body) {
  const std::string text = body.dump();
  return fmt::format("{:016x}", XXH64(text.data(), text.size(), 0));
}

}  // namespace

const char* pack_quantizer_abi(StoreFormat format) {
  switch (format) {
    case StoreFormat::w2: return "moet-w2-sym4-e8m0-rowmajor-a32-v1";
    case StoreFormat::w2k: return "moet-w2k-e8p-ue5m3-rowmajor-a32-v1";
    case StoreFormat::fp4: return "moet-mxfp4-e8m0-rowmajor-a32-v1";
  }
  return "?";
}

SlotLayout slot_layout(StoreFormat format, int64_t hidden, int64_t intermediate) {
  SlotLayout s;
  s.hidden = hidden;
  s.intermediate = intermediate;
  s.codes13 = 0;
  s.scales13 = store_codes_bytes(format, 2 * intermediate, hidden);
  s.codes2 = s.scales13 + store_scales_bytes(2 * intermediate, hidden);
  s.scales2 = s.codes2 + store_codes_bytes(format, hidden, intermediate);
  s.slot_bytes = s.scales2 + store_scales_bytes(hidden, intermediate);
  s.stride = round_up(s.slot_bytes, kPackAlign);
  return s;
}

PackPaths pack_paths(const std::filesystem::path& dir, StoreFormat format, int rank, int world) {
  const std::string base = fmt::format("experts-{}-rank{}of{}", store_format_name(format), rank, world);
  return {dir / (base + ".pack"), dir / (base + ".json"), dir / (base + ".lock")};
}

nlohmann::json pack_sidecar_json(const PackSpec& spec) {
  const SlotLayout s = spec.layout();
  nlohmann::json body = {
      {"format_version", kPackFormatVersion},
      {"quantizer_abi", pack_quantizer_abi(spec.format)},
      {"format", store_format_name(spec.format)},
      {"zero_mode", zero_mode_name(spec.zero_mode)},
      {"checkpoint_identity", spec.identity},
      {"n_layers", spec.n_layers},
      {"n_experts", spec.n_experts},
      {"rank", spec.rank},
      {"world", spec.world},
      {"expert_begin", spec.expert_begin()},
      {"expert_count", spec.expert_count()},
      {"hidden", spec.hidden},
      {"intermediate", spec.intermediate},
      {"slot", {{"codes13", s.codes13}, {"scales13", s.scales13}, {"codes2", s.codes2},
                {"scales2", s.scales2}, {"slot_bytes", s.slot_bytes}}},
      {"stride", s.stride},
      {"file_bytes", spec.file_bytes()},
      {"layers", spec.layers},
  };
  if (spec.w2_quantizer != W2Quantizer::reference) body["w2_quantizer"] = w2_quantizer_name(spec.w2_quantizer);
  if (!spec.imatrix.empty()) body["imatrix"] = spec.imatrix;
  if (spec.w2k_quantizer != W2kQuantizer::reference) body["w2k_quantizer"] = w2k_quantizer_name(spec.w2k_quantizer);
  if (!spec.layer_moments.empty()) body["layer_moments"] = spec.layer_moments;
  if (!spec.expert_moments.empty()) body["expert_moments"] = spec.expert_moments;
  if (!spec.expert_moments.empty() && !spec.layer_moments.empty())
    body["expert_moments_prior"] = spec.expert_moments_prior;
  body["checksum"] = body_checksum(body);
  return body;
}

PackSpec pack_sidecar_read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MOET_CHECK(in.good(), "pack sidecar {}: cannot open", path.string());
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    fail("corrupt pack sidecar {}: not JSON ({})", path.string(), e.what());
  }
  try {
    nlohmann::json body = j;
    body.erase("checksum");
    MOET_CHECK(j.at("checksum").get<std::string>() == body_checksum(body),
               "corrupt pack sidecar {}: checksum mismatch", path.string());
    PackSpec spec;
    spec.format = store_format_parse(j.at("format").get<std::string>());
    spec.zero_mode = zero_mode_parse(j.at("zero_mode").get<std::string>());
    spec.identity = j.at("checkpoint_identity").get<std::string>();
    spec.n_layers = j.at("n_layers").get<int64_t>();
    spec.n_experts = j.at("n_experts").get<int64_t>();
    spec.rank = j.at("rank").get<int>();
    spec.world = j.at("world").get<int>();
    spec.hidden = j.at("hidden").get<int64_t>();
    spec.intermediate = j.at("intermediate").get<int64_t>();
    spec.layers = j.at("layers").get<std::vector<int64_t>>();
    spec.w2_quantizer = w2_quantizer_parse(j.value("w2_quantizer", "reference"));
    spec.imatrix = j.value("imatrix", "");
    spec.w2k_quantizer = w2k_quantizer_parse(j.value("w2k_quantizer", "reference"));
    spec.layer_moments = j.value("layer_moments", "");
    spec.expert_moments = j.value("expert_moments", "");
    spec.expert_moments_prior = j.value("expert_moments_prior", int64_t(0));
    MOET_CHECK(j.at("format_version").get<int>() == kPackFormatVersion,
               "pack sidecar {}: format version {}, this build uses {}", path.string(),
               j.at("format_version").dump(), kPackFormatVersion);
    MOET_CHECK(j.at("quantizer_abi").get<std::string>() == pack_quantizer_abi(spec.format),
               "pack sidecar {}: quantizer ABI '{}', this build uses '{}'", path.string(),
               j.at("quantizer_abi").get<std::string>(), pack_quantizer_abi(spec.format));
    // The derived fields must agree with what this build computes from the spec.
    MOET_CHECK(pack_sidecar_json(spec) == j, "pack sidecar {}: fields inconsistent with "
               "format version {} / this quantizer", path.string(), kPackFormatVersion);
    return spec;
  } catch (const nlohmann::json::exception& e) {
    fail("corrupt pack sidecar {}: {}", path.string(), e.what());
  }
}

std::string pack_check(const PackPaths& paths, const PackSpec& expected) {
  std::error_code ec;
  if (!std::filesystem::exists(paths.sidecar, ec)) return fmt::format("no sidecar {}", paths.sidecar.string());
  if (!std::filesystem::exists(paths.pack, ec)) return fmt::format("no pack file {}", paths.pack.string());
  PackSpec have;
  try {
    have = pack_sidecar_read(paths.sidecar);
  } catch (const Error& e) {
    return e.what();
  }
  const nlohmann::json a = pack_sidecar_json(have), b = pack_sidecar_json(expected);
  // Primary fields first (in this order), so the reason names the cause, not a derived field.
  static const char* const kOrder[] = {"format", "checkpoint_identity", "zero_mode", "w2_quantizer", "imatrix",
                                       "w2k_quantizer", "layer_moments", "expert_moments", "expert_moments_prior",
                                       "n_layers", "n_experts", "rank", "world", "hidden", "intermediate", "layers"};
  std::vector<std::string> keys(std::begin(kOrder), std::end(kOrder));
  for (const auto& [key, value] : b.items()) keys.push_back(key);
  for (const auto& [key, value] : a.items()) keys.push_back(key);
  const auto field = [](const nlohmann::json& j, const std::string& key) {  // optional fields may be absent
    return j.contains(key) ? j.at(key) : nlohmann::json();
  };
  for (const std::string& key : keys) {
    if (key != "checksum" && field(a, key) != field(b, key))
      return fmt::format("sidecar field '{}' is {} but {} is expected", key, field(a, key).dump(),
                         field(b, key).dump());
  }
  const uint64_t size = std::filesystem::file_size(paths.pack, ec);
  if (ec || size != expected.file_bytes())
    return fmt::format("pack file {} has {} bytes, the sidecar implies {} (truncated or foreign)",
                       paths.pack.string(), ec ? 0 : size, expected.file_bytes());
  return "";
}

}  // namespace moet
