#!/usr/bin/env bash
# (terse: the project copy of ../shared/cuda/setup-toolchain.sh; `cargo xtask cuda-toolchain` runs it.)
# Build-only CUDA 13.0 toolchain from PyPI wheels, for compiling candle's `cuda`
# feature (candle-kernels + cudarc dynamic-linking) on a machine with no GPU.
# Usage: bash setup-toolchain.sh [DIR]   (default DIR: $HOME/.cache/cuda-13.0)
# Idempotent: a second run only prints the exports.  Then: eval "$(bash setup-toolchain.sh)"
set -euo pipefail
ROOT="${1:-$HOME/.cache/cuda-13.0}"
mkdir -p "$ROOT" && ROOT="$(cd "$ROOT" && pwd)"   # exports must be absolute
PY="${PYTHON:-python3}"

# CUDA 13.0 update 2 = PyPI `cuda-toolkit==13.0.2` = what torch 2.11.0 (cu130) pins.
# Keep <= 13.0: the GPU machine's driver 580 is CUDA 13.0 and cannot JIT newer PTX.
PKGS=(
  nvidia-cuda-nvcc==13.0.88    # bin/: nvcc ptxas fatbinary nvlink cudafe++
  nvidia-nvvm==13.0.88         # nvvm/bin/cicc, nvvm/libdevice
  nvidia-cuda-crt==13.0.88     # include/crt/*
  nvidia-cuda-runtime==13.0.96 # cuda.h cuda_runtime.h cuda_fp16.h cuda_bf16.h, libcudart.so.13
  nvidia-cuda-cccl==13.0.85    # include/cccl (cub, thrust, libcu++)
  nvidia-cuda-nvrtc==13.0.88   # libnvrtc.so.13
  nvidia-curand==10.4.0.35     # libcurand.so.10
  nvidia-cublas==13.1.0.3      # libcublas.so.13, libcublasLt.so.13
)

if [ ! -f "$ROOT/.complete" ]; then
  mkdir -p "$ROOT/wheels"
  "$PY" -m pip download --quiet --no-deps --dest "$ROOT/wheels" "${PKGS[@]}" >&2
  # Unpack every wheel's nvidia/cu13/ into ROOT (bin/ include/ lib/ nvvm/), keeping exec bits.
  "$PY" - "$ROOT" "$ROOT"/wheels/*.whl <<'EOF'
import os, shutil, sys, zipfile
root, pre = sys.argv[1], "nvidia/cu13/"
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for i in z.infolist():
            if not i.filename.startswith(pre) or i.is_dir() or ".alt.so" in i.filename:
                continue
            dst = os.path.join(root, i.filename[len(pre):])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with z.open(i) as s, open(dst, "wb") as d:
                shutil.copyfileobj(s, d)
            os.chmod(dst, (i.external_attr >> 16) & 0o777 or 0o644)
EOF
  ln -sfn lib "$ROOT/lib64"
  # Wheels ship only SONAMEs (libcublas.so.13); the linker's -lcublas needs libcublas.so.
  for f in "$ROOT"/lib/lib*.so.*; do b="${f##*/}"; ln -sf "$b" "$ROOT/lib/${b%%.so.*}.so"; done
  # No wheel ships libcuda (it comes with the driver): link against a stub that exports
  # every cu* name in cuda.h, each returning CUDA_ERROR_NO_DEVICE (100). Build use only.
  mkdir -p "$ROOT/lib/stubs"
  { grep -ohE '\bcu[A-Z][A-Za-z0-9_]*' "$ROOT/include/cuda.h"; echo cuProfilerStart; echo cuProfilerStop; } \
    | sort -u | sed 's/.*/int &(void) { return 100; }/' > "$ROOT/lib/stubs/libcuda.c"
  "${CC:-cc}" -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$ROOT/lib/stubs/libcuda.so" "$ROOT/lib/stubs/libcuda.c"
  grep -q 'release 13.0' <<<"$("$ROOT/bin/nvcc" --version)" || { echo "nvcc is not 13.0" >&2; exit 1; }
  rm -rf "$ROOT/wheels"
  touch "$ROOT/.complete"
fi

# NCCL for the data-parallel GPU backend (terse-dist's `nccl` feature links -lnccl). Its wheel
# keeps its files under nvidia/nccl/, not nvidia/cu13/. Added to trees made before it was.
if [ ! -f "$ROOT/lib/libnccl.so" ]; then
  mkdir -p "$ROOT/wheels"
  "$PY" -m pip download --quiet --no-deps --dest "$ROOT/wheels" nvidia-nccl-cu13==2.32.3 >&2
  "$PY" - "$ROOT" "$ROOT"/wheels/nvidia_nccl_cu13-*.whl <<'EOF'
import os, shutil, sys, zipfile
root, pre = sys.argv[1], "nvidia/nccl/"
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        for i in z.infolist():
            name = i.filename
            if i.is_dir() or not (name.startswith(pre + "lib/") or name == pre + "include/nccl.h"):
                continue
            dst = os.path.join(root, name[len(pre):])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with z.open(i) as s, open(dst, "wb") as d:
                shutil.copyfileobj(s, d)
EOF
  ln -sf libnccl.so.2 "$ROOT/lib/libnccl.so"
  rm -rf "$ROOT/wheels"
fi

cat <<EOF
export CUDA_ROOT="$ROOT" CUDA_HOME="$ROOT" CUDA_PATH="$ROOT"
export PATH="$ROOT/bin:\$PATH"
export CUDA_COMPUTE_CAP="\${CUDA_COMPUTE_CAP:-90}"
EOF
