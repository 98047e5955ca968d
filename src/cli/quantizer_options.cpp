// Quantizer flags (see quantizer_options.h).
#include "cli/quantizer_options.h"

#include "core/error.h"

#include <fmt/format.h>

namespace moet::cli {

void QuantizerFlags::add_to(CLI::App& sub) {
  sub.add_option("--w2-quantizer", w2,
                 "how w2 picks its bytes: reference (the fixed pipeline, default) or opt (each block's exponent "
                 "chosen by the error, weighted by --imatrix when given; same format)")
      ->check(CLI::IsMember({"reference", "opt"}));
  sub.add_option("--w2k-quantizer", w2k,
                 "how w2k picks its bytes: reference (each block's nearest codewords, weighted by --imatrix when "
                 "given; default) or ldlq (BlockLDLQ: the codewords chosen in order, each block's rounding error fed "
                 "back into the later columns through the inputs' second moments from --layer-moments and/or "
                 "--expert-moments, which lowers the error of the layer's outputs rather than of the weights; same format and "
                 "decoder, slower to quantize)")
      ->check(CLI::IsMember({"reference", "ldlq"}));
  sub.add_option("--imatrix", imatrix,
                 "importance matrix from `moet imatrix` for the quantizers that weigh their error by it "
                 "(the reference w2k quantizer, --w2-quantizer opt); its hash is part of a pack's identity");
  sub.add_option("--layer-moments", layer_moments,
                 "input second moments per MoE layer from `moet imatrix --layer-moments` for --w2k-quantizer "
                 "ldlq (the H of the experts --expert-moments lacks); its hash is part of a pack's identity");
  sub.add_option("--expert-moments", expert_moments,
                 "each expert's own input second moments from `moet imatrix --expert-moments` (every expert, or the "
                 "hottest with --expert-moments-top) for --w2k-quantizer ldlq: the experts it holds round against "
                 "their own H, the others against --layer-moments' (needed unless it holds every expert); its hash is "
                 "part of a pack's identity");
  sub.add_option("--expert-moments-prior", expert_moments_prior,
                 fmt::format("with --layer-moments and --expert-moments: an expert's own H counts as its routed tokens "
                             "n_e against N tokens of its layer's H, H' = (n_e H_e + N H_layer) / (n_e + N); 0 keeps "
                             "H_e as measured (default {})",
                             kDefaultExpertMomentsPrior))
      ->check(CLI::NonNegativeNumber);
}

QuantizerChoice QuantizerFlags::resolve(const std::string& format) const {
  QuantizerChoice q;
  q.w2 = w2_quantizer_parse(w2);
  q.w2k = w2k_quantizer_parse(w2k);
  MOET_CHECK(q.w2 == W2Quantizer::reference || format == "w2", "--w2-quantizer {} is for the w2 format, not {}", w2,
             format);
  MOET_CHECK(q.w2k == W2kQuantizer::reference || format == "w2k", "--w2k-quantizer {} is for the w2k format, not {}",
             w2k, format);
  const bool ldlq = q.w2k == W2kQuantizer::ldlq;
  MOET_CHECK(!ldlq || !layer_moments.empty() || !expert_moments.empty(),
             "--w2k-quantizer ldlq rounds against the layers' input second moments: give --layer-moments F (made by "
             "`moet imatrix --layer-moments F`) and/or --expert-moments F");
  MOET_CHECK(layer_moments.empty() || ldlq, "--layer-moments is read by --w2k-quantizer ldlq only");
  MOET_CHECK(expert_moments.empty() || ldlq, "--expert-moments is read by --w2k-quantizer ldlq only");
  MOET_CHECK(expert_moments_prior < 0 || (!layer_moments.empty() && !expert_moments.empty()),
             "--expert-moments-prior blends each expert's own H with its layer's: give --layer-moments and "
             "--expert-moments");
  if (!imatrix.empty()) {
    MOET_CHECK((format == "w2k" && !ldlq) || (format == "w2" && q.w2 == W2Quantizer::opt),
               "--imatrix is read by the w2k format and by --w2-quantizer opt only (not {}{})", format,
               format == "w2"  ? " with the reference quantizer"
               : ldlq          ? " with --w2k-quantizer ldlq, which weighs by --layer-moments"
                               : "");
    q.imatrix = std::make_shared<const Imatrix>(imatrix_read(imatrix));
  }
  if (!ldlq) return q;
  auto moments = std::make_shared<LdlqMoments>();
  if (!layer_moments.empty()) moments->layers = LayerMoments::read(layer_moments);
  if (!expert_moments.empty()) moments->experts = ExpertMoments::read(expert_moments);
  if (expert_moments_prior >= 0) moments->prior_tokens = expert_moments_prior;
  q.ldlq_moments = std::move(moments);
  return q;
}

}  // namespace moet::cli
