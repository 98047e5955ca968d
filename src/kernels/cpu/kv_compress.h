// DeepSeek-V4's KV compressor (transformers' DeepseekV4CSACompressor / HCACompressor and the
// indexer's own compressor), one window at a time over a paged state cache.
//
// The state cache holds, per token, the compressor's projections kv [coff * dim] then gate
// [coff * dim] (coff = 2 with overlap, else 1). Window w covers positions [w m, w m + m) (m the
// ratio). When a row's position closes a window (position % m == m - 1), its compressed entry is
//   without overlap: slot i < m:  kv[w m + i][c],          gate[w m + i][c] + bias[i][c]
//   with overlap:    slot i < m:  kv[(w-1) m + i][c],      gate[(w-1) m + i][c] + bias[i][c]
//                                 (absent for w = 0: weight 0)
//                    slot m + i:  kv[w m + i][dim + c],    gate[w m + i][dim + c] + bias[i][dim + c]
//   entry[c] = sum over slots of kv * softmax over slots of gate      (per channel c)
// then RMS-normalised with `norm` (eps), roped at position w m on its last rot_dim values (the
// rope table's), and written into the row's own slot of `out` (one row of dim values). Rows that
// close no window write nothing. A row reads state rows of its own sequence through its block
// table, so the step must have written its own state rows first.
#pragma once

#include "core/op_params.h"
#include "core/paged_kv.h"
#include "core/thread_pool.h"

#include <cstdint>

namespace moet {

struct KvCompressParams {
  int64_t ratio = 0;
  bool overlap = false;
  int64_t dim = 0;
  float eps = 0.0f;
};

// position_bias [ratio, coff * dim]; norm [dim].
void kv_compress(const KvCompressParams& p, const PagedKv& state, const AttentionRows& rows_info, int64_t rows,
                 const float* position_bias, const float* norm, const RopeTable& rope, const PagedKv& out,
                 ThreadPool& pool);

}  // namespace moet
