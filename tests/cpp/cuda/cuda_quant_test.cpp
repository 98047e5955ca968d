// The W2, W2K and MXFP4 routed-expert kernels against the CPU backend (kernels/cpu/w2_matmul.h) on
// random codes and scales: every code value, scale bytes near 1 (UE8M0 120..127; W2K's UE5M3
// 158..167, about 2^-4) plus the byte 0 (UE8M0's subnormal 2^-127, W2K's zero scale),
// batch sizes 1 to 300 (every pass size that pass_size.h can pick, experts with more rows than one
// pass, more items than the grouping block has threads, the W2 prefill kernels of
// moe_w2_prefill.h with experts of several passes and partial tile groups), hidden/inner
// multiples of 32 that leave
// lanes idle (blocks per row not a multiple of 32 or 64); plus run-to-run bit-identity. Results
// agree within FP32 rounding (the GPU sums a block's 32 products in another order than the CPU).
// Absent experts (null table entries) contribute exactly nothing, bit for bit. In a decode-like
// step a row's W2 output does not depend on the batch (memcmp).
// GPU cases skip with a message when no GPU is visible; the pass-size choice and the W2 tile
// layout's index arithmetic are host code and always run.
#include "gpu_test_util.h"
#include "kernels/cuda/moe_w2.h"
#include "kernels/cuda/moe_w2_prefill.h"
#include "kernels/cuda/w2_layout.h"

#include <algorithm>
#include <numeric>
#include <set>

namespace moet::test {
namespace {

constexpr double kTol = 2e-5;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed, int lo, int hi, bool with_zero) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = uint8_t(with_zero && i % 97 == 5 ? 0 : dist(rng));
  return out;
}

std::pair<Tensor, Tensor> plane(BackendPair& p, const std::vector<uint8_t>& bytes, std::vector<int64_t> shape) {
  HostTensor info{"plane", DType::u8, std::move(shape), bytes.data(), bytes.size(), "test"};
  return {p.cpu->upload(info), p.gpu->upload(info)};
}

const char* format_label(ExpertFormat format) {
  return format == ExpertFormat::w2 ? "w2" : format == ExpertFormat::w2k ? "w2k" : "fp4";
}

// One layer of `experts` random W2/W2K/FP4 experts in both backends (the same bytes for the same
// seed); the experts listed in `absent` have no tensors.
std::pair<ExpertSet, ExpertSet> quant_layer(BackendPair& p, ExpertFormat format, int64_t experts, int64_t hidden,
                                            int64_t inner, const std::vector<int64_t>& absent = {}) {
  const int64_t bits = expert_format_bits(format);
  const int s = format == ExpertFormat::w2k ? 40 : 0;  // W2K bytes 160..167: scales (1 + m/8) 2^-4, every mantissa
  std::vector<ExpertWeights> cpu_experts, gpu_experts;
  for (int64_t e = 0; e < experts; ++e) {
    if (std::count(absent.begin(), absent.end(), e)) {
      cpu_experts.emplace_back();
      gpu_experts.emplace_back();
      continue;
    }
    const uint64_t seed = 1000 * uint64_t(e) + uint64_t(bits) + uint64_t(s);
    auto gu = plane(p, random_bytes(size_t(2 * inner * hidden * bits / 8), seed, 0, 255, false),
                    {2 * inner, hidden * bits / 8});
    auto gus = plane(p, random_bytes(size_t(2 * inner * hidden / 32), seed + 1, 120 + s, 127 + s, true),
                     {2 * inner, hidden / 32});
    auto dn = plane(p, random_bytes(size_t(hidden * inner * bits / 8), seed + 2, 0, 255, false), {hidden, inner * bits / 8});
    auto dns = plane(p, random_bytes(size_t(hidden * inner / 32), seed + 3, 118 + s, 126 + s, true),
                     {hidden, inner / 32});
    cpu_experts.push_back({gu.first, dn.first, format, gus.first, dns.first});
    gpu_experts.push_back({gu.second, dn.second, format, gus.second, dns.second});
  }
  const ExpertLayout layout{format, hidden, inner};
  return {p.cpu->expert_set(layout, cpu_experts), p.gpu->expert_set(layout, gpu_experts)};
}

void check_quant_moe(ExpertFormat format, int64_t experts, int64_t top_k, int64_t hidden, int64_t inner, int64_t rows) {
  BackendPair p;
  const int64_t bits = expert_format_bits(format);
  const auto [cpu_set, gpu_set] = quant_layer(p, format, experts, hidden, inner);
  const auto in = p.moe_inputs(rows, experts, top_k, hidden, static_cast<uint64_t>(rows * 31 + bits));
  auto out = p.alloc({rows, hidden});
  p.cpu->moe_experts(in.x.first, cpu_set, in.ids.first, in.weights.first, out.first);
  p.gpu->moe_experts(in.x.second, gpu_set, in.ids.second, in.weights.second, out.second);
  const double diff = max_rel_diff(p, out);
  EXPECT_LT(diff, kTol) << format_label(format) << " rows " << rows << " hidden " << hidden << " inner " << inner;
  std::printf("%-3s experts %ld top-%ld hidden %ld inner %ld rows %ld: max rel |cuda - cpu| = %.3g\n",
              format_label(format), long(experts), long(top_k), long(hidden), long(inner), long(rows), diff);
  Tensor again = p.gpu->alloc({rows, hidden});
  p.gpu->moe_experts(in.x.second, gpu_set, in.ids.second, in.weights.second, again);
  const auto a = host(*p.gpu, out.second), b = host(*p.gpu, again);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "run to run";
}

// Experts absent from the table (tiered residency) contribute nothing: on the GPU the layer with
// every third expert absent gives exactly (memcmp) the full layer's result for routing that names
// no expert (-1) where the absent ones were chosen, and agrees with the CPU's absent layer.
void check_absent_experts(ExpertFormat format, int64_t experts, int64_t top_k, int64_t hidden, int64_t inner,
                          int64_t rows) {
  BackendPair p;
  std::vector<int64_t> absent;
  for (int64_t e = 1; e < experts; e += 3) absent.push_back(e);
  const auto [cpu_partial, gpu_partial] = quant_layer(p, format, experts, hidden, inner, absent);
  const auto full = quant_layer(p, format, experts, hidden, inner);
  const auto in = p.moe_inputs(rows, experts, top_k, hidden, uint64_t(rows * 7 + 3));
  std::vector<int32_t> ids(size_t(rows * top_k));
  p.cpu->to_host(in.ids.first, ids.data());
  for (int32_t& id : ids)
    if (std::count(absent.begin(), absent.end(), id)) id = -1;
  Tensor dropped = p.gpu->alloc({rows, top_k}, DType::i32);
  p.gpu->from_host(ids.data(), dropped);
  auto out = p.alloc({rows, hidden});
  Tensor reference = p.gpu->alloc({rows, hidden});
  p.cpu->moe_experts(in.x.first, cpu_partial, in.ids.first, in.weights.first, out.first);
  p.gpu->moe_experts(in.x.second, gpu_partial, in.ids.second, in.weights.second, out.second);
  p.gpu->moe_experts(in.x.second, full.second, dropped, in.weights.second, reference);
  EXPECT_LT(max_rel_diff(p, out), kTol) << "rows " << rows;
  const auto a = host(*p.gpu, out.second), b = host(*p.gpu, reference);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "rows " << rows << " hidden " << hidden;
}

struct MoeShape {
  int64_t experts, top_k, hidden, inner, rows;
};
// Batch sizes 1 to 64 over 8 experts and more (every pass size of both kernels), hidden / inner
// with a lane's extra block, top-8 with many experts active, 320 items (more than the grouping
// block has threads), and DeepSeek-V3's expert shape with all experts active: long tiles, some
// covered by one warp alone, some shared by several (the persistent W2 kernels' two ways of
// finishing a tile).
constexpr MoeShape kMoeShapes[] = {
    {8, 2, 64, 32, 1}, {8, 2, 64, 32, 2},  {8, 2, 64, 32, 3},  {8, 2, 64, 32, 4},     {8, 2, 64, 32, 5},
    {8, 2, 64, 32, 8}, {8, 2, 64, 32, 20}, {4, 2, 64, 32, 64}, {16, 4, 256, 96, 5},   {12, 3, 2080, 1056, 1},
    {12, 3, 2080, 1056, 7}, {10, 8, 512, 64, 4}, {16, 8, 256, 96, 40}, {8, 8, 7168, 2048, 1}, {8, 8, 7168, 2048, 8},
    {8, 2, 256, 96, 300},  {8, 8, 2048, 768, 64},  // prefill: W2 passes of 64 items
};

// Whether W2 runs a shape on the prefill kernels (needs the GPU's shared-memory limit).
bool w2_prefill(const MoeShape& s) {
  return cuda::moe_w2_scratch(s.rows, s.top_k, s.experts, s.hidden, s.inner, false).pass_items ==
         cuda::kW2PrefillPassItems;
}

class CudaQuantMoe : public ::testing::TestWithParam<ExpertFormat> {};

TEST_P(CudaQuantMoe, MatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  const ExpertFormat f = GetParam();
  int prefill_shapes = 0;
  for (const MoeShape& s : kMoeShapes) prefill_shapes += w2_prefill(s);
  EXPECT_EQ(cuda::w2_prefill_fits() ? 3 : 0, prefill_shapes);  // {4, 2, 64, 32, 64} and the last two
  for (const MoeShape& s : kMoeShapes) check_quant_moe(f, s.experts, s.top_k, s.hidden, s.inner, s.rows);
}

TEST_P(CudaQuantMoe, AbsentExpertsContributeNothing) {
  MOET_SKIP_WITHOUT_GPU();
  for (const MoeShape& s : {MoeShape{8, 2, 64, 32, 1}, MoeShape{8, 2, 64, 32, 8}, MoeShape{16, 8, 256, 96, 40},
                            MoeShape{8, 2, 256, 96, 300}, MoeShape{8, 8, 2048, 768, 64}})
    check_absent_experts(GetParam(), s.experts, s.top_k, s.hidden, s.inner, s.rows);
}

// In a decode-like step (StepInputs::row_invariant) a row's W2 output depends only on its own row:
// DeepSeek-V3's expert shape, whose tile blocks are longer than the grid's warps can each take
// whole at batch 1 (so the plain partition cuts them where the step's passes put the cut), at 1,
// 3 and 8 rows (8, 16 and 32 passes) and at 40 (past the prefill kernels' threshold), each memcmp-
// equal to the first rows of the 40-row step.
TEST(CudaQuantMoe, W2RowsOfDecodeLikeStepsDoNotDependOnTheBatch) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const int64_t experts = 8, top_k = 8, hidden = 7168, inner = 2048, most = 40;
  const auto sets = quant_layer(p, ExpertFormat::w2, experts, hidden, inner);
  const auto in = p.moe_inputs(most, experts, top_k, hidden, 11);
  const std::vector<int32_t> zeros(static_cast<size_t>(most), 0);
  std::vector<int32_t> positions(static_cast<size_t>(most));
  std::iota(positions.begin(), positions.end(), 0);
  const std::vector<int64_t> slots(size_t(most), 0);
  const std::vector<int32_t> table(size_t(most), 0);
  const int32_t* tables[] = {table.data()};
  const auto first_rows = [&](const Tensor& t, int64_t rows) {
    return Tensor{t.dtype, {rows, t.dim(1)}, t.storage, t.data};
  };
  const auto run = [&](int64_t rows) {
    p.gpu->begin_step({rows, zeros.data(), positions.data(), zeros.data(), slots.data(), 1, tables, 1, 0, true});
    Tensor out = p.gpu->alloc({rows, hidden});
    p.gpu->moe_experts(first_rows(in.x.second, rows), sets.second, first_rows(in.ids.second, rows),
                       first_rows(in.weights.second, rows), out);
    return host(*p.gpu, out);
  };
  const std::vector<float> all = run(most);
  for (const int64_t rows : {1, 3, 8}) {
    const std::vector<float> some = run(rows);
    EXPECT_EQ(0, std::memcmp(some.data(), all.data(), some.size() * sizeof(float))) << rows << " rows";
  }
}

// The pass sizes follow the expected items per expert: one item (pair) per pass at decode with
// many experts, where most active experts get one item; more when experts are few or batches
// large. Host code: runs without a GPU.
TEST(CudaQuantMoe, PassSizesFollowTheItemsPerExpert) {
  using cuda::moe_quant_rows_per_pass;
  using cuda::w2_pairs_per_pass;
  for (int64_t rows : {1, 2, 4, 8}) {
    for (int64_t experts : {128, 256}) {  // Qwen3-235B and DeepSeek-V3, top-8
      EXPECT_EQ(1, w2_pairs_per_pass(rows, 8, experts)) << "rows " << rows << " of " << experts << " experts";
      EXPECT_EQ(1, moe_quant_rows_per_pass(rows, 8, experts)) << "rows " << rows << " of " << experts << " experts";
    }
  }
  EXPECT_EQ(1, w2_pairs_per_pass(1, 8, 8));  // batch 1: one item per expert, however many are active
  EXPECT_EQ(1, moe_quant_rows_per_pass(1, 8, 8));
  EXPECT_GT(w2_pairs_per_pass(8, 8, 8), 1);  // every expert gets all 8 rows
  EXPECT_GT(moe_quant_rows_per_pass(8, 8, 8), 1);
  EXPECT_EQ(4, w2_pairs_per_pass(512, 8, 128));  // prefill: 32 items per expert on average
  EXPECT_EQ(8, moe_quant_rows_per_pass(512, 8, 128));
  // MatchesCpu's shapes reach every pass size the kernels are compiled for.
  std::set<int> pairs, rows_per_pass;
  for (const MoeShape& s : kMoeShapes) {
    pairs.insert(w2_pairs_per_pass(s.rows, s.top_k, s.experts));
    rows_per_pass.insert(moe_quant_rows_per_pass(s.rows, s.top_k, s.experts));
  }
  EXPECT_EQ((std::set<int>{1, 2, 4}), pairs);
  EXPECT_EQ((std::set<int>{1, 2, 4, 8}), rows_per_pass);
}

// The A fragments (w2_fragment_pos) and the split activations (w2_split_offset) must put the same
// column under the same k of the same k-step, each covering a chunk once, and a register half's
// exponent base (w2_word_base) must be the scale byte of that column's block.
TEST(CudaQuantMoe, W2FragmentsAndActivationsPairTheSameColumns) {
  using cuda::w2_fragment_pos;
  constexpr int64_t kChunk = 3;  // any chunk: offsets are per chunk plus a fixed stride
  std::set<std::pair<int, int>> weights;
  std::set<int64_t> offsets;
  for (int lane = 0; lane < 32; ++lane) {
    const int c = lane & 3;
    for (int w = 0; w < 4; ++w)
      for (int j = 0; j < 8; ++j)
        for (int h = 0; h < 2; ++h) {
          const cuda::W2FragmentPos pos = w2_fragment_pos(lane, w, j, h);
          ASSERT_TRUE(pos.row >= 0 && pos.row < 16 && pos.col >= 0 && pos.col < 128);
          EXPECT_TRUE(weights.insert({pos.row, pos.col}).second) << "lane " << lane << " w " << w << " j " << j;
          // B register r = (j & 3) >> 1 of k-step j >> 2 holds k = 2c + 8r + h, as A register j & 3 does.
          const int step = j >> 2, r = (j & 3) >> 1;
          const int64_t expected = ((kChunk * 16 + w * 4 + c) * 8) + step * 4 + r * 2 + h;
          EXPECT_EQ(expected, cuda::w2_split_offset(kChunk * 128 + pos.col)) << "column " << pos.col;
          offsets.insert(cuda::w2_split_offset(kChunk * 128 + pos.col));
          EXPECT_EQ(pos.col / 32, cuda::w2_half_block(w, h));
          const uint32_t bytes = 0xFB7F0105u;  // blocks 0..3: 0x05, 0x01, 0x7F, 0xFB
          const uint32_t exponent = (cuda::w2_word_base(bytes, w) >> (7 + 16 * h)) & 0xFF;
          EXPECT_EQ((bytes >> (8 * (pos.col / 32))) & 0xFF, exponent) << "word " << w << " half " << h;
          EXPECT_EQ(0u, cuda::w2_word_base(bytes, w) & ~0x7F807F80u);
        }
  }
  EXPECT_EQ(size_t(16 * 128), weights.size());
  EXPECT_EQ(size_t(128), offsets.size());
  EXPECT_EQ(kChunk * 128, *offsets.begin());
  EXPECT_EQ(kChunk * 128 + 127, *offsets.rbegin());
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaQuantMoe,
                         ::testing::Values(ExpertFormat::w2, ExpertFormat::fp4, ExpertFormat::w2k),
                         [](const ::testing::TestParamInfo<ExpertFormat>& info) {
                           return std::string(format_label(info.param));
                         });

TEST(CudaQuantMoe, RejectsMalformedPlanes) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const std::vector<uint8_t> codes(size_t(64 * 48 / 4));
  // hidden 48 is not a multiple of 32 along the scale blocks.
  auto gu = plane(p, codes, {64, 48 / 4});
  auto gus = plane(p, std::vector<uint8_t>(64 * 1), {64, 1});
  auto dn = plane(p, std::vector<uint8_t>(48 * 32 / 4), {48, 32 / 4});
  auto dns = plane(p, std::vector<uint8_t>(48), {48, 1});
  std::vector<ExpertWeights> experts{{gu.second, dn.second, ExpertFormat::w2, gus.second, dns.second}};
  EXPECT_THROW(p.gpu->expert_set({ExpertFormat::w2, 48, 32}, experts), std::exception);
}

// The tensor-core W2 kernels put the scale into the weights' BF16 exponent (level 4 adds 2 to
// it), so scales >= 2^126 (bytes >= 253) are refused at load with a message, not silently
// overflowed.
TEST(CudaQuantMoe, RejectsW2ScalesBeyondTheTileRange) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const int64_t hidden = 64, inner = 32;
  auto gu = plane(p, std::vector<uint8_t>(size_t(2 * inner * hidden / 4)), {2 * inner, hidden / 4});
  std::vector<uint8_t> gate_up_scales(size_t(2 * inner * hidden / 32), 127);
  gate_up_scales[5] = 253;
  auto gus = plane(p, gate_up_scales, {2 * inner, hidden / 32});
  auto dn = plane(p, std::vector<uint8_t>(size_t(hidden * inner / 4)), {hidden, inner / 4});
  auto dns = plane(p, std::vector<uint8_t>(size_t(hidden * inner / 32), 127), {hidden, inner / 32});
  std::vector<ExpertWeights> experts{{gu.second, dn.second, ExpertFormat::w2, gus.second, dns.second}};
  try {
    p.gpu->expert_set({ExpertFormat::w2, hidden, inner}, experts);
    ADD_FAILURE() << "a W2 scale byte of 253 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("2^126"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moet::test
