// The CUDA backend's routed experts (class in cuda_backend_impl.h): a layer's table of device
// pointers (kernels/cuda/moe.h) with W2 planes replaced by their tensor-core tiles, updates of
// its entries between steps, stand-ins for absent entries, and the slot pool of tiered residency:
// one device allocation of equal slots plus a load scratch, filled from pinned host rows by one
// batched copy on the copy stream, then converted in place (W2 tiles) on the compute stream,
// which waits for the copy. A layer with an FP4 tier (expert_set_add_tier) has a second table,
// the tier's entries present there and marked served elsewhere in the first; FP4 slots can also
// be loaded without waiting (expert_slots_load_async: the copy stream alone, an event to poll).
// Pinned host memory and zero fills live here too.
#include "backend/cuda/cuda_backend_impl.h"

#include "core/error.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/w2_tiles.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

namespace moet {

using namespace moet::cuda;

namespace {

// Rows of a W2 slot pool loaded (and converted) per batched copy: the scratch holds two batches.
constexpr int64_t kSlotLoadBatch = 16;

}  // namespace

std::pair<Tensor, Tensor> CudaBackend::w2_tiled_views(std::shared_ptr<void> storage, uint8_t* tiled, int64_t rows,
                                                      int64_t cols) {
  const int64_t padded = w2_tile_shape(rows, cols).chunks * kW2ChunkCols;
  // The two tensors keep the planes' shapes over one plane of records (codes and scales
  // together, w2_tiles.h), the scales one pointing at the first record's scale bytes.
  return {Tensor{DType::u8, {rows, padded / 4}, storage, tiled},
          Tensor{DType::u8, {rows, padded / 32}, storage, tiled + kW2ChunkCodeBytes}};
}

// Replaces a W2 plane pair [rows, cols / 4] + [rows, cols / 32] by its tensor-core tiles
// (kernels/cuda/w2_tiles.h), shaped as the planes of cols rounded up to 128.
void CudaBackend::tile_w2(Tensor& codes, Tensor& scales, bool gate_up, Tensor& bad_scale) {
  const int64_t rows = codes.dim(0), cols = codes.dim(1) * 4;
  Tensor tiled = device_tensor(DType::u8, {int64_t(w2_tile_shape(rows, cols).bytes())});
  w2_tile_launch(static_cast<const uint8_t*>(codes.data), static_cast<const uint8_t*>(scales.data), rows, cols,
                 gate_up, tiled.as<uint8_t>(), bad_scale.as<int32_t>(), stream_);
  check_launch("w2_tile");
  std::tie(codes, scales) = w2_tiled_views(tiled.storage, tiled.as<uint8_t>(), rows, cols);
}

void CudaBackend::check_bad_scales() {
  if (bad_scale_.empty()) return;
  int32_t bad = 0;
  to_host(bad_scale_, &bad);
  MOET_CHECK(bad == 0, "a W2 expert has a block scale >= 2^126, beyond what the CUDA kernels take");
}

size_t CudaBackend::device_expert_bytes(const ExpertLayout& layout) {
  const int64_t hidden = layout.hidden, inner = layout.inner;
  if (layout.format == ExpertFormat::w2)
    return w2_tile_shape(2 * inner, hidden).bytes() + w2_tile_shape(hidden, inner).bytes();
  MOET_CHECK(layout.format != ExpertFormat::dense, "expert slots hold W2, W2K or FP4 experts");
  const int64_t code_bits = expert_format_bits(layout.format);
  const int64_t codes = 3 * hidden * inner * code_bits / 8, scales = 3 * hidden * inner / 32;
  return size_t(codes + scales);
}

ExpertPointers CudaBackend::table_entry(const ExpertSet& set, const ExpertWeights& e, ExpertFormat format) {
  const ExpertWeights* source = &e;
  const int32_t presence =
      !e.present() ? (e.host ? kHostComputed : kAbsent) : e.format == format ? kPresent : kServedElsewhere;
  if (presence != kPresent) {
    const ExpertLayout l{format, set.layout.hidden, set.layout.inner};
    const auto key = std::make_tuple(int(l.format), int(set.dense_dtype), l.hidden, l.inner);
    auto it = stand_ins_.find(key);
    if (it == stand_ins_.end()) {
      // A zeroed expert in the device layout: codes 0 and scale bytes 0 (2^-127), or zeros.
      ExpertWeights z;
      if (l.format == ExpertFormat::dense) {
        z.gate_up = device_tensor(set.dense_dtype, {2 * l.inner, l.hidden});
        z.down = device_tensor(set.dense_dtype, {l.hidden, l.inner});
        for (Tensor* t : {&z.gate_up, &z.down})
          cuda_check(cudaMemsetAsync(t->data, 0, t->bytes(), stream_), "cudaMemset");
      } else {  // one slot: its planes are one zeroed allocation
        z = alloc_expert_slots(l, {}, 1).weights[0];
        cuda_check(cudaMemsetAsync(z.gate_up.data, 0, device_expert_bytes(l), stream_), "cudaMemset");
      }
      it = stand_ins_.emplace(key, z).first;
    }
    source = &it->second;
  }
  return {source->gate_up.data, source->down.data, static_cast<const uint8_t*>(source->gate_up_scales.data),
          static_cast<const uint8_t*>(source->down_scales.data), presence, 0};
}

// The set's table (and its tier's) from set.experts, each in one copy (a few KB), ordered before
// the next step. In the tier's table every entry not of the tier's format is served elsewhere.
void CudaBackend::write_tables(const ExpertSet& set) {
  std::vector<ExpertPointers> pointers;
  for (const ExpertWeights& e : set.experts) pointers.push_back(table_entry(set, e, set.layout.format));
  copy_to_device(set.table.data, pointers.data(), pointers.size() * sizeof(ExpertPointers));
  if (!set.has_tier()) return;
  pointers.clear();
  for (const ExpertWeights& e : set.experts) {
    ExpertPointers p = table_entry(set, e, set.tier_format);
    // The first table's pass records misses and adds the host's results.
    if (p.present == kAbsent || p.present == kHostComputed) p.present = kServedElsewhere;
    pointers.push_back(p);
  }
  copy_to_device(set.tier_table.data, pointers.data(), pointers.size() * sizeof(ExpertPointers));
}

ExpertSet CudaBackend::expert_set(const ExpertLayout& layout, std::vector<ExpertWeights> experts) {
  const DType dense_dtype = expert_set_check(layout, experts);
  for (ExpertWeights& e : experts) {
    if (!e.present() || e.format == ExpertFormat::dense) continue;
    MOET_CHECK(aligned(e.gate_up.data, 16) && aligned(e.down.data, 16), "expert code planes must be 16-byte aligned");
    if (e.format != ExpertFormat::w2) continue;
    if (bad_scale_.empty()) {
      bad_scale_ = device_tensor(DType::i32, {1});
      cuda_check(cudaMemsetAsync(bad_scale_.data, 0, sizeof(int32_t), stream_), "cudaMemset");
    }
    tile_w2(e.gate_up, e.gate_up_scales, true, bad_scale_);
    tile_w2(e.down, e.down_scales, false, bad_scale_);
  }
  check_bad_scales();
  Tensor table = device_tensor(DType::u8, {int64_t(experts.size() * sizeof(ExpertPointers))});
  ExpertSet set{layout, dense_dtype, std::move(experts), table, {}};
  write_tables(set);
  return set;
}

// Entries come in the device layout (resident experts tiled by expert_set(), slots by their
// loads): the tables are rewritten whole.
void CudaBackend::expert_set_update(ExpertSet& set, std::span<const int64_t> experts,
                                    std::span<const ExpertWeights> weights) {
  expert_set_assign(set, experts, weights);
  for (size_t i = 0; i < weights.size(); ++i)
    MOET_CHECK(!weights[i].present() || weights[i].format == set.layout.format ||
                   (set.has_tier() && weights[i].format == set.tier_format),
               "expert_set_update: an expert of another format than the layer's and its tier's");
  write_tables(set);
}

void CudaBackend::expert_set_add_tier(ExpertSet& set, ExpertFormat tier) {
  MOET_CHECK(tier == ExpertFormat::w2 || tier == ExpertFormat::fp4, "an expert tier holds W2 or FP4 experts");
  MOET_CHECK(set.layout.format != ExpertFormat::dense, "an expert tier sits over block-format experts, not dense ones");
  set.tier_format = tier;
  if (set.has_tier() && set.tier_table.empty())
    set.tier_table = device_tensor(DType::u8, {int64_t(set.experts.size() * sizeof(ExpertPointers))});
  write_tables(set);
}

// Slots of the device layout side by side, then the scratch that raw rows land in before their
// conversion (W2 only, two batches of rows; FP4 and W2K rows are copied into their slots as they are).
ExpertSlots CudaBackend::alloc_expert_slots(const ExpertLayout& layout, const ExpertRowLayout& row, int64_t count) {
  MOET_CHECK(count > 0, "an expert slot pool needs slots (got {})", count);
  const size_t slot = (device_expert_bytes(layout) + 255) / 256 * 256;
  const size_t row_stride = (row.bytes + 255) / 256 * 256;
  const size_t scratch = layout.format == ExpertFormat::w2 ? 2 * size_t(kSlotLoadBatch) * row_stride : 0;
  Tensor memory = device_tensor(DType::u8, {int64_t(slot * size_t(count) + scratch)});
  ExpertSlots slots{layout, row, {}, memory.storage};
  const int64_t hidden = layout.hidden, inner = layout.inner;
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* base = memory.as<uint8_t>() + size_t(i) * slot;
    ExpertWeights w;
    w.format = layout.format;
    if (layout.format == ExpertFormat::w2) {
      std::tie(w.gate_up, w.gate_up_scales) = w2_tiled_views(memory.storage, base, 2 * inner, hidden);
      std::tie(w.down, w.down_scales) =
          w2_tiled_views(memory.storage, base + w2_tile_shape(2 * inner, hidden).bytes(), hidden, inner);
    } else {  // FP4, W2K: the row's four planes in the row's order
      const auto plane = [&](uint64_t offset, std::vector<int64_t> shape) {
        return Tensor{DType::u8, std::move(shape), memory.storage, base + offset};
      };
      const int64_t bits = expert_format_bits(layout.format);
      w.gate_up = plane(row.codes13, {2 * inner, hidden * bits / 8});
      w.gate_up_scales = plane(row.scales13, {2 * inner, hidden / 32});
      w.down = plane(row.codes2, {hidden, inner * bits / 8});
      w.down_scales = plane(row.scales2, {hidden, inner / 32});
    }
    slots.weights.push_back(std::move(w));
  }
  return slots;
}

void CudaBackend::expert_slots_load(ExpertSlots& slots, std::span<const int64_t> ids,
                                    std::span<const uint8_t* const> rows) {
  MOET_CHECK(ids.size() == rows.size(), "expert_slots_load: {} slots for {} rows", ids.size(), rows.size());
  for (int64_t id : ids) MOET_CHECK(id >= 0 && id < slots.count(), "expert slot {} outside the pool of {}", id, slots.count());
  const ExpertLayout& l = slots.layout;
  const ExpertRowLayout& r = slots.row;
  const bool w2 = l.format == ExpertFormat::w2;
  const size_t row_stride = (r.bytes + 255) / 256 * 256;
  uint8_t* scratch = static_cast<uint8_t*>(slots.weights.back().gate_up.data) +
                     (device_expert_bytes(l) + 255) / 256 * 256;
  if (w2 && bad_scale_.empty()) {
    bad_scale_ = device_tensor(DType::i32, {1});
    cuda_check(cudaMemsetAsync(bad_scale_.data, 0, sizeof(int32_t), stream_), "cudaMemset");
  }
  // The copy stream may overwrite the scratch (or a slot) only once the compute stream is done
  // with what it held.
  cuda_check(cudaEventRecord(copy_done_, stream_), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(copy_stream_, copy_done_), "cudaStreamWaitEvent");
  // W2 rows land in the two halves of the scratch by turns: a batch's copy runs while the batch
  // before it converts, and waits only for the conversions of the batch that used its half last.
  const size_t batch = w2 ? size_t(kSlotLoadBatch) : ids.size();
  for (size_t first = 0, turn = 0; first < ids.size(); first += batch, turn ^= 1) {
    const size_t n = std::min(batch, ids.size() - first);
    uint8_t* half = scratch + turn * batch * row_stride;
    if (w2 && first >= 2 * batch)
      cuda_check(cudaStreamWaitEvent(copy_stream_, scratch_free_[turn]), "cudaStreamWaitEvent");
    std::vector<void*> dsts(n);
    for (size_t i = 0; i < n; ++i)
      dsts[i] = w2 ? half + i * row_stride
                   : static_cast<uint8_t*>(slots.weights[size_t(ids[first + i])].gate_up.data) - r.codes13;
    copy_rows(dsts, rows.subspan(first, n), r.bytes);
    cuda_check(cudaEventRecord(copy_done_, copy_stream_), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, copy_done_), "cudaStreamWaitEvent");
    if (!w2) continue;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* raw = half + i * row_stride;
      const ExpertWeights& dst = slots.weights[size_t(ids[first + i])];
      w2_tile_launch(raw + r.codes13, raw + r.scales13, 2 * l.inner, l.hidden, true,
                     static_cast<uint8_t*>(dst.gate_up.data), bad_scale_.as<int32_t>(), stream_);
      w2_tile_launch(raw + r.codes2, raw + r.scales2, l.hidden, l.inner, false,
                     static_cast<uint8_t*>(dst.down.data), bad_scale_.as<int32_t>(), stream_);
      check_launch("w2_tile");
    }
    cuda_check(cudaEventRecord(scratch_free_[turn], stream_), "cudaEventRecord");
  }
  // The rows have been read once the copies are done: the caller may reuse their memory.
  cuda_check(cudaStreamSynchronize(copy_stream_), "waiting for the expert copies");
}

// Per batch of kSlotLoadBatch: the victims back into their row layout in the writeback scratch on
// the compute stream (after every step that reads them: W2 untiled, FP4 copied), then their
// device-to-host copies on the writeback stream while expert_slots_load() brings the new rows in
// on the copy stream (which also waits for the compute stream): both PCIe directions at once.
void CudaBackend::expert_slots_exchange(ExpertSlots& slots, std::span<const int64_t> ids,
                                        std::span<const uint8_t* const> in_rows, std::span<uint8_t* const> out_rows) {
  MOET_CHECK(ids.size() == in_rows.size() && ids.size() == out_rows.size(),
             "expert_slots_exchange: {} slots for {} rows in and {} out", ids.size(), in_rows.size(), out_rows.size());
  for (int64_t id : ids)
    MOET_CHECK(id >= 0 && id < slots.count(), "expert slot {} outside the pool of {}", id, slots.count());
  const ExpertLayout& l = slots.layout;
  const ExpertRowLayout& r = slots.row;
  const size_t row_stride = (r.bytes + 255) / 256 * 256;
  if (writeback_stream_ == nullptr) {
    cuda_check(cudaStreamCreateWithFlags(&writeback_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&writeback_ready_, cudaEventDisableTiming), "cudaEventCreate");
  }
  if (writeback_scratch_.bytes() < size_t(kSlotLoadBatch) * row_stride)
    writeback_scratch_ = device_tensor(DType::u8, {int64_t(size_t(kSlotLoadBatch) * row_stride)});
  uint8_t* scratch = writeback_scratch_.as<uint8_t>();
  for (size_t first = 0; first < ids.size(); first += size_t(kSlotLoadBatch)) {
    const size_t n = std::min(size_t(kSlotLoadBatch), ids.size() - first);
    // The previous batch's copies out of the scratch are done before it is rewritten.
    cuda_check(cudaStreamSynchronize(writeback_stream_), "waiting for expert write-backs");
    for (size_t i = 0; i < n; ++i) {
      const ExpertWeights& w = slots.weights[size_t(ids[first + i])];
      uint8_t* row = scratch + i * row_stride;
      if (l.format == ExpertFormat::w2) {
        w2_untile_launch(static_cast<const uint8_t*>(w.gate_up.data), 2 * l.inner, l.hidden, true, row + r.codes13,
                         row + r.scales13, stream_);
        w2_untile_launch(static_cast<const uint8_t*>(w.down.data), l.hidden, l.inner, false, row + r.codes2,
                         row + r.scales2, stream_);
        check_launch("w2_untile");
      } else {
        cuda_check(cudaMemcpyAsync(row, static_cast<const uint8_t*>(w.gate_up.data) - r.codes13, r.bytes,
                                   cudaMemcpyDeviceToDevice, stream_),
                   "copying an evicted expert");
      }
    }
    cuda_check(cudaEventRecord(writeback_ready_, stream_), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(writeback_stream_, writeback_ready_), "cudaStreamWaitEvent");
    for (size_t i = 0; i < n; ++i)
      cuda_check(cudaMemcpyAsync(out_rows[first + i], scratch + i * row_stride, r.bytes, cudaMemcpyDeviceToHost,
                                 writeback_stream_),
                 "writing an evicted expert back to the host");
    expert_slots_load(slots, ids.subspan(first, n), in_rows.subspan(first, n));
  }
  cuda_check(cudaStreamSynchronize(writeback_stream_), "waiting for expert write-backs");
}

void CudaBackend::copy_rows(std::span<void* const> dsts, std::span<const uint8_t* const> rows, uint64_t bytes) {
  std::vector<const void*> srcs(rows.begin(), rows.end());
  std::vector<size_t> sizes(rows.size(), size_t(bytes));
  cudaMemcpyAttributes attrs{};
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attrs.srcLocHint.type = cudaMemLocationTypeHost;
  attrs.dstLocHint.type = cudaMemLocationTypeDevice;
  size_t attr_index = 0;
  cuda_check(cudaMemcpyBatchAsync(const_cast<void**>(dsts.data()), srcs.data(), sizes.data(), rows.size(), &attrs,
                                  &attr_index, 1, copy_stream_),
             "batched host-to-device copy of expert rows");
}

// FP4 rows need no conversion: they go straight into their slots on the copy stream, after the
// steps already enqueued (which may still read the slots' old experts); nothing waits for them.
ExpertLoadFence CudaBackend::expert_slots_load_async(ExpertSlots& slots, std::span<const int64_t> ids,
                                                     std::span<const uint8_t* const> rows) {
  if (slots.layout.format != ExpertFormat::fp4 || ids.empty()) {
    expert_slots_load(slots, ids, rows);
    return {};
  }
  MOET_CHECK(ids.size() == rows.size(), "expert_slots_load_async: {} slots for {} rows", ids.size(), rows.size());
  std::vector<void*> dsts;
  for (int64_t id : ids) {
    MOET_CHECK(id >= 0 && id < slots.count(), "expert slot {} outside the pool of {}", id, slots.count());
    dsts.push_back(static_cast<uint8_t*>(slots.weights[size_t(id)].gate_up.data) - slots.row.codes13);
  }
  cuda_check(cudaEventRecord(copy_done_, stream_), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(copy_stream_, copy_done_), "cudaStreamWaitEvent");
  copy_rows(dsts, rows, slots.row.bytes);
  cudaEvent_t done = nullptr;
  cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  std::shared_ptr<void> event(done, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
  cuda_check(cudaEventRecord(done, copy_stream_), "cudaEventRecord");
  return {event};
}

bool CudaBackend::expert_slots_ready(const ExpertLoadFence& fence) {
  if (!fence.event) return true;
  const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(fence.event.get()));
  if (state == cudaErrorNotReady) return false;
  cuda_check(state, "polling an expert copy");
  return true;
}

void CudaBackend::expert_slots_wait(const ExpertLoadFence& fence) {
  if (fence.event)
    cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(fence.event.get())), "waiting for an expert copy");
}

// Mapped as well, so that the device can read and write it directly (host experts' mailboxes).
std::shared_ptr<uint8_t> CudaBackend::alloc_pinned(size_t bytes) {
  void* memory = nullptr;
  const size_t size = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
  cuda_check(cudaHostAlloc(&memory, size, cudaHostAllocPortable | cudaHostAllocMapped),
             "allocating page-locked host memory");
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(memory), [](uint8_t* p) { cudaFreeHost(p); });
}

void* CudaBackend::mapped_pointer(const void* host) {
  auto it = mapped_.find(host);
  if (it == mapped_.end()) {
    void* device = nullptr;
    cuda_check(cudaHostGetDevicePointer(&device, const_cast<void*>(host), 0), "cudaHostGetDevicePointer");
    it = mapped_.emplace(host, device).first;
  }
  return it->second;
}

void CudaBackend::fill_zero(Tensor& t) {
  cuda_check(cudaMemsetAsync(t.data, 0, t.bytes(), stream_), "fill_zero");
  check_launch("fill_zero");
}

}  // namespace moet
