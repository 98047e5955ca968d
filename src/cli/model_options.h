// Flags shared by the subcommands that load a model: where it runs (--device cpu|cuda, CPU
// threads and kernel path, the GPU memory budget, CUDA graphs and the CUDA debugging and tuning
// knobs, each with its MOET_* environment fallback), how the KV cache stores its values
// (--kv-cache-dtype) and which folder it comes from (--model), plus the code that builds the
// backend, opens the checkpoint and loads the model from them. This is the only
// place those settings are read: the backends take them as options. The CUDA backend is reached through a
// plain C++ factory (backend/cuda/cuda_backend.h), so no CUDA header is included here.
#pragma once

#include "backend/backend.h"
#include "cli/expert_options.h"
#include "cli/parallel_options.h"
#include "io/checkpoint.h"
#include "models/model.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

namespace moet::cli {

struct DeviceOptions {
  std::string device = "cpu";
  int threads = 0;
  std::string cpu_isa = "auto";
  bool cpu_portable = false;  // --cpu-portable: an alias of --cpu-isa portable
  double gpu_memory_utilization = 0.9;
  double gpu_memory_limit_gib = 0.0;
  std::string cuda_graphs = "on";
  int64_t cuda_graphs_max = 32;
  int64_t cuda_gemm_min_rows = 16;
  bool cuda_sync = false;
  bool cuda_profile = false;
  bool cuda_unverified = false;

  void add_to(CLI::App& sub);
  // The CPU kernels' level --cpu-isa / --cpu-portable name (fails for a level this CPU lacks, or
  // for --cpu-portable with another --cpu-isa than auto or portable).
  CpuIsa cpu_isa_level() const;
  // Whether paths not yet verified on a GPU are refused: on cuda unless --cuda-unverified.
  bool refuses_unverified() const { return device == "cuda" && !cuda_unverified; }
};

// The backend the options name (cuda: on GPU `gpu`); fails with a one-line message for cuda in a
// CPU-only build.
std::unique_ptr<Backend> backend_create(const DeviceOptions& options, int gpu = 0);

// --kv-cache-dtype auto|fp32|bf16|fp8|fp8_e4m3|fp8_e5m2|nvfp4 (vLLM's names; auto = bf16).
struct KvCacheOptions {
  std::string dtype = "auto";

  void add_to(CLI::App& sub);
};

// The cache dtype the options name on `device` (for Model::set_kv_cache_dtype(); called before
// the backend is made): auto is bf16 on the CPU and fp32 on cuda (docs/kv.md says why).
KvDtype kv_cache_dtype_resolve(const KvCacheOptions& options, const DeviceOptions& device);


struct ModelOptions {
  std::string model_dir;
  DeviceOptions device;
  ExpertOptions experts;
  KvCacheOptions kv_cache;
  ParallelOptions parallel;

  void add_to(CLI::App& sub);
};

struct LoadedModel {
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<Backend> backend;  // null for a split model (its ranks own theirs)
  std::unique_ptr<CommGroup> group;  // a split model's ranks (outlives the model)
  NodeLink node0;                    // a node other than 0 of a model split over nodes: its link to node 0
  std::unique_ptr<Model> model;

  // Whether this process is a node other than 0 (it then only follows node 0: follow()).
  bool follower() const { return node0.open(); }
  // Runs node 0's steps on this node's ranks until node 0 stops (models/remote_nodes.h).
  void follow();
};

// The experts' load options for `device` (ExpertOptions::resolve; max_step_rows: the most decode
// rows one step of the command has; the host kernels' ISA for tiering from the device flags).
ModelLoadOptions model_load_options(const DeviceOptions& device, const ExpertOptions& experts, int64_t max_step_rows);
// load_mtp: also the checkpoint's MTP layer (--speculative-config method mtp). With
// --tensor-parallel-size > 1 a ParallelModel over comm_group_create()'s ranks (models/parallel_model.h);
// over several nodes node 0's tells the others every step, and the others must follow().
LoadedModel load_model(const ModelOptions& options, int64_t max_step_rows = 1, bool load_mtp = false);

}  // namespace moet::cli
