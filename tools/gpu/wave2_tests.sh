#!/usr/bin/env bash
# On the GPU machine, after tools/gpu/pack.sh: wave 2's CUDA test groups, each under its own time
# limit so one hang does not hide the others, then everything else in moet_cuda_tests. One gtest log
# per group and a line per group (exit code, seconds, passed, failed) in RESULTS_DIR/steps.txt.
# The device tool brings back only a few files from $OUT: pack RESULTS_DIR into one archive after.
# Usage: bash tools/gpu/wave2_tests.sh RESULTS_DIR [LIMIT_SECONDS_PER_GROUP]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: wave2_tests.sh RESULTS_DIR [LIMIT]}
LIMIT=${2:-90}
mkdir -p "$OUT_DIR"
source tools/gpu/carry_env.sh
export MOET_LOG_LEVEL=${MOET_LOG_LEVEL:-warn}
cat "$CARRY/commit" > "$OUT_DIR/commit.txt"; nvidia-smi -L > "$OUT_DIR/machine.txt"
groups=(
  "residency=Stores/CudaResidency*:CudaResidencyGraphs.*:CudaExpertSlots.*"
  "past_cache=CudaHostExperts.*:Modes/CudaPastTheCache.*:CudaW2Untile.*"
  "fp4_gate=CudaFp4Tier*:CudaLogitConfidence*:Formats/CudaQuantMoe*"
  "w2k=CudaImatrix.*"
  "sparse=CudaSparseOps.*:*glm_moe*:*deepseek_v4*"
  "kv=CudaKvCache.*"
  "speculative=CudaSpeculative*"
)
seen=""
for g in "${groups[@]}"; do
  name=${g%%=*} filter=${g#*=}
  step "$name" "$CARRY/moet_cuda_tests" --gtest_filter="$filter"
  seen="$seen:$filter"
  echo "  $name: $(grep -cE '^\[       OK' "$OUT_DIR/$name.log") ok, $(grep -cE '^\[  FAILED  \]' "$OUT_DIR/$name.log") failed" | tee -a "$OUT_DIR/steps.txt"
done
LIMIT=$((LIMIT * 3)) step rest "$CARRY/moet_cuda_tests" --gtest_filter="*-${seen#:}"
echo "  rest: $(grep -cE '^\[       OK' "$OUT_DIR/rest.log") ok, $(grep -cE '^\[  FAILED  \]' "$OUT_DIR/rest.log") failed" | tee -a "$OUT_DIR/steps.txt"
