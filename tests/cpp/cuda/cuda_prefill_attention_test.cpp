// Prefill attention on the tensor cores (kernels/cuda/prefill_attention.h) through the CUDA
// backend, against the CPU backend within kTol: one sequence of 1..300 rows (the query tile's
// edges for tiles of 1, 2, 8, 16 and 64 rows), several sequences in one step over scattered
// physical blocks (block sizes 16 and 24), a chunked prefill (rows after keys an earlier step
// wrote), head dims 64 and 128, GQA groups 1, 4 and 8, MLA's latent cache (DeepSeek-V3: one KV
// head of 576 floats, V its first 512; 16 and 128 query heads), and a mixed step (a prefill run
// between decode rows of other sequences, whose bits must be those of the decode kernel alone).
// Each step also runs twice (bit-identical) and asserts by its profile name which kernel served
// it, so a test cannot silently run the decode kernel. Skips with a message when no GPU is visible.
#include "gpu_test_util.h"

#include <fmt/format.h>

#include <string>
#include <utility>

namespace moet::test {
namespace {

constexpr double kTol = 2e-5;

struct Shape {
  int64_t q_heads, kv_heads, k_dim, v_dim;
  bool mla;  // V aliases K (its first v_dim floats): the latent cache
};
Shape gqa(int64_t q_heads, int64_t kv_heads, int64_t dim) { return {q_heads, kv_heads, dim, dim, false}; }
Shape mla(int64_t q_heads) { return {q_heads, 1, 576, 512, true}; }

struct Row {
  int32_t seq, position;
};

// Sequences of the given capacities in one KV cache per backend, their blocks scattered (a fixed
// permutation of all blocks); each step writes random K / V at its rows' positions and attends.
class PrefillCase {
 public:
  PrefillCase(Shape shape, int64_t block_size, const std::vector<int64_t>& capacities)
      : shape_(shape), block_size_(block_size) {
    int64_t blocks = 0;
    for (int64_t capacity : capacities) {
      tables_.emplace_back();
      for (int64_t b = 0; b < (capacity + block_size - 1) / block_size; ++b) tables_.back().push_back(int32_t(blocks++));
    }
    for (auto& table : tables_)
      for (int32_t& b : table) b = int32_t((int64_t(b) * 7919) % blocks);
    for (const auto& table : tables_) table_ptrs_.push_back(table.data());
    const KvLayout layout{KvDtype::f32, shape.kv_heads, shape.k_dim, shape.v_dim, shape.mla};
    cpu_cache_ = p_.cpu->alloc_kv(blocks, block_size, layout);
    gpu_cache_ = p_.gpu->alloc_kv(blocks, block_size, layout);
    bench_ops(*p_.gpu).set_profiling(true);
  }

  // One step of `rows`: K / V (MLA: the latent rows) written, attention on both backends within
  // kTol, run twice on the GPU bit-identical, served by the attention op named `kernel`. Returns
  // the GPU output.
  std::vector<float> step(const std::vector<Row>& rows, const std::string& kernel, const std::string& what) {
    const int64_t n = int64_t(rows.size()), kv_row = shape_.kv_heads * shape_.k_dim, q_stride = q_stride_();
    std::vector<int32_t> positions, row_seq, tokens(size_t(n), 0);
    std::vector<int64_t> slots;
    for (const Row& r : rows) {
      positions.push_back(r.position);
      row_seq.push_back(r.seq);
      slots.push_back(int64_t(tables_[size_t(r.seq)][size_t(r.position / block_size_)]) * block_size_ +
                      r.position % block_size_);
    }
    p_.begin_step({n, tokens.data(), positions.data(), row_seq.data(), slots.data(), int64_t(tables_.size()),
                   table_ptrs_.data(), block_size_});
    const uint64_t seed = 1000 * ++steps_;
    auto k = p_.activation(random_floats(size_t(n * kv_row), seed), {n, kv_row});
    auto v = p_.activation(random_floats(size_t(n * kv_row), seed + 1), {n, kv_row});
    p_.cpu->kv_write(cpu_cache_, k.first, shape_.mla ? nullptr : &v.first);
    p_.gpu->kv_write(gpu_cache_, k.second, shape_.mla ? nullptr : &v.second);
    auto q = p_.activation(random_floats(size_t(n * shape_.q_heads * q_stride), seed + 2), {n, shape_.q_heads, q_stride});
    auto out = p_.alloc({n, shape_.q_heads, shape_.v_dim});
    Tensor again = p_.gpu->alloc({n, shape_.q_heads, shape_.v_dim});
    const float scale = scale_();
    p_.cpu->attention(cpu_cache_, q.first, shape_.q_heads, q_stride, scale, out.first);
    p_.gpu->attention(gpu_cache_, q.second, shape_.q_heads, q_stride, scale, out.second);
    p_.gpu->attention(gpu_cache_, q.second, shape_.q_heads, q_stride, scale, again);
    EXPECT_EQ(attention_ops(*p_.gpu), std::vector<std::string>{kernel}) << what;
    EXPECT_LT(max_rel_diff(p_, out), kTol) << what;
    const auto gpu = host(*p_.gpu, out.second), twice = host(*p_.gpu, again);
    EXPECT_EQ(0, std::memcmp(gpu.data(), twice.data(), gpu.size() * sizeof(float))) << what << ": run to run";
    last_q_ = host(*p_.gpu, q.second);
    return gpu;
  }

  // Row `row` of the last step attended alone in a one-row step (the decode kernel).
  std::vector<float> alone(const std::vector<Row>& rows, int64_t row) {
    const Row r = rows[size_t(row)];
    const int32_t token = 0;
    const int64_t slot = 0;  // nothing written
    p_.gpu->begin_step({1, &token, &r.position, &r.seq, &slot, int64_t(tables_.size()), table_ptrs_.data(),
                        block_size_});
    const int64_t q_row = shape_.q_heads * q_stride_();
    Tensor q = p_.activation({last_q_.begin() + row * q_row, last_q_.begin() + (row + 1) * q_row},
                             {1, shape_.q_heads, q_stride_()}).second;
    Tensor out = p_.gpu->alloc({1, shape_.q_heads, shape_.v_dim});
    p_.gpu->attention(gpu_cache_, q, shape_.q_heads, q_stride_(), scale_(), out);
    EXPECT_EQ(attention_ops(*p_.gpu), std::vector<std::string>{"attention"});
    return host(*p_.gpu, out);
  }

  int64_t row_floats() const { return shape_.q_heads * shape_.v_dim; }

 private:
  int64_t q_stride_() const { return shape_.k_dim + 3; }
  float scale_() const { return 1.0f / std::sqrt(float(shape_.k_dim)); }

  BackendPair p_;
  Shape shape_;
  int64_t block_size_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<const int32_t*> table_ptrs_;
  KvLayerCache cpu_cache_, gpu_cache_;
  std::vector<float> last_q_;
  uint64_t steps_ = 0;
};

std::vector<Row> run_of(int32_t seq, int32_t first_position, int32_t count) {
  std::vector<Row> rows;
  for (int32_t i = 0; i < count; ++i) rows.push_back({seq, first_position + i});
  return rows;
}

std::string label(Shape s) {
  return s.mla ? fmt::format("MLA {} heads x {}/{}", s.q_heads, s.k_dim, s.v_dim)
               : fmt::format("{}/{} heads x {}", s.q_heads, s.kv_heads, s.k_dim);
}

// Qwen3-30B-A3B's heads (group 8: tiles of 8 rows), group 4 at dim 64 (16 rows), group 1 (64
// rows); MLA with DeepSeek-V3's 128 heads (tiles of 32 heads x 1 row) and 16 (16 heads x 2 rows).
const Shape kShapes[] = {gqa(32, 4, 128), gqa(8, 2, 64), gqa(4, 4, 128), gqa(2, 2, 64), mla(128), mla(16)};

TEST(CudaPrefillAttention, OneSequenceMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  for (const Shape& shape : kShapes)
    for (int32_t rows : {1, 2, 15, 16, 17, 63, 64, 65, 300}) {
      PrefillCase c(shape, 16, {rows});
      // One row is not a run: the decode kernel serves it.
      c.step(run_of(0, 0, rows), rows == 1 ? "attention" : "prefill_attention",
             fmt::format("{} rows {}", label(shape), rows));
    }
}

TEST(CudaPrefillAttention, SeveralSequencesMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  for (const Shape& shape : kShapes)
    for (int64_t block_size : {16, 24}) {
      PrefillCase c(shape, block_size, {70, 33, 130});
      std::vector<Row> rows = run_of(2, 0, 130);
      for (const auto& run : {run_of(0, 0, 70), run_of(1, 0, 33)}) rows.insert(rows.end(), run.begin(), run.end());
      c.step(rows, "prefill_attention", fmt::format("{} block size {}", label(shape), block_size));
    }
}

// Chunks of 100 and 130 rows (and 40 + 6 of a second sequence) after the first chunk's keys.
TEST(CudaPrefillAttention, ChunkedPrefillMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  for (const Shape& shape : kShapes) {
    PrefillCase c(shape, 16, {230, 46});
    std::vector<Row> first = run_of(0, 0, 100), second = run_of(0, 100, 130);
    const auto other_first = run_of(1, 0, 40), other_second = run_of(1, 40, 6);
    first.insert(first.end(), other_first.begin(), other_first.end());
    second.insert(second.begin(), other_second.begin(), other_second.end());
    c.step(first, "prefill_attention", label(shape) + " first chunk");
    c.step(second, "prefill_attention", label(shape) + " second chunk");
  }
}

// A mixed step: decode rows of sequences 0 and 2 around a 41-row chunk of sequence 1. The decode
// rows take the decode kernel: their bits are those of the row attended alone.
TEST(CudaPrefillAttention, MixedStepMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  for (const Shape& shape : kShapes) {
    PrefillCase c(shape, 16, {51, 61, 31});
    std::vector<Row> prefill = run_of(0, 0, 50);
    for (const auto& run : {run_of(1, 0, 20), run_of(2, 0, 30)}) prefill.insert(prefill.end(), run.begin(), run.end());
    c.step(prefill, "prefill_attention", label(shape) + " prefill");
    std::vector<Row> mixed = {{0, 50}};
    const auto chunk = run_of(1, 20, 41);
    mixed.insert(mixed.end(), chunk.begin(), chunk.end());
    mixed.push_back({2, 30});
    const auto all = c.step(mixed, "prefill_attention+attention", label(shape) + " mixed");
    for (int64_t row : {int64_t(0), int64_t(mixed.size()) - 1}) {
      const auto one = c.alone(mixed, row);
      EXPECT_EQ(0, std::memcmp(one.data(), all.data() + row * c.row_floats(), one.size() * sizeof(float)))
          << label(shape) << " decode row " << row;
    }
  }
}

}  // namespace
}  // namespace moet::test
