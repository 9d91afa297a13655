#!/bin/sh
# lab-seconds: 118
# Clones of a running Linux VM with a DAX filesystem on virtio-pmem (issue #11 with --pmem),
# one L1 boot, one L2 boot. A stock Debian L2 boots with --pmem fs.pcow (a pcow image),
# makes ext4 on /dev/pmem0, mounts it with -o dax and runs a shell on its console socket.
#  1. the parent writes `before` (known bytes) and syncs;
#  2. `densevm vm clone --count 2`: fs.pcow becomes the frozen base of one overlay per clone
#     (tpl/pmem0.clone-K.pcow) and of the one the parent goes on in (tpl/pmem0.parent.pcow),
#     the parent's region remapped at the same host address while it is paused;
#  3. each clone reads `before` (same md5), writes its own `mine-K`, syncs (fsync on DAX:
#     virtio-pmem flushes), reads it back;
#  4. the parent overwrites the first 64 KiB of `before` in place (DAX stores into pages its
#     new overlay takes from the frozen base: read-only KVM slots, copy-up) and writes
#     `parent-after`. With DAX a file's data is not in the guest page cache: every read of
#     `before` loads from the VM's own pmem mapping, so each clone must still read the
#     original bytes, the parent its new ones. Directories and inodes are cached in each
#     guest's block-device page cache (its own since the clone), so each VM also unmounts
#     and mounts again, which re-reads them from its image, and lists the directory: the
#     parent must see neither clone's file, each clone neither `parent-after` nor the other
#     clone's file; reading `before` then grows no guest's page cache (DAX still on);
#  5. every VM unmounts and powers off; on L1 the base, the parent's overlay and both clone
#     overlays check clean (densevm image check), the base's bytes (file and guest view) are
#     those taken right after the clone call, e2fsck -fn is clean on the three VMs' images
#     and debugfs finds exactly each VM's files with the right bytes (the base holds the
#     state at the clone point: `before` only).
# Reports the clone call's time, each VM's RSS/PSS (smaps_rollup) with those of its guest RAM
# and base image mappings, and the parent's pmem counters; after step 3 each clone's guest
# RAM PSS must be at most 70% of its RSS (shared with the parent and the other clone).
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_file "$GUEST_INITRD_TOOLS"
need_cmd md5sum awk seq xargs e2fsck debugfs
W=/tmp/pmem-clones
tmpfs_workdir "$W"
N=2
IMG=$W/fs.pcow
densevm image create "$IMG" 64M > /dev/null || fail "densevm image create $IMG 64M"

# What each file holds; the guest writes the same with its busybox seq.
md5_of() { md5sum | cut -d' ' -f1; }
BEFORE_MD5=$(seq 1 200000 | md5_of)
BEFORE2_MD5=$( { head -c 65536 /dev/zero; seq 1 200000 | tail -c +65537; } | md5_of)
AFTER_MD5=$(seq 3000001 3050000 | md5_of)
mine_seq() { echo "$(($1 * 1000000 + 1000001)) $(($1 * 1000000 + 1050000))"; } # clone K: seq range
mine_md5() { seq $(mine_seq "$1") | md5_of; }

GUEST=$(cat <<'EOF'
wait_dev /dev/pmem0
mkfs.ext4 -q -F -b 4096 /dev/pmem0 || { echo "guest: mkfs.ext4 failed"; exit 6; }
mkdir -p /mnt/pm
mount -t ext4 -o dax /dev/pmem0 /mnt/pm || { dmesg | tail -n 5; exit 7; }
mark PMEM-DAX "$(grep ' /mnt/pm ' /proc/mounts | grep -c dax)"
echo READY-FOR-INPUT
while read -r line; do eval "$line"; done
EOF
)
L2_MODULES=virtio_pci,virtio_pmem,nd_pmem,crc32c_generic,ext4
# The VMM's debug log (template steps, read-only slot refreshes) goes into the console
# logs of the parent and, inherited, of the clones: it explains a failure.
export DENSEVM_LOG=warn,densevm=debug,densevm_vmm=debug,densevm_pmem=debug NO_COLOR=1
l2_start "$W/parent.log" "$GUEST_INITRD_TOOLS" "$GUEST_FNS
$GUEST" --pmem "$IMG" --api-sock "$W/api.sock" --console-sock "$W/console.sock"
unset DENSEVM_LOG NO_COLOR
parent=$L2_PID
trap 'kill $parent $(cat "$W"/pids 2>/dev/null) 2>/dev/null' EXIT
wait_for_line_pid "$W/parent.log" READY-FOR-INPUT 600 "$parent" || {
  tail -n 30 "$W/parent.log"; l2_rejected "$W/parent.log"; fail "the parent never got ready"
}
echo "parent: booted to its shell in $(($(cut -d. -f1 /proc/uptime) - L2_START)) s"
[ "$(guest_value "$W/parent.log" PMEM-DAX)" = 1 ] ||
  { grep -iE 'dax|pmem|ext4' "$W/parent.log" | tail; fail "ext4 on /dev/pmem0 is not mounted with dax"; }

# q WHO CMD: runs CMD (no double quotes, no backslashes) in the shell of WHO (parent,
# clone0, clone1) and sets ANS to what it printed. The typed line is echoed by the tty: the
# answer carries text the line does not ($((6*7))), and a tag of its own.
QN=0
q() {
  case $1 in
    parent) _sock=$W/console.sock _log=$W/parent.log ;;
    clone*) _sock=$W/tpl/clone-${1#clone}.console.sock _log=$W/tpl/clone-${1#clone}.console ;;
    *) fail "q: unknown VM $1" ;;
  esac
  QN=$((QN + 1))
  densevm console --sock "$_sock" --send="echo \"@Q$QN \$($2) Q$QN-END@\$((6*7))\"\n" \
    --wait-for="Q$QN-END@42" --console-file "$_log" --timeout 300 ||
    { tail -n 20 "$_log"; vmm_threads "$(vm_pid "$1")"; grep 'ended:' "$W/parent.log"
      fail "$1: no answer within 300 s to: $2"; }
  ANS=$(tr -d '\r' < "$_log" | sed -n "s/.*@Q$QN \(.*\) Q$QN-END@42.*/\1/p" | tail -n 1)
}
# vm_pid WHO: the VMM process of WHO.
vm_pid() {
  case $1 in
    parent) echo "$parent" ;;
    clone*) sed -n "$((${1#clone} + 1))p" "$W/pids" ;;
  esac
}
# expect WHO WHAT EXPECTED CMD: q WHO CMD, and its answer must be EXPECTED.
expect() {
  q "$1" "$4"
  [ "$ANS" = "$3" ] || { tail -n 12 "$_log"; fail "$1: $2: expected '$3', got '$ANS' (from: $4)"; }
  echo "ok: $1: $2"
}
md5cmd() { echo "md5sum < /mnt/pm/$1 | cut -c1-32"; }

# 1. The parent's file from before the clone.
expect parent "writes 'before' and syncs" "$BEFORE_MD5" \
  "seq 1 200000 > /mnt/pm/before && sync && $(md5cmd before)"

# 2. The clones.
t0=$(cut -d' ' -f1 /proc/uptime)
densevm vm clone --api-sock "$W/api.sock" --count $N --dir "$W/tpl" --json > "$W/clone.json" || {
  tail -n 20 "$W/parent.log"; tail -n 5 "$W"/tpl/*.console; fail "clone: $(cat "$W/clone.json")"; }
t1=$(cut -d' ' -f1 /proc/uptime)
json_ms() { sed -n "s/.*\"$1\": *\([0-9][0-9.]*\).*/\1/p" "$W/clone.json" | head -n 1; }
echo "densevm vm clone --count $N: clones running $(json_ms running_ms) ms after the request, answer after $(json_ms ms) ms, $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s with the CLI's start"
# The frozen base as it is right after the clone call: its file's bytes and the guest's view.
base_file_md5=$(md5_of < "$IMG")
densevm image convert -f pcow -O raw "$IMG" "$W/base.raw" || fail "densevm image convert $IMG"
base_view_md5=$(md5_of < "$W/base.raw")
rm -f "$W/base.raw"
sed -n 's/.*"pid": *\([0-9]*\).*/\1/p' "$W/clone.json" > "$W/pids"
[ "$(wc -l < "$W/pids")" = $N ] || fail "expected $N clones: $(cat "$W/clone.json")"
for f in pmem0.parent.pcow pmem0.clone-0.pcow pmem0.clone-1.pcow; do
  [ -f "$W/tpl/$f" ] || fail "clone: no overlay $W/tpl/$f (have: $(ls "$W/tpl" | xargs))"
done
k=0
while [ $k -lt $N ]; do
  pid=$(sed -n "$((k + 1))p" "$W/pids")
  kill -0 "$pid" 2>/dev/null || { tail -n 20 "$W/tpl/clone-$k.console"; grep 'ended:' "$W/parent.log"
    fail "clone $k (pid $pid) is not running"; }
  k=$((k + 1))
done
kill -0 "$parent" 2>/dev/null || { tail -n 20 "$W/parent.log"; fail "the parent ended at the clone"; }
# plain FILE: FILE without carriage returns and terminal colour sequences.
plain() { awk '{ gsub(/\r/, ""); gsub(/\033\[[0-9;]*m/, ""); print }' "$1"; }
plain "$W/parent.log" | grep 'template:' | sed 's/^/  parent| /'

# 3. Each clone reads the parent's file, writes its own.
k=0
while [ $k -lt $N ]; do
  expect clone$k "reads 'before' as the parent wrote it" "$BEFORE_MD5" "$(md5cmd before)"
  expect clone$k "writes 'mine-$k', syncs, reads it back" "$(mine_md5 $k)" \
    "seq $(mine_seq $k) > /mnt/pm/mine-$k && sync && $(md5cmd mine-$k)"
  k=$((k + 1))
done

# Memory: each VM's RSS and PSS (smaps_rollup), its guest RAM mapping (the frozen RAM file,
# shared by all three) and the base image's mapping (its page cache, shared by all three).
# Check (after step 3): the clones' guest RAM is shared, PSS at most 70% of RSS. Not the
# whole process: the pmem pages each VM wrote after the clone (ext4's lazy inode table init
# can run then) are its own.
mem_line() { # mem_line WHAT PID
  set -- "$1" "$2" $(awk '/^Rss:/ { r = $2 } /^Pss:/ { p = $2 } END { print r, p }' "/proc/$2/smaps_rollup")
  set -- "$@" $(mapping_kb "$2" /memfd:densevm-ram | cut -d' ' -f1,2) $(mapping_kb "$2" "$IMG" | cut -d' ' -f1,2)
  echo "  $1 (pid $2): RSS $3 kB, PSS $4 kB; guest RAM RSS $5 kB, PSS $6 kB; base image mapping RSS $7 kB, PSS $8 kB"
  [ "$5" -gt 0 ] || fail "$1: no guest RAM mapping /memfd:densevm-ram in /proc/$2/smaps"
  [ "$1" = parent ] || [ $(($6 * 10)) -le $(($5 * 7)) ] || MEM_FAIL="$MEM_FAIL $1"
}
mem_all() {
  MEM_FAIL=""
  mem_line parent "$parent"
  k=0
  for pid in $(cat "$W/pids"); do
    mem_line "clone $k" "$pid"
    k=$((k + 1))
  done
}

echo "memory after each clone wrote its file:"
mem_all
[ -z "$MEM_FAIL" ] || fail "guest RAM PSS above 70% of its RSS (not shared) in:$MEM_FAIL"

# 4. The parent overwrites 'before' in place and writes a new file.
expect parent "overwrites the first 64 KiB of 'before' in place (fsync)" "$BEFORE2_MD5" \
  "dd if=/dev/zero of=/mnt/pm/before bs=4096 count=16 conv=notrunc,fsync 2>/dev/null && $(md5cmd before)"
expect parent "writes 'parent-after' and syncs" "$AFTER_MD5" \
  "seq 3000001 3050000 > /mnt/pm/parent-after && sync && $(md5cmd parent-after)"
# Isolation. WHO's expected listing, its own file and that file's md5, 'before''s md5.
isolated() { # isolated WHO LISTING OWNFILE OWNMD5 BEFOREMD5
  expect "$1" "reads 'before' (DAX: from its own pmem mapping, no page cache)" "$5" "$(md5cmd before)"
  expect "$1" "unmounts and mounts /dev/pmem0 again (dax)" 1 \
    "cd / && umount /mnt/pm && mount -t ext4 -o dax /dev/pmem0 /mnt/pm && grep ' /mnt/pm ' /proc/mounts | grep -c dax"
  expect "$1" "lists exactly its own files after the remount" "$2" "ls /mnt/pm | xargs"
  # With DAX, reading the 1.2 MiB file must not fill the guest page cache.
  _cached="awk '/^Cached:/ { print \$2 }' /proc/meminfo"
  q "$1" "echo 3 > /proc/sys/vm/drop_caches; a=\$($_cached); m=\$($(md5cmd before)); b=\$($_cached); echo \$m \$((b - a))"
  set -- "$@" $ANS
  [ "$6" = "$5" ] || fail "$1: 'before' after the remount: expected md5 $5, got '$ANS'"
  [ -n "$7" ] && [ "$7" -lt 512 ] || fail "$1: reading 'before' (1259 kB) grew the guest page cache by '$7' kB: not DAX"
  echo "ok: $1: reads 'before' after the remount; the guest page cache grew by $7 kB (DAX)"
  expect "$1" "reads '$3' after the remount" "$4" "$(md5cmd "$3")"
}
isolated parent "before lost+found parent-after" parent-after "$AFTER_MD5" "$BEFORE2_MD5"
k=0
while [ $k -lt $N ]; do
  isolated clone$k "before lost+found mine-$k" "mine-$k" "$(mine_md5 $k)" "$BEFORE_MD5"
  k=$((k + 1))
done
echo "memory after the isolation checks (each guest dropped its caches and remounted):"
mem_all

# 5. Every VM unmounts and powers off.
down() { # down WHO PID
  expect "$1" "unmounts /dev/pmem0" ok "cd / && umount /mnt/pm && echo ok"
  q_sock=$W/console.sock
  [ "$1" = parent ] || q_sock=$W/tpl/clone-${1#clone}.console.sock
  densevm console --sock "$q_sock" --send='poweroff -f\n' || fail "$1: cannot type poweroff"
  _i=0
  while kill -0 "$2" 2>/dev/null && [ $_i -lt 600 ]; do sleep 0.2; _i=$((_i + 1)); done
  kill -0 "$2" 2>/dev/null && fail "$1 (pid $2) still runs 120 s after poweroff -f"
  echo "ok: $1 powered off"
}
k=0
for pid in $(cat "$W/pids"); do
  down clone$k "$pid"
  k=$((k + 1))
done
down parent "$parent"
wait "$parent"
status=$?
[ "$status" = 0 ] || { tail -n 20 "$W/parent.log"; fail "the parent's densevm exited with $status after poweroff"; }
# The VMMs' own warnings are shown; an error or a panic fails the test.
for log in "$W/parent.log" "$W"/tpl/clone-*.console; do
  plain "$log" | grep -E ' (WARN|ERROR) |panicked' | head -n 5 | sed "s/^/  $(basename "$log"): /"
  ! plain "$log" | grep -qE ' ERROR |panicked' || fail "$(basename "$log"): the VMM logged an error (above)"
done
[ -s "$W/parent.log.json" ] && echo "parent pmem counters: guest_write_exits $(json_number "$W/parent.log.json" guest_write_exits), cow_units $(json_number "$W/parent.log.json" cow_units), expansions $(json_number "$W/parent.log.json" expansions), read-only slot refreshes $(json_number "$W/parent.log.json" refreshes)"

# On L1: the images.
[ "$(md5_of < "$IMG")" = "$base_file_md5" ] || fail "the base image file $IMG changed after the clone call"
densevm image convert -f pcow -O raw "$IMG" "$W/base.end.raw" || fail "densevm image convert $IMG (end)"
[ "$(md5_of < "$W/base.end.raw")" = "$base_view_md5" ] || fail "the guest's view of the base image changed after the clone call"
echo "ok: the base image's file and guest view are byte for byte those of right after the clone call"
for img in "$IMG" "$W/tpl/pmem0.parent.pcow" "$W/tpl/pmem0.clone-0.pcow" "$W/tpl/pmem0.clone-1.pcow"; do
  densevm image check "$img" > "$W/check.out" 2>&1 || { cat "$W/check.out"; fail "densevm image check $img: not clean"; }
  echo "ok: densevm image check $(basename "$img") is clean ($(densevm image info "$img" | sed -n 's/^allocated clusters: //p') clusters allocated)"
done
# ls_of RAW: the names in the root directory of the ext4 image RAW (debugfs).
ls_of() { debugfs -R 'ls -p /' "$1" 2>/dev/null | awk -F/ '$6 != "." && $6 != ".." && $6 != "" { print $6 }' | sort | xargs; }
file_md5() { debugfs -R "cat /$2" "$1" 2>/dev/null | md5_of; }
fs_holds() { # fs_holds WHAT RAW LISTING OWNFILE OWNMD5 BEFOREMD5
  [ "$(ls_of "$2")" = "$3" ] || fail "$1: the image's root holds '$(ls_of "$2")', expected '$3'"
  [ "$(file_md5 "$2" before)" = "$6" ] || fail "$1: 'before' in the image has the wrong bytes"
  [ -z "$4" ] || [ "$(file_md5 "$2" "$4")" = "$5" ] || fail "$1: '$4' in the image has the wrong bytes"
  echo "ok: $1: the image holds '$3' with the right bytes"
}
# The base was frozen with the filesystem mounted: replay its journal in a copy first.
cp "$W/base.end.raw" "$W/base.fsck.raw"
e2fsck -fy "$W/base.fsck.raw" > "$W/base.fsck" 2>&1
st=$?
[ $st -le 1 ] || { tail -n 20 "$W/base.fsck"; fail "e2fsck -fy on a copy of the base image: exit $st"; }
fs_holds "base (frozen at the clone)" "$W/base.fsck.raw" "before lost+found" "" "" "$BEFORE_MD5"
densevm image convert -f pcow -O raw "$W/tpl/pmem0.parent.pcow" "$W/parent.raw" || fail "convert the parent's overlay"
e2fsck -fn "$W/parent.raw" > "$W/parent.fsck" 2>&1 || { tail -n 20 "$W/parent.fsck"; fail "e2fsck -fn on the parent's image is not clean"; }
fs_holds parent "$W/parent.raw" "before lost+found parent-after" parent-after "$AFTER_MD5" "$BEFORE2_MD5"
rm -f "$W/parent.raw"
k=0
while [ $k -lt $N ]; do
  densevm image convert -f pcow -O raw "$W/tpl/pmem0.clone-$k.pcow" "$W/clone.raw" || fail "convert clone $k's overlay"
  e2fsck -fn "$W/clone.raw" > "$W/clone.fsck" 2>&1 || { tail -n 20 "$W/clone.fsck"; fail "e2fsck -fn on clone $k's image is not clean"; }
  fs_holds "clone $k" "$W/clone.raw" "before lost+found mine-$k" "mine-$k" "$(mine_md5 $k)" "$BEFORE_MD5"
  rm -f "$W/clone.raw"
  k=$((k + 1))
done
echo "PASS: $N clones of a Linux VM with DAX ext4 on virtio-pmem: each reads the parent's file, writes only its own overlay, the parent only its own, the frozen base unchanged, all images clean"
