// Quantizer flags (see quantizer_options.h).
#include "cli/quantizer_options.h"

#include "core/error.h"

namespace moet::cli {

void QuantizerFlags::add_to(CLI::App& sub) {
  sub.add_option("--w2-quantizer", w2,
                 "how w2 picks its bytes: reference (the fixed pipeline, default) or opt (each block's exponent "
                 "chosen by the error, weighted by --imatrix when given; same format)")
      ->check(CLI::IsMember({"reference", "opt"}));
  sub.add_option("--w2k-quantizer", w2k,
                 "how w2k picks its bytes: reference (each block's nearest codewords, weighted by --imatrix when "
                 "given; default) or ldlq (BlockLDLQ: the codewords chosen in order, each block's rounding error fed "
                 "back into the later columns through the layer's input second moments from --layer-moments, "
                 "which lowers the error of the layer's outputs rather than of the weights; same format and "
                 "decoder, slower to quantize)")
      ->check(CLI::IsMember({"reference", "ldlq"}));
  sub.add_option("--imatrix", imatrix,
                 "importance matrix from `moet imatrix` for the quantizers that weigh their error by it "
                 "(the reference w2k quantizer, --w2-quantizer opt); its hash is part of a pack's identity");
  sub.add_option("--layer-moments", layer_moments,
                 "input second moments per MoE layer from `moet imatrix --layer-moments` for --w2k-quantizer "
                 "ldlq; its hash is part of a pack's identity");
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
  MOET_CHECK(!ldlq || !layer_moments.empty(),
             "--w2k-quantizer ldlq rounds against the layers' input second moments: give --layer-moments F (made by "
             "`moet imatrix --layer-moments F`)");
  MOET_CHECK(layer_moments.empty() || ldlq, "--layer-moments is read by --w2k-quantizer ldlq only");
  if (!imatrix.empty()) {
    MOET_CHECK((format == "w2k" && !ldlq) || (format == "w2" && q.w2 == W2Quantizer::opt),
               "--imatrix is read by the w2k format and by --w2-quantizer opt only (not {}{})", format,
               format == "w2"  ? " with the reference quantizer"
               : ldlq          ? " with --w2k-quantizer ldlq, which weighs by --layer-moments"
                               : "");
    q.imatrix = std::make_shared<const Imatrix>(imatrix_read(imatrix));
  }
  if (ldlq) q.layer_moments = LayerMoments::read(layer_moments);
  return q;
}

}  // namespace moet::cli
