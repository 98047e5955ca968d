// One routed expert's SwiGLU feed-forward over its block-format planes (W2 or MXFP4, the four
// planes of a host row: io/pack_format.h) for `rows` activation rows: out[t] = down(silu(gate(x[t]))
// * up(x[t])), FP32. It is the per-expert work of the CPU backend's MoE op (matmul_w2 / matmul_fp4
// over the stacked gate/up rows, silu_mul, the down product), so its results are the op's bits;
// the host experts of tiered residency (experts/host_experts.h) run it from an expert's host row.
// W2 products share each block's decoding among the rows (kernels/cpu/w2_rows.h: matmul_w2's bits).
// Parallel over output columns on `pool` (results independent of the thread count).
#pragma once

#include "core/cpu_isa.h"
#include "core/thread_pool.h"

#include <cstdint>

namespace moet {

struct BlockExpertPlanes {
  const uint8_t* gate_up_codes = nullptr;   // [2 * inner, hidden * bits / 8]: gate rows, then up rows
  const uint8_t* gate_up_scales = nullptr;  // [2 * inner, hidden / 32]
  const uint8_t* down_codes = nullptr;      // [hidden, inner * bits / 8]
  const uint8_t* down_scales = nullptr;     // [hidden, inner / 32]
  int bits = 2;                             // 2: W2, 4: MXFP4
};

// Floats of scratch block_expert_ffn() needs for `rows` rows.
inline int64_t block_expert_ffn_scratch(int64_t rows, int64_t inner) { return rows * 3 * inner; }

// x [rows, hidden] -> out [rows, hidden]; hidden and inner multiples of 32.
void block_expert_ffn(const float* x, int64_t rows, int64_t hidden, int64_t inner, const BlockExpertPlanes& w,
                      float* scratch, float* out, ThreadPool& pool, CpuIsa isa);

}  // namespace moet
