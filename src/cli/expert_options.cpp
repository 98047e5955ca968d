// Expert storage and residency flags (see expert_options.h).
#include "cli/expert_options.h"

#include "core/error.h"

namespace moet::cli {

uint64_t gib_or_auto(const std::string& flag, const std::string& value) {
  if (value == "auto") return 0;
  double gib = -1.0;
  try {
    size_t used = 0;
    gib = std::stod(value, &used);
    if (used != value.size()) gib = -1.0;
  } catch (const std::exception&) {
  }
  MOET_CHECK(gib >= 0.0, "{}: '{}' is neither a size in GiB nor auto", flag, value);
  return uint64_t(gib * double(uint64_t(1) << 30));
}

void ExpertOptions::add_to(CLI::App& sub) {
  sub.add_option("--experts", experts,
                 "how routed experts are stored: w2 (2-bit sign-symmetric, default), w2k (2-bit E8 lattice "
                 "codebook with fine scales, 2.25 bits a weight: lower error than w2 at the same size), fp4 "
                 "(MXFP4) or native (the checkpoint's values; FP8/FP4 sources decoded to F32)")
      ->envname("MOET_EXPERTS")
      ->check(CLI::IsMember({"native", "w2", "w2k", "fp4"}));
  quantizer.add_to(sub);
  sub.add_option("--zero-mode", zero_mode,
                 "W2 sign of exact zeros: auto (alt for tensors whose zeros are one-signed), sign "
                 "(keep the sign bit) or alt (alternate by column parity)")
      ->check(CLI::IsMember({"auto", "sign", "alt"}));
  sub.add_option("--pack-dir", pack_dir,
                 "keep quantized experts in pack files here: built on the first start, reused on "
                 "later ones (rebuilt when stale)")
      ->envname("MOET_PACK_DIR");
  sub.add_option("--expert-cache-gb", cache_gb,
                 "hold only this many GiB of routed experts on the device, the rest in a host store "
                 "(--expert-store), fetched on a miss and the step run again, bit-identical to holding all; "
                 "auto = what the memory budget leaves after weights, KV cache and 4 GiB for activations; "
                 "0 = every expert resident (default)")
      ->envname("MOET_EXPERT_CACHE_GB");
  sub.add_option("--expert-cache-slots", cache_slots,
                 "the expert cache as a number of experts instead of GiB (tests); 0 = use --expert-cache-gb")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--expert-store", store,
                 "where experts outside the cache live: ram (all rows in pinned host memory; the default), "
                 "pack (read from the pack file in --pack-dir on every miss), arena (the pack behind a "
                 "pinned cache of --expert-ram-gb)")
      ->check(CLI::IsMember({"ram", "pack", "arena"}));
  sub.add_option("--store-threads", store_threads, "pack / arena stores: threads reading the pack file")
      ->check(CLI::Range(1, 256));
  sub.add_flag("--pack-direct-io", direct_io,
               "pack / arena stores: read the pack with O_DIRECT (bypasses the page cache: a hard host-memory "
               "budget)");
  sub.add_option("--expert-ram-gb", ram_gb,
                 "arena store: GiB of pinned host memory caching pack rows (auto = 25% of the pack)");
  sub.add_flag("--no-preheat", no_preheat,
               "arena store: do not read the hot set the last run saved (<pack>.heat.json) into the arena at boot");
  sub.add_option("--miss-tolerance", miss_tolerance,
                 "run a step again only when more than this many (layer, expert) pairs were missing (0 = always; "
                 "above 0 the output may differ from holding every expert)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--max-replays", max_replays,
                 "runs of a step after the first at most while experts are missing; then the misses are "
                 "accepted (logged once)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--expert-eviction", eviction,
                 "which cached expert a fetch replaces: lru (least recently used) or frequency (least used, "
                 "counts decayed every step)")
      ->check(CLI::IsMember({"lru", "frequency"}));
  sub.add_option("--kpi-every", kpi_every, "steps between expert-cache and FP4-tier KPI log lines (0 = none)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--expert-tiering", tiering,
                 "inclusive (default): the host store holds every expert, the cache copies of some; exclusive: an "
                 "expert is in the cache or in the host store, never both (capacity = cache + host RAM; a fetch "
                 "copies the evicted expert back; --expert-store ram or arena, the cache sized in GiB or slots)")
      ->check(CLI::IsMember({"inclusive", "exclusive"}));
  sub.add_option("--cpu-experts", cpu_experts,
                 "routed experts not in the cache: off (fetched, the step run again; default), on (computed on the "
                 "host from their host rows, the hottest moved into the cache after the step; without a cache every "
                 "routed expert runs on the host), auto (per miss: fetch, host, or skip within --miss-tolerance, "
                 "from costs measured at startup)")
      ->check(CLI::IsMember({"off", "on", "auto"}));
  sub.add_option("--cpu-expert-threads", cpu_expert_threads,
                 "--cpu-experts on|auto: host threads computing experts (0 = one per hardware thread)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--expert-promote-per-step", promote_per_step,
                 "--cpu-experts on|auto: host-computed experts moved into the cache after a step at most (the hottest, "
                 "replacing colder ones; 0 = the cache keeps what it has)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--expert-prefetch", prefetch,
                 "off (default) or next-layer: decode steps run layer by layer and each MoE layer's input is routed "
                 "through the next MoE layer's router to load the experts it predicts before that layer runs")
      ->check(CLI::IsMember({"off", "next-layer"}));
  fp4.add_to(sub);
}

ModelLoadOptions ExpertOptions::resolve(int64_t max_step_rows) const {
  ModelLoadOptions options;
  options.experts = expert_mode_parse(experts);
  options.zero_mode = zero_mode_parse(zero_mode);
  const QuantizerChoice q = quantizer.resolve(experts);
  options.w2_quantizer = q.w2;
  options.imatrix = q.imatrix;
  options.w2k_quantizer = q.w2k;
  options.ldlq_moments = q.ldlq_moments;
  options.pack_dir = pack_dir;
  const uint64_t cache_bytes = gib_or_auto("--expert-cache-gb", cache_gb);
  const bool cache_on = cache_slots > 0 || cache_gb == "auto" || cache_bytes > 0;
  const bool store_flags = store != "ram" || direct_io || ram_gb != "auto" || no_preheat;
  // --cpu-experts on without a cache: no slots, every routed expert on the host.
  const bool host_only = !cache_on && cpu_experts == "on";
  MOET_CHECK(cache_on || host_only || !store_flags, "--expert-store and its flags need the expert cache "
                                                    "(--expert-cache-gb or --expert-cache-slots)");
  MOET_CHECK(cache_on || host_only || cpu_experts == "off",
             "--cpu-experts auto chooses between the expert cache and the host: give --expert-cache-gb or "
             "--expert-cache-slots (or --cpu-experts on to compute every routed expert on the host)");
  MOET_CHECK(cache_on || tiering == "inclusive",
             "--expert-tiering exclusive needs the expert cache (--expert-cache-gb GiB or --expert-cache-slots N)");
  MOET_CHECK(cache_on || prefetch == "off", "--expert-prefetch next-layer loads into the expert cache: give "
                                            "--expert-cache-gb or --expert-cache-slots");
  MOET_CHECK(cpu_experts != "off" || (cpu_expert_threads == 0 && promote_per_step == 4),
             "--cpu-expert-threads and --expert-promote-per-step are for --cpu-experts on or auto");
  fp4.resolve(options, max_step_rows, cache_slots == 0 && cache_gb == "auto", kpi_every);
  if (!cache_on && !host_only) return options;
  MOET_CHECK(options.experts != ExpertMode::native, "the expert cache holds W2 or FP4 experts: not with --experts native");
  MOET_CHECK(store == "ram" || !pack_dir.empty(), "--expert-store {} reads the pack file: give --pack-dir", store);
  MOET_CHECK(store == "arena" || (ram_gb == "auto" && !no_preheat), "--expert-ram-gb and --no-preheat are for "
                                                                   "--expert-store arena");
  TieringConfig t;
  t.residency.slots = cache_slots;
  t.residency.cache_bytes = cache_slots > 0 ? 0 : cache_bytes;
  t.residency.miss_tolerance = miss_tolerance;
  t.residency.max_replays = max_replays;
  t.residency.policy = victim_policy_parse(eviction);
  t.residency.max_step_rows = max_step_rows;
  t.residency.kpi_every = kpi_every;
  t.store.kind = expert_store_parse(store);
  t.store.threads = store_threads;
  t.store.direct_io = direct_io;
  t.store.arena_bytes = gib_or_auto("--expert-ram-gb", ram_gb);
  t.store.preheat = !no_preheat;
  t.residency.tiering = expert_tiering_parse(tiering);
  t.residency.cpu_experts = cpu_experts_parse(cpu_experts);
  t.residency.host_only = host_only;
  t.residency.cpu_threads = cpu_expert_threads;
  t.residency.promote_per_step = promote_per_step;
  t.residency.prefetch = expert_prefetch_parse(prefetch);
  MOET_CHECK(t.residency.tiering == ExpertTiering::inclusive || (cache_gb != "auto" || cache_slots > 0),
             "--expert-tiering exclusive sizes the host store by the cache: give --expert-cache-gb GiB or "
             "--expert-cache-slots N, not auto");
  MOET_CHECK(t.residency.tiering == ExpertTiering::inclusive || store != "pack",
             "--expert-tiering exclusive with --expert-store pack: the pack store keeps no row in RAM, so there is "
             "nothing to make exclusive (use ram or arena)");
  options.tiering = t;
  return options;
}

}  // namespace moet::cli
