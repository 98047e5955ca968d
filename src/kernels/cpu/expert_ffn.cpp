// One block-format expert's SwiGLU FFN (see expert_ffn.h).
#include "kernels/cpu/expert_ffn.h"

#include "core/error.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/w2_matmul.h"
#include "kernels/cpu/w2_rows.h"

namespace moet {

void block_expert_ffn(const float* x, int64_t rows, int64_t hidden, int64_t inner, const BlockExpertPlanes& w,
                      float* scratch, float* out, ThreadPool& pool, CpuIsa isa) {
  MOET_CHECK((w.bits == 2 || w.bits == 4) && hidden % 32 == 0 && inner % 32 == 0,
             "block_expert_ffn: W2 or MXFP4 planes with hidden and inner multiples of 32 (got {} bits, {} x {})",
             w.bits, hidden, inner);
  const auto product = w.bits == 2 ? matmul_w2_rows : matmul_fp4;  // matmul_w2's bits, decoding shared by rows
  float* gate_up = scratch;                // [rows, 2 * inner]
  float* act = scratch + rows * 2 * inner;  // [rows, inner]
  product(x, rows, hidden, w.gate_up_codes, w.gate_up_scales, 2 * inner, gate_up, pool, isa);
  silu_mul(gate_up, rows, inner, act);
  product(act, rows, inner, w.down_codes, w.down_scales, hidden, out, pool, isa);
}

}  // namespace moet
