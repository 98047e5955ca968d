// What a CUDA-graph replay costs the host and the GPU, by graph size and launch attributes: a
// chain of N tiny kernels (one block each) captured with or without programmatic dependent launch
// (PDL), replayed as one graph or as K graphs of N / K kernels launched back to back. Prints, per
// case, the host time inside cudaGraphLaunch (all K calls) and the wall time from the first call
// to the stream's completion, averaged over the replays. It answers whether a decode step's
// graph (about 12 kernels a layer) pays per node at launch, and whether splitting it, uploading it
// ahead (cudaGraphUpload), the size of the kernels' parameters, opted-in dynamic shared memory
// or a mix of kernels changes that.
// build: nvcc -O3 -std=c++17 -arch=sm_90 -o graph_launch_cost tools/gpu/graph_launch_cost.cu
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <vector>

namespace {

// Kernel parameters of B bytes (a pointer and padding), as the step's larger kernels take.
template <int B>
struct Params {
  int* counter;
  char pad[B - sizeof(int*)];
};

template <int B, int V = 0>
__global__ void tiny(Params<B> p) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0) ++p.counter[0];
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// kShared: 64 KB of dynamic shared memory per block (opted in), as the attention kernel takes;
// kMixed: 12 different kernels in turn, as a decode layer has.
enum Variant { kPlain, kShared, kMixed };

template <int V>
void set_shared(size_t bytes) {
  static bool done = [&] {
    return cudaFuncSetAttribute(tiny<16, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) == cudaSuccess;
  }();
  (void)done;
}

template <int V>
void launch_variant(cudaLaunchConfig_t& config, int* counter) {
  Params<16> p{};
  p.counter = counter;
  check(cudaLaunchKernelEx(&config, tiny<16, V>, p), "launch");
}

void launch_mixed(int i, cudaLaunchConfig_t& config, int* counter) {
  switch (i % 12) {
    case 0: launch_variant<1>(config, counter); break;
    case 1: launch_variant<2>(config, counter); break;
    case 2: launch_variant<3>(config, counter); break;
    case 3: launch_variant<4>(config, counter); break;
    case 4: launch_variant<5>(config, counter); break;
    case 5: launch_variant<6>(config, counter); break;
    case 6: launch_variant<7>(config, counter); break;
    case 7: launch_variant<8>(config, counter); break;
    case 8: launch_variant<9>(config, counter); break;
    case 9: launch_variant<10>(config, counter); break;
    case 10: launch_variant<11>(config, counter); break;
    default: launch_variant<12>(config, counter); break;
  }
}

template <int B>
void launch(bool pdl, cudaStream_t stream, int* counter, Variant variant = kPlain, int index = 0) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  if (variant == kShared) {
    set_shared<13>(64 << 10);
    config.dynamicSmemBytes = 64 << 10;
    launch_variant<13>(config, counter);
    return;
  }
  if (variant == kMixed) {
    launch_mixed(index, config, counter);
    return;
  }
  Params<B> p{};
  p.counter = counter;
  check(cudaLaunchKernelEx(&config, tiny<B>, p), "launch");
}

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

template <int B>
void measure(int nodes, int pieces, bool pdl, bool upload, cudaStream_t stream, int* counter, Variant variant = kPlain) {
  std::vector<cudaGraphExec_t> execs(static_cast<size_t>(pieces));
  for (auto& exec : execs) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "begin capture");
    for (int i = 0; i < nodes / pieces; ++i) launch<B>(pdl, stream, counter, variant, i);
    cudaGraph_t graph = nullptr;
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    if (upload) check(cudaGraphUpload(exec, stream), "upload");
    cudaGraphDestroy(graph);
  }
  check(cudaStreamSynchronize(stream), "sync");
  constexpr int kReplays = 30;
  double host = 0, wall = 0;
  for (int r = 0; r < kReplays + 3; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (auto exec : execs) check(cudaGraphLaunch(exec, stream), "launch graph");
    const auto launched = std::chrono::steady_clock::now();
    check(cudaStreamSynchronize(stream), "sync");
    const auto done = std::chrono::steady_clock::now();
    if (r < 3) continue;  // warm-up
    host += seconds(launched - start);
    wall += seconds(done - start);
  }
  std::printf("%-6s %6d nodes  %3d graphs  params %4d B  upload %-3s  pdl %-3s  cudaGraphLaunch %8.1f us  launch-to-done %8.1f us  (%.2f us/node)\n",
              variant == kShared ? "shared" : variant == kMixed ? "mixed" : "plain", nodes, pieces, B, upload ? "yes" : "no", pdl ? "on" : "off", 1e6 * host / kReplays, 1e6 * wall / kReplays,
              1e6 * wall / kReplays / nodes);
  for (auto exec : execs) cudaGraphExecDestroy(exec);
}

}  // namespace

int main() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  int* counter = nullptr;
  check(cudaMalloc(&counter, sizeof(int)), "malloc");
  for (int nodes : {100, 1200})
    for (bool pdl : {false, true})
      for (int pieces : {1, 12}) {
        measure<16>(nodes, pieces, pdl, true, stream, counter);
        measure<16>(nodes, pieces, pdl, false, stream, counter);
        measure<512>(nodes, pieces, pdl, true, stream, counter);
        measure<16>(nodes, pieces, pdl, true, stream, counter, kShared);
        measure<16>(nodes, pieces, pdl, true, stream, counter, kMixed);
      }
  return 0;
}
