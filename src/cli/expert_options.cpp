// Expert storage flags (see expert_options.h).
#include "cli/expert_options.h"

namespace moet::cli {

void ExpertOptions::add_to(CLI::App& sub) {
  sub.add_option("--experts", experts,
                 "how routed experts are stored: w2 (2-bit sign-symmetric, default), fp4 (MXFP4) or "
                 "native (the checkpoint's values; FP8/FP4 sources decoded to F32)")
      ->envname("MOET_EXPERTS")
      ->check(CLI::IsMember({"native", "w2", "fp4"}));
  sub.add_option("--zero-mode", zero_mode,
                 "W2 sign of exact zeros: auto (alt for tensors whose zeros are one-signed), sign "
                 "(keep the sign bit) or alt (alternate by column parity)")
      ->check(CLI::IsMember({"auto", "sign", "alt"}));
  sub.add_option("--pack-dir", pack_dir,
                 "keep quantized experts in pack files here: built on the first start, reused on "
                 "later ones (rebuilt when stale)")
      ->envname("MOET_PACK_DIR");
}

ModelLoadOptions ExpertOptions::resolve() const {
  return {expert_mode_parse(experts), zero_mode_parse(zero_mode), pack_dir};
}

}  // namespace moet::cli
