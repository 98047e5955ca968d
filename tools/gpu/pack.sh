#!/usr/bin/env bash
# Here (the dev machine, nvcc present): builds the GPU binaries for sm_90 in build-cuda and copies
# them, with the shared libraries the GPU machine lacks, into .gpu-carry/ (git-ignored), and
# compresses that into .gpu-pack/carry.tar.xz (git-ignored), which the device tool carries next to
# the working tree (the tree plus what is carried must stay under 64 MiB); tools/gpu/run.sh
# unpacks and runs them there.
# Usage: bash tools/gpu/pack.sh [archs]   (default 90; BUILD_DIR=... picks the build folder, default build-cuda)
# BASE=REV also builds commit REV (checked out in the git worktree .gpu-base/, built in
# build-base/, both kept so the next time is incremental) and packs its moet and cuda_*_bench as
# <name>_base, for same-run A/B against the working tree (docs/gpu.md, "Variants").
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCHS=${1:-90}
B=${BUILD_DIR:-build-cuda}
EXCLUDE=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
mkdir -p "$(dirname "$EXCLUDE")"
for ignored in /.gpu-carry/ /.gpu-pack/ /.gpu-base/; do
  grep -qx "$ignored" "$EXCLUDE" 2>/dev/null || echo "$ignored" >> "$EXCLUDE"
done
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOET_CUDA=ON -DMOET_CUDA_ARCHS="$ARCHS" > /dev/null
cmake --build "$B" --target moet moet_cuda_tests cuda_moe_bench cuda_norm_bench cuda_ops_bench cuda_host_experts_bench \
  experts_host_bench cuda_sparse_bench
rm -rf .gpu-carry && mkdir -p .gpu-carry/lib
BINARIES="$B/moet $B/tests/cpp/cuda/moet_cuda_tests $B/bench/cuda_moe_bench $B/bench/cuda_norm_bench $B/bench/cuda_ops_bench"
BINARIES+=" $B/bench/cuda_host_experts_bench $B/bench/experts_host_bench $B/bench/cuda_sparse_bench"
cp $BINARIES .gpu-carry/ && strip .gpu-carry/moet .gpu-carry/moet_cuda_tests .gpu-carry/cuda_*_bench \
  .gpu-carry/experts_host_bench
# Every non-glibc/non-libstdc++ library the binaries load (the GPU image lacks PCRE2, utf8proc,
# xxhash, liburing; copying the rest too keeps the versions the binaries were linked against),
# except cuBLAS: too large to carry, and the GPU machine has CUDA 13's (tools/gpu/cuda_libs.sh).
for bin in $BINARIES; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcublas[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" .gpu-carry/lib/; done
# The kernel tracer (tools/gpu/kernel_trace.cpp) and the CUPTI it was linked against, when the
# toolkit has CUPTI.
CUDA_ROOT=$(dirname "$(dirname "$(command -v nvcc)")")
if [ -f "$CUDA_ROOT/include/cupti.h" ]; then
  CUPTI_LIB=$(dirname "$(find -L "$CUDA_ROOT" -name 'libcupti.so' -print -quit)")
  g++ -std=c++17 -shared -fPIC -O2 -Wall -I"$CUDA_ROOT/include" tools/gpu/kernel_trace.cpp -L"$CUPTI_LIB" -lcupti \
    -o .gpu-carry/libmoet_kernel_trace.so
  cp -L "$CUPTI_LIB"/libcupti.so.[0-9]* .gpu-carry/lib/
fi
git rev-parse HEAD > .gpu-carry/commit
pwd > .gpu-carry/source_dir  # the tests' MOET_SOURCE_DIR: carry_env.sh links it to the tree there
{ git diff --quiet && git diff --cached --quiet; } || echo "(+ uncommitted changes)" >> .gpu-carry/commit
if [ -n "${BASE:-}" ]; then
  if [ -d .gpu-base ]; then
    git -C .gpu-base checkout -q --detach "$BASE"
  else
    git worktree add -q --detach .gpu-base "$BASE"
  fi
  cmake -S .gpu-base -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOET_CUDA=ON -DMOET_CUDA_ARCHS="$ARCHS" > /dev/null
  cmake --build build-base --target moet cuda_moe_bench cuda_norm_bench cuda_ops_bench
  for bin in moet bench/cuda_moe_bench bench/cuda_norm_bench bench/cuda_ops_bench; do
    cp "build-base/$bin" ".gpu-carry/$(basename "$bin")_base" && strip ".gpu-carry/$(basename "$bin")_base"
  done
  echo "base: $(git -C .gpu-base rev-parse HEAD)" >> .gpu-carry/commit
fi
mkdir -p .gpu-pack && tar cJf .gpu-pack/carry.tar.xz .gpu-carry
du -sh .gpu-carry .gpu-pack
