// Importance matrix files (io/imatrix.h): write -> read gives the same vectors, counts and
// metadata; the hash follows the bytes; a file of another model (layers, experts, columns) and
// a file that is not an imatrix are refused with errors naming the file.
#include "../error_of.h"
#include "small_moe_config.h"
#include "core/error.h"
#include "io/imatrix.h"
#include "io/safetensors.h"
#include "pack_test_util.h"

#include <gtest/gtest.h>

#include <functional>

namespace moet {
namespace {

Imatrix small_imatrix(float bias) {
  Imatrix m;
  m.checkpoint_identity = "id";
  m.tokens = 123;
  m.min_tokens = 8;
  for (int64_t layer : {1, 2}) {
    for (int e = 0; e < 2; ++e) {
      ImatrixExpert x;
      for (int k = 0; k < 64; ++k) x.gate_up_in.push_back(bias + float(layer * 100 + e * 10 + k));
      for (int k = 0; k < 32; ++k) x.down_in.push_back(bias + 0.5f * float(k));
      m.layers[layer].push_back(x);
    }
    m.expert_tokens[layer] = {7, 40};
  }
  return m;
}

}  // namespace

TEST(Imatrix, WriteReadRoundTripAndHash) {
  const auto dir = test::temp_dir("imatrix");
  const Imatrix m = small_imatrix(1);
  const std::string hash = imatrix_write(dir / "a.imatrix", m);
  const Imatrix r = imatrix_read(dir / "a.imatrix");
  EXPECT_EQ(r.hash, hash);
  EXPECT_EQ(r.checkpoint_identity, "id");
  EXPECT_EQ(r.tokens, 123);
  EXPECT_EQ(r.min_tokens, 8);
  EXPECT_EQ(r.expert_tokens.at(2), (std::vector<int32_t>{7, 40}));
  for (int64_t layer : {1, 2})
    for (int e = 0; e < 2; ++e) {
      EXPECT_EQ(r.layers.at(layer)[size_t(e)].gate_up_in, m.layers.at(layer)[size_t(e)].gate_up_in);
      EXPECT_EQ(r.layers.at(layer)[size_t(e)].down_in, m.layers.at(layer)[size_t(e)].down_in);
    }
  EXPECT_EQ(r.input(2, 1, false)[3], 2 * 100 + 10 + 3 + 1);
  EXPECT_EQ(r.input(0, 0, false), nullptr);
  EXPECT_NO_THROW(imatrix_check(r, test::small_moe_config(), "a.imatrix"));
  EXPECT_EQ(imatrix_write(dir / "b.imatrix", m), hash);                // same content, same hash
  EXPECT_NE(imatrix_write(dir / "c.imatrix", small_imatrix(2)), hash);  // changed values, changed hash
  std::filesystem::remove_all(dir);
}

TEST(Imatrix, AnotherModelIsRefused) {
  const Imatrix m = small_imatrix(1);
  ModelConfig c = test::small_moe_config();
  c.hidden_size = 128;
  EXPECT_NE(error_of([&] { imatrix_check(m, c, "x.imatrix"); }).find("x.imatrix was made for another model"),
            std::string::npos);
  c = test::small_moe_config();
  c.n_routed_experts = 4;
  EXPECT_NE(error_of([&] { imatrix_check(m, c, "x.imatrix"); }).find("experts"), std::string::npos);
  c = test::small_moe_config();
  c.layer_is_moe = {true, true, true};
  EXPECT_NE(error_of([&] { imatrix_check(m, c, "x.imatrix"); }).find("MoE layers"), std::string::npos);
}

TEST(Imatrix, NotAnImatrixIsRefused) {
  const auto dir = test::temp_dir("imatrix");
  safetensors_write(dir / "w.safetensors", {{"w", DType::f32, {2}, std::vector<uint8_t>(8, 0)}});
  EXPECT_NE(error_of([&] { imatrix_read(dir / "w.safetensors"); }).find("is not a moet importance matrix"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace moet
