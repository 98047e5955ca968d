#!/usr/bin/env bash
# Here (the dev machine, nvcc present): builds the GPU binaries for sm_90 in build-cuda and copies
# them, with the shared libraries the GPU machine lacks, into .gpu-carry/ (git-ignored), which
# the device tool carries next to the working tree; tools/gpu/run.sh runs them there.
# Usage: bash tools/gpu/pack.sh [archs]   (default 90; BUILD_DIR=... picks the build folder, default build-cuda)
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCHS=${1:-90}
B=${BUILD_DIR:-build-cuda}
grep -qx '/.gpu-carry/' .git/info/exclude 2>/dev/null || echo '/.gpu-carry/' >> .git/info/exclude
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOET_CUDA=ON -DMOET_CUDA_ARCHS="$ARCHS" > /dev/null
cmake --build "$B" --target moet moet_cuda_tests cuda_moe_bench
rm -rf .gpu-carry && mkdir -p .gpu-carry/lib
BINARIES="$B/moet $B/tests/cpp/cuda/moet_cuda_tests $B/bench/cuda_moe_bench"
cp $BINARIES .gpu-carry/ && strip .gpu-carry/moet .gpu-carry/moet_cuda_tests .gpu-carry/cuda_moe_bench
# Every non-glibc/non-libstdc++ library the binaries load (the GPU image lacks PCRE2, utf8proc,
# xxhash, liburing; copying the rest too keeps the versions the binaries were linked against).
for bin in $BINARIES; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" .gpu-carry/lib/; done
git rev-parse HEAD > .gpu-carry/commit
{ git diff --quiet && git diff --cached --quiet; } || echo "(+ uncommitted changes)" >> .gpu-carry/commit
du -sh .gpu-carry
