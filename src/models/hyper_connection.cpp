// Hyper-connection weights (see hyper_connection.h).
#include "models/hyper_connection.h"

namespace moet {
namespace {

// "<stem>fn", "<stem>base", "<stem>scale" with `mixes` outputs and `scales` scales.
HyperConnection load(const ModelConfig& c, WeightLoader& loader, const std::string& stem, int64_t mixes,
                     int64_t scales) {
  return {loader.weight_f32(stem + "fn", {mixes, c.hc_mult * c.hidden_size}), loader.weight_f32(stem + "base", {mixes}),
          loader.weight_f32(stem + "scale", {scales})};
}

}  // namespace

HyperConnectionWeights HyperConnection::weights(const ModelConfig& c) const {
  return {&fn, &base, &scale, c.hc_mult, c.hc_sinkhorn_iters, float(c.hc_eps), float(c.rms_norm_eps)};
}

std::unique_ptr<HyperConnections> hyper_layer_load(const ModelConfig& c, WeightLoader& loader, int64_t layer) {
  const int64_t mixes = (2 + c.hc_mult) * c.hc_mult;
  const std::string p = c.layer_name(layer);
  return std::make_unique<HyperConnections>(
      HyperConnections{load(c, loader, p + "hc_attn_", mixes, 3), load(c, loader, p + "hc_ffn_", mixes, 3)});
}

std::unique_ptr<HyperConnection> hyper_head_load(const ModelConfig& c, WeightLoader& loader) {
  return std::make_unique<HyperConnection>(load(c, loader, "hc_head_", c.hc_mult, 1));
}

}  // namespace moet
