// Checkpoint tensors -> SourceViews and pack specs (see pack_source.h).
#include "io/pack_source.h"

#include "core/error.h"

#include <cstring>

namespace moet {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Shape without the expert dimension, and the byte offset of `expert`'s slice.
std::vector<int64_t> sliced_shape(const HostTensor& t, int64_t expert, int matrix_rank, uint64_t* offset) {
  std::vector<int64_t> shape = t.shape;
  *offset = 0;
  if (expert >= 0 && int(shape.size()) == matrix_rank + 1) {
    MOET_CHECK(expert < shape[0], "tensor {}: expert {} out of range [0, {})", t.name, expert, shape[0]);
    *offset = uint64_t(expert) * (t.bytes / uint64_t(shape[0]));
    shape.erase(shape.begin());
  }
  MOET_CHECK(int(shape.size()) == matrix_rank, "tensor {}: shape {} is not an expert matrix", t.name, t.shape_text());
  return shape;
}

const uint8_t* slice(const HostTensor& t, int64_t expert, int matrix_rank) {
  uint64_t offset;
  sliced_shape(t, expert, matrix_rank, &offset);
  return t.data + offset;
}

}  // namespace

SourceView checkpoint_source_view(const Checkpoint& ckpt, const std::string& name, int64_t expert) {
  SourceView v;
  v.name = name;
  uint64_t offset;
  if (ends_with(name, "_blocks")) {
    const HostTensor& blocks = ckpt.get(name);
    const auto shape = sliced_shape(blocks, expert, 3, &offset);
    MOET_CHECK(blocks.dtype == DType::u8 && shape[2] == 16, "tensor {}: expected U8 [.., N, K/32, 16]", name);
    v.format = SourceFormat::mxfp4;
    v.rows = shape[0];
    v.cols = shape[1] * 32;
    v.data = blocks.data + offset;
    v.scales = slice(ckpt.get(name.substr(0, name.size() - 7) + "_scales"), expert, 2);
    return v;
  }
  const HostTensor& w = ckpt.get(name);
  const auto shape = sliced_shape(w, expert, 2, &offset);
  v.rows = shape[0];
  v.cols = shape[1];
  v.data = w.data + offset;
  switch (w.dtype) {
    case DType::bf16: v.format = SourceFormat::bf16; return v;
    case DType::f16: v.format = SourceFormat::f16; return v;
    case DType::f32: v.format = SourceFormat::f32; return v;
    case DType::f8_e4m3: {
      const HostTensor& s = ckpt.get(name + "_scale_inv");
      v.format = SourceFormat::fp8_block;
      v.scales = slice(s, expert, 2);
      v.scales_dtype = s.dtype;
      const auto& q = ckpt.config().value("quantization_config", nlohmann::json::object());
      if (q.contains("weight_block_size")) {
        v.block_rows = q["weight_block_size"].at(0).get<int64_t>();
        v.block_cols = q["weight_block_size"].at(1).get<int64_t>();
      }
      return v;
    }
    case DType::i8:
    case DType::u8: {
      // X.weight_scale (modelopt, Mixtral MXFP4), or X.scale (DeepSeek-V4's FP4 experts: I8 codes, UE8M0 scales).
      const std::string stem = ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : name;
      const HostTensor& s = ckpt.find(name + "_scale") ? ckpt.get(name + "_scale") : ckpt.get(stem + ".scale");
      v.cols = shape[1] * 2;
      v.scales = slice(s, expert, 2);
      if (s.dtype == DType::f8_e4m3) {
        v.format = SourceFormat::nvfp4;
        const HostTensor& g = ckpt.get(name + "_scale_2");
        MOET_CHECK(g.dtype == DType::f32 && g.bytes >= 4, "tensor {}_scale_2: expected F32", name);
        float global;
        std::memcpy(&global, g.data + (g.bytes == 4 ? 0 : 4 * uint64_t(std::max<int64_t>(expert, 0))), 4);
        v.global_scale = global;
      } else {
        MOET_CHECK(s.dtype == DType::u8 || s.dtype == DType::f8_e8m0,
                   "tensor {}: scales {} are not E4M3 (NVFP4) or U8 / F8_E8M0 (MXFP4)", name, s.name);
        v.format = SourceFormat::mxfp4;
      }
      return v;
    }
    default:
      fail("tensor {}: dtype {} is not an expert weight format", name, dtype_name(w.dtype));
  }
}

bool pack_uses_imatrix(StoreFormat format, const PackQuantizer& quantizer) {
  return quantizer.imatrix != nullptr &&
         ((format == StoreFormat::w2k && quantizer.w2k == W2kQuantizer::reference) ||
          (format == StoreFormat::w2 && quantizer.w2 == W2Quantizer::opt));
}

PackSpec pack_spec_for(const Checkpoint& ckpt, const ModelConfig& config, StoreFormat format,
                       ZeroMode zero_mode, int rank, int world, const PackQuantizer& quantizer) {
  MOET_CHECK(world >= 1 && rank >= 0 && rank < world, "pack: rank {} of {} is invalid", rank, world);
  PackSpec spec;
  spec.format = format;
  spec.zero_mode = zero_mode;
  if (format == StoreFormat::w2) spec.w2_quantizer = quantizer.w2;
  if (pack_uses_imatrix(format, quantizer)) {
    imatrix_check(*quantizer.imatrix, config, quantizer.imatrix->path);
    spec.imatrix = quantizer.imatrix->hash;
  }
  if (format == StoreFormat::w2k && quantizer.w2k == W2kQuantizer::ldlq) {
    const LdlqMoments* moments = quantizer.ldlq_moments;
    MOET_CHECK(moments != nullptr, "the w2k LDLQ quantizer needs second moments (--layer-moments, --expert-moments)");
    moments->check(config);
    spec.w2k_quantizer = W2kQuantizer::ldlq;
    if (moments->layers) spec.layer_moments = moments->layers->hash();
    if (moments->experts) spec.expert_moments = moments->experts->hash();
    if (moments->layers && moments->experts) spec.expert_moments_prior = moments->prior_tokens;
  }
  spec.identity = ckpt.identity();
  spec.n_layers = config.num_hidden_layers;
  spec.n_experts = config.n_routed_experts;
  spec.hidden = config.hidden_size;
  spec.intermediate = config.moe_intermediate_size;
  spec.rank = rank;
  spec.world = world;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l)
    if (l < int64_t(config.layer_is_moe.size()) && config.layer_is_moe[size_t(l)]) spec.layers.push_back(l);
  MOET_CHECK(!spec.layers.empty() && spec.n_experts > 0, "pack: {} has no routed experts", ckpt.dir().string());
  return spec;
}

ExpertSourceFn checkpoint_expert_sources(const Checkpoint& ckpt, const ModelConfig& config, const Imatrix* imatrix,
                                         LdlqFactors* ldlq) {
  return [&ckpt, &config, imatrix, ldlq](int64_t layer, int64_t expert) {
    const auto names = config.expert_tensor_names(layer, expert);
    ExpertSources sources{checkpoint_source_view(ckpt, names.gate), checkpoint_source_view(ckpt, names.up),
                          checkpoint_source_view(ckpt, names.down)};
    if (imatrix != nullptr) {
      sources.gate_up_importance = imatrix->input(layer, expert, false);
      sources.down_importance = imatrix->input(layer, expert, true);
    }
    if (ldlq != nullptr) {
      sources.gate_up_ldlq = ldlq->get(layer, expert, false);
      sources.down_ldlq = ldlq->get(layer, expert, true);
    }
    return sources;
  };
}

}  // namespace moet
