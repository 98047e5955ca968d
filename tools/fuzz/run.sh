#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined) and runs each for
# SECONDS_PER_TARGET seconds (default 600). Not part of CI. Usage:
#   bash tools/fuzz/run.sh [seconds] [target...]     targets: tokenizer_fuzz jinja_fuzz
# Corpora live in build-fuzz/corpus/<target>; crashes are written to build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET=${1:-600}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(tokenizer_fuzz jinja_fuzz)
OUT=build-fuzz
mkdir -p "$OUT/obj" "$OUT/artifacts"
FLAGS="-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -Isrc"
objects=()
for src in src/tokenizer/*.cpp; do
  obj="$OUT/obj/$(basename "${src%.cpp}").o"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then clang++ $FLAGS -c "$src" -o "$obj"; fi
  objects+=("$obj")
done
LIBS="$(pkg-config --libs libpcre2-8 libutf8proc zlib) -lfmt"
for target in "${TARGETS[@]}"; do
  clang++ $FLAGS -fsanitize=fuzzer "tools/fuzz/$target.cpp" "${objects[@]}" $LIBS -o "$OUT/$target"
  mkdir -p "$OUT/corpus/$target"
  if [ "$target" = jinja_fuzz ] && [ -d ../shared/data/templates ]; then cp -n ../shared/data/templates/*.jinja "$OUT/corpus/$target/" 2>/dev/null || true; fi
  echo "[fuzz] $target for ${SECONDS_PER_TARGET}s"
  "$OUT/$target" -max_total_time="$SECONDS_PER_TARGET" -timeout=25 -rss_limit_mb=4096 -max_len=8192 \
    -artifact_prefix="$OUT/artifacts/$target-" "$OUT/corpus/$target" > "$OUT/$target.log" 2>&1 || true
  grep -E "^(SUMMARY|==[0-9]+==ERROR)|Done [0-9]+ runs" "$OUT/$target.log" || tail -n 5 "$OUT/$target.log"
done
