#!/usr/bin/env bash
# Runs `xtask gpu-check` on a lent GPU machine (the `device` tool's run, from the repository
# root, with target/gpu/xtask.xz carried; `cargo xtask gpu-session` prints the exact call).
#   bash scripts/gpu-check.sh [--timeout SECONDS] [--retry]
# Unpacks the binary, appends the CUDA libraries of the machine's torch venv to the existing
# LD_LIBRARY_PATH (the driver's libcuda stays where the machine put it), refuses in one line
# when a library is missing (instead of the loader's message before main), and runs gpu-check
# under a time limit. --retry sets CUDA_LAUNCH_BLOCKING=1 so a kernel fault names its launch.
# The report lands in $OUT/gpu-check.json (the device tool brings $OUT back), rewritten after
# every parity group, so a timeout still returns the rows that ran.
set -uo pipefail
limit=360
blocking=0
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) limit="$2"; shift 2 ;;
    --retry) blocking=1; shift ;;
    *) echo "gpu-check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
out="${OUT:-/tmp/gpu-out}"
mkdir -p "$out"
xz_bin="target/gpu/xtask.xz"
[ -f "$xz_bin" ] || { echo "gpu-check.sh: $xz_bin is missing (cargo xtask build-gpu, carried)"; exit 3; }
bin=/tmp/terse-xtask
python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$xz_bin" "$bin" \
  || { echo "gpu-check.sh: could not unpack $xz_bin"; exit 3; }
chmod +x "$bin"
py=/opt/torch/.venv/bin/python3
[ -x "$py" ] || py=python3
sp=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
if [ -n "$sp" ] && [ -d "$sp/nvidia" ]; then
  libs=$(printf '%s:' "$sp"/nvidia/*/lib)
  export LD_LIBRARY_PATH="${libs%:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
missing=$(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
if [ -n "$missing" ]; then
  echo "gpu-check.sh: libraries not found: ${missing}(LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})" | tee "$out/gpu-check.error"
  exit 3
fi
[ "$blocking" = 1 ] && export CUDA_LAUNCH_BLOCKING=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
export RUST_BACKTRACE=1
timeout --signal=KILL "$limit" "$bin" gpu-check --out "$out/gpu-check.json" 2>&1 | tee "$out/gpu-check.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 137 ] && echo "gpu-check.sh: gpu-check killed after ${limit} s; the finished rows are in $out/gpu-check.json"
exit "$rc"
