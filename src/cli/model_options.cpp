// Shared device and model-loading flags (see model_options.h).
#include "cli/model_options.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#ifdef MOET_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace moet::cli {

void DeviceOptions::add_to(CLI::App& sub) {
  sub.add_option("--device", device, "where to compute: cpu or cuda")
      ->envname("MOET_DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub.add_option("--threads", threads, "CPU threads for compute (0 = one per core)")
      ->envname("MOET_THREADS")
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--cpu-portable", cpu_portable,
               "cpu: run the portable kernels even where the CPU has AVX2 (for comparisons; slower)")
      ->envname("MOET_CPU_SCALAR");
  sub.add_option("--gpu-memory-utilization", gpu_memory_utilization,
                 "cuda: fraction of the GPU's memory moet may take")
      ->envname("MOET_GPU_MEMORY_UTILIZATION")
      ->check(CLI::Range(0.01, 1.0));
  sub.add_option("--gpu-memory-limit", gpu_memory_limit_gib,
                 "cuda: at most this many GiB of GPU memory (0 = use --gpu-memory-utilization); lets a "
                 "large card stand in for a smaller one")
      ->envname("MOET_GPU_MEMORY_LIMIT")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--cuda-graphs", cuda_graphs,
                 "cuda: on = each decode step shape (batch size, context bucket) is captured in a CUDA graph the "
                 "first time and replayed after, one launch per step instead of one per op (same results); "
                 "off = every op launched one by one (eager), for debugging and comparison")
      ->envname("MOET_CUDA_GRAPHS")
      ->check(CLI::IsMember({"on", "off"}));
  sub.add_option("--cuda-graphs-max", cuda_graphs_max,
                 "cuda: captured graphs kept at once (least recently used dropped first)")
      ->envname("MOET_CUDA_GRAPHS_MAX")
      ->check(CLI::PositiveNumber);
  sub.add_option("--cuda-gemm-min-rows", cuda_gemm_min_rows,
                 "cuda: products of at least this many rows with BF16 or FP8-block weights run as cuBLASLt GEMMs "
                 "on the tensor cores (0 = never)")
      ->envname("MOET_CUDA_GEMM_MIN_ROWS")
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--cuda-sync", cuda_sync,
               "cuda: synchronise and check for errors after every op (finds a faulting kernel; slow)")
      ->envname("MOET_CUDA_SYNC");
  sub.add_flag("--cuda-profile", cuda_profile,
               "cuda: time every op of eager steps with CUDA events from the start (the per-op profile)")
      ->envname("MOET_CUDA_PROFILE");
}

std::unique_ptr<Backend> backend_create(const DeviceOptions& options) {
  if (options.device == "cpu")
    return cpu_backend_create({options.threads, options.cpu_portable ? CpuIsa::portable : cpu_isa_best()});
#ifdef MOET_HAVE_CUDA
  CudaBackendOptions cuda;
  cuda.memory_utilization = options.gpu_memory_utilization;
  cuda.memory_limit_gib = options.gpu_memory_limit_gib;
  cuda.graphs = options.cuda_graphs == "on";
  cuda.max_graphs = options.cuda_graphs_max;
  cuda.gemm_min_rows = options.cuda_gemm_min_rows;
  cuda.sync_every_op = options.cuda_sync;
  cuda.profile = options.cuda_profile;
  return cuda_backend_create(cuda);
#else
  fail("--device {}: this moet was built without CUDA (nvcc was not found at configure time)", options.device);
#endif
}

void check_verified_on_gpu(const DeviceOptions& device, std::string_view feature) {
  static constexpr std::string_view kUnverified[] = {"--experts w2k", "moet imatrix"};
  for (std::string_view f : kUnverified)
    MOET_CHECK(device.device != "cuda" || f != feature, "{} on --device cuda is not yet verified on a GPU", feature);
}

void ModelOptions::add_to(CLI::App& sub) {
  sub.add_option("--model", model_dir, "model folder: config.json + *.safetensors (+ tokenizer files)")
      ->required();
  device.add_to(sub);
  experts.add_to(sub);
}

LoadedModel load_model(const ModelOptions& options, int64_t max_step_rows) {
  if (options.experts.experts == "w2k") check_verified_on_gpu(options.device, "--experts w2k");
  LoadedModel loaded;
  loaded.checkpoint = std::make_unique<Checkpoint>(Checkpoint::open(options.model_dir));
  loaded.backend = backend_create(options.device);
  loaded.model = model_load(*loaded.checkpoint, *loaded.backend, nullptr, options.experts.resolve(max_step_rows));
  return loaded;
}

}  // namespace moet::cli
