#!/usr/bin/env bash
# densevm image convert / commit / rebase vs qemu-img on the same inputs, alternated in one
# run (docs/benchmarks.md "### pcow convert, commit, rebase vs qemu-img").
#
#   scripts/bench-convert.sh            (make bench-convert)
#
# Inputs (built once in $DIR, python3 + /dev/urandom):
#   in64.raw   64 MiB, every other 64 KiB cluster random, the rest written zeros
#   in512.raw  512 MiB, 7 of every 8 clusters random, the 8th written zeros
# convert:  densevm image convert -f raw -O pcow   vs  qemu-img convert -f raw -O qcow2, and
#           vs  qemu-img convert -t writeback (qemu-img convert's default cache mode is
#           "unsafe": it never flushes the data it wrote; densevm's convert and -t writeback
#           return with the image durable)
# commit:   base = the 64 MiB input converted; overlay with every 4th cluster written
#           (same bytes in both: pcow through examples/bench_overlay, qcow2 through qemu-io)
#           densevm image commit   vs  qemu-img commit
# rebase:   same base + overlay, rebase onto nothing (flatten, every base cluster copied up)
#           densevm image rebase -b ""   vs  qemu-img rebase -b ""
# Every run starts from fresh copies after a `sync` (so no tool waits for the writeback of
# the previous one's output); only the tool itself is timed. Medians of $RUNS,
# ratio = qemu-img time / densevm time (> 1: densevm faster). Results are checked with qemu-img compare.
set -euo pipefail
DENSEVM=${DENSEVM:-target/release/densevm}
OVERLAY=${OVERLAY:-target/release/examples/bench_overlay}
DIR=${DIR:-build/bench-convert}
RUNS=${RUNS:-7}
mkdir -p "$DIR"
DENSEVM=$(realpath "$DENSEVM")
OVERLAY=$(realpath "$OVERLAY")
cd "$DIR"

make_input() { # FILE MiB ZERO_EVERY ZERO_REM
  [ -f "$1" ] && [ "$(stat -c %s "$1")" = $(($2 << 20)) ] && return
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import os, sys
path, mib, every, rem = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
C = 64 << 10
with open(path + ".part", "wb") as f:
    for i in range(mib * 16):
        f.write(bytes(C) if i % every == rem else os.urandom(C))
os.rename(path + ".part", path)
PY
}
make_input in64.raw 64 2 1
make_input in512.raw 512 8 7

now() { date +%s%N; }
# time_ms CMD... : runs CMD, prints its wall time in ms
time_ms() { local t0 t1; t0=$(now); "$@" >/dev/null; t1=$(now); echo $(((t1 - t0) / 1000)); }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ms() { awk -v u="$1" 'BEGIN {printf "%.1f", u/1000}'; }

declare -A D Q W
ratio() { awk -v d="$1" -v q="$2" 'BEGIN {printf "%.2f", q/d}'; }
row() { # NAME
  local d q w
  d=$(printf '%s\n' ${D[$1]} | median); q=$(printf '%s\n' ${Q[$1]} | median)
  if [ -n "${W[$1]:-}" ]; then
    w=$(printf '%s\n' ${W[$1]} | median)
    printf '| %s | %s ms | %s ms | %s | %s ms | %s |\n' "$1" "$(ms "$d")" "$(ms "$q")" \
      "$(ratio "$d" "$q")" "$(ms "$w")" "$(ratio "$d" "$w")"
  else
    printf '| %s | %s ms | %s ms | %s | (default is durable) | |\n' "$1" "$(ms "$d")" \
      "$(ms "$q")" "$(ratio "$d" "$q")"
  fi
}

# convert
for input in in64.raw in512.raw; do
  for ((r = 0; r < RUNS; r++)); do
    rm -f out.pcow out.qcow2 outw.qcow2; sync
    D[convert $input]+=" $(time_ms "$DENSEVM" image convert -f raw -O pcow "$input" out.pcow)"
    sync
    Q[convert $input]+=" $(time_ms qemu-img convert -f raw -O qcow2 "$input" out.qcow2)"
    sync
    W[convert $input]+=" $(time_ms qemu-img convert -t writeback -f raw -O qcow2 "$input" outw.qcow2)"
  done
  "$DENSEVM" image convert -f pcow -O raw out.pcow back.raw
  cmp -s back.raw "$input" || { echo "bench-convert: pcow round trip of $input differs" >&2; exit 1; }
  rm -f back.raw out.pcow out.qcow2 outw.qcow2
done

# commit / rebase inputs: base + overlay with every 4th 64 KiB cluster rewritten
rm -f base.pcow base.qcow2 ov.pcow ov.qcow2
"$DENSEVM" image convert -f raw -O pcow in64.raw base.pcow
qemu-img convert -f raw -O qcow2 in64.raw base.qcow2
"$DENSEVM" image create -b base.pcow ov.pcow 64M >/dev/null
"$OVERLAY" ov.pcow 4 65536
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 ov.qcow2 64M
cmds=()
for ((i = 0; i < 1024; i += 4)); do cmds+=(-c "write -P $(((i / 4) % 251 + 1)) $((i * 65536)) 64k"); done
qemu-io -f qcow2 "${cmds[@]}" ov.qcow2 >/dev/null
fresh() {
  cp base.pcow b.pcow; cp ov.pcow o.pcow; "$DENSEVM" image rebase -u -b b.pcow o.pcow
  cp base.qcow2 b.qcow2; cp ov.qcow2 o.qcow2; qemu-img rebase -u -b b.qcow2 -F qcow2 o.qcow2
  sync
}
same() { # PCOW QCOW2 WHAT
  "$DENSEVM" image convert -f pcow -O raw "$1" cmp.raw
  qemu-img compare -q -f raw -F qcow2 cmp.raw "$2" || { echo "bench-convert: $3 results differ" >&2; exit 1; }
  rm -f cmp.raw
}
for ((r = 0; r < RUNS; r++)); do
  fresh
  D[commit 1/4 of 64 MiB]+=" $(time_ms "$DENSEVM" image commit o.pcow)"
  sync
  Q[commit 1/4 of 64 MiB]+=" $(time_ms qemu-img commit -q o.qcow2)"
done
same b.pcow b.qcow2 commit
for ((r = 0; r < RUNS; r++)); do
  fresh
  D[rebase -b \"\" (flatten)]+=" $(time_ms "$DENSEVM" image rebase -b "" o.pcow)"
  sync
  Q[rebase -b \"\" (flatten)]+=" $(time_ms qemu-img rebase -q -b "" o.qcow2)"
done
same o.pcow o.qcow2 rebase
rm -f b.* o.*

echo "bench-convert: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), medians of $RUNS (tools alternated)"
echo
echo "| operation | densevm | qemu-img (default) | ratio | qemu-img -t writeback | ratio |"
echo "|---|---|---|---|---|---|"
for k in "convert in64.raw" "convert in512.raw" "commit 1/4 of 64 MiB" "rebase -b \"\" (flatten)"; do row "$k"; done
