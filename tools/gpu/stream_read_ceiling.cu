// The read ceiling of small weight streams (docs/gpu-history.md, "Run 7"): how fast ONE kernel, or two
// chained by programmatic dependent launch (as gate_up then down), reads N bytes spread over 8
// regions picked at random from a 4 GB pool (as 8 routed experts), 20 calls captured into a CUDA
// graph and replayed 10 times, against the 1 GiB device copy of the same run. Access patterns:
// each warp a contiguous range ("contig") or the grid sweeping memory together ("sweep"), D
// 16-byte loads in flight per lane, W warps per SM. A standalone experiment, not part of the
// build: nvcc -O3 -std=c++17 -arch=sm_90 -o stream_read_ceiling tools/gpu/stream_read_ceiling.cu
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <random>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

struct Regions { const uint4* p[8]; int n; int lines_per_region; int first_line; int lines; };

__device__ __forceinline__ uint4 lds(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int D, bool kSweep>
__global__ void read_kernel(Regions r, unsigned* out, int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  const int wpb = blockDim.x / 32;
  const long long warps = (long long)gridDim.x * wpb, w = (long long)blockIdx.x * wpb + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const long long lines = r.lines;
  uint32_t acc = 0;
  auto addr = [&](long long l) {
    const int line = int(l) + r.first_line;
    const int region = line / r.lines_per_region, off = line - region * r.lines_per_region;
    return r.p[region] + (long long)off * 32 + lane;
  };
  if (kSweep) {
    for (long long l = w; l < lines; l += D * warps) {
      uint4 v[D];
#pragma unroll
      for (int d = 0; d < D; ++d) { const long long ll = l + d * warps; v[d] = ll < lines ? lds(addr(ll)) : make_uint4(0,0,0,0); }
#pragma unroll
      for (int d = 0; d < D; ++d) acc ^= v[d].x ^ v[d].y ^ v[d].z ^ v[d].w;
    }
  } else {
    const long long l0 = w * lines / warps, l1 = (w + 1) * lines / warps;
    for (long long l = l0; l < l1; l += D) {
      uint4 v[D];
#pragma unroll
      for (int d = 0; d < D; ++d) { const long long ll = l + d; v[d] = ll < l1 ? lds(addr(ll)) : make_uint4(0,0,0,0); }
#pragma unroll
      for (int d = 0; d < D; ++d) acc ^= v[d].x ^ v[d].y ^ v[d].z ^ v[d].w;
    }
  }
  if (acc == 0x9E3779B9u) out[0] = acc;
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
}

typedef void (*KernelFn)(Regions, unsigned*, int);
template <int D, bool S> KernelFn pick() { return read_kernel<D, S>; }

void launch(KernelFn k, int blocks, int threads, cudaStream_t s, Regions r, unsigned* out, bool pdl) {
  cudaLaunchAttribute at[1] = {};
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t c{};
  c.gridDim = dim3(blocks); c.blockDim = dim3(threads); c.stream = s; c.attrs = at; c.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&c, k, r, out, int(pdl)));
}

int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t pool_bytes = size_t(4) << 30;
  uint8_t* pool; CK(cudaMalloc(&pool, pool_bytes)); CK(cudaMemset(pool, 1, pool_bytes));
  unsigned* out; CK(cudaMalloc(&out, 64));
  uint8_t* dst; CK(cudaMalloc(&dst, size_t(1) << 30));  // copy target
  cudaStream_t s; CK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  // copy ceiling, 2 GB
  float ms;
  double copy_gbs = 0;
  for (int i = 0; i < 4; ++i) {
    CK(cudaEventRecord(e0, s)); CK(cudaMemcpyAsync(dst, pool, size_t(1) << 30, cudaMemcpyDeviceToDevice, s)); CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1)); CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i) copy_gbs = std::max(copy_gbs, 2.0 * (1 << 30) / (ms * 1e-3) / 1e9);
  }
  printf("copy 1 GiB: %.1f GB/s (read + write)\n", copy_gbs);
  std::mt19937 rng(5);
  const double sizes_mb[] = {4.2, 10.6, 14.2, 28.3, 42.5, 66.1, 99.1, 200, 800};
  struct Cfg { const char* name; KernelFn k; int bps, threads; bool sweep; int depth; };
  std::vector<Cfg> cfgs = {
    {"contig D2 16w", pick<2,false>(), 2, 256, false, 2}, {"contig D4 16w", pick<4,false>(), 2, 256, false, 4},
    {"contig D8 16w", pick<8,false>(), 2, 256, false, 8}, {"contig D2 32w", pick<2,false>(), 4, 256, false, 2},
    {"contig D4 32w", pick<4,false>(), 4, 256, false, 4}, {"contig D8 32w", pick<8,false>(), 4, 256, false, 8},
    {"contig D4 64w", pick<4,false>(), 8, 256, false, 4}, {"contig D2 12w", pick<2,false>(), 3, 128, false, 2},
    {"sweep D2 32w", pick<2,true>(), 4, 256, true, 2}, {"sweep D4 32w", pick<4,true>(), 4, 256, true, 4},
    {"sweep D8 32w", pick<8,true>(), 4, 256, true, 8}, {"sweep D4 64w", pick<4,true>(), 8, 256, true, 4},
    {"sweep D8 16w", pick<8,true>(), 2, 256, true, 8},
  };
  const int calls = 20, replays = 10;
  for (double mb : sizes_mb) {
    const int lines_per_region = int(mb * 1e6 / 8 / 512);
    const size_t region_bytes = size_t(lines_per_region) * 512;
    const double bytes = 8.0 * region_bytes;
    // 4 region sets, random non-overlapping slots of the pool
    const int slots = int(pool_bytes / region_bytes);
    std::vector<Regions> sets(4);
    for (auto& r : sets) {
      std::vector<int> all(slots); for (int i = 0; i < slots; ++i) all[i] = i; std::shuffle(all.begin(), all.end(), rng);
      for (int i = 0; i < 8; ++i) r.p[i] = reinterpret_cast<const uint4*>(pool + size_t(all[i]) * region_bytes);
      r.n = 8; r.lines_per_region = lines_per_region; r.first_line = 0; r.lines = 8 * lines_per_region;
    }
    for (int split = 0; split < 2; ++split)
    for (auto& c : cfgs) {
      if (split && !(c.depth == 4)) continue;
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < calls; ++i) {
        Regions r = sets[i % 4];
        if (!split) { launch(c.k, sms * c.bps, c.threads, s, r, out, true); }
        else {  // two kernels chained: first 2/3 of the lines, then the rest (gate_up then down)
          Regions a = r, b = r; a.lines = r.lines * 2 / 3; b.first_line = a.lines; b.lines = r.lines - a.lines;
          launch(c.k, sms * c.bps, c.threads, s, a, out, true); launch(c.k, sms * c.bps, c.threads, s, b, out, true);
        }
      }
      CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e0, s));
      for (int i = 0; i < replays; ++i) CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1)); CK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = ms * 1e3 / (calls * replays);
      printf("%7.1f MB  %-16s %s %8.2f us  %6.1f%% of copy\n", bytes / 1e6, c.name, split ? "x2" : "  ", us, 100.0 * bytes / (us * 1e-6) / 1e9 / copy_gbs);
      cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
    }
  }
  return 0;
}
