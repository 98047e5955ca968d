// From a checkpoint to the formats layer: a SourceView for any expert weight as hub checkpoints
// store it, and the PackSpec / ExpertSourceFn that pack building needs. Recognised layouts of a
// weight `X.weight` (or `X_blocks` for gpt-oss style MXFP4):
//   BF16 / F16 / F32                 plain [N, K]
//   F8_E4M3 + X.weight_scale_inv     FP8 with [ceil(N/128), ceil(K/128)] F32/BF16 block scales
//                                    (block size from quantization_config.weight_block_size)
//   U8 [N, K/2] + X.weight_scale E4M3 [N, K/16] + X.weight_scale_2 F32   NVFP4 (modelopt)
//   U8 [N, K/2] + X.weight_scale U8 [N, K/32]                            MXFP4 (UE8M0 scales)
//   I8 / U8 [N, K/2] + X.scale F8_E8M0 / U8 [N, K/32]                    MXFP4 (DeepSeek-V4's experts)
//   X_blocks U8 [.., N, K/32, 16] + X_scales U8 [.., N, K/32]            MXFP4 (gpt-oss)
// A leading expert dimension (fused expert tensors) is sliced by `expert` when given (>= 0).
#pragma once

#include "formats/source.h"
#include "io/checkpoint.h"
#include "io/imatrix.h"
#include "io/ldlq_moments.h"
#include "io/model_config.h"
#include "io/pack_writer.h"

#include <string>

namespace moet {

SourceView checkpoint_source_view(const Checkpoint& ckpt, const std::string& name, int64_t expert = -1);

// How a pack's experts are quantized beyond format and zero mode: W2's and W2K's quantizers, the
// importance matrix (null: none) that W2-opt and the reference W2K weigh their error by, and the
// second moments (null: none) that W2K's LDLQ rounds against.
struct PackQuantizer {
  W2Quantizer w2 = W2Quantizer::reference;
  const Imatrix* imatrix = nullptr;
  W2kQuantizer w2k = W2kQuantizer::reference;
  const LdlqMoments* ldlq_moments = nullptr;
};
// Whether `format` with `quantizer` reads an importance matrix (the reference W2K; W2 with the
// opt quantizer).
bool pack_uses_imatrix(StoreFormat format, const PackQuantizer& quantizer);

// The pack expected for this checkpoint, format, zero mode and rank. An imatrix or second-moments
// file the quantizer reads must belong to the model (else a one-line error naming the file); its
// hash (and the blend's prior) becomes part of the pack's identity. W2K's LDLQ without second
// moments is an error.
PackSpec pack_spec_for(const Checkpoint& ckpt, const ModelConfig& config, StoreFormat format,
                       ZeroMode zero_mode, int rank = 0, int world = 1, const PackQuantizer& quantizer = {});
// Each expert's source views, with the imatrix's column importance and the LDLQ decompositions
// of its inputs' second moments (its own or its layer's: io/ldlq_moments.h) when given.
ExpertSourceFn checkpoint_expert_sources(const Checkpoint& ckpt, const ModelConfig& config,
                                         const Imatrix* imatrix = nullptr, LdlqFactors* ldlq = nullptr);

}  // namespace moet
