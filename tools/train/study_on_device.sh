#!/usr/bin/env bash
# Issue #5 in one device command: train the `study` model (tools/train/train.py --size study,
# DeepSeek-V3 architecture, 64 experts top-6, 8 layers) with a time limit, export it to
# $STUDY_MODEL (hub format, checked by reloading it with transformers: --verify), measure its
# importance matrix on the training split (issue 31: `moet imatrix` on the CPU, every 200th
# training document up to 400,000 characters, as docs/quality.md does for models/tiny), then run
# the quality harness (tools/quality/eval_quality.py --formats all --imatrix) on it with moet on
# the GPU: the held-out text of docs/quality.md (first 12,000 characters of the corpus test
# split), the 32 prompts of tests/fixtures/quality_prompts.txt, 1024 scored tokens, 32 greedy
# tokens.
#
# Usage (repo root on the GPU machine, .gpu-carry/ from tools/gpu/pack.sh and data/corpus-study/
# from tools/train/study_corpus.py carried):  bash tools/train/study_on_device.sh OUT_DIR
#
# OUT_DIR gets at most 9 files, each written as soon as its stage ends (a timeout keeps what is
# done): study.log (everything printed), stages.json (seconds per stage), config.json,
# train_metrics.json and loss.png (train.py's), study.imatrix, quality.json / quality.md /
# quality.png (the harness's, rewritten after every format).
#
# Environment (defaults for the H200 run; the CPU smoke test overrides them):
#   STUDY_TIME_LIMIT   seconds of training (train.py --time-limit)            330
#   STUDY_STEPS        train.py --steps (the cosine schedule's length)       the preset's (20000)
#   STUDY_TRAIN_ARGS   more train.py arguments, appended last (they win)     --eval-every 100 --eval-windows 64
#   STUDY_SAMPLES      1: train.py --samples (transformers greedy samples)   0
#   STUDY_CORPUS       corpus folder                                          data/corpus-study (else data/corpus)
#   STUDY_MODEL        export folder (about 0.5 GB; not returned)             /tmp/study
#   STUDY_MOET         moet binary (its lib/ beside it goes on LD_LIBRARY_PATH) .gpu-carry/moet (else build/moet)
#   STUDY_DEVICE       moet --device                                          cuda
#   STUDY_MAX_PROMPTS  prompts for the greedy comparison                      32
#   STUDY_EVAL_ARGS    more eval_quality.py arguments                          (none)
# shellcheck disable=SC2317  # the stage functions are called through `stage`
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${1:?usage: study_on_device.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/study.log") 2>&1
export PYTHONUNBUFFERED=1

TIME_LIMIT=${STUDY_TIME_LIMIT:-330}
TRAIN_ARGS=${STUDY_TRAIN_ARGS-"--eval-every 100 --eval-windows 64"}
CORPUS=${STUDY_CORPUS:-}
if [ -z "$CORPUS" ]; then
  CORPUS=data/corpus-study
  [ -f "$CORPUS/train.jsonl.xz" ] || CORPUS=data/corpus
fi
MODEL=${STUDY_MODEL:-/tmp/study}
MOET=${STUDY_MOET:-}
if [ -z "$MOET" ]; then
  MOET=.gpu-carry/moet
  [ -x "$MOET" ] || MOET=build/moet
fi
MOET=$(cd "$(dirname "$MOET")" && pwd)/$(basename "$MOET")
MOET_LIB=$(dirname "$MOET")/lib
if [ -d "$MOET_LIB" ]; then
  export LD_LIBRARY_PATH=$MOET_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
DEVICE=${STUDY_DEVICE:-cuda}
MAX_PROMPTS=${STUDY_MAX_PROMPTS:-32}
WORK=$(mktemp -d /tmp/study_work.XXXXXX)

STAGES=""
T0=$(date +%s.%N)
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }
stage() {  # stage NAME COMMAND...: runs it, prints and records its wall time and exit code
  local name=$1; shift
  local start; start=$(date +%s.%N)
  echo "=== [$(elapsed "$T0") s] $name"
  "$@"
  local rc=$?
  local took; took=$(elapsed "$start")
  echo "=== $name: exit $rc, $took s"
  STAGES="$STAGES${STAGES:+,}{\"stage\": \"$name\", \"exit\": $rc, \"seconds\": $took}"
  printf '{"stages": [%s], "total_s": %s}\n' "$STAGES" "$(elapsed "$T0")" > "$OUT/stages.json"
  return "$rc"
}

preflight() {
  git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head -20
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "(no nvidia-smi)"
  nproc; df -h /tmp | tail -1
  python3 - <<'PY'
import importlib
for m in ("torch", "transformers", "tokenizers", "safetensors", "numpy", "matplotlib", "ml_dtypes"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "MISSING", type(e).__name__)
import torch
print("torch cuda:", torch.cuda.is_available())
PY
  echo "corpus $CORPUS:"; ls -l "$CORPUS"
  echo "moet $MOET"
  "$MOET" --version || return 1
  "$MOET" dequant --help | grep -q -- --all-experts || { echo "moet lacks dequant --all-experts"; return 1; }
  "$MOET" generate --help | grep -q -- --prompts-file || { echo "moet lacks generate --prompts-file"; return 1; }
  # the harness's moet calls work on this device (models/tiny is tracked): fail before training, not after
  "$MOET" --log-level warn score --model models/tiny --device "$DEVICE" --experts native \
    --text-file tests/fixtures/score_text.txt --max-tokens 64 || return 1
  # one loaded model for many prompts must give what one process per prompt gives (KV blocks and
  # any captured CUDA graphs are reused across prompts); retry with CUDA graphs off if not
  prompts_file_check || { export MOET_CUDA_GRAPHS=off; echo "retrying with MOET_CUDA_GRAPHS=off"; prompts_file_check; }
}

prompts_file_check() {
  python3 - "$MOET" "$DEVICE" <<'PY'
import json, pathlib, subprocess, sys
moet, device = sys.argv[1:3]
base = [moet, "--log-level", "warn", "generate", "--model", "models/tiny", "--device", device, "--experts", "native",
        "--max-tokens", "12", "--json"]
prompts = [p for p in pathlib.Path("tests/fixtures/quality_prompts.txt").read_text().split("\n\n") if p.strip()][:4]
run = lambda *a: subprocess.run(base + list(a), capture_output=True, text=True, check=True).stdout
batch = [json.loads(l)["output_ids"] for l in run("--prompts-file", "tests/fixtures/quality_prompts.txt",
                                                  "--max-prompts", "4").splitlines()]
single = [json.loads(run("--prompt", p))["output_ids"] for p in prompts]
print("prompts-file vs one run per prompt:", "same" if batch == single else f"DIFFERENT {batch} vs {single}")
sys.exit(batch != single)
PY
}

heldout() {  # docs/quality.md: the first 12,000 characters of the test split, documents joined by blank lines
  python3 - "$CORPUS/test.jsonl.xz" "$WORK/heldout.txt" <<'PY'
import json, lzma, sys
docs = [json.loads(line)["text"] for line in lzma.open(sys.argv[1], "rt")]
open(sys.argv[2], "w").write("\n\n".join(docs)[:12000])
PY
}

train() {
  local extra=()
  [ -n "${STUDY_STEPS:-}" ] && extra+=(--steps "$STUDY_STEPS")
  [ "${STUDY_SAMPLES:-0}" = 1 ] && extra+=(--samples)
  rm -rf "$MODEL"  # never evaluate an export left by an earlier run
  # shellcheck disable=SC2086  # TRAIN_ARGS is a list of words
  python3 tools/train/train.py --size study --seed 1234 --corpus "$CORPUS" --cache "$WORK/tokens" --out "$MODEL" \
    --time-limit "$TIME_LIMIT" --verify "${extra[@]}" $TRAIN_ARGS
  local rc=$?
  # train.py writes metrics.json and loss.png last; keep whatever exists even when it failed late
  cp "$MODEL/config.json" "$OUT/config.json" 2>/dev/null
  cp "$MODEL/metrics.json" "$OUT/train_metrics.json" 2>/dev/null
  cp "$MODEL/loss.png" "$OUT/loss.png" 2>/dev/null
  python3 - "$MODEL/metrics.json" <<'PY' || true
import json, sys
m = json.load(open(sys.argv[1]))
print("final:", json.dumps(m.get("final")))
print("verify:", json.dumps(m.get("verify")))
PY
  ls "$MODEL"/model*.safetensors > /dev/null 2>&1 && [ -f "$MODEL/config.json" ] || return 1
  [ "$rc" -eq 0 ] || echo "train.py exited $rc after exporting (plot or samples?); evaluating the export anyway"
  du -sh "$MODEL"
}

imatrix() {  # on the CPU: `moet imatrix --device cuda` waits for its GPU test (docs/formats.md)
  python3 - "$CORPUS/train.jsonl.xz" "$WORK/imatrix_text.txt" <<'PY'
import json, lzma, sys
docs, size = [], 0
for i, line in enumerate(lzma.open(sys.argv[1], "rt")):
    if i % 200 == 0:
        docs.append(json.loads(line)["text"])
        size += len(docs[-1])
        if size > 400000:
            break
open(sys.argv[2], "w").write("\n\n".join(docs)[:400000])
PY
  "$MOET" --log-level warn imatrix --model "$MODEL" --device cpu --text-file "$WORK/imatrix_text.txt" \
    --out "$OUT/study.imatrix"
}

quality() {
  local weighted=()
  [ -f "$OUT/study.imatrix" ] && weighted=(--imatrix "$OUT/study.imatrix")
  # shellcheck disable=SC2086
  python3 tools/quality/eval_quality.py --model "$MODEL" --text "$WORK/heldout.txt" \
    --prompts tests/fixtures/quality_prompts.txt --out "$OUT" --moet "$MOET" --device "$DEVICE" \
    --max-tokens 1024 --greedy-tokens 32 --max-prompts "$MAX_PROMPTS" --work "$WORK/quality" \
    --formats all "${weighted[@]}" ${STUDY_EVAL_ARGS:-}
  local rc=$?
  cat "$OUT/quality.md" 2>/dev/null
  return "$rc"
}

status=0
stage preflight preflight || { echo "preflight failed: not training"; exit 1; }
stage heldout heldout || exit 1
stage train train || { echo "no export: stopping"; exit 1; }
stage imatrix imatrix || status=1
stage quality quality || status=1
rm -rf "$WORK"
echo "=== done in $(elapsed "$T0") s; OUT_DIR:"
ls -l "$OUT"
exit $status
