#!/usr/bin/env bash
# On the GPU machine: the expert cache's decode benchmarks (docs/experts.md), after
# tools/gpu/pack.sh. For a model MODEL (config:layers, default Qwen3-235B-A22B:94) it runs
# `moet bench` with every expert resident, then with the cache at each of SLOTS (expert counts,
# space-separated) for each routing of ROUTINGS (default "uniform zipf:1.0"), each with EXTRA
# (more bench flags, e.g. "--gpu-memory-limit 32 --expert-store arena --pack-dir /tmp/p"; with
# SLOTS=0 the cache is sized by an --expert-cache-gb in EXTRA), RESIDENT=0 skips the resident runs
# (a card too small for them), each run killed after MOET_RB_LIMIT seconds (default 150), and the pinned host-to-device ceiling once
# (`moet bench` prints it as upload_gb_per_s). JSON and logs per run into RESULTS_DIR, the summary
# table (tokens/s against resident, replayed steps, missing pairs per step, hit rate, fetch GB/s
# against the ceiling) into RESULTS_DIR/summary.txt (also printed).
# Usage: bash tools/gpu/residency_bench.sh RESULTS_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: residency_bench.sh RESULTS_DIR}
MODEL=${MODEL:-Qwen3-235B-A22B:94}
SLOTS=${SLOTS:-3008}
ROUTINGS=${ROUTINGS:-uniform zipf:1.0}
EXTRA=${EXTRA:-}
RESIDENT=${RESIDENT:-1}
LIMIT=${MOET_RB_LIMIT:-150}
mkdir -p "$OUT_DIR"
source tools/gpu/carry_env.sh
export MOET_LOG_LEVEL=${MOET_LOG_LEVEL:-info}
config=${MODEL%%:*} layers=${MODEL##*:}
run() {  # run NAME FLAGS...
  local name=$1; shift
  local start=$SECONDS
  # shellcheck disable=SC2086  # EXTRA is a list of flags
  timeout -k 10 "$LIMIT" "$CARRY/moet" bench --device cuda --config "bench/configs/$config.config.json" --layers "$layers" \
    --json-out "$OUT_DIR/$name.json" "$@" > "$OUT_DIR/$name.log" 2>&1
  echo "$name: exit $? ($((SECONDS - start)) s)" | tee -a "$OUT_DIR/steps.txt"
}
for routing in $ROUTINGS; do
  tag=$(echo "$routing" | tr ':.' '__')
  [ "$RESIDENT" = 0 ] || run "resident_$tag" --dummy-routing "$routing"
  for slots in $SLOTS; do
    # shellcheck disable=SC2086
    run "cache${slots}_$tag" --dummy-routing "$routing" --expert-cache-slots "$slots" $EXTRA
  done
done
python3 - "$OUT_DIR" <<'PY' | tee "$OUT_DIR/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
print("run | decode tok/s | vs resident | replayed steps | missing pairs/step | hit rate | coverage | fetch GB/s | of pinned H2D")
for name, r in runs.items():
    tag = name.split("_", 1)[1]
    base = runs.get(f"resident_{tag}", {}).get("decode_tokens_per_s")
    e = r.get("experts", {})
    tps = r.get("decode_tokens_per_s", 0.0)
    up = r.get("upload_gb_per_s", 0.0)
    fetch = e.get("fetch_gb_per_s", 0.0)
    steps = max(1, e.get("steps", 0))
    print(f"{name} | {tps:.2f} | {tps / base if base else 0:.3f} | {e.get('replayed_steps', 0)}/{e.get('steps', 0)} | "
          f"{e.get('missing_pairs', 0) / steps:.1f} | {e.get('hit_rate', 0):.3f} | {e.get('coverage', 0):.3f} | "
          f"{fetch:.1f} | {fetch / up if up else 0:.2f}")
PY
