#!/usr/bin/env bash
# The sanitizer job of CI: a CPU-only clang build with AddressSanitizer + UndefinedBehaviorSanitizer
# (UB is fatal) of every module and C++ test suite, the C++ tests under it, then a short fuzz of
# each libFuzzer target (tools/fuzz) from its seed corpus. Bounded: FUZZ_SECONDS per target
# (default 20). Usage: bash tools/test_sanitizers.sh [build-dir=build-asan]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-asan}
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
LAUNCHER=()
command -v ccache > /dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
start=$(date +%s)
# -O1 with line tables: the usual sanitizer setting, and it compiles faster than -O2.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DMOET_CUDA=OFF -DMOET_SANITIZE=ON -DMOET_FUZZ=ON -DMOET_TESTS=ON -DMOET_BENCH=OFF "${LAUNCHER[@]}" > /dev/null
cmake --build "$BUILD" -j "$(nproc)" --target moet_cpp_tests fuzz_targets
built=$(date +%s)
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" --timeout 900
tested=$(date +%s)
BUILD="$BUILD" FUZZ_SEED=${FUZZ_SEED:-1} bash tools/fuzz/run.sh "$FUZZ_SECONDS"
echo "[sanitizers] build $((built - start)) s, C++ tests $((tested - built)) s, fuzz $(( $(date +%s) - tested )) s"
