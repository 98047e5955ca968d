// Layer-moments files (io/layer_moments.h): write -> read gives the same matrices and metadata,
// the hash follows the bytes, a file of another model (shapes, layers) or not a layer-moments
// file is refused naming it, and LdlqFactors makes each layer's decompositions once, keeps only
// the layer asked last and has none for a layer the file lacks.
#include "../error_of.h"
#include "small_moe_config.h"
#include "../temp_dir.h"
#include "core/error.h"
#include "io/layer_moments.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

namespace moet {
namespace {

// A symmetric positive definite matrix: diagonal 2 + bias, off-diagonals small.
std::vector<float> spd(int64_t k, float bias) {
  std::vector<float> m(size_t(k * k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) m[size_t(i * k + j)] = i == j ? 2 + bias : 0.3f / float(1 + std::abs(i - j));
  return m;
}

LayerMomentsData small_moments(float bias) {
  LayerMomentsData d;
  d.hidden = 64;
  d.inner = 32;
  d.tokens = 99;
  d.pairs = 400;
  d.checkpoint_identity = "id";
  for (int64_t layer : {1, 2}) d.layers[layer] = {spd(64, bias + float(layer)), spd(32, bias)};
  return d;
}

}  // namespace

TEST(LayerMoments, WriteReadRoundTripAndHash) {
  TempDir dir;
  const LayerMomentsData d = small_moments(0);
  const std::string hash = layer_moments_write(dir.path() / "a.moments", d);
  const auto m = LayerMoments::read(dir.path() / "a.moments");
  EXPECT_EQ(m->hash(), hash);
  EXPECT_EQ(m->hash().size(), 16u);
  for (int64_t layer : {1, 2})
    for (const bool down : {false, true}) {
      const HostTensor* t = m->matrix(layer, down);
      ASSERT_NE(t, nullptr);
      const std::vector<float>& want = down ? d.layers.at(layer).down_in : d.layers.at(layer).gate_up_in;
      EXPECT_EQ(t->shape, (std::vector<int64_t>{down ? 32 : 64, down ? 32 : 64}));
      EXPECT_EQ(0, std::memcmp(t->data, want.data(), t->bytes));
    }
  EXPECT_EQ(m->matrix(0, false), nullptr);
  EXPECT_NO_THROW(m->check(test::small_moe_config()));
  EXPECT_EQ(layer_moments_write(dir.path() / "b.moments", d), hash);                 // same content, same hash
  EXPECT_NE(layer_moments_write(dir.path() / "c.moments", small_moments(1)), hash);  // changed values
}

TEST(LayerMoments, AnotherModelOrFileIsRefused) {
  TempDir dir;
  layer_moments_write(dir.path() / "a.moments", small_moments(0));
  const auto m = LayerMoments::read(dir.path() / "a.moments");
  const std::string file = (dir.path() / "a.moments").string();
  ModelConfig c = test::small_moe_config();
  c.hidden_size = 128;
  EXPECT_NE(error_of([&] { m->check(c); }).find("layer moments " + file + " were made for another model"),
            std::string::npos);
  c = test::small_moe_config();
  c.moe_intermediate_size = 16;
  EXPECT_NE(error_of([&] { m->check(c); }).find("down"), std::string::npos);
  c = test::small_moe_config();
  c.num_hidden_layers = 4;
  c.layer_is_moe = {false, true, true, true};
  EXPECT_NE(error_of([&] { m->check(c); }).find("no layers.3.gate_up_in"), std::string::npos);
  c = test::small_moe_config();
  c.layer_is_moe = {false, false, true};
  EXPECT_NE(error_of([&] { m->check(c); }).find("1 MoE layers"), std::string::npos);
  safetensors_write(dir.path() / "w.safetensors", {{"w", DType::f32, {2}, std::vector<uint8_t>(8, 0)}});
  EXPECT_NE(error_of([&] { LayerMoments::read(dir.path() / "w.safetensors"); }).find("is not a moet layer-moments file"),
            std::string::npos);
}

TEST(LayerMoments, FactorsOnePerLayerAndInput) {
  TempDir dir;
  layer_moments_write(dir.path() / "a.moments", small_moments(0));
  ThreadPool pool(1);
  LdlqFactors factors(LayerMoments::read(dir.path() / "a.moments"), pool);
  std::shared_ptr<const W2kLdlqFactor> gate_up = factors.get(1, false), down = factors.get(1, true);
  ASSERT_NE(gate_up, nullptr);
  EXPECT_EQ(gate_up->K, 64);
  EXPECT_EQ(down->K, 32);
  EXPECT_EQ(factors.get(1, false), gate_up) << "made once";
  const std::weak_ptr<const W2kLdlqFactor> first = gate_up;
  const std::vector<double> first_r = gate_up->R;
  gate_up.reset(), down.reset();
  EXPECT_FALSE(first.expired()) << "kept while layer 1 is the layer asked last";
  const auto next = factors.get(2, false);
  EXPECT_TRUE(first.expired()) << "released for layer 2";
  EXPECT_NE(next->R, first_r) << "layer 2's matrix differs";
  EXPECT_EQ(factors.get(0, false), nullptr) << "a layer the file lacks";
}

}  // namespace moet
