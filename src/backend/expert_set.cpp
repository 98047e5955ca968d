// expert_set_check() and expert_set_assign() (see expert_types.h): what every backend's
// expert_set() and expert_set_update() demand of a layer.
#include "backend/backend.h"

namespace moet {

DType expert_set_check(const ExpertLayout& layout, const std::vector<ExpertWeights>& experts, ExpertFormat tier) {
  MOET_CHECK(!experts.empty(), "an MoE layer needs experts");
  const int64_t hidden = layout.hidden, inner = layout.inner;
  DType dense_dtype = DType::f32;
  bool first = true;
  for (const ExpertWeights& e : experts) {
    if (!e.present()) continue;
    MOET_CHECK(e.format == layout.format || (tier != ExpertFormat::dense && e.format == tier),
               "the experts of one layer must share one format (or be of its recovery tier's)");
    if (e.format == ExpertFormat::dense) {
      MOET_CHECK((e.gate_up.dtype == DType::bf16 || e.gate_up.dtype == DType::f32) && e.down.dtype == e.gate_up.dtype &&
                     (first || e.gate_up.dtype == dense_dtype),
                 "dense experts must be BF16 or F32, one dtype per layer");
      MOET_CHECK(e.gate_up.shape == std::vector<int64_t>({2 * inner, hidden}) &&
                     e.down.shape == std::vector<int64_t>({hidden, inner}),
                 "dense expert shapes gate_up [{}, {}] down [{}, {}] differ from the layer's [{}, {}] / [{}, {}]",
                 e.gate_up.dim(0), e.gate_up.dim(1), e.down.dim(0), e.down.dim(1), 2 * inner, hidden, hidden, inner);
      dense_dtype = e.gate_up.dtype;
      first = false;
      continue;
    }
    // Block formats: U8 codes [rows, cols * bits / 8] and UE8M0 scales [rows, cols / 32].
    const int64_t bits = expert_format_bits(e.format);
    MOET_CHECK(e.gate_up.dtype == DType::u8 && e.down.dtype == DType::u8 && e.gate_up_scales.dtype == DType::u8 &&
                   e.down_scales.dtype == DType::u8 && hidden % 32 == 0 && inner % 32 == 0 &&
                   e.gate_up.shape == std::vector<int64_t>({2 * inner, hidden * bits / 8}) &&
                   e.down.shape == std::vector<int64_t>({hidden, inner * bits / 8}) &&
                   e.gate_up_scales.numel() == 2 * inner * (hidden / 32) && e.down_scales.numel() == hidden * (inner / 32),
               "malformed {} expert planes: gate_up [{}, {}] down [{}, {}] for hidden {} inner {}",
               layout.format == ExpertFormat::w2    ? "W2"
               : layout.format == ExpertFormat::w2k ? "W2K"
                                                    : "FP4",
               e.gate_up.dim(0), e.gate_up.dim(1), e.down.dim(0), e.down.dim(1), hidden,
               inner);
  }
  return dense_dtype;
}

void expert_set_assign(ExpertSet& set, std::span<const int64_t> experts, std::span<const ExpertWeights> weights) {
  MOET_CHECK(experts.size() == weights.size(), "expert_set_update: {} entries for {} weights", experts.size(),
             weights.size());
  for (size_t i = 0; i < experts.size(); ++i) {
    MOET_CHECK(experts[i] >= 0 && size_t(experts[i]) < set.experts.size(), "expert {} outside the layer", experts[i]);
    set.experts[size_t(experts[i])] = weights[i];
  }
}

}  // namespace moet
