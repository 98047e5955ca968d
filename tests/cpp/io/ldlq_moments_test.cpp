// The second-moment files of W2K's LDLQ quantizer and what it rounds each expert against
// (io/layer_moments.h, io/expert_moments.h, io/ldlq_moments.h). Both files, each test run over
// both kinds: write -> read gives the same matrices and metadata, the hash follows the bytes, a
// file of another model (shapes, layers) or not of its kind is refused naming it. LdlqFactors:
// the layer's decompositions are made once and kept for the layer asked last; an expert the expert
// moments hold rounds against its own H (other bits than the layer H's when the matrices differ,
// the same bits when they are equal, whatever the prior), blended with the layer's by its tokens
// and the prior; the others against the layer's; without layer moments every expert must be
// held; the decompositions are the same bits for any thread count.
#include "../error_of.h"
#include "small_moe_config.h"
#include "../temp_dir.h"
#include "core/error.h"
#include "io/imatrix.h"
#include "io/ldlq_moments.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

namespace moet {
namespace {

// A symmetric positive definite matrix: diagonal 2 + bias, off-diagonals small (the layers'
// decaying with distance; with `alternating` an expert's, of alternating sign and diagonally
// dominant).
std::vector<float> spd(int64_t k, float bias, bool alternating = false) {
  std::vector<float> m(size_t(k * k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const float d = float(1 + std::abs(i - j));
      m[size_t(i * k + j)] = i == j ? 2 + bias : alternating ? ((i + j) % 2 ? -0.9f : 0.9f) / (d * d) : 0.3f / d;
    }
  return m;
}

LayerMomentsData small_layer_moments(float bias) {
  LayerMomentsData d;
  d.hidden = 64;
  d.inner = 32;
  d.tokens = 99;
  d.pairs = 400;
  d.checkpoint_identity = "id";
  for (int64_t layer : {1, 2}) d.layers[layer] = {spd(64, bias + float(layer)), spd(32, bias)};
  return d;
}

// Per-expert moments of small_moe_config's 2 experts; `held(layer, expert)` says which have matrices.
Imatrix small_expert_moments(float bias, const std::function<bool(int64_t, int64_t)>& held) {
  Imatrix m;
  m.checkpoint_identity = "id";
  m.tokens = 99;
  for (int64_t layer : {1, 2}) {
    m.expert_tokens[layer] = {int32_t(10 * layer), 300};
    for (int64_t e = 0; e < 2; ++e) {
      const float b = bias + float(layer) + 0.5f * float(e + 1);
      ImatrixExpert x{std::vector<float>(64, 2 + b), std::vector<float>(32, 2 + b), {}, {}};
      if (held(layer, e)) x.gate_up_xx = spd(64, b, true), x.down_xx = spd(32, b, true);
      m.layers[layer].push_back(x);
    }
  }
  return m;
}

bool every(int64_t, int64_t) { return true; }

// One kind of file for the tests run over both: how to write a small one (bias changes its
// values), read it, check it against a model, and the words its errors use.
struct MomentsKind {
  const char* name;  // "layer moments" / "expert moments"
  std::function<std::string(const std::filesystem::path&, float bias)> write;  // returns the hash
  std::function<std::string(const std::filesystem::path&)> read_hash;
  std::function<void(const std::filesystem::path&, const ModelConfig&)> check;
  const char* missing_layer_3;  // the detail when the model has an MoE layer 3 the file lacks
  const char* fewer_layers;     // the detail when layer 1 is not an MoE layer
};

void PrintTo(const MomentsKind& kind, std::ostream* os) { *os << kind.name; }

std::vector<MomentsKind> kinds() {
  return {{"layer moments", [](const auto& p, float b) { return layer_moments_write(p, small_layer_moments(b)); },
           [](const auto& p) { return LayerMoments::read(p)->hash(); },
           [](const auto& p, const ModelConfig& c) { LayerMoments::read(p)->check(c); }, "no layers.3.gate_up_in",
           "the model has 1 MoE layers"},
          {"expert moments",
           [](const auto& p, float b) { return imatrix_second_moments_write(p, small_expert_moments(b, every)); },
           [](const auto& p) { return ExpertMoments::read(p)->hash(); },
           [](const auto& p, const ModelConfig& c) { ExpertMoments::read(p)->check(c); },
           "no layers.3.expert_tokens", "layer 1 has 2 experts' token counts, the model 0"}};
}

class MomentsFile : public testing::TestWithParam<MomentsKind> {};

INSTANTIATE_TEST_SUITE_P(Kinds, MomentsFile, testing::ValuesIn(kinds()),
                         [](const auto& info) { return std::string(info.param.name[0] == 'l' ? "Layer" : "Expert"); });

}  // namespace

TEST_P(MomentsFile, HashFollowsTheBytes) {
  TempDir dir;
  const MomentsKind& kind = GetParam();
  const std::string hash = kind.write(dir.path() / "a", 0);
  EXPECT_EQ(kind.read_hash(dir.path() / "a"), hash);
  EXPECT_EQ(hash.size(), 16u);
  EXPECT_NO_THROW(kind.check(dir.path() / "a", test::small_moe_config()));
  EXPECT_EQ(kind.write(dir.path() / "b", 0), hash);  // same content, same hash
  EXPECT_NE(kind.write(dir.path() / "c", 1), hash);  // changed values
}

TEST_P(MomentsFile, AnotherModelOrFileIsRefused) {
  TempDir dir;
  const MomentsKind& kind = GetParam();
  kind.write(dir.path() / "a", 0);
  const std::filesystem::path file = dir.path() / "a";
  const auto refusal = [&](const ModelConfig& c) { return error_of([&] { kind.check(file, c); }); };
  ModelConfig c = test::small_moe_config();
  c.hidden_size = 128;
  EXPECT_NE(refusal(c).find(std::string(kind.name) + " " + file.string() + " were made for another model"),
            std::string::npos)
      << refusal(c);
  c = test::small_moe_config();
  c.moe_intermediate_size = 16;
  EXPECT_NE(refusal(c).find("down"), std::string::npos) << refusal(c);
  c = test::small_moe_config();
  c.num_hidden_layers = 4;
  c.layer_is_moe = {false, true, true, true};
  EXPECT_NE(refusal(c).find(kind.missing_layer_3), std::string::npos) << refusal(c);
  c = test::small_moe_config();
  c.layer_is_moe = {false, false, true};
  EXPECT_NE(refusal(c).find(kind.fewer_layers), std::string::npos) << refusal(c);
  safetensors_write(dir.path() / "w.safetensors", {{"w", DType::f32, {2}, std::vector<uint8_t>(8, 0)}});
  const std::string not_one = std::string("is not a moet ") + (kind.name[0] == 'l' ? "layer" : "expert") + "-moments file";
  EXPECT_NE(error_of([&] { kind.check(dir.path() / "w.safetensors", test::small_moe_config()); }).find(not_one),
            std::string::npos);
}

TEST(LayerMoments, WriteReadRoundTrip) {
  TempDir dir;
  const LayerMomentsData d = small_layer_moments(0);
  layer_moments_write(dir.path() / "a.moments", d);
  const auto m = LayerMoments::read(dir.path() / "a.moments");
  for (int64_t layer : {1, 2})
    for (const bool down : {false, true}) {
      const HostTensor* t = m->matrix(layer, down);
      ASSERT_NE(t, nullptr);
      const std::vector<float>& want = down ? d.layers.at(layer).down_in : d.layers.at(layer).gate_up_in;
      EXPECT_EQ(t->shape, (std::vector<int64_t>{down ? 32 : 64, down ? 32 : 64}));
      EXPECT_EQ(0, std::memcmp(t->data, want.data(), t->bytes));
    }
  EXPECT_EQ(m->matrix(0, false), nullptr);
}

TEST(ExpertMoments, WriteReadRoundTripOfSomeExperts) {
  TempDir dir;
  const auto only_expert_1 = [](int64_t, int64_t e) { return e == 1; };
  const Imatrix d = small_expert_moments(0, only_expert_1);
  imatrix_second_moments_write(dir.path() / "a.moments", d);
  const auto m = ExpertMoments::read(dir.path() / "a.moments");
  for (int64_t layer : {1, 2}) {
    EXPECT_EQ(m->matrix(layer, 0, false), nullptr);
    EXPECT_EQ(m->matrix(layer, 0, true), nullptr);
    for (const bool down : {false, true}) {
      const HostTensor* t = m->matrix(layer, 1, down);
      ASSERT_NE(t, nullptr);
      const std::vector<float>& want = down ? d.layers.at(layer)[1].down_xx : d.layers.at(layer)[1].gate_up_xx;
      EXPECT_EQ(0, std::memcmp(t->data, want.data(), t->bytes));
    }
    EXPECT_EQ(m->tokens(layer, 0), 10 * layer) << "token counts of every expert";
    EXPECT_EQ(m->tokens(layer, 1), 300);
  }
  EXPECT_EQ(m->first_missing(test::small_moe_config()), "layer 1 expert 0");
  EXPECT_NO_THROW(m->check(test::small_moe_config())) << "a file of some experts belongs to the model";
  imatrix_second_moments_write(dir.path() / "b.moments", small_expert_moments(0, every));
  EXPECT_EQ(ExpertMoments::read(dir.path() / "b.moments")->first_missing(test::small_moe_config()), "");
}

namespace {

struct Files {
  TempDir dir;
  std::shared_ptr<const LayerMoments> layers;
  std::shared_ptr<const ExpertMoments> experts;
  // Layer moments (bias 0) and expert moments holding `held` (bias 0: other matrices than the
  // layer's; each expert's own H equal to its layer's with same_as_layer).
  Files(const std::function<bool(int64_t, int64_t)>& held, bool same_as_layer = false) {
    const LayerMomentsData l = small_layer_moments(0);
    layer_moments_write(dir.path() / "layer.moments", l);
    Imatrix e = small_expert_moments(0, held);
    if (same_as_layer)
      for (auto& [layer, experts] : e.layers)
        for (ImatrixExpert& x : experts)
          if (!x.gate_up_xx.empty()) x.gate_up_xx = l.layers.at(layer).gate_up_in, x.down_xx = l.layers.at(layer).down_in;
    imatrix_second_moments_write(dir.path() / "expert.moments", e);
    layers = LayerMoments::read(dir.path() / "layer.moments");
    experts = ExpertMoments::read(dir.path() / "expert.moments");
  }
  std::shared_ptr<const LdlqMoments> moments(bool with_layers, bool with_experts, int64_t prior = 0) const {
    return std::make_shared<const LdlqMoments>(
        LdlqMoments{with_layers ? layers : nullptr, with_experts ? experts : nullptr, prior});
  }
};

bool same_bits(const W2kLdlqFactor& a, const W2kLdlqFactor& b) {
  return a.K == b.K && a.U == b.U && a.R == b.R && a.weight == b.weight;
}

// W2K codes and scales of a few rows quantized against `f`.
std::vector<uint8_t> quantized(const W2kLdlqFactor& f) {
  std::vector<double> w(size_t(4 * f.K));
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0, 0.02);
  for (double& v : w) v = normal(rng);
  std::vector<uint8_t> bytes(size_t(4 * (f.K / 4 + f.K / 32)));
  w2k_ldlq_quantize_rows(w.data(), 4, f, bytes.data(), bytes.data() + 4 * (f.K / 4));
  return bytes;
}

}  // namespace

TEST(LdlqFactors, LayerFactorsOnePerLayerAndInput) {
  const Files files(every);
  ThreadPool pool(1);
  LdlqFactors factors(files.moments(true, false), pool);
  std::shared_ptr<const W2kLdlqFactor> gate_up = factors.get(1, 0, false), down = factors.get(1, 0, true);
  ASSERT_NE(gate_up, nullptr);
  EXPECT_EQ(gate_up->K, 64);
  EXPECT_EQ(down->K, 32);
  EXPECT_EQ(factors.get(1, 1, false), gate_up) << "made once, shared by the layer's experts";
  const std::weak_ptr<const W2kLdlqFactor> first = gate_up;
  const std::vector<double> first_r = gate_up->R;
  gate_up.reset(), down.reset();
  EXPECT_FALSE(first.expired()) << "kept while layer 1 is the layer asked last";
  const auto next = factors.get(2, 0, false);
  EXPECT_TRUE(first.expired()) << "released for layer 2";
  EXPECT_NE(next->R, first_r) << "layer 2's matrix differs";
  EXPECT_EQ(factors.get(0, 0, false), nullptr) << "a layer the file lacks";
}

TEST(LdlqFactors, HeldExpertsRoundAgainstTheirOwnMoments) {
  const Files files([](int64_t, int64_t e) { return e == 1; });
  ThreadPool pool(1);
  LdlqFactors layer_only(files.moments(true, false), pool), both(files.moments(true, true), pool);
  for (const bool down : {false, true}) {
    const auto layer = layer_only.get(1, 1, down), own = both.get(1, 1, down);
    EXPECT_FALSE(same_bits(*own, *layer)) << "expert 1's own H differs from its layer's";
    EXPECT_NE(quantized(*own), quantized(*layer));
    const HostTensor* mine = files.experts->matrix(1, 1, down);
    std::vector<float> H(size_t(mine->numel()));
    std::memcpy(H.data(), mine->data, mine->bytes);
    EXPECT_TRUE(same_bits(*own, w2k_ldlq_factor(H.data(), mine->shape[0], pool))) << "prior 0: H_e as measured";
    EXPECT_TRUE(same_bits(*both.get(1, 0, down), *layer)) << "expert 0 is not held: its layer's";
  }
}

TEST(LdlqFactors, AnOwnMatrixEqualToTheLayersGivesTheSameBits) {
  const Files files(every, true);
  ThreadPool pool(1);
  LdlqFactors layer_only(files.moments(true, false), pool);
  for (const int64_t prior : {0, 100}) {
    LdlqFactors both(files.moments(true, true, prior), pool);
    for (const bool down : {false, true}) {
      const auto own = both.get(2, 1, down), layer = layer_only.get(2, 1, down);
      EXPECT_NE(own, layer) << "made from the expert's file";
      EXPECT_TRUE(same_bits(*own, *layer)) << "prior " << prior;
      EXPECT_EQ(quantized(*own), quantized(*layer));
    }
  }
}

TEST(LdlqFactors, ThePriorBlendsWithTheLayersByTokens) {
  const Files files(every);
  ThreadPool pool(1);
  const int64_t n0 = 30, n = files.experts->tokens(1, 0);  // 10 tokens
  LdlqFactors blended(files.moments(true, true, n0), pool), own(files.moments(true, true, 0), pool);
  const HostTensor *e = files.experts->matrix(1, 0, true), *l = files.layers->matrix(1, true);
  std::vector<float> H(size_t(e->numel()));
  for (size_t i = 0; i < H.size(); ++i) {
    float a, b;
    std::memcpy(&a, e->data + 4 * i, 4), std::memcpy(&b, l->data + 4 * i, 4);
    H[i] = float((double(n) * a + double(n0) * b) / double(n + n0));
  }
  EXPECT_TRUE(same_bits(*blended.get(1, 0, true), w2k_ldlq_factor(H.data(), 32, pool)));
  EXPECT_FALSE(same_bits(*blended.get(1, 0, true), *own.get(1, 0, true)));
  LdlqFactors experts_only(files.moments(false, true, n0), pool);
  EXPECT_TRUE(same_bits(*experts_only.get(1, 0, true), *own.get(1, 0, true))) << "no layer H: nothing to blend";
}

TEST(LdlqFactors, SameBitsForAnyThreadCount) {
  const Files files(every);
  ThreadPool one(1), three(3);
  LdlqFactors a(files.moments(true, true, 30), one), b(files.moments(true, true, 30), three);
  for (const int64_t layer : {1, 2})
    for (const int64_t e : {0, 1})
      for (const bool down : {false, true}) EXPECT_TRUE(same_bits(*a.get(layer, e, down), *b.get(layer, e, down)));
}

TEST(LdlqMoments, ExpertMomentsAloneMustHoldEveryExpert) {
  const Files some([](int64_t layer, int64_t e) { return layer == 1 || e == 0; }), all(every);
  const ModelConfig c = test::small_moe_config();
  EXPECT_NE(error_of([&] { some.moments(false, true)->check(c); })
                .find("expert moments " + some.experts->path() + " hold no matrices for layer 2 expert 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { some.moments(false, true)->check(c); }).find("give --layer-moments"), std::string::npos);
  EXPECT_EQ(error_of([&] { some.moments(true, true)->check(c); }), "") << "the layer's H for the others";
  EXPECT_EQ(error_of([&] { all.moments(false, true)->check(c); }), "");
  EXPECT_NE(error_of([&] { all.moments(false, false)->check(c); }).find("needs second moments"), std::string::npos);
  ModelConfig other = c;
  other.hidden_size = 128;
  EXPECT_NE(error_of([&] { all.moments(true, true)->check(other); }).find("were made for another model"),
            std::string::npos);
}

}  // namespace moet
