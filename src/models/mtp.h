// The MTP ("next-n") layer of DeepSeek-V3-style checkpoints, exactly as tools/train/train.py
// defines and trains it (and as vLLM and SGLang run DeepSeek's): for a position i, with h_i the
// model's hidden state after its final norm and t_{i+1} the token after position i,
//   x = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])   eh_proj: [hidden, 2 hidden], embedding first
//   x = DecoderLayer_L(x)                               a full decoder layer (index L =
//                                                       num_hidden_layers), rope position i
//   g = shared_head.norm(x); logits = shared_head.head(g)   predicts t_{i+2}
// Its tensors are model.layers.L.{enorm, hnorm, eh_proj, shared_head.norm, shared_head.head,
// embed_tokens} and the layer's own attention, norms and MoE (routed experts in the model's
// ExpertPool at index L, stored in the format of the rest). DeepSeek-V3 ships the embedding and
// head as copies of the model's; byte-identical copies reuse the model's tensors. Only the first
// MTP layer is loaded: drafts beyond the first chain it on its own output g. Its KV caches come
// after the decoder's (the last layer specs); attention runs over the MTP layer's
// entries of positions 0..i exactly as in training (a causal layer of its own).
#pragma once

#include "models/blocks.h"

#include <memory>
#include <vector>

namespace moet {

struct MtpLayer {
  Tensor enorm, hnorm, eh_proj, head_norm, embed, head;
  DecoderLayer layer;

  // The rows of the step (tokens t_{i+1} from the step inputs, `hidden` the h_i [rows, hidden] on
  // the backend, only read: a replayed pass reads it again) through the layer: `normed` = g
  // [rows, hidden]; `residual` and `branch` are scratch of the same shape.
  void forward(StepContext& ctx, const Tensor& hidden, std::span<KvLayerCache> caches, float eps, Tensor& residual,
               Tensor& normed, Tensor& branch);
};

// Fails with a one-line error naming the model folder's config and tensors when the checkpoint has
// no MTP layer (num_nextn_predict_layers 0, or its tensors absent, as in fixtures that keep the
// config field only).
void mtp_require(const ModelConfig& config, const WeightLoader& loader);
// The MTP layer around `layer` (its attention and FFN, loaded by the caller like any decoder
// layer at index num_hidden_layers); `embed` and `head` are the model's, reused when the copies
// are identical.
std::unique_ptr<MtpLayer> mtp_layer_load(const ModelConfig& config, WeightLoader& loader, DecoderLayer layer,
                                         const Tensor& embed, const Tensor& head);

}  // namespace moet
