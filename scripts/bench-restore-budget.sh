#!/usr/bin/env bash
# Restoring under a memory budget (issue #13, probe guest on /dev/kvm): one probe VM writes
# 32 MiB that do not compress (each word its address times a constant) and 32 MiB of one
# byte (compresses), then sleeps; its snapshot (64 MiB of data in the memory file) is
# restored without a budget (RAM private over the snapshot's file) and with
# --memory-budget 16M and 8M (RAM of its own, read from the snapshot on first access). Each
# restored guest sums the 64 MiB (both sums checked against the parent's) and exits.
# Reported per restore: wall time, peak VmRSS (sampled every 20 ms), the JSON report's USS
# at the end and the tier's counters. Usage: scripts/bench-restore-budget.sh [DENSEVM]
# Writes $BENCH_RESTORE_OUT (build/bench-restore-budget)/{table.md,*.json,*.err}.
set -euo pipefail
cd "$(dirname "$0")/.."
densevm="${1:-${DENSEVM:-target/release/densevm}}"
[ -x "$densevm" ] || { echo "bench-restore-budget: no densevm binary at $densevm (make build)" >&2; exit 1; }
[ -c /dev/kvm ] || { echo "bench-restore-budget: needs /dev/kvm" >&2; exit 1; }
out="${BENCH_RESTORE_OUT:-build/bench-restore-budget}"
rm -rf "$out"; mkdir -p "$out"
script="fill-addr ram 8M 32M; write ram 40M 32M 0x5a; sleep 60000; sum ram 8M 32M; sum ram 40M 32M; exit 4"
"$densevm" run --memory 96M --timeout 900 --probe "$script" --api-sock "$out/api.sock" > "$out/parent.out" 2>&1 &
parent=$!
trap 'kill $parent 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q 'sleep 60000 ms' "$out/parent.out" && break
  kill -0 $parent 2>/dev/null || break
  sleep 0.5
done
grep -q 'sleep 60000 ms' "$out/parent.out" || { cat "$out/parent.out"; echo "bench-restore-budget: the parent did not get to its sleep" >&2; exit 1; }
"$densevm" vm snapshot --dir "$out/snap" --api-sock "$out/api.sock" >&2
kill $parent; wait $parent 2>/dev/null || true
echo "# $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg), snapshot memory file $(du -m "$out/snap/memory" | cut -f1) MiB" | tee "$out/table.md"
peak() { local m=0 r; while [ -e "/proc/$1" ]; do r=$(awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null || true); [ -n "$r" ] && [ "$r" -gt "$m" ] && m=$r; sleep 0.02; done; echo "$m"; }
{
  echo
  echo "| restore | wall s | peak RSS MiB | USS at end MiB | resident at end MiB | read from the snapshot (missing faults + prefetched) | evicted (clean / compressed / swap) | tier CPU ms |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
} | tee -a "$out/table.md"
sums=""
for mode in plain 16M 8M; do
  extra=()
  [ "$mode" = plain ] || extra=(--memory-budget "$mode")
  s=$(date +%s.%N)
  "$densevm" run --json --timeout 900 --restore "$out/snap" "${extra[@]}" > "$out/$mode.json" 2> "$out/$mode.err" &
  pid=$!
  pk=$(peak $pid)
  rc=0; wait $pid || rc=$?
  e=$(date +%s.%N)
  [ "$rc" = 4 ] || { tail "$out/$mode.err"; echo "bench-restore-budget: restore $mode exited $rc" >&2; exit 1; }
  got=$(grep -o 'sum ram [^=]*= [0-9a-f]*' "$out/$mode.err" | tr '\n' ' ')
  [ -n "$sums" ] || sums=$got
  [ "$got" = "$sums" ] && [ -n "$got" ] || { echo "bench-restore-budget: restore $mode summed '$got', not '$sums'" >&2; exit 1; }
  python3 - "$out/$mode.json" "$mode" "$s" "$e" "$pk" <<'PY' | tee -a "$out/table.md"
import json, sys
d = json.load(open(sys.argv[1])); mode, s, e, pk = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
t = d.get("memory_tier")
name = "plain (private over the snapshot)" if mode == "plain" else f"--memory-budget {mode}"
if t:
    print(f"| {name} | {e - s:.1f} | {pk / 1024:.1f} | {d['uss_kib'] / 1024:.1f} | {t['resident_kib'] / 1024:.1f} | "
          f"{t['missing_faults']} + {t['prefetched']} | {t.get('evicted_clean', 0)} / {t['evicted_compressed']} / {t['evicted_swap']} | {t['service_cpu_us'] / 1000:.0f} |")
else:
    print(f"| {name} | {e - s:.1f} | {pk / 1024:.1f} | {d['uss_kib'] / 1024:.1f} | — | — | — | — |")
PY
done
echo "sums (every restore): $sums" | tee -a "$out/table.md"
