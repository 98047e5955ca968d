#!/usr/bin/env bash
# On the GPU machine, after `BASE=REV bash tools/gpu/pack.sh` here: a same-run A/B of the working
# tree's binaries (.gpu-carry/moet, cuda_ops_bench, cuda_moe_bench) against REV's (the *_base
# copies). Machines differ by about 5% end to end, so only such pairs count (docs/gpu.md).
# End to end: every model of MODELS (default "Qwen3-30B-A3B:48 Qwen3-235B-A22B:94 DeepSeek-V3:5",
# config:layers) is decoded by base, then new, ROUNDS times (default 2), at batch BATCH (default
# 1), random weights and W2 experts, CUDA graphs on; each run is killed after MOET_AB_LIMIT
# seconds (default 150: building Qwen3-235B's 94 random layers alone takes about a minute).
# Then the microbenchmarks of BENCHES (default "cuda_ops_bench cuda_moe_bench"; empty: none), base
# then new, each line of one followed by the same line of the other. Every run's JSON and log go into RESULTS_DIR, the summary into ab.txt there
# (also printed).
# Usage: bash tools/gpu/ab.sh RESULTS_DIR [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: ab.sh RESULTS_DIR [ROUNDS]}
ROUNDS=${2:-2}
MODELS=${MODELS:-"Qwen3-30B-A3B:48 Qwen3-235B-A22B:94 DeepSeek-V3:5"}
BATCH=${BATCH:-1}
BENCHES=${BENCHES-cuda_ops_bench cuda_moe_bench}
LIMIT=${MOET_AB_LIMIT:-150}
mkdir -p "$OUT_DIR"
CARRY=${CARRY:-$PWD/.gpu-carry}
[ -f .gpu-pack/carry.tar.xz ] && [ ! -x "$CARRY/moet" ] && tar xJf .gpu-pack/carry.tar.xz
[ -x "$CARRY/moet_base" ] || { echo "no .gpu-carry/moet_base: pack with BASE=REV" >&2; exit 1; }
export LD_LIBRARY_PATH=$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
source tools/gpu/cuda_libs.sh
export MOET_LOG_LEVEL=warn

for round in $(seq 1 "$ROUNDS"); do
  for entry in $MODELS; do
    model=${entry%%:*} layers=${entry##*:}
    for side in base new; do
      bin=$CARRY/moet$([ $side = base ] && echo _base)
      name=${model}_b${BATCH}_${side}_$round
      timeout -k 10 "$LIMIT" "$bin" bench --device cuda --config "bench/configs/$model.config.json" --layers "$layers" \
        --batch "$BATCH" --json-out "$OUT_DIR/$name.json" > "$OUT_DIR/$name.log" 2>&1
      echo "$name: exit $?"
    done
  done
done
for bench in $BENCHES; do
  for side in base new; do
    timeout -k 10 120 "$CARRY/$bench$([ $side = base ] && echo _base)" > "$OUT_DIR/${bench}_$side.log" 2>&1
    echo "${bench}_$side: exit $?"
  done
done

python3 - "$OUT_DIR" "$CARRY/commit" "$MODELS" "$BATCH" "$ROUNDS" "$BENCHES" > "$OUT_DIR/ab.txt" <<'EOF'
import json, pathlib, re, sys
out, commit, models, batch, rounds = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3].split(), sys.argv[4], int(sys.argv[5])
benches = sys.argv[6].split()
print(commit.read_text().strip() if commit.exists() else "commit unknown")
print(f"end to end, batch {batch}, tokens/s (graphs on) per round; new / base of the means")
for entry in models:
    model, layers = entry.split(":")
    line = {}
    for side in ("base", "new"):
        values = []
        for r in range(1, rounds + 1):
            try:
                values.append(json.loads((out / f"{model}_b{batch}_{side}_{r}.json").read_text())["decode_tokens_per_s"])
            except (OSError, ValueError, KeyError):
                values.append(None)
        line[side] = values
    shown = {s: " ".join("-" if v is None else f"{v:.2f}" for v in vs) for s, vs in line.items()}
    means = {s: sum(v for v in vs if v is not None) / max(1, sum(v is not None for v in vs)) for s, vs in line.items()}
    ratio = f"{means['new'] / means['base']:.4f}" if means["base"] and means["new"] else "-"
    print(f"  {model} ({layers} layers): base {shown['base']} | new {shown['new']} | {ratio}")
for bench in benches:
    print(f"{bench}: base line, then new")
    logs = {}
    for side in ("base", "new"):
        path = out / f"{bench}_{side}.log"
        logs[side] = path.read_text().splitlines() if path.exists() else []
    label = lambda l: re.split(r"\s{2,}\d", l, maxsplit=1)[0].strip()
    new_by_label = {label(l): l for l in logs["new"] if "batch" in l}
    for l in logs["base"]:
        if "batch" not in l:
            continue
        print(f"  base {l}")
        print(f"  new  {new_by_label.get(label(l), '(missing)')}")
EOF
cat "$OUT_DIR/ab.txt"
