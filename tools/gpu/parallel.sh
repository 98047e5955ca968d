#!/usr/bin/env bash
# On the GPU machine: the runs of tensor and expert parallelism (docs/parallel.md), from the binaries
# tools/gpu/pack.sh put into .gpu-pack/carry.tar.xz. NCCL is not carried (218 MB): it is loaded at
# run time from the machine's CUDA toolkit or PyTorch's pip package (tools/gpu/cuda_libs.sh finds
# it and sets MOET_NCCL_LIBRARY). Two modes:
#   tests  the NCCL suite of moet_cuda_tests (tests/cpp/cuda/cuda_parallel_test.cpp) with the CUDA
#          gate of split models (cli/parallel_options.cpp) still in place: on one GPU NCCL at N = 1
#          (collectives, a one-rank split equal bit for bit to the whole model with its collectives
#          inside captured CUDA graphs); on two GPUs or more also TP = 2 and EP = 2 against the CPU
#          (fixtures, logits and greedy tokens) and run-to-run identity; then, on its own under a
#          60 s limit, whether NCCL accepts two ranks on one GPU (it is expected to refuse);
#   bench  (two GPUs, after that gate is lifted) greedy identity of `moet generate` split over 2 GPUs
#          on the fixtures against their goldens, the same over two processes of one GPU each
#          (--nnodes 2 on this host: the rendezvous, node 1 following node 0), then `moet bench` of
#          MODELS (config:layers, default "Qwen3-235B-A22B:94 DeepSeek-V3:61", invented weights, W2
#          experts) at BATCHES (default "1 8") with --tensor-parallel-size 2, without and with
#          --enable-expert-parallel, and on one GPU where the model fits (Qwen3-235B; DeepSeek-V3's
#          671B needs two), each with --profile: decode tokens/s and the collectives' share of rank
#          0's step (its per-op profile, CUDA events around every op and collective) go into
#          RESULTS_DIR/summary.txt.
# Each run is killed after MOET_PAR_LIMIT seconds (default 300); JSON and logs per run go into
# RESULTS_DIR. Usage: bash tools/gpu/parallel.sh RESULTS_DIR tests|bench
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: parallel.sh RESULTS_DIR tests|bench}
MODE=${2:?usage: parallel.sh RESULTS_DIR tests|bench}
MODELS=${MODELS:-Qwen3-235B-A22B:94 DeepSeek-V3:61}
BATCHES=${BATCHES:-1 8}
LIMIT=${MOET_PAR_LIMIT:-300}
mkdir -p "$OUT_DIR"
source tools/gpu/carry_env.sh
export MOET_LOG_LEVEL=${MOET_LOG_LEVEL:-info}
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT_DIR/machine.txt" 2>&1
nvidia-smi topo -m >> "$OUT_DIR/machine.txt" 2>&1

if [ "$MODE" = tests ]; then
  step nccl_tests "$CARRY/moet_cuda_tests" --gtest_filter='Nccl.*' \
    --gtest_output=json:"$OUT_DIR/nccl_tests.json"
  LIMIT=60 step nccl_two_ranks_one_gpu "$CARRY/moet_cuda_tests" --gtest_filter='Nccl.DISABLED_TwoRanksOnOneGpu' \
    --gtest_also_run_disabled_tests
  grep -h "NCCL" "$OUT_DIR"/nccl_*.log | sort -u | tee "$OUT_DIR/summary.txt"
  exit 0
fi

[ "$MODE" = bench ] || { echo "unknown mode $MODE (tests or bench)" >&2; exit 2; }
[ "$GPUS" -ge 2 ] || echo "warning: $GPUS GPU(s) visible; the split runs need 2" | tee -a "$OUT_DIR/steps.txt"
check_golden() {  # check_golden NAME FIXTURE: NAME.log's JSON line against the fixture's greedy tokens
  python3 - "$OUT_DIR/$1.log" "tests/fixtures/$2/golden.json" <<'EOF' | tee -a "$OUT_DIR/summary.txt"
import json, sys
log, golden = open(sys.argv[1]).read().splitlines(), json.load(open(sys.argv[2]))
out = next((json.loads(l) for l in reversed(log) if l.startswith("{")), None)
same = out is not None and out["output_ids"] == golden["greedy_ids"]
print(f"{sys.argv[1].split('/')[-1][:-4]}: greedy tokens {'equal to' if same else 'DIFFERENT from'} the golden")
EOF
}
prompt_ids() {
  python3 -c "import json, sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt_ids'])))" \
    "tests/fixtures/$1/golden.json"
}
for fixture in qwen3_moe deepseek_v3 glm4_moe mixtral; do
  for split in "" "--enable-expert-parallel"; do
    name=generate_${fixture}_tp2${split:+_ep}
    step "$name" "$CARRY/moet" generate --device cuda --model "tests/fixtures/$fixture" \
      --prompt-ids "$(prompt_ids "$fixture")" --max-tokens 16 --experts native --kv-cache-dtype fp32 --json \
      --tensor-parallel-size 2 $split
    check_golden "$name" "$fixture"
  done
done
# Two nodes on this host: two processes of one GPU each (CUDA_VISIBLE_DEVICES), the TCP rendezvous
# on 127.0.0.1, node 1 following node 0's steps (models/remote_nodes.h).
for split in "" "--enable-expert-parallel"; do
  name=generate_deepseek_v3_two_nodes${split:+_ep}
  two_nodes=(generate --device cuda --model tests/fixtures/deepseek_v3 --prompt-ids "$(prompt_ids deepseek_v3)"
             --max-tokens 16 --experts native --kv-cache-dtype fp32 --json --tensor-parallel-size 2 $split
             --nnodes 2 --master-addr 127.0.0.1 --master-port 29517)
  CUDA_VISIBLE_DEVICES=1 timeout -k 10 "$LIMIT" "$CARRY/moet" "${two_nodes[@]}" --node-rank 1 \
    > "$OUT_DIR/${name}_node1.log" 2>&1 &
  node1=$!
  CUDA_VISIBLE_DEVICES=0 step "$name" "$CARRY/moet" "${two_nodes[@]}" --node-rank 0
  wait "$node1"
  echo "${name}_node1: exit $?" | tee -a "$OUT_DIR/steps.txt"
  check_golden "$name" deepseek_v3
done
for entry in $MODELS; do
  model=${entry%%:*} layers=${entry##*:}
  for batch in $BATCHES; do
    for split in "1" "2" "2 --enable-expert-parallel"; do
      [ "$split" = 1 ] && [ "$model" = DeepSeek-V3 ] && continue  # 671B: W2 experts need two H200s
      ep=$([ "${split#* }" != "$split" ] && echo _ep)
      name=bench_$(echo "$model" | tr 'A-Z.-' 'a-z__')_b${batch}_tp${split%% *}$ep
      step "$name" "$CARRY/moet" bench --device cuda --config "bench/configs/$model.config.json" \
        --layers "$layers" --batch "$batch" --profile --json-out "$OUT_DIR/$name.json" --tensor-parallel-size $split
    done
  done
done
python3 - "$OUT_DIR" <<'EOF' | tee -a "$OUT_DIR/summary.txt"
import glob, json, os, sys
print(f"{'run':44} {'tokens/s':>10} {'graphs off':>10} {'collectives':>12}")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
    r = json.load(open(path))
    ops = r.get("profile", {}).get("ops", [])
    share = sum(op["share"] for op in ops if op["op"].split("[")[0] in
                ("all_reduce", "all_gather", "all_to_all", "reduce_scatter", "broadcast"))
    print(f"{os.path.basename(path)[6:-5]:44} {r['decode_tokens_per_s']:10.1f} "
          f"{r.get('decode_tokens_per_s_graphs_off', float('nan')):10.1f} {100 * share:11.1f}%")
EOF
