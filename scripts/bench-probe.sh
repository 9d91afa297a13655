#!/usr/bin/env bash
# Probe VM start-up and VMM memory overhead, with QEMU's idle VMM in the same run as peer.
# Usage: scripts/bench-probe.sh [RUNS]   (writes build/bench-probe.md and prints it)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-20}"
densevm="${DENSEVM:-target/release/densevm}"
[ -x "$densevm" ] || { echo "bench-probe: build first (make build)" >&2; exit 1; }
[ -r /dev/kvm ] || { echo "bench-probe: /dev/kvm is missing" >&2; exit 1; }
out=build/bench-probe; mkdir -p "$out"

# Each VM idles 2 s, then exits. Its smaps is read from outside at 1.5 s, after the VMM
# dropped its start-up code mappings (crates/vmm/src/text_trim.rs, at 0.5 s): what an idle
# VM holds. The report at exit (--report-json) gives the start-up trace and the figures at
# the exit, after the exit path ran.
# The binary's code pages count in USS by how they came into the page cache (a file just
# written by `cp` or the linker is cached in larger folios and maps in larger pieces: the
# same binary's idle USS measured 580-1840 KiB that way): drop its cached pages, so that
# every run reads it the way a host that booted with it does (readahead).
python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$densevm"
echo "bench-probe: $runs idle 128 MiB probe VMs, 2 s each..." >&2
rm -f "$out"/run-*.json "$out"/smaps-*.txt
for i in $(seq 1 "$runs"); do
  "$densevm" run --memory 128M --probe 'sleep 2000; exit 0' --report-json "$out/run-$i.json" >/dev/null &
  pid=$!
  sleep 1.5
  cat "/proc/$pid/smaps" > "$out/smaps-$i.txt"
  wait "$pid"
  printf '\r  %d/%d' "$i" "$runs" >&2
done
echo >&2

# QEMU 7.2 peer: an idle 128 MiB KVM VM stopped before its first instruction (-S).
qemu_uss=""
if command -v qemu-system-x86_64 >/dev/null; then
  qemu-system-x86_64 -accel kvm -m 128 -nodefaults -display none -S -monitor none &
  qpid=$!
  sleep 2
  qemu_uss=$(awk '/^Private_(Clean|Dirty)/ {s+=$2} END {print s}' "/proc/$qpid/smaps_rollup" 2>/dev/null || true)
  kill "$qpid" 2>/dev/null || true; wait "$qpid" 2>/dev/null || true
fi

python3 - "$out" "$runs" "${qemu_uss:-}" <<'PY'
import json, statistics, sys, glob, datetime
out, runs, qemu = sys.argv[1], int(sys.argv[2]), sys.argv[3]
docs = [json.load(open(f)) for f in glob.glob(f"{out}/run-*.json")]
def idle(path):
    """USS and anonymous KiB of a live smaps, without the guest RAM mappings."""
    uss = anon = 0; guest = False
    for line in open(path):
        head = line.split()
        if not head[0].endswith(":"):
            guest = "memfd:densevm-ram" in line
        elif not guest and head[0] in ("Private_Clean:", "Private_Dirty:"):
            uss += int(head[1])
        elif not guest and head[0] == "Anonymous:":
            anon += int(head[1])
    return uss, anon
live = [idle(f) for f in glob.glob(f"{out}/smaps-*.txt")]
live_uss = statistics.median(u for u, _ in live)
live_anon = statistics.median(a for _, a in live)
def med(key): return statistics.median(d["trace_ms"][key] for d in docs)
first = med("vcpu0_first_entry"); ready = med("vm_ready"); probe = med("probe_start")
uss = statistics.median(d["vmm_overhead"]["uss_kib"] for d in docs)
pss = statistics.median(d["vmm_overhead"]["pss_kib"] for d in docs)
tot = statistics.median(d["uss_kib"] for d in docs)
lines = [
  f"Measured {datetime.date.today()} with `scripts/bench-probe.sh {runs}` (median of {len(docs)} runs, 128 MiB idle probe VM, 1 vCPU):",
  "",
  "| metric | densevm | QEMU 7.2 peer (same run) |",
  "|---|---|---|",
  f"| process start → VM ready | {ready:.2f} ms | |",
  f"| process start → first vCPU entry | {first:.2f} ms | |",
  f"| process start → first probe instruction (guest mark) | {probe:.2f} ms | |",
  f"| VMM USS at idle, 1.5 s after start (process minus guest memory) | {live_uss:.0f} KiB | {qemu + ' KiB (whole process, -S, no guest code run)' if qemu else 'not measured (qemu-system-x86 missing)'} |",
  f"| of which anonymous (heap, stacks, relocated data) | {live_anon:.0f} KiB | |",
  f"| VMM USS at exit (`--report-json`, after the exit path ran) | {uss:.0f} KiB | |",
  f"| VMM PSS at exit | {pss:.0f} KiB | |",
  f"| process USS at exit incl. guest pages touched | {tot:.0f} KiB | |",
]
text = "\n".join(lines) + "\n"
open(f"{out}.md", "w").write(text)
print(text)
PY
