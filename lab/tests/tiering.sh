#!/bin/sh
# lab-seconds: 200
# lab-cpus: all
# lab-disk: 1G
# Memory tiering with the stock Debian guest (issue #13), one L1 boot, one L2:
# `densevm run --memory 256M --cpus 2 --memory-budget 128M,...` (a DRAM budget of half its
# RAM) with an API socket. Two vCPUs and `readers=1`: the tier reads swap-file pages in a
# reader thread beside its service thread; the swap file on a scratch disk (direct reads;
# in L1's RAM it would be DRAM outside the budget). The guest's workload fills a tmpfs with
# 48 MiB from /dev/urandom (does not compress: the swap file) and 48 MiB of a repeated line
# (compresses), copies the random file, and checksums everything twice: 144 MiB of live
# data on top of the kernel's own use, over the budget. (Sizes fit the lab's 600 s per
# test under nested TCG.) Checks:
#  - the guest finishes, every checksum agrees, and the compressible file's checksum equals
#    the host's for the same bytes (the data is right, not only stable);
#  - the tier moved pages to both tiers and served them back (GET /memory-tier, and the
#    final JSON report's memory_tier);
#  - guest RAM resident in L1, sampled every second through the API, never exceeds the
#    budget plus the tier's slack (1/32 of it, at least 1 MiB: 4 MiB);
#  - the guest did not set up KVM's async page faults (hidden under a budget);
#  - the VMM maps neither the kernel nor the initrd file (copied into RAM under a budget).
# Then a restore under a budget: L1 snapshots the VM (its files still in the guest's
# tmpfs), kills it and restores the snapshot with `--memory-budget 96M` (RAM of its own,
# read from the snapshot on first access); the restored guest checksums every file again:
# the same sums, pages read from the snapshot and dropped again (clean), resident within
# 96 + 3 MiB.
# Printed: the workload's time, the tier's counters and CPU time, the VMM's peak RSS.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_cmd awk md5sum yes head
W=/tmp/tiering
tmpfs_workdir "$W"
scratch_disk /mnt/tier

GUEST=$(cat <<'EOF'
mkdir -p /mnt/t && mount -t tmpfs -o size=160m tmpfs /mnt/t || { echo "guest: no tmpfs"; exit 3; }
# md5, not sha256, for the 8 sums of 48 MiB (integrity only; the compressible file's sum is
# also compared with L1's for the same bytes): under nested TCG the workload took 144 s
# instead of 168, the restored VM 27 s instead of 37.
sum() { set -- $(md5sum "$1"); echo "$1"; }
t0=$(now)
dd if=/dev/urandom of=/mnt/t/r bs=1M count=48 2>/dev/null || exit 4
yes densevm-tiering-0123456789 | head -c 50331648 > /mnt/t/c || exit 4
r1=$(sum /mnt/t/r); c1=$(sum /mnt/t/c)
cp /mnt/t/r /mnt/t/r2 || exit 4
r2=$(sum /mnt/t/r2); r3=$(sum /mnt/t/r); c2=$(sum /mnt/t/c)
mark R1 "$r1"; mark R2 "$r2"; mark R3 "$r3"; mark C1 "$c1"; mark C2 "$c2"
mark WORKLOAD-S "$(awk "BEGIN { print $(now) - $t0 }")"
# The vector of KVM's "page ready" interrupts is set up only with async page faults.
mark APF "$(grep -c HYP: /proc/interrupts)"
[ "$r1" = "$r2" ] && [ "$r1" = "$r3" ] && [ "$c1" = "$c2" ] || { echo "guest: checksums differ"; exit 5; }
# L1 snapshots the VM now and restores it; the restored guest wakes up here.
mark SNAP-READY 1
sleep 10
mark R4 "$(sum /mnt/t/r2)"; mark R5 "$(sum /mnt/t/r)"; mark C4 "$(sum /mnt/t/c)"
EOF
)
L2_MEM=256M
l2_start "$W/vm.log" "$GUEST_INITRD" "$GUEST_FNS
$GUEST" --api-sock "$W/api.sock" --cpus 2 --memory-budget 128M,swap_dir=/mnt/tier,readers=1
vm=$L2_PID
trap 'kill $vm 2>/dev/null' EXIT
# sample SOCK LOG UNTIL: samples guest RAM resident (the tier's own figure, peak_res) and
# the VMM's RSS (peak_rss) every second until the VM ends or LOG has the line UNTIL; the
# last sample stays in $W/t.json.
sample() {
  peak_res=0 peak_rss=0 samples=0
  while kill -0 "$L2_PID" 2>/dev/null; do
    if densevm vm memory-tier --api-sock "$1" --json > "$W/t.json.new" 2>/dev/null; then
      mv "$W/t.json.new" "$W/t.json"
      res=$(json_number "$W/t.json" resident_kib)
      [ -n "$res" ] && [ "$res" -gt "$peak_res" ] && peak_res=$res
      samples=$((samples + 1))
    fi
    rss=$(awk '$1 == "Rss:" { print $2 }' "/proc/$L2_PID/smaps_rollup" 2>/dev/null)
    [ -n "$rss" ] && [ "$rss" -gt "$peak_rss" ] && peak_rss=$rss
    l2_follow "$2"
    grep -q "$3" "$2" && break
    [ "$(($(cut -d. -f1 /proc/uptime) - L2_START))" -lt 480 ] || break
    sleep 1
  done
}
# n FILE KEY: a counter from FILE, a GET /memory-tier answer or a JSON report's memory_tier.
n() {
  tr -d '\n ' < "$1" | sed 's/.*"memory_tier":{//' | grep -o "\"$2\":[0-9]*" | head -n 1 | cut -d: -f2
}

sample "$W/api.sock" "$W/vm.log" DENSEVM-SNAP-READY
log=$W/vm.log
grep -q DENSEVM-SNAP-READY "$log" || { l2_wait "$log" "tiered guest" 500; fail "the guest never got to its snapshot point"; }
want_c=$(yes densevm-tiering-0123456789 | head -c 50331648 | md5sum | cut -d' ' -f1)
[ "$(guest_value "$log" C1)" = "$want_c" ] ||
  fail "the compressible file's checksum in the guest ($(guest_value "$log" C1)) is not the host's ($want_c)"
[ -n "$(guest_value "$log" R1)" ] || fail "the guest printed no checksum"
# A booted VM under a budget hides KVM's async page faults (docs/tiering.md, "KVM").
[ "$(guest_value "$log" APF)" = 0 ] || fail "the guest under a budget has the vector of async page faults (HYP: in /proc/interrupts)"
# Under a budget the kernel and initrd are copied into guest RAM: the VMM maps neither file
# (the guest's writes to a mapped image would be its memory outside the budget).
for f in "$GUEST_VMLINUX" "$GUEST_INITRD"; do
  ! grep -qF " $(readlink -f "$f")" "/proc/$vm/maps" || fail "the VMM under a budget maps $f: guest memory outside the budget"
done
echo "ok: no boot image mapped from its file under a budget"
echo "workload: $(guest_value "$log" WORKLOAD-S) s; $samples samples, peak guest RAM resident $((peak_res / 1024)) MiB, peak VMM RSS $((peak_rss / 1024)) MiB"
tr -d '\n' < "$W/t.json"; echo
[ "$(n "$W/t.json" evicted_swap)" -gt 0 ] || fail "no page went to the swap file"
[ "$(n "$W/t.json" evicted_compressed)" -gt 0 ] || fail "no page was compressed"
[ "$(n "$W/t.json" missing_faults)" -gt 0 ] || fail "no page came back"
[ "$(n "$W/t.json" swap_reads_behind)" -gt 0 ] || fail "no swap-file page was read by the tier's reader thread"
[ "$samples" -ge 5 ] || fail "only $samples samples of GET /memory-tier"
limit=$(((128 + 4) * 1024))
[ "$peak_res" -le "$limit" ] || fail "guest RAM resident peaked at $peak_res KiB, over the budget + slack ($limit KiB)"
echo "ok: tiered guest (budget 128 MiB of 256) finished its workload with correct checksums"

# ---- snapshot, then a restore under a budget ------------------------------------------
densevm vm pause --api-sock "$W/api.sock" > /dev/null || fail "pause"
densevm vm snapshot --api-sock "$W/api.sock" --dir "$W/snap" --json > "$W/snap.json" || fail "snapshot: $(cat "$W/snap.json")"
kill -9 "$vm"; wait "$vm" 2> /dev/null
echo "ok: snapshot of the tiered VM ($(json_number "$W/snap.json" ms) ms, $(du -m "$W/snap/memory" | cut -f1) MiB in its memory file)"
log=$W/restored.log
: > "$log"
densevm run --restore "$W/snap" --memory-budget 96M --api-sock "$W/api2.sock" --json > "$log.json" 2> "$log" &
L2_PID=$! L2_LINES=0 L2_START=$(cut -d. -f1 /proc/uptime)
vm=$L2_PID
sample "$W/api2.sock" "$log" DENSEVM-GUEST-EXIT
l2_wait "$log" "restored tiered guest" 300
for k in R4 R5; do
  [ "$(guest_value "$log" $k)" = "$(guest_value "$W/vm.log" R1)" ] ||
    fail "restored: $k = '$(guest_value "$log" $k)', not the random file's sum before the snapshot"
done
[ "$(guest_value "$log" C4)" = "$want_c" ] || fail "restored: the compressible file's sum is '$(guest_value "$log" C4)'"
echo "restored: $samples samples, peak guest RAM resident $((peak_res / 1024)) MiB, peak VMM RSS $((peak_rss / 1024)) MiB"
tr -d '\n ' < "$log.json" | grep -o '"memory_tier":{[^}]*}' || fail "no memory_tier in the restored VM's JSON report"
[ "$(n "$log.json" missing_faults)" -gt 0 ] || fail "restored: no page was read from the snapshot"
# The restored guest only reads its files: pages leave RAM for nothing (the snapshot has them).
[ "$(n "$log.json" evicted_clean)" -gt 0 ] || fail "restored: no clean page left RAM under the budget"
limit=$(((96 + 3) * 1024))
[ "$peak_res" -le "$limit" ] || fail "restored: guest RAM resident peaked at $peak_res KiB, over the budget + slack ($limit KiB)"
echo "PASS: tiered guest (budget 128 MiB of 256) and its restore under a 96 MiB budget: correct checksums, within budget"
