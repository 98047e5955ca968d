// DeepSeek-V4 (model_type deepseek_v4, DeepseekV4ForCausalLM; V4-Flash, V4-Pro): hyper-connections
// around every block (hc_mult streams, Sinkhorn-normalised mixing: models/hyper_connection.h),
// shared-KV attention over a sliding window plus compressed KV entries per layer type (sliding
// only, compressed sparse attention with the lightning indexer, heavily compressed attention:
// models/compressed_attention.h), the grouped low-rank output projection, MoE in every layer with
// sqrtsoftplus scores, hash routing (tid2eid) in the first layers, the SwiGLU clamp swiglu_limit
// in routed and shared experts. Config fields as transformers 5.17 writes them or as the hub's
// config.json ships them (compress_ratios per layer, num_hash_layers, qk_rope_head_dim,
// rope_scaling with compress_rope_theta); absent ones take DeepseekV4Config's defaults. Tensor
// names are the hub's (DeepSeek's own: "layers.N.attn.wq_a.weight", "layers.N.ffn.experts.E.w1",
// "embed.weight", "head.weight", "hc_head_fn", ...), which transformers converts when it loads
// them. The MTP module ("mtp.0.*") is not loaded.
#include "models/arch/arch.h"

#include "core/error.h"
#include "models/compressed_attention.h"

namespace moet {
namespace {

using nlohmann::json;
using namespace config_json;

const std::vector<std::string> kLayerTypes = {"sliding_attention", "compressed_sparse_attention",
                                              "heavily_compressed_attention"};

// Per layer: sliding_attention, compressed_sparse_attention or heavily_compressed_attention.
std::vector<std::string> read_v4_layer_types(const json& c, int64_t n) {
  if (present(c, "layer_types")) return read_layer_types(c, "layer_types", n, kLayerTypes);
  std::vector<std::string> types;
  if (present(c, "compress_ratios")) {
    const json& ratios = c["compress_ratios"];
    MOET_CHECK(ratios.is_array() && int64_t(ratios.size()) >= n, "config.json: 'compress_ratios' must list {} layers",
               n);
    for (int64_t l = 0; l < n; ++l) {
      const int64_t r = ratios[size_t(l)].is_number_integer() ? ratios[size_t(l)].get<int64_t>() : -1;
      MOET_CHECK(r == 0 || r == 4 || r == 128, "config.json: compress_ratios[{}] is {}, not 0, 4 or 128", l,
                 ratios[size_t(l)].dump());
      types.push_back(r == 0 ? kLayerTypes[0] : r == 4 ? kLayerTypes[1] : kLayerTypes[2]);
    }
    return types;
  }
  for (int64_t l = 0; l < n; ++l)  // transformers' default: 2 heavily compressed, then alternating
    types.push_back(l < 2 ? kLayerTypes[2] : l % 2 == 1 ? kLayerTypes[1] : kLayerTypes[2]);
  return types;
}

// The compression rate of each compressed type: compress_rates, legacy compress_rate_csa / _hca.
int64_t compress_rate(const json& c, const std::string& type) {
  const bool sparse = type == kLayerTypes[1];
  int64_t rate = sparse ? 4 : 128;
  if (present(c, "compress_rates")) rate = opt_int(c["compress_rates"], type.c_str(), rate);
  return opt_int(c, sparse ? "compress_rate_csa" : "compress_rate_hca", rate);
}

// The "main" and "compress" rope settings: rope_parameters {main, compress} as transformers writes
// them, else rope_theta (main) and compress_rope_theta with rope_scaling / rope_parameters (compress;
// yarn's attention factor 1 unless given).
void read_v4_rope(const json& c, ModelConfig& m, double partial) {
  json main, compress;
  const json params = present(c, "rope_parameters") ? c["rope_parameters"]
                      : present(c, "rope_scaling")  ? c["rope_scaling"]
                                                    : json::object();
  MOET_CHECK(params.is_object(), "config.json: rope_parameters/rope_scaling must be an object");
  if (params.contains("main") && params.contains("compress")) {
    main = params["main"];
    compress = params["compress"];
  } else {
    main = {{"rope_type", "default"}, {"rope_theta", opt_num(c, "rope_theta", 10000.0)}};
    compress = params;
    compress["rope_theta"] = opt_num(c, "compress_rope_theta", 160000.0);
    const std::string type = opt_str(compress, "rope_type", opt_str(compress, "type", "default"));
    if (type == "yarn" && !compress.contains("attention_factor")) compress["attention_factor"] = 1.0;
  }
  for (json* sub : {&main, &compress})
    if (!sub->contains("partial_rotary_factor")) (*sub)["partial_rotary_factor"] = partial;
  const auto rope = [&](const json& sub) {
    json wrapped = {{"rope_parameters", sub}};
    if (present(c, "max_position_embeddings")) wrapped["max_position_embeddings"] = c["max_position_embeddings"];
    RopeConfig r = config_read_rope(wrapped, m.head_dim, 1.0);
    r.interleaved = true;
    return r;
  };
  m.rope = rope(main);
  m.compress_rope = rope(compress);
  MOET_CHECK(m.rope.dim == m.qk_rope_head_dim && m.compress_rope.dim == m.qk_rope_head_dim,
             "config.json: the main and compress ropes must rotate qk_rope_head_dim = {} values (got {} and {})",
             m.qk_rope_head_dim, m.rope.dim, m.compress_rope.dim);
}

void read_deepseek_v4(const json& c, ModelConfig& m) {
  config_read_common(c, m);
  const int64_t n = m.num_hidden_layers;
  m.num_key_value_heads = opt_int(c, "num_key_value_heads", 1);
  MOET_CHECK(m.num_key_value_heads == 1, "config.json: deepseek_v4 attention has one shared KV head (got {})",
             m.num_key_value_heads);
  m.head_dim = opt_int(c, "head_dim", 512);
  m.q_lora_rank = opt_int(c, "q_lora_rank", 1024);
  const double partial = present(c, "partial_rotary_factor") ? opt_num(c, "partial_rotary_factor", 0.125)
                         : present(c, "qk_rope_head_dim")
                             ? double(req_int(c, "qk_rope_head_dim")) / double(m.head_dim)
                             : 64.0 / 512.0;
  m.qk_rope_head_dim = int64_t(double(m.head_dim) * partial);
  m.moe_intermediate_size = req_int(c, "moe_intermediate_size");
  m.n_routed_experts = req_int(c, "n_routed_experts");
  m.n_shared_experts = opt_int(c, "n_shared_experts", 1);
  const std::string scoring = opt_str(c, "scoring_func", "sqrtsoftplus");
  MOET_CHECK(scoring == "sqrtsoftplus" || scoring == "sigmoid" || scoring == "softmax",
             "config.json: scoring_func '{}' is not sqrtsoftplus, sigmoid or softmax", scoring);
  m.scoring = scoring == "sqrtsoftplus" ? RouterScoring::sqrtsoftplus
              : scoring == "sigmoid"    ? RouterScoring::sigmoid
                                        : RouterScoring::softmax;
  m.has_correction_bias = true;
  m.norm_topk_prob = true;  // DeepseekV4TopKRouter / HashRouter always renormalise
  m.routed_scaling_factor = opt_num(c, "routed_scaling_factor", 1.5);
  m.swiglu_limit = opt_num(c, "swiglu_limit", 10.0);
  m.sliding_window = opt_int(c, "sliding_window", 128);
  m.o_groups = opt_int(c, "o_groups", 8);
  m.o_lora_rank = opt_int(c, "o_lora_rank", 1024);
  m.index_n_heads = opt_int(c, "index_n_heads", 64);
  m.index_head_dim = opt_int(c, "index_head_dim", 128);
  m.index_topk = opt_int(c, "index_topk", 512);
  m.hc_mult = opt_int(c, "hc_mult", 4);
  m.hc_sinkhorn_iters = opt_int(c, "hc_sinkhorn_iters", 20);
  m.hc_eps = opt_num(c, "hc_eps", 1e-6);
  m.num_nextn_predict_layers = opt_int(c, "num_nextn_predict_layers", 0);
  MOET_CHECK(m.hc_mult >= 1 && m.hc_sinkhorn_iters >= 1 && m.sliding_window >= 1 && m.o_groups >= 1 &&
                 m.index_head_dim >= m.qk_rope_head_dim && m.head_dim >= m.qk_rope_head_dim,
             "config.json: inconsistent deepseek_v4 sizes (hc_mult, hc_sinkhorn_iters, sliding_window, o_groups, "
             "index_head_dim, head_dim vs qk_rope_head_dim)");
  for (const std::string& type : read_v4_layer_types(c, n)) {
    m.layer_compress_ratio.push_back(type == kLayerTypes[0] ? 0 : compress_rate(c, type));
    m.layer_runs_indexer.push_back(type == kLayerTypes[1]);
  }
  std::vector<std::string> mlp;
  if (present(c, "mlp_layer_types")) {
    mlp = read_layer_types(c, "mlp_layer_types", n, {"hash_moe", "moe"});
  } else {
    const int64_t hashed = opt_int(c, "num_hash_layers", 3);
    for (int64_t l = 0; l < n; ++l) mlp.push_back(l < hashed ? "hash_moe" : "moe");
  }
  for (int64_t l = 0; l < n; ++l) {
    m.layer_is_moe.push_back(true);
    m.layer_hash_routed.push_back(mlp[size_t(l)] == "hash_moe");
  }
  read_v4_rope(c, m, partial);
  // The hub checkpoint's own tensor names.
  m.layer_prefix = "layers.";
  m.attention_block = "attn";
  m.input_norm = "attn_norm";
  m.post_attention_norm = "ffn_norm";
  m.embed_name = "embed.weight";
  m.final_norm_name = "norm.weight";
  m.lm_head_name = "head.weight";
  m.moe_block = "ffn";
  m.expert_gate = "w1";
  m.expert_up = "w3";
  m.expert_down = "w2";
  m.router_bias = "bias";
}

}  // namespace

const ArchSpec& deepseek_v4_arch() {
  static const ArchSpec spec{"deepseek_v4", {"DeepseekV4ForCausalLM"}, "", read_deepseek_v4,
                             compressed_attention_load, compressed_attention_kv_specs};
  return spec;
}

}  // namespace moet
