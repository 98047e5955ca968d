// A CUPTI injection library that writes one CSV line per kernel the process runs, CUDA-graph
// nodes included, with the GPU's start and end timestamps: the timeline of a decode step inside
// its graph, which the device image's tools cannot show (it has Nsight Compute, which times nodes
// one by one, but not Nsight Systems). The CUDA driver loads it at initialisation when
//   CUDA_INJECTION64_PATH=/path/libmoet_kernel_trace.so MOET_KERNEL_TRACE=trace.csv <program>
// and the file is written when the program exits; tools/gpu/trace_report.py turns it into a
// per-op table. MOET_KERNEL_TRACE_KINDS picks what is traced, a comma list of kernel (the
// default), memcpy and runtime (the CUDA runtime calls, host-side spans on the same clock), to
// see what a step does between two graph replays. Tracing kernels slows graph launches down
// (CUPTI instruments each node): runtime alone times the host calls as they are. A
// kernel's start is when its first block began, so with programmatic dependent launch it may
// precede the previous kernel's end. Build: tools/gpu/pack.sh (g++ -shared ... -lcupti).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

// One traced span; kind is "kernel", "memcpy" (name: direction and bytes) or "runtime" (the call).
struct KernelRecord {
  const char* kind;
  uint32_t correlation, graph_id, stream;
  uint64_t graph_node, start, end;
  int64_t blocks;
  int32_t threads, registers;
  std::string name;
};

std::mutex records_mutex;
std::vector<KernelRecord> records;

std::string demangle(const char* name) {
  int status = 0;
  char* text = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && text ? text : name;
  std::free(text);
  for (char& ch : out)
    if (ch == '"') ch = '\'';  // the name is one quoted CSV field
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<KernelRecord> batch;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      batch.push_back({"kernel", k->correlationId, k->graphId, k->streamId, k->graphNodeId, k->start, k->end,
                       int64_t(k->gridX) * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                       k->registersPerThread, demangle(k->name)});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      const char* direction = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                              : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                                                                               : "other";
      batch.push_back({"memcpy", m->correlationId, m->graphId, m->streamId, m->graphNodeId, m->start, m->end, 0, 0,
                       0, std::string(direction) + " " + std::to_string(m->bytes) + " B"});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* api = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const char* name = nullptr;
      cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, api->cbid, &name);
      batch.push_back({"runtime", api->correlationId, 0, api->threadId, 0, api->start, api->end, 0, 0, 0,
                       name ? name : "?"});
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(records_mutex);
  records.insert(records.end(), batch.begin(), batch.end());
}

void write_trace() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("MOET_KERNEL_TRACE");
  FILE* file = std::fopen(path ? path : "kernel_trace.csv", "w");
  if (!file) {
    std::fprintf(stderr, "moet kernel trace: cannot write %s\n", path ? path : "kernel_trace.csv");
    return;
  }
  std::lock_guard<std::mutex> lock(records_mutex);
  std::fprintf(file, "kind,correlation,graph_id,graph_node,stream,start_ns,end_ns,blocks,threads,registers,name\n");
  for (const KernelRecord& r : records)
    std::fprintf(file, "%s,%u,%u,%llu,%u,%llu,%llu,%lld,%d,%d,\"%s\"\n", r.kind, r.correlation, r.graph_id,
                 static_cast<unsigned long long>(r.graph_node), r.stream, static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), static_cast<long long>(r.blocks), r.threads, r.registers,
                 r.name.c_str());
  std::fclose(file);
  std::fprintf(stderr, "moet kernel trace: %zu records written to %s\n", records.size(),
               path ? path : "kernel_trace.csv");
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* kinds = std::getenv("MOET_KERNEL_TRACE_KINDS");
  const std::string list = std::string(",") + (kinds ? kinds : "kernel") + ",";
  const auto wanted = [&](const char* kind) { return list.find(std::string(",") + kind + ",") != std::string::npos; };
  bool ok = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) == CUPTI_SUCCESS;
  if (ok && wanted("kernel")) ok = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) == CUPTI_SUCCESS;
  if (ok && wanted("memcpy")) ok = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) == CUPTI_SUCCESS;
  if (ok && wanted("runtime")) ok = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) == CUPTI_SUCCESS;
  if (!ok) {
    std::fprintf(stderr, "moet kernel trace: CUPTI refused activity tracing\n");
    return 0;
  }
  std::atexit(write_trace);
  return 1;
}
