#!/usr/bin/env bash
# On the GPU machine: the FP4 tier's and the confidence gate's GPU runs (docs/experts.md), from the
# binaries tools/gpu/pack.sh put into .gpu-pack/carry.tar.xz. Three modes:
#   tests  the CUDA suites of the tier and the gate (tests/cpp/cuda/cuda_fp4_tier_test.cpp, the
#          MoE kernels and the expert cache they change) and cuda_ops_bench's logit_confidence
#          cases; runs with the tier's CUDA gate (cli/model_options.cpp) still in place;
#   bench  (after that gate is lifted) `moet bench` of MODEL (config:layers, default
#          Qwen3-235B-A22B:94, invented weights, --dummy-routing zipf:1.0) at BATCHES (default
#          "1 8"): W2 experts resident without a tier, then with an FP4 pool of FP4_SLOTS experts
#          (default 3008, 25% of Qwen3-235B's 12032) with the manager alone and with the gate at
#          each of TAUS (default "0.6 1"); invented experts route without locality and their FP4
#          rows are unrelated to their W2 rows, so these measure cost only;
#   study  (after the gate is lifted) tools/quality/fp4_gate_study.py on $STUDY_MODEL (the study
#          model tools/train/study_on_device.sh exported in the same device command) with
#          --device cuda, the held-out text and prompts of docs/quality.md (/tmp/heldout.txt must
#          hold the text: docs/quality.md says how it is made).
# Each run is killed after MOET_FG_LIMIT seconds (default 200); JSON and logs per run go into
# RESULTS_DIR, a summary table into RESULTS_DIR/summary.txt (bench).
# Usage: bash tools/gpu/fp4_gate_bench.sh RESULTS_DIR tests|bench|study
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: fp4_gate_bench.sh RESULTS_DIR tests|bench|study}
MODE=${2:?usage: fp4_gate_bench.sh RESULTS_DIR tests|bench|study}
MODEL=${MODEL:-Qwen3-235B-A22B:94}
BATCHES=${BATCHES:-1 8}
FP4_SLOTS=${FP4_SLOTS:-3008}
TAUS=${TAUS:-0.6 1}
LIMIT=${MOET_FG_LIMIT:-200}
mkdir -p "$OUT_DIR"
source tools/gpu/carry_env.sh
export MOET_LOG_LEVEL=${MOET_LOG_LEVEL:-info}
case "$MODE" in
  tests)
    step cuda_tests "$CARRY/moet_cuda_tests" \
      --gtest_filter='CudaFp4Tier*:CudaLogitConfidence*:Formats/CudaQuantMoe*:Stores/CudaResidency*:CudaResidencyGr*'
    MOET_OPS_BENCH_ONLY=logit_confidence step ops_bench "$CARRY/cuda_ops_bench" "$OUT_DIR/ops_bench.json"
    ;;
  bench)
    config=${MODEL%%:*} layers=${MODEL##*:}
    bench() {  # bench NAME FLAGS...
      local name=$1; shift
      step "$name" "$CARRY/moet" bench --device cuda --config "bench/configs/$config.config.json" --layers "$layers" \
        --dummy-routing zipf:1.0 --json-out "$OUT_DIR/$name.json" "$@"
    }
    for batch in $BATCHES; do
      bench "w2_b$batch" --batch "$batch"
      bench "pool_b$batch" --batch "$batch" --fp4-pool-slots "$FP4_SLOTS"
      for tau in $TAUS; do
        bench "gate${tau}_b$batch" --batch "$batch" --fp4-pool-slots "$FP4_SLOTS" --gate-tau "$tau"
      done
    done
    python3 - "$OUT_DIR" <<'PY' | tee "$OUT_DIR/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "ops_bench"}
print("run | decode tok/s | vs W2 | coverage | FP4 hit rate | gated steps | gate replays | promotions")
for name, r in runs.items():
    base = runs.get("w2_" + name.rsplit("_", 1)[1], {}).get("decode_tokens_per_s")
    f = r.get("fp4", {})
    tps = r.get("decode_tokens_per_s", 0.0)
    print(f"{name} | {tps:.2f} | {tps / base if base else 0:.3f} | {f.get('coverage', 0):.3f} | "
          f"{f.get('hit_rate', 0):.3f} | {f.get('gated_steps', 0)}/{f.get('judged_steps', 0)} | "
          f"{f.get('gate_replays', 0)} | {f.get('promotions', 0)} + {f.get('forced_promotions', 0)}")
PY
    ;;
  study)
    step study python3 tools/quality/fp4_gate_study.py --model "${STUDY_MODEL:?set STUDY_MODEL}" --device cuda \
      --moet "$CARRY/moet" --text /tmp/heldout.txt --prompts tests/fixtures/quality_prompts.txt --out "$OUT_DIR" \
      --max-tokens 1024 --greedy-tokens 32 --taus 0.3,0.5,0.7,0.9
    ;;
  *) echo "unknown mode $MODE (tests|bench|study)"; exit 2 ;;
esac
