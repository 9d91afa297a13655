#!/usr/bin/env bash
# Clone latency on this host's /dev/kvm with the probe guest (issue #11): from the
# `POST /clones` request to every clone's vCPUs running (the API's `running_us`), for a
# 256 MiB and a 2 GiB guest with a quarter of their RAM touched, so that the figures show
# whether the latency depends on guest RAM. Per size and repetition a fresh parent:
#   first   its first `densevm vm clone --count 1`
#   again   a second call on the same parent, which wrote nothing since (its template reused)
#   batch   one `--count 8` call on a third fresh template (total / 8 and total)
# The round trip of the call (`ms`) is reported too: the parent then still moves its RAM off
# the template (O(its resident RAM)) before it answers.
# Usage: scripts/bench-clone-latency.sh [REPS]  (writes build/bench-clone-latency.md)
set -euo pipefail
cd "$(dirname "$0")/.."
reps="${1:-5}"
densevm="${DENSEVM:-target/release/densevm}"
[ -x "$densevm" ] || { echo "bench-clone-latency: build first (make build)" >&2; exit 1; }
[ -r /dev/kvm ] || { echo "bench-clone-latency: /dev/kvm is missing" >&2; exit 1; }
out=build/bench-clone-latency
rm -rf "$out"; mkdir -p "$out"
pids=()
# Clones are recorded in a file: `clone` runs in a command substitution (a subshell), whose
# changes to `pids` would be lost, and a clone outlives its parent. Left running, each
# clone's sleeping probe wakes its vCPU every 10 ms and slows every later measurement.
clone_pids="$out/clone-pids"
cleanup() {
  for p in "${pids[@]}"; do { kill -9 "$p"; wait "$p"; } 2>/dev/null || true; done
  if [ -f "$clone_pids" ]; then
    while read -r p; do kill -9 "$p" 2>/dev/null || true; done <"$clone_pids"
    while read -r p; do
      for _ in $(seq 1 500); do kill -0 "$p" 2>/dev/null || break; sleep 0.01; done
    done <"$clone_pids"
    rm -f "$clone_pids"
  fi
}
trap cleanup EXIT

# parent SIZE TOUCH NAME: starts a probe parent, waits until it sleeps; sets SOCK.
parent() {
  SOCK="$out/$3.sock"
  "$densevm" run --memory "$1" --timeout 600 --api-sock "$SOCK" \
    --probe "touch $2; sleep 60000; exit 0" >"$out/$3.console" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do
    grep -q "sleep 60000 ms" "$out/$3.console" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "bench-clone-latency: parent $3 did not reach its sleep" >&2; exit 1
}

# clone SOCK DIR COUNT: one clone call; appends "running_ms ms" to $out/results.
clone() {
  local json
  json=$("$densevm" vm clone --api-sock "$1" --count "$3" --dir "$2" --json)
  echo "$json" | sed -n 's/^ *"pid": *\([0-9]*\).*/\1/p' >>"$clone_pids"
  echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["running_ms"], d["ms"])'
}

for size in 256M 2G; do
  touch=$([ "$size" = 256M ] && echo 64M || echo 512M)
  for r in $(seq 1 "$reps"); do
    parent "$size" "$touch" "p-$size-$r"
    echo "$size first $(clone "$SOCK" "$out/t-$size-$r-a" 1)" >>"$out/results"
    echo "$size again $(clone "$SOCK" "$out/t-$size-$r-b" 1)" >>"$out/results"
    cleanup; pids=()
    printf '\r  %s %d/%d' "$size" "$r" "$reps" >&2
  done
  parent "$size" "$touch" "p-$size-batch"
  echo "$size batch8 $(clone "$SOCK" "$out/t-$size-batch" 8)" >>"$out/results"
  cleanup; pids=()
done
echo >&2

python3 - "$out" "$reps" <<'PY'
import statistics, sys, datetime
out, reps = sys.argv[1], sys.argv[2]
rows = {}
for line in open(f"{out}/results"):
    size, kind, running, total = line.split()
    rows.setdefault((size, kind), []).append((float(running), float(total)))
def cell(size, kind):
    v = rows[(size, kind)]
    run = [r for r, _ in v]; tot = [t for _, t in v]
    if len(v) == 1:
        return f"{run[0]:.1f} ({run[0] / 8:.2f} per clone) | {tot[0]:.1f}"
    return (f"{statistics.median(run):.1f} ({min(run):.1f}–{max(run):.1f}) | "
            f"{statistics.median(tot):.1f} ({min(tot):.1f}–{max(tot):.1f})")
lines = [
    f"Measured {datetime.date.today()} with `scripts/bench-clone-latency.sh {reps}` "
    f"(probe guest on this host's /dev/kvm, 1 vCPU, a quarter of RAM touched; median "
    f"(min–max) of {reps} fresh parents):",
    "",
    "| guest RAM | call | clones running, ms | answer (round trip), ms |",
    "|---|---|---:|---:|",
]
for size in ("256M", "2G"):
    for kind, name in (("first", "first clone of a parent"),
                       ("again", "second clone, parent unchanged"),
                       ("batch8", "8 clones in one call")):
        lines.append(f"| {size} | {name} | {cell(size, kind)} |")
f = lambda s, k: statistics.median(r for r, _ in rows[(s, k)])
lines += ["", f"Ratio 2 GiB / 256 MiB of the median time to running: first clone "
          f"{f('2G', 'first') / f('256M', 'first'):.2f}, second clone "
          f"{f('2G', 'again') / f('256M', 'again'):.2f}."]
open(f"{out}.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
