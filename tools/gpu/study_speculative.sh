#!/usr/bin/env bash
# On the GPU machine, after tools/gpu/pack.sh and a study model export (tools/train/train.py, e.g.
# by tools/train/study_on_device.sh): MTP speculative decoding on real text (issue 30;
# docs/speculative.md). Greedy generation from the prompts of tests/fixtures/quality_prompts.txt
# (MAX_TOKENS each) without drafts, then with the model's MTP layer drafting k = 1, 2, 3 tokens:
# decode tokens/s against no speculation, acceptance length, per-position acceptance and whether
# every prompt's output equals the run without drafts. Extra flags for every run in EXTRA (e.g.
# --cuda-graphs off). Logs and JSON lines into RESULTS_DIR, the table
# into RESULTS_DIR/summary.txt.
# Usage: bash tools/gpu/study_speculative.sh RESULTS_DIR MODEL_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: study_speculative.sh RESULTS_DIR MODEL_DIR}
MODEL=${2:?usage: study_speculative.sh RESULTS_DIR MODEL_DIR}
MAX_TOKENS=${MAX_TOKENS:-128}
EXTRA=${EXTRA:-}
LIMIT=${MOET_SS_LIMIT:-120}
mkdir -p "$OUT_DIR"
source tools/gpu/carry_env.sh
export MOET_LOG_LEVEL=${MOET_LOG_LEVEL:-info}
for k in 0 1 2 3; do
  spec=()
  [ "$k" = 0 ] || spec=(--speculative-config "{\"method\":\"mtp\",\"num_speculative_tokens\":$k}")
  # shellcheck disable=SC2086  # EXTRA is a list of flags
  step "mtp_k$k" "$CARRY/moet" generate --device "${DEVICE:-cuda}" --model "$MODEL" \
    --prompts-file tests/fixtures/quality_prompts.txt --max-tokens "$MAX_TOKENS" --json "${spec[@]}" $EXTRA
  grep '^{' "$OUT_DIR/mtp_k$k.log" > "$OUT_DIR/mtp_k$k.jsonl"
done
python3 - "$OUT_DIR" <<'PY' | tee "$OUT_DIR/summary.txt"
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
load = lambda k: [json.loads(l) for l in (out / f"mtp_k{k}.jsonl").read_text().splitlines() if l.strip()]
base = load(0)
base_tps = statistics.mean(r["decode_tokens_per_s"] for r in base) if base else 0.0
print("drafts | prompts | mean decode tok/s | vs none | acceptance length | per-position acceptance | same output")
for k in range(4):
    rows = load(k)
    if not rows:
        print(f"{k} | 0"); continue
    tps = statistics.mean(r["decode_tokens_per_s"] for r in rows)
    same = sum(a["output_ids"] == b["output_ids"] for a, b in zip(rows, base))
    drafted = [sum(r.get("drafted_per_position", [0] * k)[i] for r in rows) for i in range(k)]
    accepted = [sum(r.get("accepted_per_position", [0] * k)[i] for r in rows) for i in range(k)]
    verify = sum(r.get("verify_steps_with_drafts", 0) for r in rows)
    length = 1 + sum(r.get("accepted_tokens", 0) for r in rows) / verify if verify else 0.0
    rates = ", ".join(f"{a / d:.3f}" if d else "-" for a, d in zip(accepted, drafted))
    print(f"{k} | {len(rows)} | {tps:.1f} | {tps / base_tps if base_tps else 0:.3f} | "
          f"{length if k else 1:.3f} | {rates or '-'} | {same}/{len(base)}")
PY
