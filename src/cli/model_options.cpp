// Shared device and model-loading flags (see model_options.h).
#include "cli/model_options.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "models/arch/arch.h"
#include "models/remote_nodes.h"
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
  sub.add_option("--cpu-isa", cpu_isa,
                 "cpu kernels (the CPU backend's and the host experts'): auto = avx2 where the CPU has it, else "
                 "portable; portable, avx2 or avx512 by name (refused where the CPU lacks it). avx512 (W2 products "
                 "only) gives avx2's results bit for bit and was slower on the one CPU measured (AMD Zen 4); "
                 "portable rounds differently")
      ->envname("MOET_CPU_ISA")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "portable", "avx2", "avx512"}));
  sub.add_flag("--cpu-portable", cpu_portable, "cpu: the same as --cpu-isa portable")->envname("MOET_CPU_SCALAR");
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
  sub.add_flag("--cuda-unverified", cuda_unverified,
               "cuda: run the paths that are refused or left off until their CUDA tests have passed on a GPU "
               "(tensor / expert parallelism); for the "
               "verification runs on a GPU machine, results not yet trusted")
      ->envname("MOET_CUDA_UNVERIFIED");
}

CpuIsa DeviceOptions::cpu_isa_level() const {
  if (!cpu_portable) return cpu_isa_parse(cpu_isa);
  MOET_CHECK(cpu_isa == "auto" || cpu_isa == "portable",
             "--cpu-portable (MOET_CPU_SCALAR) and --cpu-isa {} (MOET_CPU_ISA) name different kernels", cpu_isa);
  return CpuIsa::portable;
}

std::unique_ptr<Backend> backend_create(const DeviceOptions& options, int gpu) {
  if (options.device == "cpu") return cpu_backend_create({options.threads, options.cpu_isa_level()});
#ifdef MOET_HAVE_CUDA
  CudaBackendOptions cuda;
  cuda.device = gpu;
  cuda.memory_utilization = options.gpu_memory_utilization;
  cuda.memory_limit_gib = options.gpu_memory_limit_gib;
  cuda.graphs = options.cuda_graphs == "on";
  cuda.max_graphs = options.cuda_graphs_max;
  cuda.gemm_min_rows = options.cuda_gemm_min_rows;
  cuda.sync_every_op = options.cuda_sync;
  cuda.profile = options.cuda_profile;
  return cuda_backend_create(cuda);
#else
  (void)gpu;
  fail("--device {}: this moet was built without CUDA (nvcc was not found at configure time)", options.device);
#endif
}

void KvCacheOptions::add_to(CLI::App& sub) {
  sub.add_option("--kv-cache-dtype", dtype,
                 "how the KV cache stores keys and values: auto (= bf16 on cpu, fp32 on cuda), fp32, bf16, fp8 "
                 "(= fp8_e4m3), fp8_e4m3, fp8_e5m2 (scales per token and head, or the checkpoint's "
                 "k_scale/v_scale), nvfp4 (MLA latent caches only: e2m1 with an e4m3 scale per 16); docs/kv.md")
      ->envname("MOET_KV_CACHE_DTYPE")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fp32", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4"}));
}

KvDtype kv_cache_dtype_resolve(const KvCacheOptions& options, const DeviceOptions& device) {
  const KvDtype dtype = kv_dtype_parse(options.dtype);
  // On CUDA auto stays fp32: decode attention stages quantized rows synchronously and is slower
  // than over fp32 at long contexts (docs/kv.md, "CUDA").
  return device.device == "cuda" && options.dtype == "auto" ? KvDtype::f32 : dtype;
}

void ModelOptions::add_to(CLI::App& sub) {
  sub.add_option("--model", model_dir, "model folder: config.json + *.safetensors (+ tokenizer files)")
      ->required();
  device.add_to(sub);
  experts.add_to(sub);
  kv_cache.add_to(sub);
  parallel.add_to(sub);
}

ModelLoadOptions model_load_options(const DeviceOptions& device, const ExpertOptions& experts, int64_t max_step_rows) {
  ModelLoadOptions options = experts.resolve(max_step_rows);
  if (options.tiering)
    options.tiering->residency.host_isa = device.cpu_isa_level();
  return options;
}

LoadedModel load_model(const ModelOptions& options, int64_t max_step_rows, bool load_mtp) {
  const KvDtype kv_dtype = kv_cache_dtype_resolve(options.kv_cache, options.device);
  LoadedModel loaded;
  ModelLoadOptions load = model_load_options(options.device, options.experts, max_step_rows);
  load.load_mtp = load_mtp;
  loaded.checkpoint = std::make_unique<Checkpoint>(Checkpoint::open(options.model_dir));
  const ParallelOptions& parallel = options.parallel;
  if (!parallel.split()) {
    loaded.backend = backend_create(options.device);
    loaded.model = model_load(*loaded.checkpoint, *loaded.backend, nullptr, load);
  } else {
    parallel_device_gate(options.device, parallel);
    const ModelConfig config = model_config_parse(loaded.checkpoint->config());
    parallel_check(config, parallel.config());  // before any rank or rendezvous
    parallel_check(load, parallel.config());
    const std::string description =
        fmt::format("{} (checkpoint {}), tensor-parallel-size {}{}, {} nodes", options.model_dir,
                    loaded.checkpoint->identity(), parallel.tensor_parallel_size,
                    parallel.enable_expert_parallel ? " with expert parallelism" : "", parallel.nnodes);
    NodeGroup nodes = comm_group_create(options.device, parallel, description);
    loaded.group = std::move(nodes.group);
    const Checkpoint& checkpoint = *loaded.checkpoint;
    ParallelLoad ranks{loaded.group.get(), parallel.enable_expert_parallel,
                       [&](int local) { return rank_backend_create(options.device, parallel, local); },
                       [&](Backend& backend, const ModelLoadOptions& own) {
                         return model_load(checkpoint, backend, nullptr, own);
                       },
                       nullptr};
    if (parallel.node_rank == 0 && !nodes.links.empty()) {
      ranks.remote = std::make_shared<RemoteNodes>(std::move(nodes.links));
    } else if (parallel.node_rank > 0) {
      loaded.node0 = std::move(nodes.links.at(0));
    }
    loaded.model = parallel_model_load(config, ranks, load);
  }
  loaded.model->set_kv_cache_dtype(kv_dtype);
  return loaded;
}

void LoadedModel::follow() {
  MOET_CHECK(follower(), "only a node other than node 0 follows node 0");
  follow_node0(*model, node0);
}

}  // namespace moet::cli
