// GLM-5 (model_type glm_moe_dsa, GlmMoeDsaForCausalLM): DeepSeek-V3's MLA (absorbed form over the
// latent cache, interleaved rope on the rope slice) with DeepSeek sparse attention: a lightning
// indexer (models/dsa_indexer.h) with a key cache of its own chooses the index_topk keys each
// query attends to; layers whose indexer_types entry is "shared" reuse the previous "full" layer's
// choice. Dense layers from mlp_layer_types (else the first first_k_dense_replace, 3 by default);
// DeepSeek-V3's routing (sigmoid + e_score_correction_bias, groups, routed_scaling_factor) and
// shared experts. The MTP layer at index num_hidden_layers loads through models/mtp.h. Defaults of
// absent fields are transformers' (GlmMoeDsaConfig).
#include "models/arch/arch.h"

#include "core/error.h"

namespace moet {
namespace {

using nlohmann::json;
using namespace config_json;

// transformers' GlmMoeDsaConfig: "full" when max(i - offset + 1, 0) % freq == 0, unless a pattern
// ("FSS..." or a list) or the list itself is given.
std::vector<bool> read_indexer_types(const json& c, int64_t layers) {
  std::vector<std::string> types;
  if (present(c, "indexer_types")) {
    types = read_layer_types(c, "indexer_types", layers, {"full", "shared"});
  } else if (present(c, "index_topk_pattern") && c["index_topk_pattern"].is_string()) {
    const std::string pattern = c["index_topk_pattern"].get<std::string>();
    MOET_CHECK(int64_t(pattern.size()) == layers && pattern.find_first_not_of("FS") == std::string::npos,
               "config.json: 'index_topk_pattern' must be {} letters F or S", layers);
    for (char ch : pattern) types.push_back(ch == 'F' ? "full" : "shared");
  } else if (present(c, "index_topk_pattern")) {
    types = read_layer_types(c, "index_topk_pattern", layers, {"full", "shared"});
  } else {
    const int64_t freq = std::max<int64_t>(opt_int(c, "index_topk_freq", 1), 1);
    const int64_t offset = opt_int(c, "index_skip_topk_offset", 2);
    for (int64_t i = 0; i < layers; ++i)
      types.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
  }
  MOET_CHECK(types.front() == "full", "config.json: the first layer's indexer_types entry must be \"full\"");
  std::vector<bool> full;
  for (const std::string& t : types) full.push_back(t == "full");
  return full;
}

void read_glm_moe_dsa(const json& c, ModelConfig& m) {
  config_read_common(c, m);
  m.rms_norm_eps = opt_num(c, "rms_norm_eps", 1e-5);
  read_deepseek_moe(c, m);
  m.scoring = RouterScoring::sigmoid;  // GlmMoeDsaTopkRouter: always sigmoid with the correction bias
  m.has_correction_bias = true;
  if (present(c, "mlp_layer_types")) {
    const auto types = read_layer_types(c, "mlp_layer_types", m.num_hidden_layers, {"dense", "sparse"});
    for (int64_t l = 0; l < m.num_hidden_layers; ++l) m.layer_is_moe[size_t(l)] = types[size_t(l)] == "sparse";
  } else {
    const int64_t dense = opt_int(c, "first_k_dense_replace", 3);
    for (int64_t l = 0; l < m.num_hidden_layers; ++l) m.layer_is_moe[size_t(l)] = l >= dense;
  }
  read_mla(c, m);
  MOET_CHECK(m.q_lora_rank > 0, "config.json: glm_moe_dsa needs q_lora_rank (its indexer reads the q latent)");
  m.rope.interleaved = true;  // transformers ropes GLM-5's MLA and indexer interleaved whatever rope_interleave says
  m.index_topk = opt_int(c, "index_topk", 2048);
  m.index_head_dim = opt_int(c, "index_head_dim", 128);
  m.index_n_heads = opt_int(c, "index_n_heads", 32);
  MOET_CHECK(m.index_topk > 0 && m.index_n_heads > 0 && m.index_head_dim >= m.qk_rope_head_dim,
             "config.json: index_topk {} / index_n_heads {} must be positive and index_head_dim {} at least "
             "qk_rope_head_dim {}", m.index_topk, m.index_n_heads, m.index_head_dim, m.qk_rope_head_dim);
  m.layer_runs_indexer = read_indexer_types(c, m.num_hidden_layers);
}

}  // namespace

const ArchSpec& glm_moe_dsa_arch() {
  static const ArchSpec spec{"glm_moe_dsa", {"GlmMoeDsaForCausalLM"}, "", read_glm_moe_dsa, mla_attention_load,
                             mla_layer_kv_specs};
  return spec;
}

}  // namespace moet
