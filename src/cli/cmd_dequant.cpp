// `moet dequant`: one tensor of a checkpoint after quantizing it to a format and dequantizing,
// written as raw little-endian float32, row-major [N, K] (K = last dim, blocks along K). Users
// compare formats with it; the Python oracle tests compare it byte for byte with numpy.
// --all-experts does the same for every routed-expert weight of the model (MoE layers and MTP
// layers) in one run, tensors spread over --threads, and writes one safetensors file of F32
// [N, K] tensors under their hub names (what the quality harness swaps into a model copy).
// Formats: source (exact values), bf16, f16, fp8 (e4m3, 128x128 blocks), mxfp4, nvfp4, w2,
// w2k, w2-asym. mxfp4, w2 (with --w2-quantizer) and w2k (with --w2k-quantizer) run the
// requantization the pack builder runs (MXFP4 sources keep their scales; --imatrix weighs w2k and
// w2-opt, --layer-moments / --expert-moments feed w2k's LDLQ, as in packs); the others run the float64 reference
// quantizers of formats/.
#include "cli/commands.h"
#include "cli/quantizer_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "formats/checkpoint_formats.h"
#include "formats/minifloat.h"
#include "formats/requant.h"
#include "formats/sign_study.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "models/arch/arch.h"
#include "io/safetensors.h"
#include "io/pack_source.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <vector>

namespace moet::cli {
namespace {

struct DequantOptions {
  std::string model, tensor, format = "w2", zero_mode = "auto", out;
  QuantizerFlags quantizer;
  int64_t expert = -1;
  int threads = 0;
  bool all_experts = false;
};

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// A routed-expert weight and what its quantizer reads besides the source.
struct ExpertTensor {
  std::string name;
  int64_t layer = 0, expert = 0;
  bool down = false;                // down's input (else gate's and up's)
  const float* importance = nullptr;  // its imatrix column weights (null: none, or an MTP layer)
  std::shared_ptr<const W2kLdlqFactor> ldlq;  // its input's LDLQ decomposition (null: none, or an MTP layer)
};

std::vector<float> dequant(const SourceView& src, const DequantOptions& o, const ExpertTensor& t, ThreadPool& pool) {
  const ZeroMode mode = zero_mode_parse(o.zero_mode);
  if (o.format == "w2" || o.format == "w2k") {
    const StoreFormat format = store_format_parse(o.format);
    const QuantizeOptions options{mode, w2_quantizer_parse(o.quantizer.w2), t.importance, t.ldlq.get()};
    return block_tensor_dequant(format, quantize(format, src, options, pool));
  }
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
  fail("unknown format '{}' (expected source|bf16|f16|fp8|mxfp4|nvfp4|w2|w2k|w2-asym)", o.format);
}

// Every routed-expert weight of the checkpoint in layer order: the MoE layers of the main model,
// then the MTP (nextn) layers that ship routed experts (the imatrix and the second moments cover the
// main layers only). The quantizer's files must belong to the model; the LDLQ decompositions are
// left to the caller.
std::vector<ExpertTensor> routed_expert_tensors(const Checkpoint& ckpt, const QuantizerChoice& q) {
  const ModelConfig config = model_config_parse(ckpt.config());
  const Imatrix* imatrix = q.imatrix.get();
  if (imatrix) imatrix_check(*imatrix, config, imatrix->path);
  if (q.ldlq_moments) q.ldlq_moments->check(config);
  std::vector<ExpertTensor> tensors;
  const int64_t layers = config.num_hidden_layers + config.num_nextn_predict_layers;
  for (int64_t layer = 0; layer < layers; ++layer) {
    const bool main_layer = layer < config.num_hidden_layers;
    if (main_layer && !config.layer_is_moe[size_t(layer)]) continue;
    for (int64_t e = 0; e < config.n_routed_experts; ++e) {
      const auto n = config.expert_tensor_names(layer, e);
      for (const std::string* name : {&n.gate, &n.up, &n.down}) {
        if (!main_layer && ckpt.find(*name) == nullptr) continue;
        const bool down = name == &n.down;
        tensors.push_back({*name, layer, e, down, imatrix ? imatrix->input(layer, e, down) : nullptr, nullptr});
      }
    }
  }
  MOET_CHECK(!tensors.empty(), "{}: no routed-expert tensors", ckpt.dir().string());
  return tensors;
}

void run_all_experts(const DequantOptions& o, const QuantizerChoice& q) {
  const Checkpoint ckpt = Checkpoint::open(o.model);
  std::vector<ExpertTensor> experts = routed_expert_tensors(ckpt, q);
  std::vector<TensorToWrite> tensors(experts.size());
  ThreadPool pool(o.threads);
  if (q.ldlq_moments) {  // every decomposition, made here in layer and expert order, kept by the tensors
    LdlqFactors factors(q.ldlq_moments, pool);
    for (ExpertTensor& t : experts) t.ldlq = factors.get(t.layer, t.expert, t.down);
  }
  MOET_LOG_INFO("dequant {} routed-expert tensors -> {} ({} threads)", experts.size(), o.format, pool.size());
  // One tensor per work item, each quantized single-threaded: the quantizers give the same bits
  // for any thread count, so the file equals the per-tensor runs byte for byte.
  std::mutex error_mutex;
  std::exception_ptr error;  // the first failure, rethrown here (workers must not throw)
  pool.parallel_for(experts.size(), [&](size_t begin, size_t end) {
    ThreadPool inner(1);
    for (size_t i = begin; i < end; ++i) {
      try {
        const SourceView src = checkpoint_source_view(ckpt, experts[i].name);
        const std::vector<float> values = dequant(src, o, experts[i], inner);
        TensorToWrite& t = tensors[i];
        t.name = experts[i].name;
        t.dtype = DType::f32;
        t.shape = {src.rows, src.cols};
        t.bytes.resize(values.size() * sizeof(float));
        std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        return;
      }
    }
  });
  if (error) std::rethrow_exception(error);
  safetensors_write(o.out, tensors);
}

void run(const DequantOptions& o) {
  const QuantizerChoice q = o.quantizer.resolve(o.format);
  if (o.all_experts) {
    MOET_CHECK(o.tensor.empty() && o.expert < 0, "--all-experts takes no --tensor or --expert");
    return run_all_experts(o, q);
  }
  MOET_CHECK(!o.tensor.empty(), "give --tensor NAME or --all-experts");
  const Checkpoint ckpt = Checkpoint::open(o.model);
  const SourceView src = checkpoint_source_view(ckpt, o.tensor, o.expert);
  MOET_LOG_INFO("dequant {}: {} [{}, {}] -> {}", o.tensor, source_format_name(src.format), src.rows, src.cols, o.format);
  ExpertTensor tensor{o.tensor};
  ThreadPool pool(o.threads);
  if (q.imatrix || q.ldlq_moments) {  // the tensor's entries (an MoE layer's: the files hold no MTP layer)
    const std::vector<ExpertTensor> experts = routed_expert_tensors(ckpt, q);
    const auto it = std::find_if(experts.begin(), experts.end(), [&](const ExpertTensor& t) { return t.name == o.tensor; });
    if (it != experts.end()) {
      tensor = *it;
      if (q.ldlq_moments) tensor.ldlq = LdlqFactors(q.ldlq_moments, pool).get(tensor.layer, tensor.expert, tensor.down);
    }
    MOET_CHECK(tensor.importance != nullptr || tensor.ldlq != nullptr,
               "--{}: {} is not a routed-expert weight of an MoE layer", q.imatrix ? "imatrix" : "w2k-quantizer ldlq",
               o.tensor);
  }
  const std::vector<float> out = dequant(src, o, tensor, pool);
  std::ofstream file(o.out, std::ios::binary);
  MOET_CHECK(file.good(), "{}: cannot write", o.out);
  file.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * sizeof(float)));
  MOET_CHECK(file.good(), "{}: write failed", o.out);
}

}  // namespace

void register_dequant(CLI::App& app, Actions& actions) {
  auto o = std::make_shared<DequantOptions>();
  CLI::App* sub = app.add_subcommand(
      "dequant", "write a tensor (or every routed expert) quantized to a format and dequantized, as float32");
  sub->add_option("--model", o->model, "model folder: config.json + *.safetensors")->required();
  sub->add_option("--tensor", o->tensor, "hub tensor name (X.weight, or X_blocks for gpt-oss MXFP4)");
  sub->add_flag("--all-experts", o->all_experts,
                "every routed-expert weight of the model (MoE and MTP layers) instead of one --tensor; "
                "--out is then one safetensors file of F32 [N, K] tensors under their hub names");
  sub->add_option("--format", o->format, "source|bf16|f16|fp8|mxfp4|nvfp4|w2|w2k|w2-asym")->required();
  sub->add_option("--zero-mode", o->zero_mode, "sign of exact zeros in w2: auto|sign|alt");
  o->quantizer.add_to(*sub);
  sub->add_option("--expert", o->expert, "expert index into a fused [E, ...] tensor");
  sub->add_option("--threads", o->threads, "worker threads (0 = one per core); same bits for any count");
  sub->add_option("--out", o->out,
                  "output file: raw little-endian float32, row-major (--tensor) or safetensors (--all-experts)")
      ->required();
  actions[sub] = [o] { run(*o); };
}

}  // namespace moet::cli
