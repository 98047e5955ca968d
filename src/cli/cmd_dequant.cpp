// `moet dequant`: one tensor of a checkpoint after quantizing it to a format and dequantizing,
// written as raw little-endian float32, row-major [N, K] (K = last dim, blocks along K). Users
// compare formats with it; the Python oracle tests compare it byte for byte with numpy.
// Formats: source (exact values), bf16, f16, fp8 (e4m3, 128x128 blocks), mxfp4, nvfp4, w2,
// w2-asym. mxfp4 and w2 run the requantization the pack builder runs (MXFP4 sources keep
// their scales); the others run the float64 reference quantizers of formats/.
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "formats/checkpoint_formats.h"
#include "formats/minifloat.h"
#include "formats/requant.h"
#include "formats/sign_study.h"
#include "io/checkpoint.h"
#include "io/pack_source.h"

#include <fstream>

namespace moet::cli {
namespace {

struct DequantOptions {
  std::string model, tensor, format = "w2", zero_mode = "auto", out;
  int64_t expert = -1;
  int threads = 0;
};

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

std::vector<float> dequant(const SourceView& src, const DequantOptions& o, ThreadPool& pool) {
  const ZeroMode mode = zero_mode_parse(o.zero_mode);
  if (o.format == "w2") return block_tensor_dequant(StoreFormat::w2, quantize_w2(src, mode, pool));
  if (o.format == "mxfp4") return block_tensor_dequant(StoreFormat::fp4, quantize_fp4(src, pool));
  if (o.format == "w2-asym") {
    std::vector<uint8_t> codes, scales;
    AsymCodebook book;
    w2_asym_quantize(src, mode, pool, &codes, &scales, &book);
    return w2_asym_dequant(codes, scales, book, src.rows, src.cols);
  }
  std::vector<double> values = source_dequant(src);
  if (o.format == "source") return to_float(values);
  if (o.format == "fp8") return to_float(source_dequant(fp8_block_quantize(values.data(), src.rows, src.cols, src.name).view()));
  if (o.format == "nvfp4") return to_float(source_dequant(nvfp4_quantize(values.data(), src.rows, src.cols, src.name).view()));
  if (o.format == "bf16" || o.format == "f16") {
    for (double& v : values) v = minifloat_round(v, o.format == "bf16" ? kBF16 : kF16);
    return to_float(values);
  }
  fail("unknown format '{}' (expected source|bf16|f16|fp8|mxfp4|nvfp4|w2|w2-asym)", o.format);
}

void run(const DequantOptions& o) {
  const Checkpoint ckpt = Checkpoint::open(o.model);
  const SourceView src = checkpoint_source_view(ckpt, o.tensor, o.expert);
  MOET_LOG_INFO("dequant {}: {} [{}, {}] -> {}", o.tensor, source_format_name(src.format), src.rows, src.cols, o.format);
  ThreadPool pool(o.threads);
  const std::vector<float> out = dequant(src, o, pool);
  std::ofstream file(o.out, std::ios::binary);
  MOET_CHECK(file.good(), "{}: cannot write", o.out);
  file.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * sizeof(float)));
  MOET_CHECK(file.good(), "{}: write failed", o.out);
}

}  // namespace

void register_dequant(CLI::App& app, Actions& actions) {
  auto o = std::make_shared<DequantOptions>();
  CLI::App* sub = app.add_subcommand("dequant", "write a tensor quantized to a format and dequantized, as raw float32");
  sub->add_option("--model", o->model, "model folder: config.json + *.safetensors")->required();
  sub->add_option("--tensor", o->tensor, "hub tensor name (X.weight, or X_blocks for gpt-oss MXFP4)")->required();
  sub->add_option("--format", o->format, "source|bf16|f16|fp8|mxfp4|nvfp4|w2|w2-asym")->required();
  sub->add_option("--zero-mode", o->zero_mode, "sign of exact zeros in w2: auto|sign|alt");
  sub->add_option("--expert", o->expert, "expert index into a fused [E, ...] tensor");
  sub->add_option("--threads", o->threads, "worker threads (0 = one per core)");
  sub->add_option("--out", o->out, "output file (raw little-endian float32, row-major)")->required();
  actions[sub] = [o] { run(*o); };
}

}  // namespace moet::cli
