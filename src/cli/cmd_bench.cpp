// `moet bench`: decode throughput of a model on the CPU or a GPU (--device; a folder, or a
// config.json with random weights and optionally fewer layers, so full-size shapes fit in memory)
// next to the copy bandwidth of the memory it computes from, measured by the backend in the same
// run. Bytes read per decode step = every weight except the embedding table, with routed experts
// counted by the share of them the step's tokens reach: top_k / n_experts at batch 1 (what one
// token reads), 1 - (1 - top_k / n_experts)^batch expected under uniform routing at larger
// batches; achieved bandwidth = that times steps/s; the ratio to the backend's copy bandwidth (a
// STREAM-like multi-threaded copy on the CPU, a device-to-device copy on the GPU; bytes read +
// written) says how close decode is to the memory roofline.
//
// --batch sequences (default 1), each with its own prompt, are prefilled one by one, then the same
// decode steps (positions prompt .. prompt + decode - 1, one token of every sequence per step,
// greedy tokens fixed by the first pass) run in passes over one KV cache:
// with CUDA graphs on (cuda, --cuda-graphs on), a first pass captures the graphs, a second is
// timed (decode_tokens_per_s) and an eager pass with graphs off is timed next to it
// (decode_tokens_per_s_graphs_off), whose logits must be bit-identical to the graph pass's;
// otherwise one eager pass is timed. --profile (or MOET_CUDA_PROFILE=1) adds an eager pass with
// the backend's per-op profile on: a table on stderr and "profile" in the JSON, per decode step.
// Every step goes through the step runner (engine/sequence_batch.h).
// A pass's time is the sum of its steps' (the forward with its logits copied to the host, and the
// first pass's greedy sampling), not of the copies of the logits the bench keeps to compare.
// --speculative-config adds "speculative": verify and draft step costs (cli/bench_speculative.h).
// --tensor-parallel-size N (and --enable-expert-parallel) splits the model over N ranks
// (docs/parallel.md); the weights, bytes per step and copy bandwidth are then rank 0's (one GPU's
// share and roofline), graphs are turned on and off on every rank, and --profile times rank 0's
// ops, the collectives included on CUDA.
#include "backend/bench_ops.h"
#include "cli/bench_speculative.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/speculative_options.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/sequence_batch.h"
#include "experts/expert_kpis.h"
#include "experts/fp4_kpis.h"
#include "io/checkpoint.h"
#include "models/arch/arch.h"
#include "models/parallel_model.h"
#include "models/remote_nodes.h"
#include "models/weight_loader.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

namespace moet::cli {
namespace {

struct BenchFlags {
  std::string model_dir;
  std::string config_file;
  int64_t layers = 0;
  DeviceOptions device;
  ExpertOptions experts;
  SpeculativeOptions speculative;
  KvCacheOptions kv_cache;
  ParallelOptions parallel;
  int64_t prompt_tokens = 16;
  int64_t decode_tokens = 32;
  int64_t batch = 1;
  double copy_gib = 1.0;
  std::string dummy_routing = "uniform";
  bool profile = false;
  std::string json_out;
};

constexpr int64_t kBlockSize = 16;

// "uniform" -> 0, "zipf:S" -> S (> 0).
double zipf_exponent(const std::string& routing) {
  if (routing == "uniform") return 0.0;
  double s = -1.0;
  if (routing.rfind("zipf:", 0) == 0) {
    try {
      size_t used = 0;
      s = std::stod(routing.substr(5), &used);
      if (used != routing.size() - 5) s = -1.0;
    } catch (const std::exception&) {
    }
  }
  MOET_CHECK(s > 0.0, "--dummy-routing: '{}' is neither uniform nor zipf:S with S > 0", routing);
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct DecodePass {
  double seconds = 0.0;
  std::vector<float> logits;  // every step's, in order
  nlohmann::json experts;     // the expert cache's KPIs over the pass (tiered experts only)
  nlohmann::json fp4;         // the FP4 tier's and the gate's over the pass (with an FP4 tier only)
};

// The backend's per-op profile of `passes` passes as JSON, per pass ("step": a decode step, or a
// prompt's prefill), and its table on stderr.
nlohmann::json profile_report(BenchOps& backend, const std::string& what, int64_t passes, bool cuda) {
  const std::vector<OpProfile> ops = backend.take_profile();
  double total = 0.0;
  for (const OpProfile& op : ops) total += op.seconds;
  nlohmann::json rows = nlohmann::json::array();
  for (const OpProfile& op : ops)
    rows.push_back({{"op", op.op},
                    {"calls_per_step", double(op.calls) / double(passes)},
                    {"us_per_step", op.seconds * 1e6 / double(passes)},
                    {"share", total > 0.0 ? op.seconds / total : 0.0}});
  const char* clock = cuda ? "GPU time between CUDA events, each op gated" : "host wall time per op";
  std::fprintf(stderr, "\nper-op profile: eager %s, %lld passes (%s)\n", what.c_str(), static_cast<long long>(passes),
               clock);
  std::fprintf(stderr, "%-44s %12s %12s %8s\n", "op", "calls/pass", "us/pass", "share");
  for (const auto& op : rows)
    std::fprintf(stderr, "%-44s %12.2f %12.2f %7.1f%%\n", op["op"].get<std::string>().c_str(),
                 op["calls_per_step"].get<double>(), op["us_per_step"].get<double>(),
                 100.0 * op["share"].get<double>());
  std::fprintf(stderr, "%-44s %12s %12.2f %7.1f%%\n", "sum of ops", "", total * 1e6 / double(passes), 100.0);
  return {{"steps", passes}, {"clock", clock}, {"ops", rows}, {"total_us_per_step", total * 1e6 / double(passes)}};
}

void run(const BenchFlags& flags) {
  MOET_CHECK(flags.model_dir.empty() != flags.config_file.empty(), "give exactly one of --model or --config");
  MOET_CHECK(flags.dummy_routing == "uniform" || !flags.config_file.empty(),
             "--dummy-routing shapes invented routers: it needs --config");
  const KvDtype kv_dtype = kv_cache_dtype_resolve(flags.kv_cache, flags.device);
  ModelLoadOptions load_options = model_load_options(flags.device, flags.experts, flags.batch);
  load_options.dummy_zipf = zipf_exponent(flags.dummy_routing);
  const SpeculativeConfig speculative = flags.speculative.resolve();
  load_options.load_mtp = speculative.method == SpeculativeConfig::Method::mtp;
  const ParallelOptions& parallel = flags.parallel;
  if (parallel.split()) parallel_device_gate(flags.device, parallel);
  const bool profile = flags.profile || flags.device.cuda_profile;
  const size_t copy_bytes = size_t(flags.copy_gib * double(1ull << 30));
  double copy_gbs = 0.0;
  const auto copy_bandwidth = [&](Backend& backend) {
    BenchOps& ops = bench_ops(backend);
    ops.set_profiling(false);  // the timed passes run without it; the profile pass turns it on
    copy_gbs = ops.copy_bandwidth(copy_bytes);
    std::fprintf(stderr, "copy bandwidth: %.2f GB/s (read + write, %s)\n", copy_gbs, backend.name().c_str());
  };
  std::unique_ptr<Backend> whole_backend;  // a split model's ranks own theirs
  if (!parallel.split()) {
    whole_backend = backend_create(flags.device);
    copy_bandwidth(*whole_backend);  // before the weights take the memory
  }

  LoadStats stats;  // a split model: rank 0's
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<CommGroup> group;
  std::unique_ptr<Model> model;
  nlohmann::json config;
  if (!flags.model_dir.empty()) {
    checkpoint = std::make_unique<Checkpoint>(Checkpoint::open(flags.model_dir));
    config = checkpoint->config();
  } else {
    config = json_read_file(flags.config_file);
    if (flags.layers > 0) config["num_hidden_layers"] = flags.layers;
  }
  const auto load = [&](Backend& backend, const ModelLoadOptions& options, LoadStats* s) {
    return checkpoint ? model_load(*checkpoint, backend, s, options)
                      : model_load_random(config, backend, 1234, s, options);
  };
  const auto load_start = std::chrono::steady_clock::now();
  if (!parallel.split()) {
    model = load(*whole_backend, load_options, &stats);
  } else {
    const ModelConfig split_config = model_config_parse(config);
    parallel_check(split_config, parallel.config());
    parallel_check(load_options, parallel.config());
    NodeGroup nodes = comm_group_create(flags.device, parallel,
                                        fmt::format("bench {} {}", flags.model_dir + flags.config_file, config.dump()));
    group = std::move(nodes.group);
    ParallelLoad ranks{group.get(), parallel.enable_expert_parallel,
                       [&](int local) { return rank_backend_create(flags.device, parallel, local); },
                       [&](Backend& backend, const ModelLoadOptions& own) {
                         return load(backend, own, own.shard.rank == 0 ? &stats : nullptr);
                       },
                       nullptr};
    if (parallel.node_rank == 0 && !nodes.links.empty())
      ranks.remote = std::make_shared<RemoteNodes>(std::move(nodes.links));
    model = parallel_model_load(split_config, ranks, load_options);
    if (parallel.node_rank > 0) return follow_node0(*model, nodes.links.at(0));  // node 0 measures
  }
  const double load_seconds = seconds_since(load_start);
  Backend* backend = &model->backend();
  BenchOps& ops = bench_ops(*backend);
  if (parallel.split()) copy_bandwidth(*backend);
  const bool graphs = flags.device.device == "cuda" && flags.device.cuda_graphs == "on" && backend->graphs();
  model->set_kv_cache_dtype(kv_dtype);
  const ModelConfig& mc = model->config();
  const int64_t vocab = mc.vocab_size;
  const int64_t batch = flags.batch;
  const double picked = double(mc.num_experts_per_tok) / double(std::max<int64_t>(1, mc.n_routed_experts));
  const double routed_share = 1.0 - std::pow(1.0 - std::min(1.0, picked), double(batch));
  // The MTP layer (--speculative-config mtp) is not read by a decode step.
  const double bytes_per_step =
      double(stats.bytes - stats.embedding_bytes - stats.routed_bytes - (stats.mtp_bytes - stats.mtp_routed_bytes)) +
      double(stats.routed_bytes - stats.mtp_routed_bytes) * routed_share;

  // Sequence s's prompt: token i is (i * 7919 + s * 104729) mod vocab, so the sequences differ.
  const int64_t prompt_len = flags.prompt_tokens, steps = flags.decode_tokens;
  SequenceBatch sequences(*model, batch, prompt_len + steps, kBlockSize);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < prompt_len; ++i)
      sequences.sequence(s).tokens.push_back(int32_t((i * 7919 + s * 104729) % vocab));
  const ExpertResidency* residency = model->experts().residency();
  const ResidencyStats prefill_stats = residency ? residency->stats() : ResidencyStats{};
  const ExpertStoreCounters prefill_store = residency ? residency->store().counters() : ExpertStoreCounters{};
  auto start = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < batch; ++s) {
    const std::vector<float> logits = sequences.run_rows(s, 0, prompt_len, ChunkRows::last).output.logits;
    sequences.sequence(s).tokens.push_back(argmax(logits.data(), vocab));
  }
  const double prefill_seconds = seconds_since(start);
  const nlohmann::json prefill_experts =
      residency ? expert_kpi_json(
                      expert_kpis(residency->stats(), prefill_stats, residency->store().counters(), prefill_store))
                : nlohmann::json();

  // Decode steps at positions prompt_len .. prompt_len + steps - 1; the first pass appends the
  // greedy tokens, later passes feed the same ones (and rewrite the same KV slots). Every step
  // sees its sequence end at its position (a step that samples, as the gate judges them). With
  // the expert cache or the FP4 tier, each pass also reports their KPIs.
  const Fp4Tier* tier = model->experts().fp4_tier();
  const auto pass = [&](bool graphs_on, bool keep_logits) {
    for_each_rank_backend(*model, [&](Backend& b) { b.set_graphs(graphs_on); });
    DecodePass result;
    const ResidencyStats stats_before = residency ? residency->stats() : ResidencyStats{};
    const ExpertStoreCounters store_before = residency ? residency->store().counters() : ExpertStoreCounters{};
    const Fp4TierStats tier_before = tier ? tier->stats() : Fp4TierStats{};
    if (keep_logits) result.logits.reserve(size_t(steps * batch * vocab));
    std::vector<std::vector<int32_t>> known(static_cast<size_t>(batch));
    for (int64_t s = 0; s < batch; ++s) known[size_t(s)] = sequences.sequence(s).tokens;
    for (int64_t i = 0; i < steps; ++i) {
      const int64_t pos = prompt_len + i;
      for (int64_t s = 0; s < batch; ++s) sequences.sequence(s).tokens.resize(size_t(pos + 1));
      // Timed: the step (and sampling, in the first pass); not the copy of its logits kept for
      // the comparison of the passes.
      const auto begin = std::chrono::steady_clock::now();
      const std::vector<float> logits = sequences.decode(pos).output.logits;
      for (int64_t s = 0; s < batch; ++s) {
        const std::vector<int32_t>& fed = known[size_t(s)];
        const bool greedy = int64_t(fed.size()) <= pos + 1;  // the first pass: a token not yet known
        const int32_t next = greedy ? argmax(logits.data() + s * vocab, vocab) : fed[size_t(pos + 1)];
        sequences.sequence(s).tokens.push_back(next);
      }
      result.seconds += seconds_since(begin);
      if (keep_logits) result.logits.insert(result.logits.end(), logits.begin(), logits.end());
    }
    if (residency)
      result.experts = expert_kpi_json(expert_kpis(residency->stats(), stats_before, residency->store().counters(),
                                                   store_before));
    if (tier) {
      Fp4Kpis k = fp4_kpis(tier->stats(), tier_before);
      k.tau = tier->gate().tau();
      result.fp4 = fp4_kpi_json(k);
    }
    return result;
  };

  nlohmann::json report = {
      {"model", flags.model_dir.empty() ? flags.config_file : flags.model_dir},
      {"family", mc.family},
      {"layers", mc.num_hidden_layers},
      {"backend", backend->name()},
      {"expert_format", flags.experts.experts},
      {"kv_cache_dtype", kv_dtype_name(model->kv_layer_specs().front().dtype)},
      {"kv_bytes_per_token", kv_bytes_per_token(model->kv_layer_specs())},
      {"weights_gb", double(stats.bytes) / 1e9},
      {"load_seconds", load_seconds},  // reading (or inventing) and uploading the weights
      {"batch", batch},
      {"tensor_parallel_size", parallel.tensor_parallel_size},
      {"expert_parallel", parallel.enable_expert_parallel},
      {"bytes_per_decode_step", bytes_per_step},
      {"bytes_per_decode_token", bytes_per_step / double(batch)},
      {"prefill_tokens_per_s", double(batch * prompt_len) / prefill_seconds},
      {"decode_steps", steps},
      {"copy_gb_per_s", copy_gbs},
      {"cuda_graphs", graphs ? "on" : "off"},
  };
  if (!flags.config_file.empty()) report["dummy_routing"] = flags.dummy_routing;
  if (!prefill_experts.is_null()) {
    report["experts_prefill"] = prefill_experts;
    report["upload_gb_per_s"] = ops.upload_bandwidth(size_t(1) << 30);  // the fetches' ceiling
  }
  double steps_per_s = 0.0, eager_steps_per_s = 0.0;
  if (graphs) {
    const DecodePass first = pass(true, true);  // captures every (batch, context bucket) graph
    const DecodePass timed = pass(true, true);
    const DecodePass eager = pass(false, true);
    if (!timed.experts.is_null()) report["experts"] = timed.experts;
    if (!first.experts.is_null()) report["experts_first_graph_pass"] = first.experts;
    if (!timed.fp4.is_null()) report["fp4"] = timed.fp4;
    steps_per_s = double(steps) / timed.seconds;
    eager_steps_per_s = double(steps) / eager.seconds;
    const auto same = [](const DecodePass& a, const DecodePass& b) {
      return a.logits.size() == b.logits.size() &&
             std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) == 0;
    };
    const GraphStats gs = backend->graph_stats();
    report["decode_tokens_per_s_first_graph_pass"] = double(batch * steps) / first.seconds;
    report["decode_tokens_per_s_graphs_off"] = double(batch) * eager_steps_per_s;
    report["decode_gb_per_s_graphs_off"] = bytes_per_step * eager_steps_per_s / 1e9;
    report["decode_fraction_of_copy_graphs_off"] = bytes_per_step * eager_steps_per_s / 1e9 / copy_gbs;
    report["graph_speedup"] = steps_per_s / eager_steps_per_s;
    report["graph_logits_identical"] = same(first, timed) && same(timed, eager);
    report["graph_captures"] = gs.captures;
    report["graph_replays"] = gs.replays;
    report["graph_failures"] = gs.failures;
  } else {
    const DecodePass timed = pass(false, false);
    if (!timed.experts.is_null()) report["experts"] = timed.experts;
    if (!timed.fp4.is_null()) report["fp4"] = timed.fp4;
    steps_per_s = double(steps) / timed.seconds;
  }
  const double achieved_gbs = bytes_per_step * steps_per_s / 1e9;
  report["decode_tokens_per_s"] = double(batch) * steps_per_s;
  report["decode_gb_per_s"] = achieved_gbs;
  report["decode_fraction_of_copy"] = achieved_gbs / copy_gbs;
  if (speculative.enabled())
    report["speculative"] = bench_speculative(sequences, speculative, prompt_len, steps, 1.0 / steps_per_s);

  if (profile) {
    const bool cuda = flags.device.device == "cuda";
    ops.take_profile();  // drop what earlier steps gathered (--cuda-profile profiles from the start)
    ops.set_profiling(true);
    pass(false, false);
    ops.set_profiling(false);
    nlohmann::json p = profile_report(ops, "decode", steps, cuda);
    p["decode_step_us"] = 1e6 / steps_per_s;
    if (graphs) p["decode_step_us_graphs_off"] = 1e6 / eager_steps_per_s;
    std::fprintf(stderr, "decode step as timed (1 / steps/s): %.2f us\n", p["decode_step_us"].get<double>());
    report["profile"] = p;
    // Sequence 0's prompt prefilled again (it rewrites the same KV slots with the same values).
    ops.set_profiling(true);
    const auto prefill_start = std::chrono::steady_clock::now();
    sequences.run_rows(0, 0, prompt_len, ChunkRows::last);
    const double prefill_profiled_seconds = seconds_since(prefill_start);
    ops.set_profiling(false);
    nlohmann::json pp = profile_report(ops, fmt::format("prefill of {} tokens", prompt_len), 1, cuda);
    pp["prefill_us_profiled"] = prefill_profiled_seconds * 1e6;
    report["prefill_profile"] = pp;
  }
  std::printf("%s\n", report.dump(2).c_str());
  if (!flags.json_out.empty()) {
    FILE* out = std::fopen(flags.json_out.c_str(), "w");
    MOET_CHECK(out != nullptr, "{}: cannot write", flags.json_out);
    std::fprintf(out, "%s\n", report.dump(2).c_str());
    std::fclose(out);
  }
}

}  // namespace

void register_bench(CLI::App& app, Actions& actions) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* sub = app.add_subcommand("bench", "measure decode speed against the device's copy bandwidth");
  sub->add_option("--model", flags->model_dir, "model folder to benchmark");
  sub->add_option("--config", flags->config_file, "config.json to build with random weights (no files needed)");
  sub->add_option("--layers", flags->layers, "with --config: keep only this many layers (0 = all)")
      ->check(CLI::NonNegativeNumber);
  flags->device.add_to(*sub);
  flags->experts.add_to(*sub);
  flags->speculative.add_to(*sub);
  flags->kv_cache.add_to(*sub);
  flags->parallel.add_to(*sub);
  sub->add_option("--prompt-tokens", flags->prompt_tokens, "prompt length before decoding")->check(CLI::PositiveNumber);
  sub->add_option("--decode-tokens", flags->decode_tokens, "decode steps to time")->check(CLI::PositiveNumber);
  sub->add_option("--batch", flags->batch,
                  "sequences decoded together, one token each per step (tokens/s counts all of them; 1 to 1024)")
      ->check(CLI::Range(int64_t(1), int64_t(1024)));
  sub->add_option("--dummy-routing", flags->dummy_routing,
                  "with --config: uniform (random routers: near-uniform expert use, a cache's worst case) or zipf:S "
                  "(a fixed per-layer bias on the router logits so expert popularity follows Zipf(S), e.g. zipf:1.0); "
                  "named in the report");
  sub->add_option("--copy-gib", flags->copy_gib, "buffer size of the copy-bandwidth measurement in GiB")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--profile", flags->profile,
                "also run the decode steps once more with the backend's per-op profile on (cuda: GPU time of "
                "each op from CUDA events; cpu: wall time) and print a table of op, calls and microseconds per "
                "token and share of the step (also --cuda-profile / MOET_CUDA_PROFILE=1)");
  sub->add_option("--json-out", flags->json_out, "also write the report to this file");
  actions[sub] = [flags] { run(*flags); };
}

}  // namespace moet::cli
