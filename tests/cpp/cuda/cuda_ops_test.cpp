// Every CUDA backend op but the products (cuda_matmul_test.cpp) against the CPU backend (the
// reference) on random inputs: the benchmarks' read reference, RMSNorm, add, SiLU-and-mul, rope
// (halves, interleaved, partial), embedding, KV writes + paged attention (GQA over two sequences with scattered blocks, MLA with V aliasing K, decode
// contexts of 1..5000 keys in every mode: fused, split by leaf, split by segment), routers
// (softmax, sigmoid grouped with bias, ties, up to 1024 experts), the MoE block, copy_columns;
// plus run-to-run bit-identity and the memory budget. Skips with a message when no GPU is visible.
#include "gpu_test_util.h"

#include "core/error.h"

#include <string>

namespace moet::test {
namespace {

constexpr double kTol = 2e-5;

// The benchmarks' read reference: the XOR of every word of regions of assorted sizes (empty, under
// one 512-byte line, not a whole number of lines, several MB) equals the CPU's.
TEST(CudaOps, ReadRegionsMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  std::vector<std::pair<Tensor, Tensor>> parts;
  std::vector<ByteRegion> cpu_regions, gpu_regions;
  uint64_t seed = 1;
  for (int64_t bytes : {int64_t(48), int64_t(4096 + 208), int64_t(3) << 20, int64_t(777) * 16}) {
    std::vector<uint8_t> values(static_cast<size_t>(bytes));
    std::mt19937_64 rng(seed++);
    for (auto& v : values) v = uint8_t(rng());
    parts.push_back(p.weight(values.data(), DType::u8, {bytes}));
    cpu_regions.push_back({parts.back().first.data, bytes});
    gpu_regions.push_back({parts.back().second.data, bytes});
  }
  cpu_regions.insert(cpu_regions.begin() + 1, {parts[0].first.data, 0});
  gpu_regions.insert(gpu_regions.begin() + 1, {parts[0].second.data, 0});
  auto sink = p.alloc({1}, DType::i32);
  bench_ops(*p.cpu).read_regions(cpu_regions, sink.first);
  bench_ops(*p.gpu).read_regions(gpu_regions, sink.second);
  const auto gpu = host<uint32_t>(*p.gpu, sink.second);
  EXPECT_EQ(*sink.first.as<uint32_t>(), gpu[0]);
  EXPECT_NE(0u, gpu[0]);
}

TEST(CudaOps, ElementwiseMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  for (int64_t dim : {32, 2048}) {
    const int64_t rows = 6;
    auto x = p.activation(random_floats(size_t(rows * dim), 5, 3.0f), {rows, dim});
    auto weight = p.activation(random_floats(size_t(dim), 6), {dim});
    auto out = p.alloc({rows, dim});
    p.cpu->rmsnorm(x.first, weight.first, 1e-6f, out.first);
    p.gpu->rmsnorm(x.second, weight.second, 1e-6f, out.second);
    EXPECT_LT(max_rel_diff(p, out), 1e-6) << "rmsnorm dim " << dim;
    auto head_weight = p.activation(random_floats(16, 7), {16});  // per-head groups of 16
    p.cpu->rmsnorm(x.first, head_weight.first, 1e-6f, x.first);
    p.gpu->rmsnorm(x.second, head_weight.second, 1e-6f, x.second);
    EXPECT_LT(max_rel_diff(p, x), 1e-6) << "in-place per-head rmsnorm";
    auto gate_up = p.activation(random_floats(size_t(rows * dim), 8, 4.0f), {rows, dim});
    auto act = p.alloc({rows, dim / 2});
    p.cpu->silu_mul(gate_up.first, act.first);
    p.gpu->silu_mul(gate_up.second, act.second);
    EXPECT_LT(max_rel_diff(p, act), 1e-6) << "silu_mul";
    p.cpu->add(out.first, gate_up.first);
    p.gpu->add(out.second, gate_up.second);
    EXPECT_EQ(max_rel_diff(p, out), 0.0) << "add";
  }
}

TEST(CudaOps, RopeMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const std::vector<int32_t> tokens = {1, 2, 3}, positions = {0, 17, 4093}, row_seq = {0, 0, 0};
  const std::vector<int64_t> slots = {0, 1, 2};
  const std::vector<int32_t> table(1024, 0);
  const int32_t* tables[] = {table.data()};
  p.begin_step({3, tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables, 4});
  for (bool interleaved : {false, true}) {
    for (int64_t rot_dim : {64, 16}) {  // 16 of 64: partial rotary at an offset
      RopeTable rope;
      for (int64_t i = 0; i < rot_dim / 2; ++i) rope.inv_freq.push_back(float(std::pow(10000.0, -2.0 * double(i) / double(rot_dim))));
      rope.scale = 1.25f;
      rope.interleaved = interleaved;
      const int64_t heads = 3, head_dim = 64, offset = head_dim - rot_dim;
      auto x = p.activation(random_floats(size_t(3 * heads * head_dim), 10), {3, heads * head_dim});
      p.cpu->rope(rope, x.first, heads, head_dim, offset);
      p.gpu->rope(rope, x.second, heads, head_dim, offset);
      EXPECT_LT(max_rel_diff(p, x), 2e-6) << "interleaved " << interleaved << " rot_dim " << rot_dim;
    }
  }
}

TEST(CudaOps, EmbeddingMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const int64_t vocab = 50, dim = 24;
  const auto tf = random_floats(size_t(vocab * dim), 11);
  const auto tb = to_bf16(tf);
  const std::vector<int32_t> tokens = {49, 0, 7, 7}, positions = {0, 1, 2, 3}, row_seq = {0, 0, 0, 0};
  const std::vector<int64_t> slots = {0, 1, 2, 3};
  const std::vector<int32_t> table = {0};
  const int32_t* tables[] = {table.data()};
  // vocab: the whole table's, so a rank's part below may see ids outside its own rows.
  p.begin_step({4, tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables, 4, vocab});
  for (bool bf16 : {true, false}) {
    auto t = bf16 ? p.weight(tb.data(), DType::bf16, {vocab, dim}) : p.weight(tf.data(), DType::f32, {vocab, dim});
    auto out = p.alloc({4, dim});
    p.cpu->embedding(t.first, 0, out.first);
    p.gpu->embedding(t.second, 0, out.second);
    EXPECT_EQ(max_rel_diff(p, out), 0.0);
    // A vocab-parallel rank's rows [7, 27): tokens 0 and 49 look up zeros.
    const size_t first = 7 * dim, elem = bf16 ? 2 : 4;
    auto part = p.weight(static_cast<const uint8_t*>(bf16 ? static_cast<const void*>(tb.data()) : tf.data()) +
                             first * elem,
                         bf16 ? DType::bf16 : DType::f32, {20, dim});
    auto zeros = p.alloc({4, dim});
    p.cpu->embedding(part.first, 7, zeros.first);
    p.gpu->embedding(part.second, 7, zeros.second);
    EXPECT_EQ(max_rel_diff(p, zeros), 0.0);
  }
}

// Two sequences with scattered physical blocks: sequence 0 holds 9 tokens, sequence 1 holds 6;
// the step writes and attends rows at positions 7, 8 of sequence 0 and 5 of sequence 1 (the
// earlier keys were written by a previous step).
void check_attention(int64_t q_heads, int64_t kv_heads, int64_t k_dim, int64_t v_dim, bool mla) {
  BackendPair p;
  const int64_t block_size = 4, blocks = 8;
  KvLayerCache cpu_cache = p.cpu->alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, kv_heads, k_dim, v_dim, mla});
  KvLayerCache gpu_cache = p.gpu->alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, kv_heads, k_dim, v_dim, mla});
  const std::vector<int32_t> table0 = {5, 1, 6}, table1 = {2, 7};
  const int32_t* tables[] = {table0.data(), table1.data()};
  auto slot = [&](const std::vector<int32_t>& table, int64_t pos) { return int64_t(table[size_t(pos / block_size)]) * block_size + pos % block_size; };
  const int64_t kv_row = kv_heads * k_dim, v_row = kv_heads * v_dim;
  for (int step = 0; step < 2; ++step) {
    std::vector<int32_t> positions, row_seq;
    if (step == 0) {
      for (int32_t pos = 0; pos < 7; ++pos) positions.push_back(pos), row_seq.push_back(0);
      for (int32_t pos = 0; pos < 5; ++pos) positions.push_back(pos), row_seq.push_back(1);
    } else {
      positions = {7, 8, 5};
      row_seq = {0, 0, 1};
    }
    const int64_t rows = int64_t(positions.size());
    std::vector<int64_t> slots;
    for (int64_t t = 0; t < rows; ++t) slots.push_back(slot(row_seq[size_t(t)] == 0 ? table0 : table1, positions[size_t(t)]));
    const std::vector<int32_t> tokens(size_t(rows), 0);
    p.begin_step({rows, tokens.data(), positions.data(), row_seq.data(), slots.data(), 2, tables, block_size});
    auto k = p.activation(random_floats(size_t(rows * kv_row), 20 + uint64_t(step)), {rows, kv_row});
    auto v = p.activation(random_floats(size_t(rows * v_row), 30 + uint64_t(step)), {rows, v_row});
    p.cpu->kv_write(cpu_cache, k.first, mla ? nullptr : &v.first);
    p.gpu->kv_write(gpu_cache, k.second, mla ? nullptr : &v.second);
    const int64_t q_stride = k_dim + 3;
    auto q = p.activation(random_floats(size_t(rows * q_heads * q_stride), 40 + uint64_t(step)), {rows, q_heads, q_stride});
    auto out = p.alloc({rows, q_heads, v_dim});
    const float scale = 1.0f / std::sqrt(float(k_dim));
    p.cpu->attention(cpu_cache, q.first, q_heads, q_stride, scale, out.first);
    p.gpu->attention(gpu_cache, q.second, q_heads, q_stride, scale, out.second);
    EXPECT_LT(max_rel_diff(p, out), kTol) << "step " << step;
  }
  EXPECT_EQ(max_rel_diff(p, {cpu_cache.k, gpu_cache.k}), 0.0) << "KV cache contents";
}

TEST(CudaOps, GqaAttentionMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  check_attention(8, 2, 32, 32, false);
}

TEST(CudaOps, MlaAttentionMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  check_attention(4, 1, 48, 32, true);
}

// Long contexts: 3000 keys in scattered blocks of 16 (the table stride bucket 256 blocks = 4096
// keys: 16 segments, the last ones idle for this row). A 2-row step runs split by segment (a
// block per segment, the last one folds), a 160-row step (short filler rows after the first two)
// fused (a block per row and head group evaluates the whole tree): both within 1e-5 of the CPU,
// and the rows they share bit-identical.
void check_long_attention(int64_t q_heads, int64_t kv_heads, int64_t k_dim, int64_t v_dim, bool mla) {
  BackendPair p;
  const int64_t block_size = 16, keys = 3000, blocks = 200;
  KvLayerCache cpu_cache = p.cpu->alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, kv_heads, k_dim, v_dim, mla});
  KvLayerCache gpu_cache = p.gpu->alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, kv_heads, k_dim, v_dim, mla});
  std::vector<int32_t> table;
  for (int64_t b = 0; b < blocks; ++b) table.push_back(int32_t((b * 7) % blocks));  // a permutation
  const int32_t* tables[] = {table.data()};
  auto slot = [&](int64_t pos) { return int64_t(table[size_t(pos / block_size)]) * block_size + pos % block_size; };
  const int64_t kv_row = kv_heads * k_dim, v_row = kv_heads * v_dim, q_stride = k_dim + 3;
  const float scale = 1.0f / std::sqrt(float(k_dim));
  {  // write every key
    std::vector<int32_t> positions, row_seq(size_t(keys), 0), tokens(size_t(keys), 0);
    std::vector<int64_t> slots;
    for (int64_t pos = 0; pos < keys; ++pos) positions.push_back(int32_t(pos)), slots.push_back(slot(pos));
    p.begin_step({keys, tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables, block_size});
    auto k = p.activation(random_floats(size_t(keys * kv_row), 70), {keys, kv_row});
    auto v = p.activation(random_floats(size_t(keys * v_row), 71), {keys, v_row});
    p.cpu->kv_write(cpu_cache, k.first, mla ? nullptr : &v.first);
    p.gpu->kv_write(gpu_cache, k.second, mla ? nullptr : &v.second);
  }
  const auto q_rows = random_floats(size_t(160 * q_heads * q_stride), 72);
  std::vector<std::vector<float>> outputs;
  for (int64_t rows : {2, 160}) {
    std::vector<int32_t> positions = {int32_t(keys - 1), 1500}, row_seq(size_t(rows), 0), tokens(size_t(rows), 0);
    for (int64_t t = 2; t < rows; ++t) positions.push_back(int32_t((t * 37) % 300));
    std::vector<int64_t> slots;
    for (int32_t pos : positions) slots.push_back(slot(pos));
    p.begin_step({rows, tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables, block_size});
    auto q = p.activation({q_rows.begin(), q_rows.begin() + rows * q_heads * q_stride}, {rows, q_heads, q_stride});
    auto out = p.alloc({rows, q_heads, v_dim});
    p.cpu->attention(cpu_cache, q.first, q_heads, q_stride, scale, out.first);
    p.gpu->attention(gpu_cache, q.second, q_heads, q_stride, scale, out.second);
    EXPECT_LT(max_rel_diff(p, out), 1e-5) << "rows " << rows;
    outputs.push_back(host(*p.gpu, out.second));
  }
  EXPECT_EQ(0, std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].size() * sizeof(float)))
      << "split and fused modes differ";
}

// Decode: sequences of the given lengths in scattered blocks of 16, every key written. Step A
// attends each sequence's last position (one row per sequence: split by segment when the longest
// needs more than 32 leaves); each sequence alone (its own table-stride bucket: fused for up to
// two leaves, split by leaf up to 32 leaves, else by segment); step B: A's rows plus short filler rows,
// enough for the fused mode. A within 1e-5 of the CPU, the same rows bit-identical across A,
// alone and B, and A run twice bit-identical.
void check_decode_attention(int64_t q_heads, int64_t kv_heads, int64_t k_dim, int64_t v_dim, bool mla,
                            const std::vector<int64_t>& contexts) {
  BackendPair p;
  const int64_t block_size = 16, sequences = int64_t(contexts.size());
  std::vector<std::vector<int32_t>> tables;
  int64_t blocks = 0;
  for (int64_t length : contexts) {
    tables.emplace_back();
    for (int64_t b = 0; b < (length + block_size - 1) / block_size; ++b) tables.back().push_back(int32_t(blocks++));
  }
  for (auto& table : tables)  // scatter: a fixed permutation of all blocks
    for (int32_t& b : table) b = int32_t((int64_t(b) * 7919) % blocks);
  KvLayerCache cpu_cache = p.cpu->alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, kv_heads, k_dim, v_dim, mla});
  KvLayerCache gpu_cache = p.gpu->alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, kv_heads, k_dim, v_dim, mla});
  std::vector<const int32_t*> table_ptrs;
  for (const auto& table : tables) table_ptrs.push_back(table.data());
  auto slot = [&](int64_t seq, int64_t pos) {
    return int64_t(tables[size_t(seq)][size_t(pos / block_size)]) * block_size + pos % block_size;
  };
  const int64_t kv_row = kv_heads * k_dim, v_row = kv_heads * v_dim, q_stride = k_dim + 3;
  {  // write every key of every sequence
    std::vector<int32_t> positions, row_seq;
    std::vector<int64_t> slots;
    for (int64_t seq = 0; seq < sequences; ++seq)
      for (int64_t pos = 0; pos < contexts[size_t(seq)]; ++pos)
        positions.push_back(int32_t(pos)), row_seq.push_back(int32_t(seq)), slots.push_back(slot(seq, pos));
    const int64_t rows = int64_t(positions.size());
    const std::vector<int32_t> tokens(size_t(rows), 0);
    p.begin_step({rows, tokens.data(), positions.data(), row_seq.data(), slots.data(), sequences, table_ptrs.data(),
                  block_size});
    auto k = p.activation(random_floats(size_t(rows * kv_row), 90), {rows, kv_row});
    auto v = p.activation(random_floats(size_t(rows * v_row), 91), {rows, v_row});
    p.cpu->kv_write(cpu_cache, k.first, mla ? nullptr : &v.first);
    p.gpu->kv_write(gpu_cache, k.second, mla ? nullptr : &v.second);
  }
  const float scale = 1.0f / std::sqrt(float(k_dim));
  const int64_t head_floats = q_heads * q_stride, fillers = 300;
  const auto q_all = random_floats(size_t((sequences + fillers) * head_floats), 92);
  // One step of rows (sequence, position, query) on the GPU, and on the CPU when asked.
  auto run = [&](const std::vector<int32_t>& seqs, const std::vector<int32_t>& positions,
                 const std::vector<float>& q_rows, bool with_cpu, const std::vector<const int32_t*>& step_tables) {
    const int64_t rows = int64_t(seqs.size());
    const std::vector<int64_t> slots(size_t(rows), 0);  // no KV write in these steps
    const std::vector<int32_t> tokens(size_t(rows), 0);
    p.begin_step({rows, tokens.data(), positions.data(), seqs.data(), slots.data(), int64_t(step_tables.size()),
                  step_tables.data(), block_size});
    auto q = p.activation(q_rows, {rows, q_heads, q_stride});
    auto out = p.alloc({rows, q_heads, v_dim});
    p.gpu->attention(gpu_cache, q.second, q_heads, q_stride, scale, out.second);
    if (with_cpu) {
      p.cpu->attention(cpu_cache, q.first, q_heads, q_stride, scale, out.first);
      EXPECT_LT(max_rel_diff(p, out), 1e-5) << "q_heads " << q_heads << " k_dim " << k_dim;
    }
    return host(*p.gpu, out.second);
  };
  auto q_of = [&](int64_t first, int64_t count) {
    return std::vector<float>(q_all.begin() + first * head_floats, q_all.begin() + (first + count) * head_floats);
  };
  std::vector<int32_t> seqs, last;
  for (int64_t seq = 0; seq < sequences; ++seq) {
    seqs.push_back(int32_t(seq));
    last.push_back(int32_t(contexts[size_t(seq)] - 1));
  }
  const auto a = run(seqs, last, q_of(0, sequences), true, table_ptrs);
  const auto a_again = run(seqs, last, q_of(0, sequences), false, table_ptrs);
  EXPECT_EQ(0, std::memcmp(a.data(), a_again.data(), a.size() * sizeof(float))) << "run to run";
  const size_t row_floats = size_t(q_heads * v_dim);
  for (int64_t seq = 0; seq < sequences; ++seq) {
    const auto alone = run({0}, {last[size_t(seq)]}, q_of(seq, 1), false, {table_ptrs[size_t(seq)]});
    EXPECT_EQ(0, std::memcmp(alone.data(), a.data() + size_t(seq) * row_floats, row_floats * sizeof(float)))
        << "sequence of " << contexts[size_t(seq)] << " keys alone";
  }
  std::vector<int32_t> b_seqs = seqs, b_pos = last;
  for (int64_t f = 0; f < fillers; ++f) {
    b_seqs.push_back(int32_t(f % sequences));
    b_pos.push_back(int32_t((f * 13) % std::min<int64_t>(40, contexts[size_t(f % sequences)])));
  }
  const auto b = run(b_seqs, b_pos, q_of(0, sequences + fillers), false, table_ptrs);
  EXPECT_EQ(0, std::memcmp(b.data(), a.data(), a.size() * sizeof(float))) << "fused and split modes differ";
}

TEST(CudaOps, DecodeGqaAttentionMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  check_decode_attention(64, 4, 128, 128, false, {1, 40, 100, 600, 1500, 5000});  // Qwen3-235B
  check_decode_attention(6, 3, 42, 42, false, {1, 70, 300});  // two heads per KV head, dims not a multiple of 4
}

TEST(CudaOps, DecodeMlaAttentionMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  check_decode_attention(16, 1, 576, 512, true, {1, 20, 100, 600, 1500});  // DeepSeek-V3's latent cache
}

TEST(CudaOps, LongContextGqaAttentionMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  check_long_attention(8, 2, 128, 128, false);
}

TEST(CudaOps, LongContextMlaAttentionMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  check_long_attention(16, 1, 576, 512, true);  // DeepSeek-V3's latent cache row
}

// The same decode row gives the same bits whatever the context bucket (table stride) the step
// is in and whichever rows share the step: here a short context attended from a step whose
// other sequence is 2000 keys long (stride bucket 128 blocks, split mode) vs alone (stride 1).
TEST(CudaOps, AttentionRowDoesNotDependOnTheStep) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const int64_t block_size = 16, blocks = 160, heads = 4, dim = 64;
  KvLayerCache cache = p.gpu->alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, heads, dim, dim, false});
  std::vector<int32_t> table0, table1 = {150};
  for (int64_t b = 0; b < 130; ++b) table0.push_back(int32_t(b));
  const int32_t* tables[] = {table0.data(), table1.data()};
  {
    std::vector<int32_t> positions, row_seq, tokens(2010, 0);
    std::vector<int64_t> slots;
    for (int64_t pos = 0; pos < 2000; ++pos) positions.push_back(int32_t(pos)), row_seq.push_back(0), slots.push_back(pos);
    for (int64_t pos = 0; pos < 10; ++pos) positions.push_back(int32_t(pos)), row_seq.push_back(1), slots.push_back(150 * block_size + pos);
    p.gpu->begin_step({2010, tokens.data(), positions.data(), row_seq.data(), slots.data(), 2, tables, block_size});
    Tensor k = p.activation(random_floats(size_t(2010 * heads * dim), 80), {2010, heads * dim}).second;
    Tensor v = p.activation(random_floats(size_t(2010 * heads * dim), 81), {2010, heads * dim}).second;
    p.gpu->kv_write(cache, k, &v);
  }
  const auto qf = random_floats(size_t(heads * dim), 82);
  Tensor q = p.activation(qf, {1, heads, dim}).second;
  const std::vector<int32_t> tokens = {0, 0}, both_positions = {1999, 9}, both_seq = {0, 1};
  const std::vector<int64_t> both_slots = {1999, 150 * block_size + 9};
  Tensor q2 = p.activation([&] { auto x = random_floats(size_t(heads * dim), 83); x.insert(x.end(), qf.begin(), qf.end()); return x; }(),
                           {2, heads, dim}).second;
  Tensor out2 = p.gpu->alloc({2, heads, dim}), out1 = p.gpu->alloc({1, heads, dim});
  p.gpu->begin_step({2, tokens.data(), both_positions.data(), both_seq.data(), both_slots.data(), 2, tables, block_size});
  p.gpu->attention(cache, q2, heads, dim, 0.125f, out2);
  const int32_t alone_position = 9, alone_seq = 0;
  const int64_t alone_slot = both_slots[1];
  const int32_t* alone_tables[] = {table1.data()};
  p.gpu->begin_step({1, tokens.data(), &alone_position, &alone_seq, &alone_slot, 1, alone_tables, block_size});
  p.gpu->attention(cache, q, heads, dim, 0.125f, out1);
  const auto both = host(*p.gpu, out2), alone = host(*p.gpu, out1);
  EXPECT_EQ(0, std::memcmp(both.data() + heads * dim, alone.data(), alone.size() * sizeof(float)));
}

// A prefill step: three sequences of 300 (two segments), 13 and 1 rows, checked against the CPU
// and bit-identical run to run; each row also against the row attended alone in a one-row step
// (the decode kernel, split by leaf or by segment). Steps the decode kernel serves (every row
// fused; here a head dim outside the tensor-core kernel's: 38) give each row the bits it gets
// alone. Steps of GQA rows with head dims 64 / 128 and of MLA's latent cache (576 / 512, V
// aliasing K) take the tensor-core prefill kernel (prefill_attention.h) for their runs: its MMAs
// over BF16 pieces round differently from the decode kernel's FP32 dot products, so prefill rows
// and decode rows now differ in the last bits (memcmp against the rows alone no longer holds):
// they are compared within kTol instead.
// The profile names which kernel served the step.
void check_prefill_rows(int64_t q_heads, int64_t kv_heads, int64_t k_dim, int64_t v_dim, bool mla,
                        const std::string& kernel) {
  BackendPair p;
  bench_ops(*p.gpu).set_profiling(true);
  const int64_t block_size = 16, blocks = 24;
  const std::vector<int64_t> lengths = {300, 13, 1};
  KvLayerCache cpu_cache = p.cpu->alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, kv_heads, k_dim, v_dim, mla});
  KvLayerCache gpu_cache = p.gpu->alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, kv_heads, k_dim, v_dim, mla});
  std::vector<std::vector<int32_t>> tables(lengths.size());
  int32_t next_block = int32_t(blocks) - 1;  // backwards: physical order differs from logical
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int64_t b = 0; b < (lengths[s] + block_size - 1) / block_size; ++b) tables[s].push_back(next_block--);
  const int32_t* table_ptrs[] = {tables[0].data(), tables[1].data(), tables[2].data()};
  std::vector<int32_t> positions, row_seq;
  std::vector<int64_t> slots;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int64_t pos = 0; pos < lengths[s]; ++pos) {
      positions.push_back(int32_t(pos));
      row_seq.push_back(int32_t(s));
      slots.push_back(int64_t(tables[s][size_t(pos / block_size)]) * block_size + pos % block_size);
    }
  const int64_t rows = int64_t(positions.size()), kv_row = kv_heads * k_dim, v_row = kv_heads * v_dim;
  const std::vector<int32_t> tokens(size_t(rows), 0);
  p.begin_step({rows, tokens.data(), positions.data(), row_seq.data(), slots.data(), 3, table_ptrs, block_size});
  auto k = p.activation(random_floats(size_t(rows * kv_row), 90), {rows, kv_row});
  auto v = p.activation(random_floats(size_t(rows * v_row), 91), {rows, v_row});
  p.cpu->kv_write(cpu_cache, k.first, mla ? nullptr : &v.first);
  p.gpu->kv_write(gpu_cache, k.second, mla ? nullptr : &v.second);
  const auto qf = random_floats(size_t(rows * q_heads * k_dim), 92);
  auto q = p.activation(qf, {rows, q_heads, k_dim});
  auto out = p.alloc({rows, q_heads, v_dim});
  Tensor again = p.gpu->alloc({rows, q_heads, v_dim});
  const float scale = 1.0f / std::sqrt(float(k_dim));
  p.cpu->attention(cpu_cache, q.first, q_heads, k_dim, scale, out.first);
  p.gpu->attention(gpu_cache, q.second, q_heads, k_dim, scale, out.second);
  p.gpu->attention(gpu_cache, q.second, q_heads, k_dim, scale, again);
  EXPECT_EQ(attention_ops(*p.gpu), std::vector<std::string>{kernel});
  EXPECT_LT(max_rel_diff(p, out), kTol);
  const auto all = host(*p.gpu, out.second), twice = host(*p.gpu, again);
  EXPECT_EQ(0, std::memcmp(all.data(), twice.data(), all.size() * sizeof(float))) << "run to run";
  const auto cpu = host(*p.cpu, out.first);
  const double cpu_scale = std::max(1.0, double(*std::max_element(cpu.begin(), cpu.end(), [](float a, float b) {
    return std::fabs(a) < std::fabs(b);
  })));
  const int64_t q_row = q_heads * k_dim, out_row = q_heads * v_dim;
  for (int64_t t : {0, 7, 8, 100, 255, 256, 295, 299, 300, 303, 312, 313}) {
    const int32_t* alone_table[] = {table_ptrs[row_seq[size_t(t)]]};
    p.gpu->begin_step({1, tokens.data(), &positions[size_t(t)], &row_seq[0], &slots[size_t(t)], 1, alone_table, block_size});
    Tensor q1 = p.activation({qf.begin() + t * q_row, qf.begin() + (t + 1) * q_row}, {1, q_heads, k_dim}).second;
    Tensor out1 = p.gpu->alloc({1, q_heads, v_dim});
    p.gpu->attention(gpu_cache, q1, q_heads, k_dim, scale, out1);
    EXPECT_EQ(attention_ops(*p.gpu), std::vector<std::string>{"attention"}) << "row " << t;
    const auto alone = host(*p.gpu, out1);
    if (kernel == "attention") {  // every row fused
      EXPECT_EQ(0, std::memcmp(all.data() + t * out_row, alone.data(), alone.size() * sizeof(float))) << "row " << t;
      continue;
    }
    double diff = 0.0;
    for (int64_t i = 0; i < out_row; ++i) diff = std::max(diff, std::fabs(double(all[size_t(t * out_row + i)]) - alone[size_t(i)]));
    EXPECT_LT(diff / cpu_scale, kTol) << "row " << t;
  }
}

TEST(CudaOps, PrefillAttentionRowsMatchRowsAlone) {
  MOET_SKIP_WITHOUT_GPU();
  // Qwen3's head dim, 4 query heads per KV head: the runs on the tensor cores, the 1-row sequence
  // on the decode kernel.
  check_prefill_rows(8, 2, 128, 128, false, "prefill_attention+attention");
  check_prefill_rows(6, 3, 38, 38, false, "attention");  // a head dim not a multiple of 4: padding, 2 heads per block
  // DeepSeek-V3's latent cache row: the runs on the tensor cores too since MLA's prefill kernel
  // (within kTol of the rows alone, no longer bit-identical), the 1-row sequence on the decode kernel.
  check_prefill_rows(16, 1, 576, 512, true, "prefill_attention+attention");
}

void check_router(RouterParams params, const std::vector<float>& logits, int64_t rows, const std::vector<float>& bias) {
  BackendPair p;
  auto l = p.activation(logits, {rows, params.experts});
  std::pair<Tensor, Tensor> b;
  RouterParams cpu_params = params, gpu_params = params;
  if (!bias.empty()) {
    b = p.activation(bias, {params.experts});
    cpu_params.correction_bias = b.first.as<float>();
    gpu_params.correction_bias = b.second.as<float>();
  }
  auto ids = p.alloc({rows, params.top_k}, DType::i32);
  auto weights = p.alloc({rows, params.top_k});
  p.cpu->router(cpu_params, l.first, ids.first, weights.first);
  p.gpu->router(gpu_params, l.second, ids.second, weights.second);
  EXPECT_EQ(host<int32_t>(*p.cpu, ids.first), host<int32_t>(*p.gpu, ids.second)) << "experts " << params.experts;
  EXPECT_LT(max_rel_diff(p, weights), 1e-6) << "experts " << params.experts;
  auto again = p.alloc({rows, params.top_k});
  p.gpu->router(gpu_params, l.second, ids.second, again.second);
  const auto first = host(*p.gpu, weights.second), second = host(*p.gpu, again.second);
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float))) << "run to run";
}

// Values with many ties: random logits rounded to quarters (equal scores, equal group scores).
std::vector<float> tied_floats(size_t n, uint64_t seed) {
  auto v = random_floats(n, seed);
  for (auto& x : v) x = std::round(x * 4.0f) / 4.0f;
  return v;
}

// Logits of -inf but about one in 23: softmax probabilities of exactly 0 fill the top 8 (ties
// to the lower index).
std::vector<float> mostly_minus_inf(size_t n, uint64_t seed) {
  auto v = random_floats(n, seed);
  for (size_t i = 0; i < n; ++i)
    if (i % 23 != 0) v[i] = -INFINITY;
  return v;
}

TEST(CudaOps, RoutersMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  for (int64_t rows : {1, 7, 37, 300}) {  // one block per row; prefill-sized batches too
    check_router({128, 8, false, true, 1.0f, 1, 1, nullptr}, random_floats(size_t(rows * 128), 50), rows, {});
    check_router({60, 4, false, false, 1.0f, 1, 1, nullptr}, random_floats(size_t(rows * 60), 51), rows, {});
    check_router({256, 8, true, true, 2.5f, 8, 4, nullptr}, random_floats(size_t(rows * 256), 52), rows,
                 random_floats(256, 53, 0.1f));  // DeepSeek-V3
    check_router({256, 8, true, true, 2.5f, 8, 4, nullptr}, tied_floats(size_t(rows * 256), 59), rows,
                 std::vector<float>(256, 0.0f));  // ties among experts and among group scores
  }
  const int64_t rows = 7;
  check_router({64, 6, true, true, 1.0f, 8, 3, nullptr}, std::vector<float>(size_t(rows * 64), 0.5f), rows,
               std::vector<float>(64, 0.0f));  // all tied: lowest indices
  check_router({1024, 64, false, false, 1.0f, 1, 1, nullptr}, random_floats(size_t(rows * 1024), 54), rows, {});
  check_router({1024, 16, true, true, 1.0f, 64, 40, nullptr}, random_floats(size_t(rows * 1024), 55), rows,
               random_floats(1024, 56, 0.1f));  // 64 groups of 16
  check_router({160, 6, true, false, 16.0f, 8, 3, nullptr}, random_floats(size_t(rows * 160), 57), rows,
               random_floats(160, 58, 0.1f));  // groups of 20
  check_router({128, 1, false, true, 1.0f, 1, 1, nullptr}, random_floats(size_t(rows * 128), 60), rows, {});
  check_router({128, 8, false, true, 1.0f, 1, 1, nullptr}, mostly_minus_inf(size_t(rows * 128), 61), rows, {});
  check_router({200, 40, true, true, 1.0f, 8, 2, nullptr}, random_floats(size_t(rows * 200), 62), rows,
               random_floats(200, 63, 0.1f));  // groups of 25, top_k over a warp's 32
  check_router({64, 8, true, false, 1.0f, 16, 1, nullptr}, random_floats(size_t(rows * 64), 64), rows,
               random_floats(64, 65, 0.1f));  // one group of 4 kept: 4 dropped (-inf) experts chosen too
}

void check_moe(int64_t experts, int64_t top_k, int64_t hidden, int64_t inner, int64_t rows) {
  BackendPair p;
  std::vector<ExpertWeights> cpu_experts, gpu_experts;
  for (int64_t e = 0; e < experts; ++e) {
    const auto gu = to_bf16(random_floats(size_t(2 * inner * hidden), 100 + uint64_t(e), 0.05f));
    const auto dn = to_bf16(random_floats(size_t(hidden * inner), 200 + uint64_t(e), 0.05f));
    auto g = p.weight(gu.data(), DType::bf16, {2 * inner, hidden});
    auto d = p.weight(dn.data(), DType::bf16, {hidden, inner});
    cpu_experts.push_back({g.first, d.first});
    gpu_experts.push_back({g.second, d.second});
  }
  const ExpertLayout layout{ExpertFormat::dense, hidden, inner};
  const ExpertSet cpu_set = p.cpu->expert_set(layout, cpu_experts), gpu_set = p.gpu->expert_set(layout, gpu_experts);
  const auto in = p.moe_inputs(rows, experts, top_k, hidden, static_cast<uint64_t>(rows));
  auto out = p.alloc({rows, hidden});
  p.cpu->moe_experts(in.x.first, cpu_set, in.ids.first, in.weights.first, out.first);
  p.gpu->moe_experts(in.x.second, gpu_set, in.ids.second, in.weights.second, out.second);
  EXPECT_LT(max_rel_diff(p, out), kTol) << "rows " << rows << " hidden " << hidden;
  Tensor again = p.gpu->alloc({rows, hidden});
  p.gpu->moe_experts(in.x.second, gpu_set, in.ids.second, in.weights.second, again);
  const auto a = host(*p.gpu, out.second), b = host(*p.gpu, again);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "run to run";
}

TEST(CudaOps, MoeExpertsMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  check_moe(8, 2, 64, 32, 1);
  check_moe(8, 2, 64, 32, 20);
  check_moe(16, 4, 256, 96, 5);
  check_moe(6, 3, 36, 20, 9);  // hidden % 8 != 0: scalar path
}

TEST(CudaOps, CopyColumnsMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  auto src = p.activation(random_floats(60, 60), {6, 10});
  auto dst = p.activation(std::vector<float>(48, 1.0f), {6, 8});
  p.cpu->copy_columns(src.first, 10, 3, dst.first, 8, 2, 6, 5);
  p.gpu->copy_columns(src.second, 10, 3, dst.second, 8, 2, 6, 5);
  EXPECT_EQ(max_rel_diff(p, dst), 0.0);
}

TEST(CudaOps, MemoryBudgetIsEnforced) {
  MOET_SKIP_WITHOUT_GPU();
  auto gpu = cuda_backend_create({0, 0.9, 1.0 / 1024});  // 1 MiB
  Tensor small = gpu->alloc({1000});
  EXPECT_THROW(gpu->alloc({1 << 20}), Error);
}

}  // namespace
}  // namespace moet::test
