// FP8-block dense weights kept as FP8 by the weight loader (models/weight_loader.h), on the CPU
// backend: matmul weights of an FP8 checkpoint load as F8_E4M3 codes with F32 block scales
// (BF16 stored scales widened), stacked gate/up pairs too when their height is a multiple of 128
// (else decoded to F32); their products are bit-identical to the products of the old decode to
// F32 (the CPU kernel decodes each row to exactly those F32 values and dots it the same way), so
// the tiny DeepSeek-V3 FP8 fixture gives the very same logits and tokens as a copy of it whose FP8
// tensors are stored decoded to F32, with the reported bytes smaller by exactly
// 4 n k - (n k + 4 * scales) per kept tensor. Missing or misshapen X.weight_scale_inv is refused
// naming that tensor (kept and decoded paths alike). Random weights of a config with
// quant_method fp8 are FP8 (fewer bytes than BF16) and run.
#include "../error_of.h"
#include "../cpu_isa_env.h"
#include "../random_values.h"
#include "../temp_dir.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/generator.h"
#include "formats/checkpoint_formats.h"
#include "io/checkpoint.h"
#include "io/pack_source.h"
#include "models/weight_loader.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace moet {
namespace {

const std::filesystem::path kFixture = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures" / "deepseek_v3_fp8";

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

void write_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config,
                      const std::vector<TensorToWrite>& tensors) {
  std::ofstream(dir / "config.json") << config.dump(2);
  safetensors_write(dir / "model.safetensors", tensors);
}

nlohmann::json fp8_config() {
  return {{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}};
}

// An FP8 weight `name` [n, k] with random codes and F32 (or BF16) block scales.
void add_fp8(std::vector<TensorToWrite>& tensors, const std::string& name, int64_t n, int64_t k, bool bf16_scales,
             uint64_t seed) {
  tensors.push_back({name, DType::f8_e4m3, {n, k}, random_fp8_codes(size_t(n * k), seed)});
  const std::vector<int64_t> shape = fp8_block_scale_shape(n, k);
  const auto scales = random_fp8_scales(size_t(shape[0] * shape[1]), seed + 1);
  if (!bf16_scales) {
    tensors.push_back({name + "_scale_inv", DType::f32, shape, bytes_of(scales)});
    return;
  }
  std::vector<uint16_t> bf16(scales.size());
  for (size_t i = 0; i < scales.size(); ++i) bf16[i] = float_to_bf16(scales[i]);
  tensors.push_back({name + "_scale_inv", DType::bf16, shape, bytes_of(bf16)});
}

// y = x @ w^T on the host.
std::vector<float> product(Backend& backend, const Tensor& w, const std::vector<float>& x) {
  const int64_t k = w.dim(1), rows = int64_t(x.size()) / k;
  Tensor xt = backend.alloc({rows, k}), y = backend.alloc({rows, w.dim(0)});
  backend.from_host(x.data(), xt);
  backend.matmul(xt, w, nullptr, y);
  std::vector<float> out(size_t(y.numel()));
  backend.to_host(y, out.data());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Fp8Dense, MatmulWeightsStayFp8AndMatchTheDecode) {
  TempDir dir;
  std::vector<TensorToWrite> tensors;
  add_fp8(tensors, "a.weight", 200, 300, false, 1);
  add_fp8(tensors, "g.weight", 128, 300, true, 3);
  add_fp8(tensors, "u.weight", 128, 300, true, 5);
  add_fp8(tensors, "s.weight", 96, 300, false, 7);
  add_fp8(tensors, "t.weight", 96, 300, false, 9);
  write_checkpoint(dir.path(), fp8_config(), tensors);
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  WeightLoader loader(checkpoint, *backend);
  const auto x = random_floats(5 * 300, 11);

  const Tensor a8 = loader.matmul_weight("a.weight", {200, 300});
  ASSERT_EQ(a8.dtype, DType::f8_e4m3);
  ASSERT_TRUE(a8.block_scales);
  EXPECT_EQ(a8.block_scales->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(loader.stats().bytes, 200u * 300 + 2 * 3 * 4);
  const Tensor a32 = loader.weight("a.weight", {200, 300});  // the decode to F32 of before
  ASSERT_EQ(a32.dtype, DType::f32);
  EXPECT_TRUE(same_bits(product(*backend, a8, x), product(*backend, a32, x)));

  const Tensor gate_up8 = loader.matmul_stacked("g.weight", "u.weight", {128, 300});
  ASSERT_EQ(gate_up8.dtype, DType::f8_e4m3);
  EXPECT_EQ(gate_up8.shape, (std::vector<int64_t>{256, 300}));
  EXPECT_EQ(gate_up8.block_scales->shape, (std::vector<int64_t>{2, 3}));
  const Tensor gate_up32 = loader.stacked("g.weight", "u.weight", {128, 300});
  EXPECT_TRUE(same_bits(product(*backend, gate_up8, x), product(*backend, gate_up32, x)));

  // 96 rows: the halves' scale blocks would not stack, so the pair is decoded.
  EXPECT_EQ(loader.matmul_stacked("s.weight", "t.weight", {96, 300}).dtype, DType::f32);
  EXPECT_EQ(loader.stats().bytes, (200u * 300 + 24) + 200 * 300 * 4 + (256 * 300 + 24) + 256 * 300 * 4 + 192 * 300 * 4);
  EXPECT_EQ(loader.report_unused(), 0u);  // the scales count as used
}

TEST(Fp8Dense, MissingOrMisshapenScalesNameTheTensor) {
  TempDir dir;
  std::vector<TensorToWrite> tensors;
  tensors.push_back({"missing.weight", DType::f8_e4m3, {130, 140}, random_fp8_codes(130 * 140, 1)});
  tensors.push_back({"shape.weight", DType::f8_e4m3, {130, 140}, random_fp8_codes(130 * 140, 2)});
  tensors.push_back({"shape.weight_scale_inv", DType::f32, {1, 2}, bytes_of(random_fp8_scales(2, 3))});
  tensors.push_back({"dtype.weight", DType::f8_e4m3, {130, 140}, random_fp8_codes(130 * 140, 4)});
  tensors.push_back({"dtype.weight_scale_inv", DType::u8, {2, 2}, std::vector<uint8_t>(4, 1)});
  write_checkpoint(dir.path(), fp8_config(), tensors);
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  auto backend = cpu_backend_create({1, test_cpu_isa()});
  WeightLoader loader(checkpoint, *backend);
  for (const char* name : {"missing", "shape", "dtype"}) {
    const std::string weight = std::string(name) + ".weight";
    for (bool kept : {true, false}) {
      const std::string message = error_of([&] {
        kept ? loader.matmul_weight(weight, {130, 140}) : loader.weight(weight, {130, 140});
      });
      EXPECT_NE(message.find(weight + "_scale_inv"), std::string::npos) << message;
    }
  }
  const std::string message = error_of([&] { loader.matmul_weight("shape.weight", {130, 140}); });
  EXPECT_NE(message.find("[1, 2]"), std::string::npos) << message;  // what is there
  EXPECT_NE(message.find("[2, 2]"), std::string::npos) << message;  // what is needed
}

// The fixture with every FP8 tensor stored decoded to F32 (the values the old loader computed).
void write_decoded_copy(const Checkpoint& checkpoint, const std::filesystem::path& dir) {
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : checkpoint.names()) {
    const HostTensor& info = checkpoint.get(name);
    if (name.ends_with("_scale_inv")) continue;
    if (info.dtype != DType::f8_e4m3) {
      tensors.push_back({name, info.dtype, info.shape, std::vector<uint8_t>(info.data, info.data + info.bytes)});
      continue;
    }
    const std::vector<double> values = source_dequant(checkpoint_source_view(checkpoint, name));
    std::vector<float> decoded(values.begin(), values.end());
    tensors.push_back({name, DType::f32, info.shape, bytes_of(decoded)});
  }
  nlohmann::json config = checkpoint.config();
  config.erase("quantization_config");
  write_checkpoint(dir, config, tensors);
}

struct Loaded {
  GenerateResult result;
  LoadStats stats;
};

Loaded run(const Checkpoint& checkpoint, const std::vector<int32_t>& prompt) {
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  ModelLoadOptions options;
  options.experts = ExpertMode::native;
  Loaded out;
  auto model = model_load(checkpoint, *backend, &out.stats, options);
  GenerateOptions generate_options;
  generate_options.max_tokens = 4;
  out.result = generate(*model, prompt, generate_options);
  return out;
}

TEST(Fp8Dense, FixtureLogitsAreThoseOfTheF32Decode) {
  const Checkpoint fp8 = Checkpoint::open(kFixture);
  TempDir dir;
  write_decoded_copy(fp8, dir.path());
  const Checkpoint decoded = Checkpoint::open(dir.path());
  const auto prompt = json_read_file(kFixture / "golden.json")["prompt_ids"].get<std::vector<int32_t>>();
  const Loaded kept = run(fp8, prompt), before = run(decoded, prompt);
  EXPECT_TRUE(same_bits(kept.result.prompt_logits, before.result.prompt_logits));
  EXPECT_EQ(kept.result.output_ids, before.result.output_ids);
  // Kept as FP8: the attention projections but kv_b_proj (head_matmul) and the down projections
  // of the dense MLP and shared expert; their gate/up pairs (96 and 32 rows) are decoded.
  uint64_t saved = 0;
  for (const std::string& name : fp8.names()) {
    const HostTensor& info = fp8.get(name);
    const bool projection = name.ends_with("q_a_proj.weight") || name.ends_with("q_b_proj.weight") ||
                            name.ends_with("kv_a_proj_with_mqa.weight") || name.ends_with("self_attn.o_proj.weight") ||
                            name.ends_with("mlp.down_proj.weight") || name.ends_with("shared_experts.down_proj.weight");
    if (info.dtype != DType::f8_e4m3 || !projection || name.starts_with("model.layers.3.")) continue;
    const uint64_t n = uint64_t(info.shape[0]), k = uint64_t(info.shape[1]);
    saved += 4 * n * k - (n * k + 4 * ((n + 127) / 128) * ((k + 127) / 128));
  }
  EXPECT_GT(saved, 0u);
  EXPECT_EQ(before.stats.bytes - kept.stats.bytes, saved);
}

TEST(Fp8Dense, RandomWeightsOfAnFp8ConfigAreFp8) {
  const nlohmann::json fp8_config = json_read_file(kFixture / "config.json");
  nlohmann::json bf16_config = fp8_config;
  bf16_config.erase("quantization_config");
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  ModelLoadOptions options;
  options.experts = ExpertMode::native;
  LoadStats fp8_stats, bf16_stats;
  auto model = model_load_random(fp8_config, *backend, 1, &fp8_stats, options);
  model_load_random(bf16_config, *backend, 1, &bf16_stats, options);
  EXPECT_LT(fp8_stats.bytes, bf16_stats.bytes);
  GenerateOptions generate_options;
  generate_options.max_tokens = 2;
  const GenerateResult result = generate(*model, {3, 4, 5}, generate_options);
  ASSERT_FALSE(result.prompt_logits.empty());
  for (float v : result.prompt_logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace moet
