// The CUDA backend (class in cuda_backend_impl.h): construction, device memory and host transfers.
// Weights and activations live in a caching allocator under the memory budget (device_memory.h);
// host copies go through pinned staging buffers (two for uploads, so the memcpy into one overlaps
// the DMA out of the other). Of what is here only to_host(), the copy bandwidth measurement and
// memory-budget releases synchronise with the host. read_regions(), copy_bandwidth() and
// upload_bandwidth() serve the memory benchmarks. Also the factory, cuda_backend_create()
// (cuda_backend.h). Expert sets and slots are in cuda_backend_experts.cpp.
#include "backend/cuda/cuda_backend.h"

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "core/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/read_regions.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace moet {

using namespace moet::cuda;

namespace {

constexpr size_t kStagingBytes = size_t(32) << 20;

// The fastest of 5 copies of `bytes` from src to dst on `stream` (after one to warm up), in seconds.
double best_copy_seconds(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  double best = 0.0;
  for (int round = 0; round < 6; ++round) {
    cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
    cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpy");
    cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (round > 0 && (best == 0.0 || double(ms) * 1e-3 < best)) best = double(ms) * 1e-3;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

}  // namespace

CudaBackend::CudaBackend(const CudaBackendOptions& options) : memory_(budget_for(options)) {
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming), "cudaEventCreate");
  for (cudaEvent_t& event : scratch_free_)
    cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  for (PinnedBuffer* buffer : {&staging_[0], &staging_[1], &step_staging_, &prefill_staging_}) {
    cuda_check(cudaEventCreateWithFlags(&buffer->done, cudaEventDisableTiming), "cudaEventCreate");
  }
  staging_[0].reserve(kStagingBytes);
  staging_[1].reserve(kStagingBytes);
  attention_counters_ = device_tensor(DType::i32, {kAttentionMaxSplitUnits});
  cuda_check(cudaMemsetAsync(attention_counters_.data, 0, attention_counters_.bytes(), stream_), "cudaMemset");
  debug_sync_ = options.sync_every_op;
  graphs_enabled_ = options.graphs;
  gemm_min_rows_ = std::max<int64_t>(0, options.gemm_min_rows);
  max_graphs_ = std::max<int64_t>(1, options.max_graphs);
  memory_.set_pressure_handler([this] { clear_graphs(); });
  set_profiling(options.profile);
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
  name_ = fmt::format("cuda ({}, sm_{}{}, budget {:.1f} GiB)", prop.name, prop.major, prop.minor,
                      double(memory_.budget()) / double(size_t(1) << 30));
}

CudaBackend::~CudaBackend() {
  gate_release();
  cudaStreamSynchronize(stream_);
  graphs_.clear();
  memory_.set_pressure_handler({});
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
  if (gate_host_) cudaFreeHost(gate_host_);
  cudaStreamSynchronize(copy_stream_);
  cudaEventDestroy(copy_done_);
  for (cudaEvent_t event : scratch_free_) cudaEventDestroy(event);
  cudaStreamDestroy(copy_stream_);
  if (writeback_stream_) {
    cudaStreamSynchronize(writeback_stream_);
    cudaEventDestroy(writeback_ready_);
    cudaStreamDestroy(writeback_stream_);
  }
  cudaStreamDestroy(stream_);
}

Tensor CudaBackend::upload(const HostTensor& info) {
  if (info.dtype != DType::bf16 && info.dtype != DType::f32 && info.dtype != DType::u8 && info.dtype != DType::i32)
    return upload_f32(info);
  Tensor t = device_tensor(info.dtype, info.shape);
  copy_to_device(t.data, info.data, info.bytes);
  return t;
}

Tensor CudaBackend::upload_stacked(const HostTensor& a, const HostTensor& b) {
  MOET_CHECK(a.dtype == b.dtype && a.shape.size() == 2 && b.shape.size() == 2 && a.shape[1] == b.shape[1],
             "cannot stack '{}' {} and '{}' {}", a.name, a.shape_text(), b.name, b.shape_text());
  if (a.dtype != DType::bf16 && a.dtype != DType::f32 && a.dtype != DType::u8) {
    const std::vector<float> fa = widen(a), fb = widen(b);
    Tensor t = device_tensor(DType::f32, {a.shape[0] + b.shape[0], a.shape[1]});
    copy_to_device(t.data, fa.data(), fa.size() * sizeof(float));
    copy_to_device(static_cast<uint8_t*>(t.data) + fa.size() * sizeof(float), fb.data(), fb.size() * sizeof(float));
    return t;
  }
  Tensor t = device_tensor(a.dtype, {a.shape[0] + b.shape[0], a.shape[1]});
  copy_to_device(t.data, a.data, a.bytes);
  copy_to_device(static_cast<uint8_t*>(t.data) + a.bytes, b.data, b.bytes);
  return t;
}

Tensor CudaBackend::upload_f32(const HostTensor& info) {
  const std::vector<float> values = widen(info);
  Tensor t = device_tensor(DType::f32, info.shape);
  copy_to_device(t.data, values.data(), values.size() * sizeof(float));
  return t;
}

Tensor CudaBackend::alloc(std::vector<int64_t> shape, DType dtype) {
  return device_tensor(dtype, std::move(shape));
}

KvLayerCache CudaBackend::alloc_kv(int64_t blocks, int64_t block_size, const KvLayout& layout) {
  // F32 caches as F32 rows (so tests and tools read them as floats), the others as bytes.
  const DType dtype = layout.dtype == KvDtype::f32 ? DType::f32 : DType::u8;
  const std::vector<int64_t> shape = {blocks * block_size, kv_slot_layout(layout).bytes / int64_t(dtype_size(dtype))};
  const auto zeroed = [&] {
    Tensor t = device_tensor(dtype, shape);
    cuda_check(cudaMemsetAsync(t.data, 0, t.bytes(), stream_), "clearing the KV cache");
    return t;
  };
  KvLayerCache cache;
  cache.k = zeroed();
  if (layout.v_aliases_k) {
    cache.v = cache.k;
  } else {
    MOET_CHECK(layout.k_dim == layout.v_dim, "separate K/V caches need k_dim == v_dim ({} vs {})", layout.k_dim,
               layout.v_dim);
    cache.v = zeroed();
  }
  cache.view = paged_kv_view(layout, cache.k.as<uint8_t>(), cache.v.as<uint8_t>(), block_size);
  return cache;
}

void CudaBackend::to_host(const Tensor& src, void* dst) {
  if (chain_) chain_end();
  const size_t bytes = src.bytes();
  for (size_t done = 0; done < bytes; done += kStagingBytes) {
    const size_t chunk = std::min(kStagingBytes, bytes - done);
    cuda_check(cudaMemcpyAsync(staging_[0].data, static_cast<const uint8_t*>(src.data) + done, chunk,
                               cudaMemcpyDeviceToHost, stream_), "device-to-host copy");
    cuda_check(cudaStreamSynchronize(stream_), "device-to-host copy");
    std::memcpy(static_cast<uint8_t*>(dst) + done, staging_[0].data, chunk);
  }
}

static_assert(kReadRegionsMax == size_t(kMaxReadRegions), "ReadRegions holds what check_read_regions admits");

void CudaBackend::read_regions(const std::vector<ByteRegion>& regions, Tensor& sink) {
  check_read_regions(regions, sink);
  ReadRegions r;
  for (const ByteRegion& region : regions) {
    r.data[r.count] = region.data;
    r.bytes[r.count++] = region.bytes;
  }
  read_regions_index(r);
  cuda_check(cudaMemsetAsync(sink.data, 0, sizeof(uint32_t), stream_), "cudaMemset");
  read_regions_launch(r, sink.as<uint32_t>(), stream_);
  check_launch("read_regions");
}

// Device-to-device copies; read + write counted.
double CudaBackend::copy_bandwidth(size_t bytes) {
  const std::shared_ptr<void> src = memory_.allocate(bytes), dst = memory_.allocate(bytes);
  cuda_check(cudaMemsetAsync(src.get(), 1, bytes, stream_), "cudaMemset");
  return 2.0 * double(bytes) / best_copy_seconds(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream_) / 1e9;
}

// Pinned host-to-device copies on the copy stream expert fetches use; bytes moved.
double CudaBackend::upload_bandwidth(size_t bytes) {
  const std::shared_ptr<uint8_t> src = alloc_pinned(bytes);
  const std::shared_ptr<void> dst = memory_.allocate(bytes);
  return double(bytes) / best_copy_seconds(dst.get(), src.get(), bytes, cudaMemcpyHostToDevice, copy_stream_) / 1e9;
}

size_t CudaBackend::budget_for(const CudaBackendOptions& options) {
  cuda_check(cudaSetDevice(options.device), "cudaSetDevice");
  size_t free_bytes = 0, total = 0;
  cuda_check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  if (options.memory_limit_gib > 0) return size_t(options.memory_limit_gib * double(size_t(1) << 30));
  return size_t(options.memory_utilization * double(total));
}

std::vector<float> CudaBackend::widen(const HostTensor& info) {
  std::vector<float> out(size_t(info.numel()));
  const auto* half = reinterpret_cast<const uint16_t*>(info.data);
  switch (info.dtype) {
    case DType::f32: std::memcpy(out.data(), info.data, info.bytes); break;
    case DType::bf16: for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(half[i]); break;
    case DType::f16: for (size_t i = 0; i < out.size(); ++i) out[i] = f16_to_float(half[i]); break;
    default:
      fail("tensor '{}' ({}): dtype {} is not supported by the CUDA backend yet", info.name, info.file,
           dtype_name(info.dtype));
  }
  return out;
}

Tensor CudaBackend::device_tensor(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.storage = memory_.allocate(t.bytes());
  t.data = t.storage.get();
  return t;
}

// Host -> device through the two staging buffers, alternating; returns before the DMA ends.
void CudaBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  for (size_t done = 0; done < bytes; done += kStagingBytes) {
    PinnedBuffer& buffer = staging_[next_staging_];
    next_staging_ ^= 1;
    const size_t chunk = std::min(kStagingBytes, bytes - done);
    buffer.wait();
    std::memcpy(buffer.data, static_cast<const uint8_t*>(src) + done, chunk);
    cuda_check(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + done, buffer.data, chunk, cudaMemcpyHostToDevice,
                               stream_), "host-to-device copy");
    cuda_check(cudaEventRecord(buffer.done, stream_), "cudaEventRecord");
  }
}

std::unique_ptr<Backend> cuda_backend_create(const CudaBackendOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    fail("--device cuda: no CUDA GPU is visible (driver missing or no device)");
  }
  MOET_CHECK(options.device >= 0 && options.device < count, "CUDA device {} does not exist ({} visible)",
             options.device, count);
  return std::make_unique<CudaBackend>(options);
}

}  // namespace moet
