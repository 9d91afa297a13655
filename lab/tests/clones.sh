#!/bin/sh
# lab-seconds: 58
# Fork-on-write clones of a running Linux VM (issue #11), one L1 boot:
# a stock Debian L2 with a writable pcow disk, a read-only raw disk, a 9p share (mounted,
# a file held open), virtio-rng, an API socket and a console socket runs a shell on its
# console. It is paused, snapshotted and
# resumed; then cloned 4 times (`densevm vm clone`). Every clone keeps running and answers
# on its own console (densevm console), writes its own disk overlay (the parent's image and
# the other clones' overlays do not see it), reads the read-only disk and the hwrng, and
# sees a new VMGenID, reads on through the file it had open in the share and writes its own
# file there; the parent keeps running, with its own writes in its own overlay.
# The shared guest RAM: each clone's PSS is well below its RSS.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_cmd md5sum awk od dd
W=/tmp/clones
tmpfs_workdir "$W"
N=4

densevm image create disk.pcow 64M > /dev/null || fail "image create"
head -c 4194304 /dev/urandom > ro.raw
ro_md5=$(md5sum < ro.raw | cut -d' ' -f1)
mkdir share
seq 1 200000 > share/numbers
share_md5=$(md5sum < share/numbers | cut -d' ' -f1)

GUEST=$(cat <<'EOF'
wait_dev /dev/vda /dev/vdb /dev/hwrng
mkdir -p /mnt/share && mount -t 9p -o trans=virtio,version=9p2000.L share /mnt/share || echo MOUNT-FAILED
exec 7< /mnt/share/numbers && read -r first <&7 && echo "SHARE-OPEN-$first"
readid() { dd if=/dev/mem bs=16 skip=$((0xef000 / 16)) count=1 2>/dev/null | od -An -tx1 | tr -d ' \n'; }
echo "PARENT-DISK-$(echo parent-before | dd of=/dev/vda bs=512 seek=8 conv=fsync 2>/dev/null; echo ok)"
(while :; do echo "TICK $(cut -d' ' -f1 /proc/uptime)"; sleep 2; done) &
echo READY-FOR-INPUT
while read -r line; do eval "$line"; done
EOF
)
L2_MODULES=virtio_pci,virtio_blk,virtio_rng,9pnet_virtio,9p
l2_start "$W/parent.log" "$GUEST_INITRD" "$GUEST_FNS
$GUEST" --api-sock "$W/api.sock" --console-sock "$W/console.sock" \
  --disk "$W/disk.pcow" --disk "$W/ro.raw,readonly" --share "$W/share,tag=share" --rng
parent=$L2_PID
trap 'kill $parent $(cat "$W"/pids 2>/dev/null) 2>/dev/null' EXIT
wait_for_line_pid "$W/parent.log" READY-FOR-INPUT 600 "$parent" || {
  tail -n 30 "$W/parent.log"; fail "the guest never got ready"
}
grep -q PARENT-DISK-ok "$W/parent.log" || fail "the parent could not write its disk"
grep -q SHARE-OPEN-1 "$W/parent.log" || fail "the parent could not mount the share and open a file in it"
ask() { # ask SOCK LOG CMD ANSWER: types CMD, waits for ANSWER
  densevm console --sock "$1" --send="$3\n" --wait-for="$4" --console-file "$2" --timeout 120 ||
    { tail -n 15 "$2"; fail "no '$4' after typing '$3' on $1"; }
}
# The typed line is echoed: each answer carries text the line itself does not ($((40+2))).
ask "$W/console.sock" "$W/parent.log" 'echo ID-$(readid)-$((40+2))' -42
parent_id=$(tr -d '\r' < "$W/parent.log" | sed -n 's/^ID-\([0-9a-f]\{32\}\)-42$/\1/p' | tail -n 1)
[ -n "$parent_id" ] && [ "$parent_id" != 00000000000000000000000000000000 ] ||
  fail "the parent has no VMGenID (got '$parent_id')"

# Pause / snapshot / resume through the API.
densevm vm pause --api-sock "$W/api.sock" > /dev/null || fail "pause"
densevm vm info --api-sock "$W/api.sock" --json | grep -q '"Paused"' || fail "info does not say Paused"
densevm vm snapshot --api-sock "$W/api.sock" --dir "$W/snap" --json > "$W/snap.json" ||
  fail "snapshot: $(cat "$W/snap.json")"
densevm vm resume --api-sock "$W/api.sock" > /dev/null || fail "resume"
echo "snapshot of the paused parent: $(json_number "$W/snap.json" ms) ms"

# The clones.
densevm vm clone --api-sock "$W/api.sock" --count $N --dir "$W/tpl" --json > "$W/clone.json" || {
  tail -n 5 "$W"/tpl/*.console; fail "clone: $(cat "$W/clone.json")"; }
echo "densevm vm clone --count $N: $(json_number "$W/clone.json" ms) ms"
sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$W/clone.json" > "$W/pids"
[ "$(wc -l < "$W/pids")" = $N ] || fail "expected $N clones: $(cat "$W/clone.json")"
k=0
while [ $k -lt $N ]; do
  sock="$W/tpl/clone-$k.console.sock"
  log="$W/tpl/clone-$k.console"
  pid=$(sed -n "$((k + 1))p" "$W/pids")
  kill -0 "$pid" 2>/dev/null || { tail "$log"; fail "clone $k (pid $pid) is not running"; }
  ask "$sock" "$log" "echo C$k-\$(echo clone-$k-data | dd of=/dev/vda bs=512 seek=8 conv=fsync 2>/dev/null; echo wrote)" "C$k-wrote"
  ask "$sock" "$log" "echo R$k-\$(md5sum < /dev/vdb | cut -c1-32)-\$(head -c 16 /dev/hwrng | wc -c)" "R$k-$ro_md5-16"
  # fd 7 was opened before the clone: the clone's 9p server restored it and reads on.
  ask "$sock" "$log" "echo S$k-\$(read -r l <&7; echo \$l)-\$(md5sum < /mnt/share/numbers | cut -c1-32)-\$(echo c$k > /mnt/share/from-clone-$k && echo w)" "S$k-2-$share_md5-w"
  ask "$sock" "$log" "echo ID$k-\$(readid)-\$((40+2))" -42
  id=$(tr -d '\r' < "$log" | sed -n "s/^ID$k-\([0-9a-f]\{32\}\)-42\$/\1/p" | tail -n 1)
  [ -n "$id" ] && [ "$id" != "$parent_id" ] || fail "clone $k: VMGenID '$id' is not new (parent $parent_id)"
  [ "$(cat "$W/share/from-clone-$k")" = "c$k" ] || fail "clone $k's file is not in the share"
  echo "clone $k: answers, wrote its disk, read-only disk and hwrng fine, read on through its open share file and wrote one, VMGenID $id"
  k=$((k + 1))
done
ask "$W/console.sock" "$W/parent.log" 'echo P-$(echo parent-after | dd of=/dev/vda bs=512 seek=8 conv=fsync 2>/dev/null; echo wrote)' P-wrote
ask "$W/console.sock" "$W/parent.log" 'echo PID-$(readid)' "PID-$parent_id"
echo "parent: still running, same VMGenID, wrote its disk after the clones"

# Shared RAM: each clone's PSS against its RSS.
for pid in $(cat "$W/pids"); do
  awk -v pid="$pid" '/^Rss:/ { r = $2 } /^Pss:/ { p = $2 } END { printf "clone pid %s: RSS %d kB, PSS %d kB\n", pid, r, p; if (p * 10 > r * 7) exit 1 }' \
    "/proc/$pid/smaps_rollup" || fail "clone $pid: PSS above 70% of RSS: its memory is not shared"
done

kill $parent $(cat "$W/pids") 2>/dev/null
sleep 1
# Each overlay holds its own VM's write; the frozen base holds the parent's write from
# before the clone.
sector8() { densevm image convert -f pcow -O raw "$1" "$W/x.raw" > /dev/null 2>&1 || fail "convert $1"; dd if="$W/x.raw" bs=512 skip=8 count=1 2>/dev/null | tr -d '\0'; rm -f "$W/x.raw"; }
base=$(sector8 "$W/disk.pcow")
[ "$base" = parent-before ] || fail "the frozen base disk.pcow holds '$base', not the parent's write from before the clone"
[ "$(sector8 "$W/tpl/disk0.parent.pcow")" = parent-after ] || fail "the parent's overlay lacks its own write"
k=0
while [ $k -lt $N ]; do
  got=$(sector8 "$W/tpl/disk0.clone-$k.pcow")
  [ "$got" = "clone-$k-data" ] || fail "clone $k's overlay holds '$got'"
  densevm image check "$W/tpl/disk0.clone-$k.pcow" > /dev/null || fail "clone $k's overlay does not check clean"
  k=$((k + 1))
done
echo "disks: base unchanged since the clone, parent and each clone wrote only their own overlay"
echo "PASS: $N clones of a running Linux VM with disks and console, each isolated, parent running"
