#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, coverage) and runs each for SECONDS seconds
# from its corpus (seeded from tools/fuzz/corpus/<target>). Prints one summary line per target:
# runs, executions per second, coverage, and whether it found a crash. Exits 1 if any did.
# Usage: bash tools/fuzz/run.sh [seconds=600] [target...]
#   targets: tokenizer_fuzz jinja_fuzz request_fuzz safetensors_fuzz config_fuzz pack_sidecar_fuzz
#            tool_parser_fuzz (all by default)
# BUILD (default build-fuzz) is the build folder; one that tools/test_sanitizers.sh made works too.
# Crashes are written to $BUILD/fuzz/artifacts/; corpora grow in $BUILD/fuzz/corpus/<target>.
# FUZZ_SEED fixes libFuzzer's random seed (CI sets it, so a short run is reproducible).
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET=${1:-600}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(tokenizer_fuzz jinja_fuzz request_fuzz safetensors_fuzz config_fuzz pack_sidecar_fuzz tool_parser_fuzz)
BUILD=${BUILD:-build-fuzz}
LAUNCHER=()
command -v ccache > /dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DMOET_CUDA=OFF -DMOET_SANITIZE=ON -DMOET_FUZZ=ON -DMOET_TESTS=OFF -DMOET_BENCH=OFF "${LAUNCHER[@]}" > /dev/null
fi
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}"
mkdir -p "$BUILD/fuzz/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}  # the request target keeps its engine for the process
failed=0
for target in "${TARGETS[@]}"; do
  corpus="$BUILD/fuzz/corpus/$target"
  mkdir -p "$corpus"
  [ -d "tools/fuzz/corpus/$target" ] && cp -n tools/fuzz/corpus/"$target"/* "$corpus/" 2>/dev/null || true
  if [ "$target" = jinja_fuzz ] && [ -d ../shared/data/templates ]; then cp -n ../shared/data/templates/*.jinja "$corpus/" 2>/dev/null || true; fi
  log="$BUILD/fuzz/$target.log"
  status=0
  "$BUILD/fuzz/$target" -max_total_time="$SECONDS_PER_TARGET" -timeout=25 -rss_limit_mb=4096 -max_len=16384 \
    -print_final_stats=1 ${FUZZ_SEED:+-seed=$FUZZ_SEED} -artifact_prefix="$BUILD/fuzz/artifacts/$target-" "$corpus" > "$log" 2>&1 || status=$?
  runs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
  speed=$(grep -oE "stat::average_exec_per_sec: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
  cov=$(grep -oE "cov: [0-9]+ ft: [0-9]+" "$log" | tail -1 || echo "cov: ?")
  if [ $status -ne 0 ]; then
    failed=1
    echo "[fuzz] $target: FAILED after $runs runs (status $status); see $log"
    grep -E "^(SUMMARY|==[0-9]+==ERROR)|property violated|Test unit written" "$log" | head -5 || true
  else
    echo "[fuzz] $target: ${SECONDS_PER_TARGET}s, $runs runs, $speed exec/s, $cov, no crash"
  fi
done
exit $failed
