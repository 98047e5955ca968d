#!/usr/bin/env bash
# On the GPU machine, after tools/gpu/pack.sh and a study model export (tools/train/train.py, e.g.
# by tools/train/study_on_device.sh): the expert cache on real text and real routing (issue 27;
# docs/experts.md), with the cache at 25% of the study model's routed experts, CUDA graphs on.
#   1. bit-identity: `moet score --decode-steps --logits-out` over the first TOKENS tokens of TEXT
#      (one decode step per position) and `moet score` in prefill chunks of 256 rows, every expert
#      resident, then with the cache and each store (ram; pack and arena over a pack built in
#      PACK_DIR on the first of them): each file is compared byte for byte (cmp) with the resident
#      one;
#   2. generation from the prompts of tests/fixtures/quality_prompts.txt (MAX_TOKENS each, greedy),
#      resident, then cached without and with --expert-prefetch next-layer: decode tokens/s, token
#      hit rate, replayed steps, missing pairs (summed over the prompts, each a fresh
#      request), prediction hit rate (mean over the prompts).
# Logs, logits hashes and JSON into RESULTS_DIR, the table into RESULTS_DIR/summary.txt.
# Usage: bash tools/gpu/study_tiered.sh RESULTS_DIR MODEL_DIR TEXT_FILE
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: study_tiered.sh RESULTS_DIR MODEL_DIR TEXT_FILE}
MODEL=${2:?usage: study_tiered.sh RESULTS_DIR MODEL_DIR TEXT_FILE}
TEXT=${3:?usage: study_tiered.sh RESULTS_DIR MODEL_DIR TEXT_FILE}
TOKENS=${TOKENS:-512}
MAX_TOKENS=${MAX_TOKENS:-128}
PACK_DIR=${PACK_DIR:-/tmp/study_pack}
LIMIT=${MOET_ST_LIMIT:-120}
mkdir -p "$OUT_DIR"
source tools/gpu/carry_env.sh
export MOET_LOG_LEVEL=${MOET_LOG_LEVEL:-info}
slots=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]+'/config.json')); \
moe=sum(1 for l in range(c['num_hidden_layers']) if l >= c.get('first_k_dense_replace', 0)); \
print(moe * c['n_routed_experts'] // 4)" "$MODEL")
echo "cache: $slots experts (25%)" | tee -a "$OUT_DIR/steps.txt"
on=(--device "${DEVICE:-cuda}" --model "$MODEL")
score_pair() {  # score_pair NAME FLAGS...: decode-step and prefill logits of TEXT
  local name=$1; shift
  step "score_decode_$name" "$CARRY/moet" score "${on[@]}" --text-file "$TEXT" --max-tokens "$TOKENS" --decode-steps \
    --logits-out "$OUT_DIR/decode_$name.f32" "$@"
  step "score_prefill_$name" "$CARRY/moet" score "${on[@]}" --text-file "$TEXT" --max-tokens "$TOKENS" --max-num-batched-tokens 256 \
    --logits-out "$OUT_DIR/prefill_$name.f32" "$@"
}
score_pair resident
rm -rf "$PACK_DIR"
score_pair ram --expert-cache-slots "$slots"
score_pair pack --expert-cache-slots "$slots" --expert-store pack --pack-dir "$PACK_DIR"
score_pair arena --expert-cache-slots "$slots" --expert-store arena --pack-dir "$PACK_DIR" --expert-ram-gb 0.05
score_pair arena_reboot --expert-cache-slots "$slots" --expert-store arena --pack-dir "$PACK_DIR" --expert-ram-gb 0.05
for kind in decode prefill; do
  for store in ram pack arena arena_reboot; do
    if cmp -s "$OUT_DIR/${kind}_resident.f32" "$OUT_DIR/${kind}_$store.f32"; then same=identical; else same=DIFFERENT; fi
    echo "logits $kind $store vs resident: $same ($(stat -c %s "$OUT_DIR/${kind}_$store.f32" 2>/dev/null) bytes)" \
      | tee -a "$OUT_DIR/steps.txt"
  done
done
sha256sum "$OUT_DIR"/*.f32 > "$OUT_DIR/logits.sha256" && rm -f "$OUT_DIR"/*.f32
generate() {  # generate NAME FLAGS...
  local name=$1; shift
  step "generate_$name" "$CARRY/moet" generate "${on[@]}" --prompts-file tests/fixtures/quality_prompts.txt --max-tokens "$MAX_TOKENS" \
    --json "$@"
  grep '^{' "$OUT_DIR/generate_$name.log" > "$OUT_DIR/generate_$name.jsonl"
}
generate resident
generate cache --expert-cache-slots "$slots"
generate cache_prefetch --expert-cache-slots "$slots" --expert-prefetch next-layer
python3 - "$OUT_DIR" <<'PY' | tee "$OUT_DIR/summary.txt"
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
print("run | prompts | mean decode tok/s | vs resident | same output | hit rate | replayed steps | "
      "missing pairs/step | prediction hit rate")
runs = {}
for p in sorted(out.glob("generate_*.jsonl")):
    rows = [json.loads(l) for l in p.read_text().splitlines() if l.strip()]
    runs[p.stem.split("_", 1)[1]] = rows
base = runs.get("resident", [])
base_tps = statistics.mean(r["decode_tokens_per_s"] for r in base) if base else 0.0
for name, rows in runs.items():
    if not rows:
        print(f"{name} | 0"); continue
    tps = statistics.mean(r["decode_tokens_per_s"] for r in rows)
    same = sum(a["output_ids"] == b["output_ids"] for a, b in zip(rows, base))
    e = [r.get("experts", {}) for r in rows]  # per prompt
    total = lambda key: sum(x.get(key, 0) for x in e)
    steps = max(1, total("steps"))
    hit = sum(x.get("hit_rate", 0) * x.get("steps", 0) for x in e) / steps
    predicted = [x["prefetch_hit_rate"] for x in e if x.get("prefetch_hit_rate", -1) >= 0]
    print(f"{name} | {len(rows)} | {tps:.1f} | {tps / base_tps if base_tps else 0:.3f} | {same}/{len(base)} | "
          f"{hit:.3f} | {total('replayed_steps')}/{total('steps')} | {total('missing_pairs') / steps:.2f} | "
          f"{statistics.mean(predicted) if predicted else -1:.3f}")
PY
