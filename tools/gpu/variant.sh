#!/usr/bin/env bash
# Here, after tools/gpu/pack.sh: builds measurement variants of one CUDA kernel file next to the
# packed binaries, for same-run A/B comparisons on the GPU machine (docs/gpu.md, "Variants").
# The file (a kernels/cuda .cu, or another copy of it given as SOURCE) is compiled with the
# build's own command plus DEFINES (e.g. -DMOET_W2_DEPTH=4), swapped into a copy of
# libmoet_kernels_cuda.a, and each TARGET (default: cuda_moe_bench) is relinked against that copy
# as .gpu-carry/<target>_<NAME>. Nothing in the build folder changes. Re-run
# `tar cJf .gpu-pack/carry.tar.xz .gpu-carry` afterwards to carry the variants.
# Usage: bash tools/gpu/variant.sh NAME FILE.cu "DEFINES" [SOURCE] [TARGET...]
#   e.g. bash tools/gpu/variant.sh depth4 moe_w2.cu "-DMOET_W2_DEPTH=4" "" moet bench/cuda_moe_bench
# TARGET is a ninja target of the build folder (moet, bench/cuda_moe_bench,
# tests/cpp/cuda/moet_cuda_tests, ...). BUILD_DIR picks the build folder (default build-cuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=${1:?usage: variant.sh NAME FILE.cu "DEFINES" [SOURCE] [TARGET...]}
FILE=${2:?kernel file, e.g. moe_w2.cu}
DEFINES=${3:-}
SOURCE=${4:-}
shift $(($# < 4 ? $# : 4))
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(bench/cuda_moe_bench)
B=${BUILD_DIR:-build-cuda}
ROOT=$PWD
OBJECT=src/kernels/cuda/CMakeFiles/moet_kernels_cuda.dir/$FILE.o
LIBRARY=src/kernels/cuda/libmoet_kernels_cuda.a
[ -d .gpu-carry ] || { echo "run tools/gpu/pack.sh first" >&2; exit 1; }
[ -n "$SOURCE" ] && SOURCE=$(realpath "$SOURCE")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The object, compiled as the build compiles it, into WORK, with the defines (and the other source).
compile=$(ninja -C "$B" -t commands "$OBJECT" | tail -n 1)
compile=${compile/-o $OBJECT/-o $WORK/$FILE.o}
[ -n "$SOURCE" ] && compile=${compile/-c $ROOT\/src\/kernels\/cuda\/$FILE/-c $SOURCE}
(cd "$B" && eval "$compile $DEFINES")
cp "$B/$LIBRARY" "$WORK/"
(cd "$WORK" && ar r libmoet_kernels_cuda.a "$FILE.o")

# Each target, linked as the build links it but against the copy.
for target in "${TARGETS[@]}"; do
  out=$ROOT/.gpu-carry/$(basename "$target")_$NAME
  link=$(ninja -C "$B" -t commands "$target" | tail -n 1)
  link=${link//$LIBRARY/$WORK/libmoet_kernels_cuda.a}
  link=${link/-o $target /-o $out }
  (cd "$B" && eval "$link")
  strip "$out"
  echo "built $out"
done
