#!/usr/bin/env bash
# ptxas's resource report of every kernel in kernels/*.cu for sm_90 (the H100/H200): registers,
# stack frame, spill stores and loads, shared memory. Any spill or stack frame (local memory)
# fails: a kernel that spills on the target GPU is slower than its design says. Needs nvcc
# (scripts/cuda-toolchain.sh; `cargo xtask build-gpu` runs this after building).
#   bash scripts/ptxas-check.sh [--arch sm_90] [--out FILE]   (the table is printed, and also
#   written to FILE when given)
set -euo pipefail
cd "$(dirname "$0")/.."
arch=sm_90
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "ptxas-check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v nvcc >/dev/null || eval "$(bash scripts/cuda-toolchain.sh --compiler-only)"
# The launch geometry the kernels are compiled for: every `pub const NAME: TYPE = N;` of
# crates/model/src/kernels/geometry.rs as -DTERSE_NAME=N, plus TERSE_GEOMETRY (the rule of
# crates/model/build_geometry.rs, which build.rs follows; a line it cannot read fails here too).
geometry=crates/model/src/kernels/geometry.rs
defines=()
while IFS= read -r line; do
  def=$(sed -n 's/^pub const \([A-Z0-9_]*\): [a-z0-9]* = \([0-9]*\);$/-DTERSE_\1=\2/p' <<<"$line")
  [ -n "$def" ] || { echo "ptxas-check.sh: ${geometry}: \`${line}\` is not \`pub const NAME: TYPE = NUMBER;\`" >&2; exit 2; }
  defines+=("$def")
done < <(grep '^pub const ' "$geometry")
defines+=(-DTERSE_GEOMETRY=1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
{
  printf '%-32s %9s %7s %7s %7s %7s\n' kernel registers stack spill_st spill_ld smem
  for cu in kernels/*.cu; do
    # shellcheck disable=SC2086 # extra flags (e.g. -maxrregcount=16 to see a spill fail it)
    nvcc -arch="$arch" -cubin -O3 -std=c++17 -Xptxas -v ${PTXAS_CHECK_NVCC_FLAGS:-} "${defines[@]}" -o "$tmp/k.cubin" "$cu" \
      >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
    # ptxas prints, per entry: "Compiling entry function 'NAME'", then the stack/spill line,
    # then "Used N registers, ... N bytes smem ...".
    awk -v arch="$arch" '
      /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2) }
      /bytes stack frame/ { stack = $1; spst = $5; spld = $9 }
      /Used [0-9]+ registers/ {
        regs = $5; smem = 0
        if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
        printf "%-32s %9s %7s %7s %7s %7s\n", name, regs, stack, spst, spld, smem
      }' "$tmp/log" >>"$tmp/table"
  done
  sort "$tmp/table"
} >"$tmp/report"
# Printed, and written to --out when given (never by reopening /dev/stdout, which would
# truncate a log file stdout is redirected to).
cat "$tmp/report"
[ -z "$out" ] || cp "$tmp/report" "$out"
# Any non-zero stack frame or spill column fails.
if awk 'NR > 1 && ($3 != 0 || $4 != 0 || $5 != 0) { bad = 1; print "ptxas-check.sh: " $1 " uses local memory (stack " $3 ", spill stores " $4 ", loads " $5 ")" > "/dev/stderr" } END { exit bad }' <(sort "$tmp/table" | sed '1i header'); then
  exit 0
fi
exit 1
