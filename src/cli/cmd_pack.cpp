// `moet pack`: quantizes every routed expert of a checkpoint to W2, W2K or the FP4 tier format and
// writes this rank's pack file and sidecar into --out (io/pack_writer.h). A pack that is already
// valid for this checkpoint, format, zero mode, quantizer and the files it read (imatrix, layer
// and expert moments) is reused unless --force is given.
#include "cli/commands.h"
#include "cli/quantizer_options.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "models/arch/arch.h"
#include "io/pack_source.h"

#include <chrono>
#include <cstdio>
#include <optional>

namespace moet::cli {
namespace {

struct PackOptions {
  std::string model, out, format = "w2", zero_mode = "auto";
  QuantizerFlags quantizer;
  int rank = 0, world = 1, threads = 0;
  bool force = false;
};

void run(const PackOptions& o) {
  const Checkpoint ckpt = Checkpoint::open(o.model);
  const ModelConfig config = model_config_parse(ckpt.config());
  const QuantizerChoice q = o.quantizer.resolve(o.format);
  const PackSpec spec = pack_spec_for(ckpt, config, store_format_parse(o.format), zero_mode_parse(o.zero_mode),
                                      o.rank, o.world, q.pack());
  const PackPaths paths = pack_paths(o.out, spec.format, o.rank, o.world);
  ThreadPool pool(o.threads);
  const auto start = std::chrono::steady_clock::now();
  std::optional<LdlqFactors> ldlq;
  if (spec.w2k_quantizer == W2kQuantizer::ldlq) ldlq.emplace(q.ldlq_moments, pool);
  const ExpertSourceFn sources = checkpoint_expert_sources(ckpt, config, q.imatrix.get(), ldlq ? &*ldlq : nullptr);
  bool built = true;
  if (o.force) {
    pack_build(paths, spec, sources, pool);
  } else {
    built = pack_ensure(paths, spec, sources, pool);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s %s: %zu layers x %lld experts, stride %llu B, %.1f MB, %s in %.2f s\n",
              built ? "built" : "up to date", paths.pack.string().c_str(), spec.layers.size(),
              (long long)spec.expert_count(), (unsigned long long)spec.layout().stride,
              double(spec.file_bytes()) / 1e6, built ? "quantized" : "checked", seconds);
}

}  // namespace

void register_pack(CLI::App& app, Actions& actions) {
  auto o = std::make_shared<PackOptions>();
  CLI::App* sub = app.add_subcommand("pack", "quantize routed experts into a pack file (a persistent cache)");
  sub->add_option("--model", o->model, "model folder: config.json + *.safetensors")->required();
  sub->add_option("--out", o->out, "folder for the pack, its sidecar and lock file")->required();
  sub->add_option("--format", o->format, "expert format: w2 (2-bit base) | w2k (2-bit E8 codebook) | fp4 (MXFP4 tier)");
  o->quantizer.add_to(*sub);
  sub->add_option("--zero-mode", o->zero_mode, "sign of exact zeros in w2: auto|sign|alt");
  sub->add_option("--rank", o->rank, "this rank (experts split contiguously over ranks)");
  sub->add_option("--world", o->world, "number of ranks");
  sub->add_option("--threads", o->threads, "quantization threads (0 = one per core)");
  sub->add_flag("--force", o->force, "rebuild even when the pack is up to date");
  actions[sub] = [o] { run(*o); };
}

}  // namespace moet::cli
