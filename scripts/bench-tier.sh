#!/usr/bin/env bash
# The memory-tiering benchmark (issue #13, process level): a zipfian key-value workload
# all in DRAM, under densevm-tier at DRAM = 1/1..1/4 of the working set, and in a memory
# cgroup limited to the same shares with the kernel's zswap in front of a swap file, all in
# one run (crates/tier/benches/tier_zipf/). Needs root (userfaultfd, cgroup, swapon).
#
# Usage: scripts/bench-tier.sh [tier_zipf options, e.g. --size 256 --secs 15 --warmup 10]
# Writes $BENCH_TIER_OUT (build/bench-tier)/raw.txt (TIERZIPF lines), results.txt (those
# and the table), tier-zipf.svg, and $BENCH_TIER_OUT.md; prints the table.
#
# Host set-up for the kernel's modes, undone on exit whatever happens (trap): a swap file
# in $BENCH_TIER_SWAPDIR (/var/tmp) swapped on, zswap enabled with lz4 (else lzo-rle, else
# the current compressor), a cgroup v1 memory directory; the child of each kernel mode
# joins it and its memory.limit_in_bytes is the share plus a small allowance.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench-tier: needs root (userfaultfd, cgroups, swapon)" >&2; exit 1; }
cargo="${CARGO:-cargo}"
out="${BENCH_TIER_OUT:-build/bench-tier}"
swapdir="${BENCH_TIER_SWAPDIR:-/var/tmp}"
swapfile="$swapdir/densevm-bench-tier.swap"
memcg_root=/sys/fs/cgroup/memory
cg="$memcg_root/densevm-bench-tier-$$"
zs=/sys/module/zswap/parameters
mkdir -p "$out"

echo "bench-tier: building the harness..." >&2
"$cargo" bench -p densevm-tier --bench tier_zipf --no-run -j2 >&2
bin=$("$cargo" bench -p densevm-tier --bench tier_zipf --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "tier_zipf" and m.get("executable"):
        print(m["executable"])')
[ -x "$bin" ] || { echo "bench-tier: no harness binary" >&2; exit 1; }

old_enabled=""; old_comp=""; old_cluster=""; swap_on=0; cg_made=0
cleanup() {
  set +e
  if [ "$cg_made" = 1 ] && [ -d "$cg" ]; then
    # Any straggler goes back to the root cgroup before the directory goes.
    for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do echo "$p" > "$memcg_root/cgroup.procs"; done
    rmdir "$cg" || echo "bench-tier: could not remove $cg" >&2
  fi
  if [ "$swap_on" = 1 ]; then swapoff "$swapfile" || echo "bench-tier: swapoff $swapfile failed" >&2; fi
  rm -f "$swapfile"
  [ -n "$old_cluster" ] && echo "$old_cluster" > /proc/sys/vm/page-cluster
  [ -n "$old_comp" ] && echo "$old_comp" > "$zs/compressor"
  [ -n "$old_enabled" ] && echo "$old_enabled" > "$zs/enabled"
  true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cgroup_args=()
if [ -d "$memcg_root" ] && [ -d "$zs" ] && [ -z "$(tail -n +2 /proc/swaps)" ]; then
  old_enabled=$(cat "$zs/enabled"); old_comp=$(cat "$zs/compressor")
  for c in lz4 lzo-rle "$old_comp"; do
    if echo "$c" > "$zs/compressor" 2>/dev/null; then break; fi
  done
  echo Y > "$zs/enabled"
  # No swap readahead, as usual in front of compressed swap (zram, zswap): with the
  # default 8-page clusters, random swap-ins fill the cgroup with swap cache and its
  # reclaim gives up (OOM kills at 1/2 in trials).
  old_cluster=$(cat /proc/sys/vm/page-cluster); echo 0 > /proc/sys/vm/page-cluster
  rm -f "$swapfile"
  # Room for the whole working set and then some (zswap needs swap slots behind it).
  dd if=/dev/zero of="$swapfile" bs=1M count="${BENCH_TIER_SWAP_MIB:-1024}" status=none
  chmod 600 "$swapfile"
  mkswap "$swapfile" >/dev/null
  swapon "$swapfile"; swap_on=1
  mkdir "$cg"; cg_made=1
  cgroup_args=(--cgroup "$cg")
  echo "bench-tier: swap $swapfile on, zswap $(cat $zs/enabled) $(cat $zs/compressor), page-cluster 0, cgroup $cg" >&2
else
  echo "bench-tier: no cgroup v1 memory controller, no zswap or swap already on: kernel modes skipped" >&2
fi

rm -f "$out/raw.txt"
"$bin" --swap-dir "$swapdir" --out "$out/raw.txt" "${cgroup_args[@]}" "$@" | tee "$out/results.txt"
{
  echo "Measured $(date -u +%Y-%m-%d) with \`make bench-tier\` ($(nproc) cores, $(uname -r)):"
  echo
  grep -v '^TIERZIPF' "$out/results.txt"
} > "$out.md"
python3 scripts/tier-plot.py "$out/raw.txt" "$out/tier-zipf.svg"
echo "bench-tier: results in $out.md, plot in $out/tier-zipf.svg" >&2
