// Parameter counts from a config (see param_count.h). Each term names the tensor it counts.
#include "models/param_count.h"

#include <regex>

namespace moet {
namespace {

// Weights stored as packed FP4 (two values a byte: U8, or DeepSeek-V4's I8) count two parameters
// per byte; integer tables (hash routing's tid2eid) are no parameters.
int64_t parameters_of(const HostTensor& info) {
  if (info.dtype == DType::i32 || info.dtype == DType::i64) return 0;
  return info.dtype == DType::u8 || info.dtype == DType::i8 ? 2 * info.numel() : info.numel();
}

// Quantization scales: X.weight_scale(_inv, _2), X.input_scale, X.scale (DeepSeek-V4), k_scale /
// v_scale; not DeepSeek-V4's hyper-connection scales (hc_attn_scale, ...), which are weights.
bool is_scale(const std::string& name) {
  static const std::regex scale(R"((weight_scale(_inv|_2)?|input_scale|(^|\.)[kv]_scale|\.scale)$)");
  return std::regex_search(name, scale);
}

int64_t layer_ratio(const ModelConfig& c, int64_t l) {
  return l < int64_t(c.layer_compress_ratio.size()) ? c.layer_compress_ratio[size_t(l)] : 0;
}

bool runs_indexer(const ModelConfig& c, int64_t l) {
  return l < int64_t(c.layer_runs_indexer.size()) && c.layer_runs_indexer[size_t(l)];
}

int64_t gqa(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  int64_t n = h * q + 2 * h * kv + q * h;     // q, k, v, o projections
  if (c.attention_bias) n += q + 2 * kv;       // q/k/v biases
  if (c.qk_norm) n += 2 * c.head_dim;          // q_norm, k_norm
  return n;
}

int64_t mla(const ModelConfig& c, int64_t l) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const int64_t rank = c.kv_lora_rank, ql = c.q_lora_rank;
  int64_t n = ql > 0 ? h * ql + ql + ql * heads * qk : h * heads * qk;       // q_a, q_a_layernorm, q_b (or q_proj)
  n += h * (rank + c.qk_rope_head_dim) + rank;                               // kv_a_proj_with_mqa, kv_a_layernorm
  n += rank * heads * (c.qk_nope_head_dim + c.v_head_dim);                  // kv_b_proj
  n += heads * c.v_head_dim * h;                                             // o_proj
  if (c.attention_bias) n += (ql > 0 ? ql : 0) + rank + c.qk_rope_head_dim + h;  // q_a, kv_a, o biases
  if (c.index_topk > 0 && runs_indexer(c, l))  // DSA indexer: wq_b, wk, k_norm (weight, bias), weights_proj
    n += ql * c.index_n_heads * c.index_head_dim + h * c.index_head_dim + 2 * c.index_head_dim + h * c.index_n_heads;
  return n;
}

// A DeepSeek-V4 compressor of `dim` (kv and gate projections, position bias, norm).
int64_t compressor(const ModelConfig& c, int64_t dim, int64_t ratio, bool overlap) {
  const int64_t width = (overlap ? 2 : 1) * dim;
  return 2 * width * c.hidden_size + ratio * width + dim;
}

int64_t compressed(const ModelConfig& c, int64_t l) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, d = c.head_dim, ql = c.q_lora_rank;
  int64_t n = h * ql + ql + ql * heads * d;              // wq_a, q_norm, wq_b
  n += h * d + d;                                         // wkv, norm
  n += c.o_lora_rank * heads * d + c.o_groups * c.o_lora_rank * h;  // wo_a (grouped), wo_b
  n += heads;                                             // attn_sink
  const int64_t ratio = layer_ratio(c, l);
  if (ratio > 0) n += compressor(c, d, ratio, runs_indexer(c, l));
  if (ratio > 0 && runs_indexer(c, l))  // indexer: wq_b, weights_proj, its compressor
    n += ql * c.index_n_heads * c.index_head_dim + h * c.index_n_heads + compressor(c, c.index_head_dim, ratio, true);
  const int64_t mixes = (2 + c.hc_mult) * c.hc_mult;
  n += 2 * (mixes * c.hc_mult * h + mixes + 3);          // hc_attn and hc_ffn: fn, base, scale
  return n;
}

}  // namespace

int64_t ParamCounts::active() const {
  return total - routed + moe_layers * experts_per_token * routed_per_layer_expert;
}

ParamCounts param_counts(const ModelConfig& c) {
  ParamCounts p;
  const int64_t h = c.hidden_size;
  p.total = c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + h;  // embedding, LM head, final norm
  if (c.hc_mult > 0) p.total += c.hc_mult * c.hc_mult * h + c.hc_mult + 1;  // hc_head
  p.routed_per_layer_expert = 3 * h * c.moe_intermediate_size;
  p.experts_per_token = c.num_experts_per_tok;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    p.total += 2 * h;  // input and post-attention norms
    p.total += c.hc_mult > 0 ? compressed(c, l) : c.mla ? mla(c, l) : gqa(c);
    if (!c.layer_is_moe[size_t(l)]) {
      p.total += 3 * h * c.intermediate_size;
      continue;
    }
    const bool hashed = l < int64_t(c.layer_hash_routed.size()) && c.layer_hash_routed[size_t(l)];
    p.total += c.n_routed_experts * h;                                               // router
    if (c.has_correction_bias && !hashed) p.total += c.n_routed_experts;             // correction bias
    p.total += 3 * h * c.moe_intermediate_size * c.n_shared_experts;                 // shared experts
    p.routed += c.n_routed_experts * p.routed_per_layer_expert;
    ++p.moe_layers;
  }
  p.total += p.routed;
  return p;
}

CheckpointCounts param_counts(const Checkpoint& checkpoint, const ModelConfig& config) {
  static const std::regex layer_index(R"(^(?:model\.)?layers\.(\d+)\.)");
  CheckpointCounts counts;
  int64_t moe_layers = 0;
  for (bool moe : config.layer_is_moe) moe_layers += moe;
  counts.main.moe_layers = moe_layers;
  counts.main.experts_per_token = config.num_experts_per_tok;
  counts.main.routed_per_layer_expert = 3 * config.hidden_size * config.moe_intermediate_size;
  for (const auto& name : checkpoint.names()) {
    const HostTensor& info = checkpoint.get(name);
    std::smatch match;
    const bool mtp = name.rfind("mtp.", 0) == 0 ||
                     (std::regex_search(name, match, layer_index) && std::stoll(match[1]) >= config.num_hidden_layers);
    if (mtp) {
      if (!is_scale(name)) counts.mtp += parameters_of(info);
      ++counts.mtp_tensors;
      continue;
    }
    if (is_scale(name)) continue;
    counts.main.total += parameters_of(info);
    if (name.find(".experts.") != std::string::npos) counts.main.routed += parameters_of(info);
  }
  return counts;
}

}  // namespace moet
