#!/usr/bin/env bash
# Runs `xtask gpu-check` on a GPU machine, from the repository root (or any directory holding
# scripts/ and target/gpu/xtask.xz, which `cargo xtask build-gpu` writes on any machine).
#   bash scripts/gpu-check.sh [--out DIR] [--timeout SECONDS] [--retry] [--skip STEP]...
# (TERSE_FLASH_TC=0 in the environment keeps the tensor-core flash kernels out of every step.)
# Unpacks the binary; adds the CUDA libraries of a Python environment with NVIDIA's wheels (a
# torch install: $CUDA_PYTHON, else /opt/torch/.venv, else python3) to LD_LIBRARY_PATH after
# what is there (the driver's libcuda stays where the system put it); refuses in one line when a
# library or a symbol is missing (`ldd -r`, instead of the loader's message before main) or when
# the driver is older than the CUDA 13.0 PTX needs; then runs gpu-check under a time limit.
# --retry sets CUDA_LAUNCH_BLOCKING=1 so a kernel fault names its launch.
# The report is DIR/gpu-check.json (DIR: --out, else $OUT, else ./gpu-check-out), rewritten
# after every group, so a timeout still keeps the rows that ran.
set -uo pipefail
limit=420
blocking=0
skips=()
out="${OUT:-gpu-check-out}"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --timeout) limit="$2"; shift 2 ;;
    --retry) blocking=1; shift ;;
    --skip) skips+=("--skip" "$2"); shift 2 ;;
    *) echo "gpu-check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
fail() { echo "gpu-check.sh: $1" | tee "$out/gpu-check.error"; exit 3; }
xz_bin="target/gpu/xtask.xz"
[ -f "$xz_bin" ] || fail "$xz_bin is missing (run cargo xtask build-gpu and copy it here)"
bin="${TMPDIR:-/tmp}/terse-xtask-$$"
python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$xz_bin" "$bin" \
  || fail "could not unpack $xz_bin"
chmod +x "$bin"
py="${CUDA_PYTHON:-/opt/torch/.venv/bin/python3}"
[ -x "$py" ] || py=python3
sp=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
if [ -n "$sp" ] && [ -d "$sp/nvidia" ]; then
  libs=$(printf '%s:' "$sp"/nvidia/*/lib)
  export LD_LIBRARY_PATH="${libs%:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# -r resolves every symbol now, so a library of the wrong version is named here too.
missing=$(ldd -r "$bin" 2>&1 | awk '/not found/ {print $1, $2, $3}' | sort -u | tr '\n' ';')
[ -z "$missing" ] || fail "missing libraries or symbols: ${missing} (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1 || true
# The kernels are CUDA 13.0 PTX: the driver must be 580 or newer to load them.
driver=$(awk -F', ' 'NR == 1 {print $3}' "$out/gpu.txt")
major="${driver%%.*}"
if [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -lt 580 ]; then
  fail "driver $driver is too old for CUDA 13.0 PTX (needs 580 or newer)"
fi
[ "$blocking" = 1 ] && export CUDA_LAUNCH_BLOCKING=1
export RUST_BACKTRACE=1
# gpu-check skips a step whose estimate would pass its own limit, 20 s inside the kill.
timeout --signal=KILL "$limit" "$bin" gpu-check --out "$out/gpu-check.json" \
  --limit-s "$((limit > 80 ? limit - 20 : 60))" ${skips[@]+"${skips[@]}"} 2>&1 | tee "$out/gpu-check.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 137 ] && echo "gpu-check.sh: gpu-check killed after ${limit} s; the finished rows are in $out/gpu-check.json"
rm -f "$bin"
exit "$rc"
