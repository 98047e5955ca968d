#!/usr/bin/env bash
# Here (no GPU needed): the machine code (SASS) nvcc made for the kernels of an object file, as an
# opcode histogram per kernel, to count what an inner loop costs before spending device time.
# cuobjdump and the nvdisasm it runs come from PyPI (NVIDIA's nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm wheels; Debian does not package them), unpacked into .tools/ (git-ignored). Usage:
#   bash tools/gpu/sass_mix.sh OBJECT [KERNEL_REGEX] [--dump FILE]
# e.g. bash tools/gpu/sass_mix.sh build-cuda/src/kernels/cuda/CMakeFiles/moet_kernels_cuda.dir/moe_w2.cu.o 'product_kernelILb1ELi1E'
# --dump FILE also writes the matching kernels' SASS to FILE (to find a loop's line range).
set -euo pipefail
cd "$(dirname "$0")/../.."
OBJECT=${1:?usage: sass_mix.sh OBJECT [KERNEL_REGEX] [--dump FILE]}
REGEX=${2:-.}
DUMP=""
[ "${3:-}" = "--dump" ] && DUMP=${4:?--dump needs a file}
TOOLS=.tools/cuobjdump
CUOBJDUMP=$( (find "$TOOLS" -name cuobjdump -type f 2>/dev/null || true) | head -1)
if [ -z "$CUOBJDUMP" ]; then
  grep -qx "/.tools/" .git/info/exclude 2>/dev/null || echo "/.tools/" >> .git/info/exclude
  mkdir -p "$TOOLS"
  python3 -m pip download --quiet --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$TOOLS"
  for wheel in "$TOOLS"/*.whl; do python3 -m zipfile -e "$wheel" "$TOOLS"/unpacked; done
  CUOBJDUMP=$(find "$TOOLS" -name cuobjdump -type f | head -1)
  chmod +x "$CUOBJDUMP" "$(dirname "$CUOBJDUMP")/nvdisasm"
fi
export PATH="$(dirname "$CUOBJDUMP"):$PATH"  # where cuobjdump finds nvdisasm
# One "kernel opcode" line per instruction of the matching kernels, then counted per kernel.
"$CUOBJDUMP" -sass "$OBJECT" | awk -v regex="$REGEX" -v dump="$DUMP" '
  /Function : / { name = $3; keep = name ~ regex; next }
  keep && /^[[:space:]]+\/\*[0-9a-f]+\*\/[[:space:]]/ {
    if (dump != "") print name ": " $0 > dump
    op = $2
    if (op ~ /^@/) op = $3
    sub(/\..*/, "", op); sub(/;$/, "", op)
    print name, op
  }' | sort | uniq -c | sort -k2,2 -k1,1nr | awk '
  $2 != kernel { kernel = $2; shown = 0; print kernel ":" }
  shown++ < 20 { printf "%8d %s\n", $1, $3 }'
