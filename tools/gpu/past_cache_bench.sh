#!/usr/bin/env bash
# On the GPU machine: past the expert cache (docs/experts.md, issue 32), from the binaries
# tools/gpu/pack.sh put into .gpu-pack/carry.tar.xz. Each mode is one device call (each run is
# killed after MOET_PC_LIMIT seconds, default 280; JSON and logs per run into RESULTS_DIR, a summary
# table into RESULTS_DIR/summary.txt):
#   tests     the CUDA suites of this work (tests/cpp/cuda/cuda_host_experts_test.cpp: host experts
#             against the CPU within FP32 rounding, exclusive tiering and prefetch memcmp-equal to
#             resident, the W2 untile and slot exchange) plus the suites they touch (MoE kernels,
#             expert cache, FP4 tier), and bench/experts_host_bench (host expert GB/s against host
#             memcpy on this 16-core host), bench/cuda_host_experts_bench (slot exchange against load and
#             the pinned upload ceiling; one DeepSeek-V3-shaped MoE layer resident, through the mailbox
#             with nothing on the host, with a quarter of its experts on the host). Runs with the
#             CUDA gate (cli/model_options.cpp) in place.
#   qwen      (after the gate is lifted) invented weights, batch 1:
#             - Qwen3-235B-A22B (94 layers) under --gpu-memory-limit 24 (a 24 GB card), zipf:1.0
#               routing: the inclusive cache of issue 27 (auto size), then with that many slots
#               exclusive fetch-only (--cpu-experts off), exclusive host-only (--cpu-experts on
#               --expert-promote-per-step 0), exclusive auto;
#             - Qwen3-30B-A3B (48 layers) with every routed expert on the host (no cache,
#               --cpu-experts on), as `llama.cpp -ot exps=CPU` runs it;
#             - prefetch: the study model ($STUDY_MODEL, else models/tiny) generating from real text
#               with the cache at 25% of its experts, without and with --expert-prefetch next-layer:
#               prediction hit rate and decode tokens/s.
#   deepseek  (after the gate is lifted; an H200: the cache below needs ~130 GiB of GPU memory)
#             DeepSeek-V3 at full depth (61 layers, 58 MoE layers x 256 W2 experts of 12.39 MB =
#             183.9 GB), invented weights, batch 1, uniform then zipf:1.0 routing, exclusive
#             tiering, ram store, --cpu-experts auto, the cache at DSV3_CACHE_GB (default 96 GiB =
#             8322 experts, 103.1 GB). What fits: inclusive tiering would pin every row on the host
#             (183.9 GB > the 128 GB of host RAM), so only exclusive does; the host then pins
#             (14848 - 8322 + 64 spare) x 12.39 MB = 81.7 GB, leaving ~46 GB to the OS and the
#             process; the GPU holds the cache (96 GiB), the dense weights (17.1 B parameters:
#             attention, shared experts, the 3 dense layers, embeddings; the startup log gives
#             their size), the KV cache and 4 GiB of activations within its 139 GiB. Booting fills
#             183.9 GB of invented rows (the ram store's fill measured 1.2 GB/s on Qwen3-235B:
#             about 150 s), so the two runs take most of a 10-minute call; the uniform one first.
# Usage: bash tools/gpu/past_cache_bench.sh RESULTS_DIR tests|qwen|deepseek
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: past_cache_bench.sh RESULTS_DIR tests|qwen|deepseek}
MODE=${2:?usage: past_cache_bench.sh RESULTS_DIR tests|qwen|deepseek}
LIMIT=${MOET_PC_LIMIT:-280}
DSV3_CACHE_GB=${DSV3_CACHE_GB:-96}
mkdir -p "$OUT_DIR"
source tools/gpu/carry_env.sh
export MOET_LOG_LEVEL=${MOET_LOG_LEVEL:-info}
bench() {  # bench NAME CONFIG LAYERS FLAGS...
  local name=$1 config=$2 layers=$3; shift 3
  step "$name" "$CARRY/moet" bench --device cuda --config "bench/configs/$config.config.json" --layers "$layers" \
    --batch 1 --decode-tokens 64 --json-out "$OUT_DIR/$name.json" "$@"
}
summary() {
  python3 - "$OUT_DIR" <<'PY' | tee "$OUT_DIR/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("run | decode tok/s | coverage | hit rate | replayed | host pairs | host routings | fetch/host/skip | "
      "written back | promoted | prediction hit rate | costs (fetch, replay, host fixed + row, ms)")
for p in sorted(out.glob("*.json")):
    r = json.loads(p.read_text())
    e = r.get("experts", {})
    c = e.get("costs", {})
    tps = r.get("decode_tokens_per_s", r.get("tokens_per_s", 0.0))
    print(f"{p.stem} | {tps:.2f} | {e.get('coverage', 0):.3f} | {e.get('hit_rate', 0):.3f} | "
          f"{e.get('replayed_steps', 0)}/{e.get('steps', 0)} | {e.get('host_pairs', 0)} | "
          f"{e.get('host_item_fraction', 0):.3f} | {e.get('chose_fetch', 0)}/{e.get('chose_host', 0)}/"
          f"{e.get('chose_skip', 0)} | {e.get('written_back_rows', 0)} | {e.get('promoted_rows', 0)} | "
          f"{e.get('prefetch_hit_rate', -1):.3f} | {c.get('fetch_ms', 0):.3f}, {c.get('replay_ms', 0):.3f}, "
          f"{c.get('host_fixed_ms', 0):.3f} + {c.get('host_row_ms', 0):.3f}")
PY
}
case "$MODE" in
  tests)
    filter='CudaHostExperts*:*CudaPastTheCache*:CudaW2Untile*:CudaExpertSlots*'
    filter+=':Formats/CudaQuantMoe*:Stores/CudaResidency*:CudaResidencyGr*:CudaFp4Tier*'
    step cuda_tests "$CARRY/moet_cuda_tests" --gtest_filter="$filter"
    step host_bench "$CARRY/experts_host_bench"
    step cuda_host_experts_bench "$CARRY/cuda_host_experts_bench" "$OUT_DIR/cuda_host_experts_bench.json"
    ;;
  qwen)
    bench q235_inclusive Qwen3-235B-A22B 94 --gpu-memory-limit 24 --dummy-routing zipf:1.0 --expert-cache-gb auto
    slots=$(sed -n 's/.*expert cache: \([0-9]*\) of .*/\1/p' "$OUT_DIR/q235_inclusive.log" | head -1)
    if [ -z "$slots" ]; then
      echo "no cache size in q235_inclusive.log: skipping the exclusive runs" | tee -a "$OUT_DIR/steps.txt"
    else
      for mode in "fetch --cpu-experts off" "host --cpu-experts on --expert-promote-per-step 0" \
                  "auto --cpu-experts auto"; do
        # shellcheck disable=SC2086  # the mode's flags
        bench "q235_exclusive_${mode%% *}" Qwen3-235B-A22B 94 --gpu-memory-limit 24 --dummy-routing zipf:1.0 \
          --expert-tiering exclusive --expert-cache-slots "$slots" ${mode#* }
      done
    fi
    bench q30_all_host Qwen3-30B-A3B 48 --cpu-experts on
    study=${STUDY_MODEL:-models/tiny}
    experts=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]+'/config.json')); \
moe=sum(1 for l in range(c['num_hidden_layers']) if l >= c.get('first_k_dense_replace', 0)); \
print(max(moe * c['num_experts_per_tok'], moe * c['n_routed_experts'] // 4))" "$study")
    for prefetch in off next-layer; do
      step "prefetch_$prefetch" "$CARRY/moet" generate --device cuda --model "$study" \
        --prompt "$(cat tests/fixtures/score_text.txt)" --max-tokens 256 --json \
        --expert-cache-slots "$experts" --expert-prefetch "$prefetch"
      grep '^{' "$OUT_DIR/prefetch_$prefetch.log" | tail -1 > "$OUT_DIR/prefetch_$prefetch.json"
    done
    summary
    ;;
  deepseek)
    for routing in uniform zipf:1.0; do
      bench "dsv3_exclusive_auto_$(echo "$routing" | tr ':.' '__')" DeepSeek-V3 61 --dummy-routing "$routing" \
        --expert-tiering exclusive --expert-store ram --expert-cache-gb "$DSV3_CACHE_GB" --cpu-experts auto
    done
    summary
    ;;
  *) echo "unknown mode $MODE (tests|qwen|deepseek)"; exit 2 ;;
esac
