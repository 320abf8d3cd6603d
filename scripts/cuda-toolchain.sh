#!/usr/bin/env bash
# terse's CUDA build toolchain: nvcc, ptxas, the CUDA headers and the libraries the `cuda` and
# `nccl` features link, unpacked from NVIDIA's PyPI wheels into one directory. It needs no GPU
# and no root: `cargo xtask cuda-toolchain` runs it, and `cargo xtask build-gpu` uses it.
#
#   bash scripts/cuda-toolchain.sh [--compiler-only] [DIR]   # default DIR: ~/.cache/cuda-13.0
#   eval "$(bash scripts/cuda-toolchain.sh)"  # the exports a build needs (idempotent)
# --compiler-only: nvcc, ptxas, nvdisasm and the headers (about a tenth of the download), enough
# for scripts/ptxas-check.sh and `cargo xtask kernel-model`; a later full install completes the
# same directory.
#
# Everything goes to stderr except the exports, so `eval` sees nothing else.
set -euo pipefail
COMPILER_ONLY=0
if [ "${1:-}" = "--compiler-only" ]; then
  COMPILER_ONLY=1
  shift
fi
DIR="${1:-$HOME/.cache/cuda-13.0}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"   # the exports must be absolute paths
PY="${PYTHON:-python3}"

# CUDA 13.0 (update 2). Not newer: the driver of the GPU machines terse targets (580) runs PTX
# of CUDA 13.0 at most, and scripts/gpu-check.sh checks that on the machine.
TOOLKIT=(
  nvidia-cuda-nvcc==13.0.88      # nvcc, ptxas, fatbinary, nvlink
  nvidia-nvvm==13.0.88           # cicc, libdevice
  nvidia-cuda-crt==13.0.88       # include/crt
  nvidia-cuda-runtime==13.0.96   # cuda.h, cuda_runtime.h, cuda_bf16.h, libcudart
  nvidia-cuda-cccl==13.0.85      # cub, thrust, libcu++
  nvidia-cuda-nvrtc==13.0.88     # libnvrtc (cudarc compiles candle's kernels at run time)
  nvidia-curand==10.4.0.35       # libcurand
  nvidia-cublas==13.1.0.3        # libcublas, libcublasLt
)
NCCL=nvidia-nccl-cu13==2.32.3   # libnccl, nccl.h (terse-dist's NCCL backend)
COMPILER=("${TOOLKIT[@]:0:5}")   # nvcc, nvvm, crt, runtime headers, cccl
# nvdisasm (the SASS `cargo xtask kernel-model` reads). 13.2.51 because PyPI has no 13.0 wheel of
# it (13.2.51 is the oldest); it disassembles the sm_90 cubins nvcc 13.0 writes.
NVDISASM=nvidia-cuda-nvdisasm==13.2.51

# unpack PREFIX KEEP WHEEL...: copies each wheel's files under PREFIX into DIR (PREFIX removed),
# keeping those whose path (after PREFIX) matches the regular expression KEEP, with their modes.
unpack() {
  "$PY" - "$DIR" "$@" <<'PYEOF'
import os, re, shutil, sys, zipfile
root, prefix, keep, wheels = sys.argv[1], sys.argv[2], re.compile(sys.argv[3]), sys.argv[4:]
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        for entry in z.infolist():
            rel = entry.filename[len(prefix):]
            if entry.is_dir() or not entry.filename.startswith(prefix) or not keep.search(rel):
                continue
            dst = os.path.join(root, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with z.open(entry) as src, open(dst, "wb") as out:
                shutil.copyfileobj(src, out)
            os.chmod(dst, (entry.external_attr >> 16) & 0o777 or 0o644)
PYEOF
}

fetch() { # fetch WHEEL...: into DIR/wheels
  mkdir -p "$DIR/wheels"
  "$PY" -m pip download --quiet --no-deps --dest "$DIR/wheels" "$@" >&2
}

if [ "$COMPILER_ONLY" = 1 ] && [ ! -f "$DIR/.complete" ] && [ ! -f "$DIR/.compiler" ]; then
  fetch "${COMPILER[@]}"
  unpack nvidia/cu13/ '^(?!.*\.alt\.so)' "$DIR"/wheels/*.whl
  "$DIR/bin/nvcc" --version | grep -q 'release 13.0' || { echo "cuda-toolchain: nvcc is not 13.0" >&2; exit 1; }
  rm -rf "$DIR/wheels"
  touch "$DIR/.compiler"
fi

if [ "$COMPILER_ONLY" = 0 ] && [ ! -f "$DIR/.complete" ]; then
  fetch "${TOOLKIT[@]}"
  unpack nvidia/cu13/ '^(?!.*\.alt\.so)' "$DIR"/wheels/*.whl
  ln -sfn lib "$DIR/lib64"
  # The wheels ship versioned libraries only; the linker's -lcublas wants libcublas.so.
  for f in "$DIR"/lib/lib*.so.*; do
    base="${f##*/}"
    ln -sf "$base" "$DIR/lib/${base%%.so.*}.so"
  done
  # libcuda comes with the driver, never in a wheel. For linking on a machine without one: a
  # stub exporting every cu* entry point of cuda.h, each failing with CUDA_ERROR_NO_DEVICE.
  mkdir -p "$DIR/lib/stubs"
  { grep -ohE '\bcu[A-Z][A-Za-z0-9_]*' "$DIR/include/cuda.h"; printf 'cuProfilerStart\ncuProfilerStop\n'; } |
    sort -u | sed 's/.*/int &(void) { return 100; }/' >"$DIR/lib/stubs/libcuda.c"
  "${CC:-cc}" -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$DIR/lib/stubs/libcuda.so" "$DIR/lib/stubs/libcuda.c"
  "$DIR/bin/nvcc" --version | grep -q 'release 13.0' || { echo "cuda-toolchain: nvcc is not 13.0" >&2; exit 1; }
  rm -rf "$DIR/wheels"
  touch "$DIR/.complete"
fi

# nvdisasm is checked on its own (not through .compiler/.complete), so a tree installed before it
# was added gets it on the next run without downloading the rest again.
if [ ! -x "$DIR/bin/nvdisasm" ]; then
  fetch "$NVDISASM"
  unpack nvidia/cu13/ '^bin/nvdisasm$' "$DIR"/wheels/nvidia_cuda_nvdisasm-*.whl
  rm -rf "$DIR/wheels"
fi

# NCCL keeps its files under nvidia/nccl/; trees made before terse-dist needed it get it here.
if [ "$COMPILER_ONLY" = 0 ] && [ ! -f "$DIR/lib/libnccl.so" ]; then
  fetch "$NCCL"
  unpack nvidia/nccl/ '^(lib/|include/nccl\.h$)' "$DIR"/wheels/nvidia_nccl_cu13-*.whl
  ln -sf libnccl.so.2 "$DIR/lib/libnccl.so"
  rm -rf "$DIR/wheels"
fi

cat <<EOF
export CUDA_ROOT="$DIR" CUDA_HOME="$DIR" CUDA_PATH="$DIR"
export PATH="$DIR/bin:\$PATH"
export CUDA_COMPUTE_CAP="\${CUDA_COMPUTE_CAP:-90}"
EOF
