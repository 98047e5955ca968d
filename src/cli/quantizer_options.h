// The flags that say how the 2-bit formats pick their bytes, shared by every command that
// quantizes routed experts (the model-loading commands through ExpertOptions, `moet pack`, `moet
// dequant`): --w2-quantizer reference|opt, --w2k-quantizer reference|ldlq, --imatrix F (read by
// W2-opt and the reference W2K), and --layer-moments F, --expert-moments F and
// --expert-moments-prior N (read by W2K's LDLQ: io/ldlq_moments.h). Each flag is valid only where
// something reads it: any other combination is a one-line error naming the flag.
#pragma once

#include "io/imatrix.h"
#include "io/pack_source.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

namespace moet::cli {

// The quantizers and the files they read, resolved for one format.
struct QuantizerChoice {
  W2Quantizer w2 = W2Quantizer::reference;
  W2kQuantizer w2k = W2kQuantizer::reference;
  std::shared_ptr<const Imatrix> imatrix;             // null: none
  std::shared_ptr<const LdlqMoments> ldlq_moments;  // null: none (not W2K's LDLQ)
  PackQuantizer pack() const { return {w2, imatrix.get(), w2k, ldlq_moments.get()}; }
};

struct QuantizerFlags {
  std::string w2 = "reference";
  std::string w2k = "reference";
  std::string imatrix;
  std::string layer_moments;
  std::string expert_moments;
  int64_t expert_moments_prior = -1;  // -1: not given (kDefaultExpertMomentsPrior)

  void add_to(CLI::App& sub);
  // Checks the combination for `format` (w2, w2k, fp4, native, or a dequant format) and reads the
  // files (whether they belong to the model is checked when it loads).
  QuantizerChoice resolve(const std::string& format) const;
};

}  // namespace moet::cli
