#!/usr/bin/env bash
# On the GPU machine: runs the CUDA test suites, parity against transformers on every fixture,
# the kernel microbenchmarks and the end-to-end decode benchmarks, from the binaries that
# tools/gpu/pack.sh put into .gpu-pack/carry.tar.xz (unpacked into .gpu-carry/), and writes everything into RESULTS_DIR, ending with
# report.json (machine, commit, tests, parity, benchmarks). Usage: bash tools/gpu/run.sh RESULTS_DIR [quick|ncu]
# "quick" runs one small end-to-end benchmark (Qwen3-30B-A3B, 4 layers; experts W2, FP4 and native
# BF16) instead of all; "ncu" runs the tests, the kernel benchmark and Nsight Compute on the W2
# product kernels (ncu_w2.log), nothing end to end. The full run also traces the Qwen3-235B step
# (timeline_qwen3_235b.log/.json: each kernel's cost inside the graph) when pack.sh built the
# tracer. Each step's log is RESULTS_DIR/<step>.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: run.sh RESULTS_DIR [quick|ncu]}
MODE=${2:-full}
mkdir -p "$OUT_DIR"
CARRY=$PWD/.gpu-carry
[ -f .gpu-pack/carry.tar.xz ] && tar xJf .gpu-pack/carry.tar.xz
export LD_LIBRARY_PATH=$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
source tools/gpu/cuda_libs.sh
export MOET_LOG_LEVEL=warn
MOET=$CARRY/moet
status=0
# A step that hangs must not eat the session's device time: each one is killed after
# MOET_GPU_STEP_LIMIT seconds (default 120 for the tests and the MoE and norm microbenchmarks, and
# 300 for the rest, cuda_ops_bench included: its prefill-sized cases take minutes; exit 124 or 137
# in steps.txt), and its output is line buffered so that what it printed before survives the kill.
STEP_LIMIT=${MOET_GPU_STEP_LIMIT:-300}
SHORT_LIMIT=${MOET_GPU_STEP_LIMIT:-120}
step() {  # step NAME COMMAND...: runs it with its log in OUT_DIR/NAME.log, records the exit code
  local name=$1; shift
  local start=$SECONDS
  timeout -k 10 "$STEP_LIMIT" stdbuf -oL -eL "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  local note=""
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && note=", killed after ${STEP_LIMIT} s"
  echo "$name: exit $rc ($((SECONDS - start)) s$note)" | tee -a "$OUT_DIR/steps.txt"
  [ $rc -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT_DIR/machine.txt" 2>&1
STEP_LIMIT=$SHORT_LIMIT step tests "$CARRY/moet_cuda_tests" --gtest_output=json:"$OUT_DIR/tests.json"
STEP_LIMIT=$SHORT_LIMIT step kernels "$CARRY/cuda_moe_bench" "$OUT_DIR/kernels.json"
step ops "$CARRY/cuda_ops_bench" "$OUT_DIR/ops.json"
STEP_LIMIT=$SHORT_LIMIT step norm "$CARRY/cuda_norm_bench"
if [ "$MODE" = ncu ]; then
  # Nsight Compute on the first launches of the W2 product kernels (the DeepSeek-V3 shape at
  # batch 1 comes first in cuda_moe_bench): throughput, occupancy and warp stall reasons.
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
  step ncu_w2 "$NCU" --clock-control none --kernel-name regex:w2_product_kernel --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section LaunchStats --section SchedulerStats --section InstructionStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio "$CARRY/cuda_moe_bench"
  python3 tools/gpu/report.py "$OUT_DIR" "$CARRY/commit" > "$OUT_DIR/report.json"
  exit $status
fi
if [ "$MODE" = quick ]; then
  for experts in w2 fp4 native; do
    step e2e_qwen3_30b_4l_$experts "$MOET" bench --device cuda --config bench/configs/Qwen3-30B-A3B.config.json \
      --layers 4 --experts $experts --profile --json-out "$OUT_DIR/e2e_qwen3_30b_4l_$experts.json"
  done
else
  # Random weights. Qwen3 shapes at full depth (W2 experts fit the card); DeepSeek-V3 cut to 5
  # layers (its 58 MoE layers of W2 experts need about 190 GB).
  step e2e_qwen3_30b "$MOET" bench --device cuda --config bench/configs/Qwen3-30B-A3B.config.json \
    --layers 48 --profile --json-out "$OUT_DIR/e2e_qwen3_30b.json"
  step e2e_qwen3_235b "$MOET" bench --device cuda --config bench/configs/Qwen3-235B-A22B.config.json \
    --layers 94 --profile --json-out "$OUT_DIR/e2e_qwen3_235b.json"
  step e2e_deepseek_v3 "$MOET" bench --device cuda --config bench/configs/DeepSeek-V3.config.json \
    --layers 5 --profile --json-out "$OUT_DIR/e2e_deepseek_v3.json"
  # Eight sequences decoded together (the few-row products on the tensor cores, docs/gpu-history.md Run 17).
  for model in Qwen3-235B-A22B:94 DeepSeek-V3:5; do
    name=$(echo "${model%%:*}" | tr 'A-Z.-' 'a-z__' | sed 's/_a22b//')
    step e2e_${name}_batch8 "$MOET" bench --device cuda --config "bench/configs/${model%%:*}.config.json" \
      --layers "${model##*:}" --batch 8 --json-out "$OUT_DIR/e2e_${name}_batch8.json"
  done
  # The runs above decode at 17..48 keys (the bench's 16-token prompt); this one at 2049..2080.
  step e2e_qwen3_30b_context2k "$MOET" bench --device cuda --config bench/configs/Qwen3-30B-A3B.config.json \
    --layers 48 --prompt-tokens 2048 --json-out "$OUT_DIR/e2e_qwen3_30b_context2k.json"
  # The Qwen3-235B step's timeline inside its graph, per kernel (docs/gpu.md, "Timeline of a step
  # inside its graph"): the traced run's own speed is not the model's (tracing slows it down).
  if [ -f "$CARRY/libmoet_kernel_trace.so" ]; then
    step trace_qwen3_235b env CUDA_INJECTION64_PATH="$CARRY/libmoet_kernel_trace.so" \
      MOET_KERNEL_TRACE="$OUT_DIR/trace_qwen3_235b.csv" "$MOET" bench --device cuda \
      --config bench/configs/Qwen3-235B-A22B.config.json --layers 94 --decode-tokens 32 \
      --json-out "$OUT_DIR/traced_qwen3_235b.json"
    step timeline_qwen3_235b python3 tools/gpu/trace_report.py "$OUT_DIR/trace_qwen3_235b.csv" \
      --json "$OUT_DIR/timeline_qwen3_235b.json"
    xz -f "$OUT_DIR/trace_qwen3_235b.csv"
  fi
fi
# Last: live transformers parity (native experts; the slowest step, least likely to change).
step parity python3 tools/gpu/parity_transformers.py "$MOET" "$OUT_DIR/parity.json"
python3 tools/gpu/report.py "$OUT_DIR" "$CARRY/commit" > "$OUT_DIR/report.json"
exit $status
