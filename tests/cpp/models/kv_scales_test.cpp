// A checkpoint's per-tensor FP8 KV scales: a copy of the mixtral fixture (GQA) with
// model.layers.0.self_attn.k_scale (F32, a scalar, vLLM's name) and
// model.layers.0.self_attn.v_proj.v_scale (BF16 [1], modelopt's name) loads them into layer 0's KV
// spec (the other layers have none), an fp8 cache written by a forward carries them as every
// token's scales, and a scale of two values fails with one line naming it.
#include "../cpu_isa_env.h"
#include "../temp_dir.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/sequence_batch.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "models/model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace moet {
namespace {

const std::filesystem::path kFixture = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures" / "mixtral";

// The fixture copied into `dir` with `extra` tensors added to its safetensors file.
void copy_with(const std::filesystem::path& dir, const std::vector<TensorToWrite>& extra) {
  const Checkpoint source = Checkpoint::open(kFixture);
  std::vector<TensorToWrite> tensors = extra;
  for (const std::string& name : source.names()) {
    const HostTensor& t = source.get(name);
    tensors.push_back({name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.bytes)});
  }
  std::filesystem::copy_file(kFixture / "config.json", dir / "config.json");
  safetensors_write(dir / "model.safetensors", tensors);
}

std::vector<uint8_t> f32_bytes(float v) {
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), &v, 4);
  return out;
}

TEST(KvScales, CheckpointScalesBecomeTheFp8CacheScales) {
  const TempDir dir;
  const uint16_t v_scale = float_to_bf16(0.25f);
  copy_with(dir.path(), {{"model.layers.0.self_attn.k_scale", DType::f32, {}, f32_bytes(0.05f)},
                         {"model.layers.0.self_attn.v_proj.v_scale", DType::bf16, {1},
                          {uint8_t(v_scale & 0xff), uint8_t(v_scale >> 8)}}});
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  auto model = model_load(checkpoint, *backend, nullptr, ModelLoadOptions{ExpertMode::native});
  EXPECT_EQ(model->kv_layer_specs()[0].k_scale, 0.05f);
  EXPECT_EQ(model->kv_layer_specs()[0].v_scale, 0.25f);
  EXPECT_EQ(model->kv_layer_specs()[1].k_scale, 0.0f);
  model->set_kv_cache_dtype(KvDtype::fp8_e4m3);
  EXPECT_EQ(model->kv_layer_specs()[0].k_scale, 0.05f);

  SequenceBatch batch(*model, 1, 8, 4);
  batch.sequence(0).tokens = {3, 14, 15, 92, 65};
  batch.run_rows(0, 0, 5, ChunkRows::last);
  const KvLayerCache& layer0 = batch.runner().cache().layers[0];
  const KvLayerCache& layer1 = batch.runner().cache().layers[1];
  const KvSlotLayout s = kv_slot_layout(paged_kv_layout(layer0.view));
  for (int32_t pos = 0; pos < 5; ++pos) {
    const int64_t slot = int64_t(batch.sequence(0).blocks[size_t(pos / 4)]) * 4 + pos % 4;
    for (int64_t g = 0; g < s.groups; ++g) {
      float k = 0.0f, v = 0.0f, other = 0.0f;
      std::memcpy(&k, layer0.view.k + slot * s.bytes + s.scale_offset + 4 * g, 4);
      std::memcpy(&v, layer0.view.v + slot * s.bytes + s.scale_offset + 4 * g, 4);
      std::memcpy(&other, layer1.view.k + slot * s.bytes + s.scale_offset + 4 * g, 4);
      EXPECT_EQ(k, 0.05f);
      EXPECT_EQ(v, 0.25f);
      EXPECT_NE(other, 0.05f);  // layer 1: scales of each token's own values
      EXPECT_GT(other, 0.0f);
    }
  }
}

TEST(KvScales, AScaleOfTwoValuesIsRefused) {
  const TempDir dir;
  std::vector<uint8_t> two = f32_bytes(0.1f);
  two.insert(two.end(), two.begin(), two.end());
  copy_with(dir.path(), {{"model.layers.2.self_attn.k_scale", DType::f32, {2}, two}});
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  auto backend = cpu_backend_create({1, test_cpu_isa()});
  try {
    model_load(checkpoint, *backend, nullptr, ModelLoadOptions{ExpertMode::native});
    ADD_FAILURE() << "a KV scale of two values was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.self_attn.k_scale"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moet
