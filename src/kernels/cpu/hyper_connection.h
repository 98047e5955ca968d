// Manifold-constrained hyper-connections (DeepSeek-V4, transformers' DeepseekV4HyperConnection /
// DeepseekV4HyperHead): the residual is `hc` parallel streams [rows, hc, dim]. Before a block,
//   flat = x / sqrt(mean(x^2) + norm_eps) over the row's hc * dim values (no weight)
//   mix  = flat @ fn^T                         fn [(2 + hc) * hc, hc * dim]
//   pre  = sigmoid(mix[0:hc] * scale[0] + base[0:hc]) + eps
//   post = 2 * sigmoid(mix[hc:2hc] * scale[1] + base[hc:2hc])
//   comb = softmax_rows(mix[2hc:].view(hc, hc) * scale[2] + base[2hc:]) + eps, then divided by its
//          column sums (+ eps), then iters - 1 times by its row sums (+ eps) and its column sums
//          (+ eps): Sinkhorn's projection towards a doubly stochastic matrix
//   collapsed = sum_i pre[i] * stream_i        the block's input (before its RMSNorm)
// and after it (hc_post) stream_k = post[k] * block_out + sum_j comb[j, k] * stream_j. The model's
// end (hc_head) collapses the streams with pre = sigmoid(flat @ fn^T * scale + base) + eps (fn
// [hc, hc * dim], one scale). All in FP32, rows in parallel, each by one thread in a fixed order.
#pragma once

#include "core/cpu_isa.h"
#include "core/thread_pool.h"

#include <cstdint>

namespace moet {

struct HyperParams {
  int64_t hc = 0;
  int64_t dim = 0;
  int64_t iters = 0;  // Sinkhorn iterations (at least 1)
  float eps = 0.0f;       // hc_eps
  float norm_eps = 0.0f;  // rms_norm_eps of the unweighted norm
};

// post [rows, hc], comb [rows, hc, hc], collapsed [rows, dim].
void hc_pre(const HyperParams& p, const float* streams, int64_t rows, const float* fn, const float* base,
            const float* scale, float* post, float* comb, float* collapsed, ThreadPool& pool, CpuIsa isa);
// streams [rows, hc, dim] updated in place from the block output [rows, dim].
void hc_post(const HyperParams& p, float* streams, int64_t rows, const float* block_out, const float* post,
             const float* comb, ThreadPool& pool);
// out [rows, dim] (scale: one value).
void hc_head(const HyperParams& p, const float* streams, int64_t rows, const float* fn, const float* base,
             const float* scale, float* out, ThreadPool& pool, CpuIsa isa);

}  // namespace moet
