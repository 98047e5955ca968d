// The second kernel of a split step of the split-K decode kernels (splitk_attention.cu,
// splitk_mla_attention.cu): each row that split folds its partials, splits 0..used-1 in order
// (attention_fold.cuh), into its output, one thread per (row, head, float4 of the output). A row
// of one split was stored by the split kernel itself and is skipped. The fold is spread over the
// whole GPU: folding in the split kernel's last block to finish put every partial of a head group
// (MLA: 32 heads x 64 splits x 2 KiB) on one SM. The fold order is fixed, so a row's bits depend on
// its own key count only.
#include "kernels/cuda/attention_fold.cuh"
#include "kernels/cuda/splitk_plan.cuh"

namespace moet::cuda {
namespace {

constexpr int kFoldThreads = 128;

__global__ void __launch_bounds__(kFoldThreads) splitk_fold_kernel(AttentionArgs a, SplitPlan p) {
  pdl_trigger();
  pdl_wait();  // the split kernel's partials
  const int64_t unit = blockIdx.y, row = p.first_row + unit, t = a.row_ids ? a.row_ids[row] : row;
  const int keys = a.positions[t] + 1;
  const int used = int(ceil_div(keys, chunk_keys(keys)));
  const int64_t v4 = a.cache.v_dim / 4, slot = int64_t(blockIdx.x) * kFoldThreads + threadIdx.x;
  if (used == 1 || slot >= a.q_heads * v4) return;
  const int64_t head = slot / v4;
  const int d4 = int(slot % v4);
  const float* first = a.partials + (unit * a.q_heads + head) * p.splits * p.width;
  store_normalised(a.out + (t * a.q_heads + head) * a.cache.v_dim + 4 * d4, fold_splits(first, p.width, used, d4), 4);
}

}  // namespace

void splitk_fold_launch(const AttentionArgs& a, const SplitPlan& p, int64_t rows, cudaStream_t stream) {
  const dim3 grid(unsigned(ceil_div(a.q_heads * (a.cache.v_dim / 4), kFoldThreads)), unsigned(rows));
  launch_dependent_kernel<splitk_fold_kernel>(grid, dim3(kFoldThreads), 0, 1, stream, a, p);
}

}  // namespace moet::cuda
