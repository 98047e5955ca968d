// Hyper-connection mixing (see hyper_connection.h).
#include "kernels/cpu/hyper_connection.h"

#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moet {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// The row's streams normalised as one vector of hc * dim values (no weight) into `flat`.
void unweighted_norm(const HyperParams& p, const float* x, float* flat) {
  const int64_t n = p.hc * p.dim;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * double(x[i]);
  const float inv = 1.0f / std::sqrt(float(sum / double(n)) + p.norm_eps);
  for (int64_t i = 0; i < n; ++i) flat[i] = x[i] * inv;
}

// out = sum_i weight[i] * stream_i.
void collapse(const HyperParams& p, const float* x, const float* weight, float* out) {
  std::fill(out, out + p.dim, 0.0f);
  for (int64_t i = 0; i < p.hc; ++i)
    for (int64_t d = 0; d < p.dim; ++d) out[d] += weight[i] * x[i * p.dim + d];
}

// Sinkhorn's normalisation of comb [hc, hc] as hyper_connection.h describes.
void sinkhorn(const HyperParams& p, float* comb) {
  const int64_t hc = p.hc;
  const auto columns = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int64_t j = 0; j < hc; ++j) sum += comb[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) comb[j * hc + k] /= sum + p.eps;
    }
  };
  for (int64_t j = 0; j < hc; ++j) {
    float* row = comb + j * hc;
    const float max = *std::max_element(row, row + hc);
    float sum = 0.0f;
    for (int64_t k = 0; k < hc; ++k) sum += (row[k] = std::exp(row[k] - max));
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + p.eps;
  }
  columns();
  for (int64_t it = 1; it < p.iters; ++it) {
    for (int64_t j = 0; j < hc; ++j) {
      float* row = comb + j * hc;
      float sum = 0.0f;
      for (int64_t k = 0; k < hc; ++k) sum += row[k];
      for (int64_t k = 0; k < hc; ++k) row[k] /= sum + p.eps;
    }
    columns();
  }
}

}  // namespace

void hc_pre(const HyperParams& p, const float* streams, int64_t rows, const float* fn, const float* base,
            const float* scale, float* post, float* comb, float* collapsed, ThreadPool& pool, CpuIsa isa) {
  const int64_t hc = p.hc, n = hc * p.dim, mix_n = (2 + hc) * hc;
  pool.parallel_for(size_t(rows), [&](size_t begin, size_t end) {
    std::vector<float> flat(static_cast<size_t>(n)), mix(static_cast<size_t>(mix_n)), pre(static_cast<size_t>(hc));
    for (size_t r = begin; r < end; ++r) {
      const int64_t t = int64_t(r);
      const float* x = streams + t * n;
      unweighted_norm(p, x, flat.data());
      for (int64_t m = 0; m < mix_n; ++m) mix[size_t(m)] = dot_f32(flat.data(), fn + m * n, n, isa);
      for (int64_t i = 0; i < hc; ++i) {
        pre[size_t(i)] = sigmoid(mix[size_t(i)] * scale[0] + base[i]) + p.eps;
        post[t * hc + i] = 2.0f * sigmoid(mix[size_t(hc + i)] * scale[1] + base[hc + i]);
      }
      float* c = comb + t * hc * hc;
      for (int64_t i = 0; i < hc * hc; ++i) c[i] = mix[size_t(2 * hc + i)] * scale[2] + base[2 * hc + i];
      sinkhorn(p, c);
      collapse(p, x, pre.data(), collapsed + t * p.dim);
    }
  }, 1);
}

void hc_post(const HyperParams& p, float* streams, int64_t rows, const float* block_out, const float* post,
             const float* comb, ThreadPool& pool) {
  const int64_t hc = p.hc, dim = p.dim;
  pool.parallel_for(size_t(rows), [&](size_t begin, size_t end) {
    std::vector<float> mixed(size_t(hc * dim));
    for (size_t r = begin; r < end; ++r) {
      const int64_t t = int64_t(r);
      float* x = streams + t * hc * dim;
      const float* c = comb + t * hc * hc;
      for (int64_t k = 0; k < hc; ++k) {
        float* out = mixed.data() + k * dim;
        for (int64_t d = 0; d < dim; ++d) out[d] = post[t * hc + k] * block_out[t * dim + d];
        for (int64_t j = 0; j < hc; ++j)
          for (int64_t d = 0; d < dim; ++d) out[d] += c[j * hc + k] * x[j * dim + d];
      }
      std::copy(mixed.begin(), mixed.end(), x);
    }
  }, 1);
}

void hc_head(const HyperParams& p, const float* streams, int64_t rows, const float* fn, const float* base,
             const float* scale, float* out, ThreadPool& pool, CpuIsa isa) {
  const int64_t hc = p.hc, n = hc * p.dim;
  pool.parallel_for(size_t(rows), [&](size_t begin, size_t end) {
    std::vector<float> flat(static_cast<size_t>(n)), pre(static_cast<size_t>(hc));
    for (size_t r = begin; r < end; ++r) {
      const int64_t t = int64_t(r);
      const float* x = streams + t * n;
      unweighted_norm(p, x, flat.data());
      for (int64_t i = 0; i < hc; ++i)
        pre[size_t(i)] = sigmoid(dot_f32(flat.data(), fn + i * n, n, isa) * scale[0] + base[i]) + p.eps;
      collapse(p, x, pre.data(), out + t * p.dim);
    }
  }, 1);
}

}  // namespace moet
