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
