// The CUDA backend's norm ops against the CPU backend: rmsnorm (one warp per group: per-head
// widths 128 x 64 heads, 96; one block per group: 2048 to 8192; odd widths and a misaligned view
// on the scalar path), add_rmsnorm (the decoder's residual step), qk_norm_rope (per-head q/k
// RMSNorm + rope: default, yarn, partial rotary, interleaved, without norms) and
// qk_norm_rope_kv_write (the same prologue plus the KV write of k and v into scattered cache
// slots, the whole K and V caches compared), plus rope at an offset (MLA). Each result is also
// checked to repeat bit for bit run to run, not to depend on the other rows of the batch, and
// (fused ops) to equal the ops it fuses bit for bit. Skips with a message when no GPU is visible.
#include "gpu_test_util.h"

#include "core/error.h"
#include "models/rope_table.h"

namespace moet::test {
namespace {

constexpr double kNormTol = 1e-6;
constexpr double kRopeTol = 2e-6;
constexpr float kEps = 1e-6f;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_bits(Backend& backend, const Tensor& a, const Tensor& b) {
  return same_bits(host(backend, a), host(backend, b));
}

// A [rows, cols] view of `t` that starts `offset` floats in (a group start off 16-byte alignment).
Tensor view(const Tensor& t, int64_t offset, int64_t rows, int64_t cols) {
  Tensor v = t;
  v.shape = {rows, cols};
  v.data = t.as<float>() + offset;
  return v;
}

constexpr int64_t kBlockSize = 16;
const std::vector<int64_t> kOrderedSlots = {0, 1, 2, 3, 4, 5, 6, 7};
const std::vector<int64_t> kScatteredSlots = {45, 3, 60, 17, 32};  // of a 4-block cache

// One step of `rows` rows of one sequence at `positions`, writing their K/V into `slots`, in both
// backends. The backends keep pointers to the step's host arrays until the next step
// (backend.h), so `positions` must outlive the step's ops (a temporary is refused; the slots are
// the constants above).
void begin_rows(BackendPair& p, const std::vector<int32_t>& positions,
                const std::vector<int64_t>& slots = kOrderedSlots) {
  static const std::vector<int32_t> tokens(8, 0), row_seq(8, 0), table(8192, 0);
  static const int32_t* tables[] = {table.data()};
  p.begin_step({int64_t(positions.size()), tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables,
                kBlockSize});
}
void begin_rows(BackendPair& p, std::vector<int32_t>&& positions, const std::vector<int64_t>& slots = kOrderedSlots) =
    delete;

TEST(CudaNorm, RmsNormMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {128, 64}, {128, 4}, {96, 5}, {70, 3}, {256, 2}, {257, 3}, {512, 1}, {1000, 5}, {1001, 3},
      {2048, 1}, {2048, 5}, {4096, 1}, {4096, 5}, {5120, 5}, {7168, 1}, {7168, 5}, {8192, 2}};
  for (const auto& [dim, groups] : shapes) {
    const auto values = random_floats(size_t(groups * dim), uint64_t(dim), 3.0f);
    auto x = p.activation(values, {groups, dim});
    auto weight = p.activation(random_floats(size_t(dim), uint64_t(dim) + 1), {dim});
    auto out = p.alloc({groups, dim});
    p.cpu->rmsnorm(x.first, weight.first, kEps, out.first);
    p.gpu->rmsnorm(x.second, weight.second, kEps, out.second);
    EXPECT_LT(max_rel_diff(p, out), kNormTol) << "dim " << dim << " groups " << groups;
    Tensor again = p.gpu->alloc({groups, dim});
    p.gpu->rmsnorm(x.second, weight.second, kEps, again);
    EXPECT_TRUE(same_bits(*p.gpu, out.second, again)) << "run to run, dim " << dim;
    Tensor one = p.activation({values.begin(), values.begin() + dim}, {1, dim}).second;
    Tensor one_out = p.gpu->alloc({1, dim});
    p.gpu->rmsnorm(one, weight.second, kEps, one_out);
    const auto batched = host(*p.gpu, out.second);
    EXPECT_TRUE(same_bits(host(*p.gpu, one_out), {batched.begin(), batched.begin() + dim}))
        << "group 0 alone vs in a batch, dim " << dim;
    p.gpu->rmsnorm(x.second, weight.second, kEps, x.second);
    EXPECT_TRUE(same_bits(*p.gpu, out.second, x.second)) << "in place, dim " << dim;
  }
}

TEST(CudaNorm, RmsNormOfMisalignedRowsMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  for (int64_t dim : {128, 4096, 8192}) {
    const int64_t groups = 3;
    auto storage = p.activation(random_floats(size_t(groups * dim + 1), 40, 2.0f), {groups * dim + 1});
    auto weight = p.activation(random_floats(size_t(dim), 41), {dim});
    auto out = p.alloc({groups, dim});
    p.cpu->rmsnorm(view(storage.first, 1, groups, dim), weight.first, kEps, out.first);
    p.gpu->rmsnorm(view(storage.second, 1, groups, dim), weight.second, kEps, out.second);
    EXPECT_LT(max_rel_diff(p, out), kNormTol) << "dim " << dim;
  }
}

TEST(CudaNorm, AddRmsNormMatchesCpuAndTheOpsItFuses) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  for (int64_t hidden : {96, 1000, 2048, 4096, 5120, 7168}) {
    const auto residual_values = random_floats(size_t(5 * hidden), uint64_t(hidden), 4.0f);
    const auto delta_values = random_floats(size_t(5 * hidden), uint64_t(hidden) + 1);
    auto weight = p.activation(random_floats(size_t(hidden), uint64_t(hidden) + 2), {hidden});
    std::vector<float> single_row;
    for (int64_t rows : {1, 5}) {
      const auto prefix = [&](const std::vector<float>& v) {
        return std::vector<float>(v.begin(), v.begin() + rows * hidden);
      };
      auto residual = p.activation(prefix(residual_values), {rows, hidden});
      auto delta = p.activation(prefix(delta_values), {rows, hidden});
      auto out = p.alloc({rows, hidden});
      p.cpu->add_rmsnorm(residual.first, delta.first, weight.first, kEps, out.first);
      p.gpu->add_rmsnorm(residual.second, delta.second, weight.second, kEps, out.second);
      EXPECT_EQ(max_rel_diff(p, residual), 0.0) << "residual, hidden " << hidden << " rows " << rows;
      EXPECT_LT(max_rel_diff(p, out), kNormTol) << "hidden " << hidden << " rows " << rows;
      Tensor unfused_residual = p.activation(prefix(residual_values), {rows, hidden}).second;
      Tensor unfused_out = p.gpu->alloc({rows, hidden});
      p.gpu->add(unfused_residual, delta.second);
      p.gpu->rmsnorm(unfused_residual, weight.second, kEps, unfused_out);
      EXPECT_TRUE(same_bits(*p.gpu, out.second, unfused_out)) << "fused vs add + rmsnorm, hidden " << hidden;
      Tensor again_residual = p.activation(prefix(residual_values), {rows, hidden}).second;
      Tensor again_out = p.gpu->alloc({rows, hidden});
      p.gpu->add_rmsnorm(again_residual, delta.second, weight.second, kEps, again_out);
      EXPECT_TRUE(same_bits(*p.gpu, out.second, again_out)) << "run to run, hidden " << hidden;
      const auto gpu_out = host(*p.gpu, out.second);
      if (rows == 1) {
        single_row = gpu_out;
      } else {
        EXPECT_TRUE(same_bits(single_row, {gpu_out.begin(), gpu_out.begin() + hidden})) << "batch, hidden " << hidden;
      }
    }
  }
}

struct PrologueCase {
  const char* name;
  int64_t q_heads, k_heads, head_dim;
  RopeConfig rope;
  bool norm;
};

RopeConfig rope_config(int64_t dim, bool interleaved, bool yarn) {
  RopeConfig c;
  c.theta = 1000000.0;
  c.dim = dim;
  c.interleaved = interleaved;
  if (yarn) {
    c.type = "yarn";
    c.factor = 40.0;
    c.original_max_position_embeddings = 4096;
    c.mscale = 1.0;
    c.mscale_all_dim = 0.707;  // attention factor != 1: cos and sin scaled
  }
  return c;
}

// The positions of a prologue check's rows (the first row alone, then all five).
const std::vector<int32_t> kProloguePositions = {131071, 0, 17, 4093, 65537};

// A prologue case's inputs for up to 5 rows (seeds seed .. seed + 3): its rope table, q and k
// values, and the per-head norm weights in both backends when the case has them (else empty).
struct PrologueInputs {
  RopeTable table;
  std::vector<float> q_values, k_values;
  std::pair<Tensor, Tensor> q_norm, k_norm;
};
PrologueInputs prologue_inputs(BackendPair& p, const PrologueCase& c, uint64_t seed) {
  PrologueInputs in{rope_table_build(c.rope), random_floats(size_t(5 * c.q_heads * c.head_dim), seed, 2.0f),
                    random_floats(size_t(5 * c.k_heads * c.head_dim), seed + 1, 2.0f), {}, {}};
  if (c.norm) {
    in.q_norm = p.activation(random_floats(size_t(c.head_dim), seed + 2), {c.head_dim});
    in.k_norm = p.activation(random_floats(size_t(c.head_dim), seed + 3), {c.head_dim});
  }
  return in;
}

void check_prologue(const PrologueCase& c) {
  SCOPED_TRACE(c.name);
  BackendPair p;
  const auto [table, q_values, k_values, q_norm, k_norm] = prologue_inputs(p, c, 50);
  const int64_t q_cols = c.q_heads * c.head_dim, k_cols = c.k_heads * c.head_dim;
  std::vector<float> single_q;
  for (int64_t rows : {1, 5}) {
    const std::vector<int32_t> positions(kProloguePositions.begin(), kProloguePositions.begin() + rows);
    begin_rows(p, positions);
    const auto input = [&](const std::vector<float>& v, int64_t cols) {
      return p.activation({v.begin(), v.begin() + rows * cols}, {rows, cols});
    };
    auto q = input(q_values, q_cols), k = input(k_values, k_cols);
    p.cpu->qk_norm_rope(table, q.first, c.q_heads, k.first, c.k_heads, c.head_dim, q_norm.first, k_norm.first, kEps);
    p.gpu->qk_norm_rope(table, q.second, c.q_heads, k.second, c.k_heads, c.head_dim, q_norm.second, k_norm.second,
                        kEps);
    EXPECT_LT(max_rel_diff(p, q), kRopeTol) << "q, rows " << rows;
    EXPECT_LT(max_rel_diff(p, k), kRopeTol) << "k, rows " << rows;
    auto unfused_q = input(q_values, q_cols).second, unfused_k = input(k_values, k_cols).second;
    if (c.norm) {
      p.gpu->rmsnorm(unfused_q, q_norm.second, kEps, unfused_q);
      p.gpu->rmsnorm(unfused_k, k_norm.second, kEps, unfused_k);
    }
    p.gpu->rope(table, unfused_q, c.q_heads, c.head_dim, 0);
    p.gpu->rope(table, unfused_k, c.k_heads, c.head_dim, 0);
    EXPECT_TRUE(same_bits(*p.gpu, q.second, unfused_q)) << "fused vs rmsnorm + rope, rows " << rows;
    EXPECT_TRUE(same_bits(*p.gpu, k.second, unfused_k)) << "fused vs rmsnorm + rope, rows " << rows;
    auto again_q = input(q_values, q_cols).second, again_k = input(k_values, k_cols).second;
    p.gpu->qk_norm_rope(table, again_q, c.q_heads, again_k, c.k_heads, c.head_dim, q_norm.second, k_norm.second, kEps);
    EXPECT_TRUE(same_bits(*p.gpu, q.second, again_q) && same_bits(*p.gpu, k.second, again_k)) << "run to run";
    const auto gpu_q = host(*p.gpu, q.second);
    if (rows == 1) {
      single_q = gpu_q;
    } else {
      EXPECT_TRUE(same_bits(single_q, {gpu_q.begin(), gpu_q.begin() + q_cols})) << "row 0 alone vs in a batch";
    }
  }
}

TEST(CudaNorm, QkNormRopeMatchesCpuAndTheOpsItFuses) {
  MOET_SKIP_WITHOUT_GPU();
  check_prologue({"Qwen3-235B: 64 q / 4 kv heads of 128, q/k norm", 64, 4, 128, rope_config(128, false, false), true});
  check_prologue({"Mixtral: no q/k norm", 32, 8, 128, rope_config(128, false, false), false});
  check_prologue({"GLM4-MoE: partial rotary, q/k norm", 12, 2, 128, rope_config(64, false, false), true});
  check_prologue({"GLM4-MoE: partial rotary, no norm", 12, 2, 128, rope_config(64, false, false), false});
  check_prologue({"yarn, interleaved", 16, 2, 64, rope_config(64, true, true), true});
  check_prologue({"yarn, 256-wide heads", 4, 1, 256, rope_config(256, false, true), true});
  check_prologue({"70-wide heads (scalar path), partial", 6, 2, 70, rope_config(32, false, false), true});
}

// qk_norm_rope_kv_write on rows at scattered slots of a 4-block cache: q and k in place and the
// whole K and V caches (untouched slots included) against the CPU backend, which runs it as
// qk_norm_rope then kv_write; all four bit for bit against the GPU's own qk_norm_rope + kv_write
// (so the cached k is exactly the prologue's and v a copy); the caches again bit for bit when the
// op runs twice.
void check_prologue_kv(const PrologueCase& c) {
  SCOPED_TRACE(c.name);
  BackendPair p;
  const auto [table, q_values, k_values, q_norm, k_norm] = prologue_inputs(p, c, 80);
  const int64_t q_cols = c.q_heads * c.head_dim, k_cols = c.k_heads * c.head_dim;
  const auto v_values = random_floats(size_t(5 * k_cols), 84, 2.0f);
  const auto new_cache = [&](Backend& b) {
    return b.alloc_kv(4, kBlockSize, KvLayout{KvDtype::f32, c.k_heads, c.head_dim, c.head_dim, false});
  };
  for (int64_t rows : {1, 5}) {
    SCOPED_TRACE(rows == 1 ? "1 row" : "5 rows");
    const std::vector<int32_t> positions(kProloguePositions.begin(), kProloguePositions.begin() + rows);
    begin_rows(p, positions, kScatteredSlots);
    const auto input = [&](const std::vector<float>& v, int64_t cols) {
      return p.activation({v.begin(), v.begin() + rows * cols}, {rows, cols});
    };
    auto q = input(q_values, q_cols), k = input(k_values, k_cols);
    const auto v = input(v_values, k_cols);
    KvLayerCache cpu_cache = new_cache(*p.cpu), gpu_cache = new_cache(*p.gpu);
    p.cpu->qk_norm_rope_kv_write(table, q.first, c.q_heads, k.first, c.k_heads, c.head_dim, q_norm.first,
                                 k_norm.first, kEps, v.first, cpu_cache);
    p.gpu->qk_norm_rope_kv_write(table, q.second, c.q_heads, k.second, c.k_heads, c.head_dim, q_norm.second,
                                 k_norm.second, kEps, v.second, gpu_cache);
    EXPECT_LT(max_rel_diff(p, q), kRopeTol) << "q";
    EXPECT_LT(max_rel_diff(p, k), kRopeTol) << "k";
    EXPECT_LT(max_rel_diff(p, {cpu_cache.k, gpu_cache.k}), kRopeTol) << "K cache";
    EXPECT_EQ(max_rel_diff(p, {cpu_cache.v, gpu_cache.v}), 0.0) << "V cache";
    auto unfused_q = input(q_values, q_cols).second, unfused_k = input(k_values, k_cols).second;
    KvLayerCache unfused_cache = new_cache(*p.gpu);
    p.gpu->qk_norm_rope(table, unfused_q, c.q_heads, unfused_k, c.k_heads, c.head_dim, q_norm.second, k_norm.second,
                        kEps);
    p.gpu->kv_write(unfused_cache, unfused_k, &v.second);
    EXPECT_TRUE(same_bits(*p.gpu, q.second, unfused_q) && same_bits(*p.gpu, k.second, unfused_k))
        << "q, k: fused vs qk_norm_rope + kv_write";
    EXPECT_TRUE(same_bits(*p.gpu, gpu_cache.k, unfused_cache.k) && same_bits(*p.gpu, gpu_cache.v, unfused_cache.v))
        << "caches: fused vs qk_norm_rope + kv_write";
    auto again_q = input(q_values, q_cols).second, again_k = input(k_values, k_cols).second;
    KvLayerCache again_cache = new_cache(*p.gpu);
    p.gpu->qk_norm_rope_kv_write(table, again_q, c.q_heads, again_k, c.k_heads, c.head_dim, q_norm.second,
                                 k_norm.second, kEps, v.second, again_cache);
    EXPECT_TRUE(same_bits(*p.gpu, gpu_cache.k, again_cache.k) && same_bits(*p.gpu, gpu_cache.v, again_cache.v))
        << "caches run to run";
  }
}

TEST(CudaNorm, QkNormRopeKvWriteMatchesCpuAndTheOpsItFuses) {
  MOET_SKIP_WITHOUT_GPU();
  check_prologue_kv({"Qwen3-235B: 64 q / 4 kv heads of 128, q/k norm", 64, 4, 128, rope_config(128, false, false),
                     true});
  check_prologue_kv({"Mixtral: no q/k norm", 32, 8, 128, rope_config(128, false, false), false});
  check_prologue_kv({"GLM4-MoE: partial rotary, q/k norm", 12, 2, 128, rope_config(64, false, false), true});
  check_prologue_kv({"partial rotary, no norm (k's tail copied)", 12, 2, 128, rope_config(64, false, false), false});
  check_prologue_kv({"yarn, interleaved", 16, 2, 64, rope_config(64, true, true), true});
  check_prologue_kv({"70-wide heads (scalar path), partial", 6, 2, 70, rope_config(32, false, false), true});
  check_prologue_kv({"5 q / 1 kv heads of 70 (scalar path), partial, no norm", 5, 1, 70,
                     rope_config(32, true, false), false});
}

// MLA's rope: 16 heads of 192 rotating [128, 192) interleaved, and the shared key of a 576-wide
// latent row rotating [512, 576).
TEST(CudaNorm, RopeAtAnOffsetMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const std::vector<int32_t> positions = {3, 4096, 77};
  begin_rows(p, positions);
  const RopeTable table = rope_table_build(rope_config(64, true, true));
  auto q = p.activation(random_floats(size_t(3 * 16 * 192), 60), {3, 16 * 192});
  auto kv = p.activation(random_floats(size_t(3 * 576), 61), {3, 576});
  p.cpu->rope(table, q.first, 16, 192, 128);
  p.gpu->rope(table, q.second, 16, 192, 128);
  p.cpu->rope(table, kv.first, 1, 576, 512);
  p.gpu->rope(table, kv.second, 1, 576, 512);
  EXPECT_LT(max_rel_diff(p, q), kRopeTol);
  EXPECT_LT(max_rel_diff(p, kv), kRopeTol);
}

TEST(CudaNorm, WidthsBeyondTheKernelsAreRefused) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  Tensor x = p.gpu->alloc({1, 8196}), w = p.gpu->alloc({8196}), out = p.gpu->alloc({1, 8196});
  EXPECT_THROW(p.gpu->rmsnorm(x, w, kEps, out), Error);
  EXPECT_THROW(p.gpu->add_rmsnorm(x, x, w, kEps, out), Error);
  const std::vector<int32_t> positions = {0};
  begin_rows(p, positions);
  Tensor q = p.gpu->alloc({1, 512}), k = p.gpu->alloc({1, 512}), norm = p.gpu->alloc({512});
  EXPECT_THROW(p.gpu->qk_norm_rope(rope_table_build(rope_config(64, false, false)), q, 1, k, 1, 512, norm, norm, kEps),
               Error);
}

// The fused KV write takes only a GQA cache of the prologue's k heads (not MLA's latent cache, where
// V aliases K, nor a cache of other heads or widths).
TEST(CudaNorm, QkNormRopeKvWriteRefusesOtherCaches) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const std::vector<int32_t> positions = {0};
  begin_rows(p, positions);
  const RopeTable table = rope_table_build(rope_config(64, false, false));
  Tensor q = p.gpu->alloc({1, 256}), k = p.gpu->alloc({1, 128}), v = p.gpu->alloc({1, 128}), none;
  for (KvLayerCache cache : {p.gpu->alloc_kv(1, kBlockSize, KvLayout{KvDtype::f32, 2, 64, 64, true}),
                             p.gpu->alloc_kv(1, kBlockSize, KvLayout{KvDtype::f32, 1, 128, 128, false}),
                             p.gpu->alloc_kv(1, kBlockSize, KvLayout{KvDtype::f32, 2, 32, 32, false})})
    EXPECT_THROW(p.gpu->qk_norm_rope_kv_write(table, q, 4, k, 2, 64, none, none, kEps, v, cache), Error);
}

}  // namespace
}  // namespace moet::test
