# Sourced by the GPU-machine scripts from the repository root: unpacks what tools/gpu/pack.sh
# carried (.gpu-pack/carry.tar.xz into $CARRY, default .gpu-carry/, unless already unpacked), puts
# its libraries first on LD_LIBRARY_PATH, links the build's source path to this tree and finds the
# machine's cuBLASLt and NCCL (cuda_libs.sh).
CARRY=${CARRY:-$PWD/.gpu-carry}
[ -f .gpu-pack/carry.tar.xz ] && [ ! -x "$CARRY/moet" ] && tar xJf .gpu-pack/carry.tar.xz
export LD_LIBRARY_PATH=$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The test binaries find fixtures under the absolute source path they were built in: where that
# path is not this tree (the GPU machine's checkout lies elsewhere), link it here.
if [ -f "$CARRY/source_dir" ]; then
  SOURCE_DIR=$(cat "$CARRY/source_dir")
  [ "$SOURCE_DIR" = "$PWD" ] || [ -e "$SOURCE_DIR" ] || { mkdir -p "$(dirname "$SOURCE_DIR")" && ln -s "$PWD" "$SOURCE_DIR"; }
fi
source tools/gpu/cuda_libs.sh
# step NAME COMMAND...: runs it, killed after $LIMIT seconds, output line-buffered into
# $OUT_DIR/NAME.log (what it printed before a kill survives), its exit code into $OUT_DIR/steps.txt.
step() {
  local name=$1; shift
  local start=$SECONDS
  timeout -k 10 "$LIMIT" stdbuf -oL -eL "$@" > "$OUT_DIR/$name.log" 2>&1
  echo "$name: exit $? ($((SECONDS - start)) s)" | tee -a "$OUT_DIR/steps.txt"
}
