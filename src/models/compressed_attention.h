// DeepSeek-V4's attention block (transformers' DeepseekV4Attention with its compressors and
// indexer), over paged caches:
//   q_res = RMSNorm(wq_a x);  q = wq_b q_res per head of head_dim, RMS-normalised without weight
//   kv    = RMSNorm(wkv x)    one key that is also the value (shared-KV MQA)
//   q and kv roped on their last qk_rope_head_dim values (pairs in place; the "main" rope in
//   sliding layers, the "compress" rope (yarn) in compressed ones)
//   keys: the last sliding_window positions of the kv cache, plus
//     heavily compressed layers: every compressed entry of a closed window (ratio m, no overlap)
//     compressed sparse layers:  the index_topk entries (ratio m, overlapping windows) the
//                                lightning indexer chooses (its own compressor at index_head_dim,
//                                queries wq_b q_res roped with the compress rope, weights_proj x)
//   attention with one learned sink logit per head (softmax scale head_dim^-0.5), the output's
//   rope slice rotated back by the query's angles, then the grouped low-rank output projection:
//   heads in o_groups groups, each group's values through its own [o_lora_rank, heads * head_dim
//   / o_groups] block of wo_a, all groups' results through wo_b.
// Compressed entries come from kernels/cpu/kv_compress.h over per-token state caches; each entry
// sits in the slot of the position that closed its window, so every cache is an ordinary paged
// cache of one row per token (the slots of other positions stay unused). Caches, in order: the
// kv rows; with compression the compressor's states and its entries; with the indexer its states
// and entries. A rank of a tensor-parallel model holds its heads (with their sinks and their part
// of the output groups) and sums the ranks' outputs with one all-reduce; the shared key, the
// compressors and the indexer are whole on every rank.
#pragma once

#include "models/blocks.h"

namespace moet {

// `prefix`: "layers.N.attn." (hub names: wq_a, q_norm, wq_b, wkv, norm, wo_a, wo_b, attn_sink,
// compressor.{wkv, wgate, ape, norm}, indexer.{wq_b, weights_proj, compressor.*}).
std::unique_ptr<AttentionBlock> compressed_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                          const std::string& prefix, int64_t layer);
std::vector<KvLayerSpec> compressed_attention_kv_specs(const ModelConfig& config, int64_t layer);

}  // namespace moet
