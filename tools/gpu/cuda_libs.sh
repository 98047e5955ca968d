# Sourced by the GPU-machine scripts after they put .gpu-carry/lib on LD_LIBRARY_PATH: appends the
# folder of that machine's cuBLASLt (libcublasLt.so.13, about 500 MB, too large to carry), from the
# CUDA toolkit or else from the pip package that PyTorch uses. Prints where it found it, or warns.
moet_cublas_dir=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
  $(python3 -c 'import nvidia, os; [print(os.path.join(p, d, "lib")) for p in nvidia.__path__ for d in ("cublas", "cu13")]' 2>/dev/null); do
  if [ -e "$dir/libcublasLt.so.13" ]; then moet_cublas_dir=$dir; break; fi
done
if [ -n "$moet_cublas_dir" ]; then
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$moet_cublas_dir
  echo "cuBLASLt: $moet_cublas_dir" >&2
else
  echo "warning: no libcublasLt.so.13 found; the moet binaries will not start" >&2
fi
# NCCL (split models: docs/parallel.md) is loaded by moet at run time (dlopen), not linked: unless
# the dynamic loader finds libnccl.so.2 by itself, name the machine's copy (CUDA toolkit, or the pip
# package PyTorch uses) in MOET_NCCL_LIBRARY.
if [ -z "${MOET_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
    $(python3 -c 'import nvidia, os; [print(os.path.join(p, "nccl", "lib")) for p in nvidia.__path__]' 2>/dev/null); do
    if [ -e "$dir/libnccl.so.2" ]; then export MOET_NCCL_LIBRARY=$dir/libnccl.so.2; break; fi
  done
  echo "NCCL: ${MOET_NCCL_LIBRARY:-not found (split models on CUDA will refuse to start)}" >&2
fi
