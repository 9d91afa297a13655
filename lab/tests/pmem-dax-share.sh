#!/bin/sh
# lab-seconds: 70
# Two VMs share one filesystem image through the host page cache (mission item 3). A first
# VM puts an ext2 filesystem with an 8 MiB file into base.pcow. Two VMs then boot with
# overlays on that base, mount their /dev/pmem0 read-only with -o dax, read the file and
# stay up. Checks: neither guest page cache holds the file; in each VMM the base image's
# mapping has the file resident with PSS about half its RSS (one host copy for both VMs).
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
dir=/tmp/pmem-dax-share
tmpfs_workdir "$dir"
MODULES=virtio_pci,virtio_pmem,nd_pmem,crc32c_generic,ext4
b64() { base64 | tr -d '\n'; }

densevm image create base.pcow 64M || fail "image create"
run_pmem_guest /tmp/mkfs.log base.pcow "$MODULES" "$(guest_pmem_script)
mke2fs -b 4096 /dev/pmem0 > /dev/null || exit 4
mkdir -p /mnt && mount -t ext2 -o dax /dev/pmem0 /mnt || exit 5
head -c 8388608 /dev/zero | tr '\\0' 'B' > /mnt/file || exit 6
umount /mnt || exit 7"

READ_FILE=$( (guest_pmem_script; cat <<'SH'
mkdir -p /mnt && mount -t ext2 -o dax,ro /dev/pmem0 /mnt || exit 3
c0=$(awk '/^Cached:/ { print $2 }' /proc/meminfo)
cat /mnt/file > /dev/null || exit 4
c1=$(awk '/^Cached:/ { print $2 }' /proc/meminfo)
echo "DENSEVM-DAX-CACHED-KB=$((c1 - c0))"
SH
) | b64)
pids=""
for i in 1 2; do
  densevm image create "top$i.pcow" 64M -b base.pcow > /dev/null || fail "image create top$i"
  densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M --pmem "top$i.pcow" \
    --cmdline "console=ttyS0 panic=-1 $L2_KERNEL_ARGS quiet hold modules=$MODULES densevm.script=$READ_FILE" \
    > "/tmp/share$i.log" 2>&1 &
  pids="$pids $!"
done
for i in 1 2; do
  wait_for_line "/tmp/share$i.log" DENSEVM-GUEST-HOLD 600 || { tail -n 20 "/tmp/share$i.log"; fail "VM $i did not finish its read"; }
  grep -q 'DENSEVM-GUEST-EXIT=0' "/tmp/share$i.log" || { tail -n 20 "/tmp/share$i.log"; fail "VM $i: the read script failed"; }
done
ok=1
i=1
for pid in $pids; do
  cached=$(guest_value "/tmp/share$i.log" DAX-CACHED-KB)
  set -- $(mapping_kb "$pid" "$dir/base.pcow")
  echo "VM $i: guest page cache change ${cached} kB; base.pcow mapping rss $1 kB pss $2 kB"
  [ "${cached:-99999}" -lt 2048 ] || ok=0
  [ "$1" -ge 8192 ] || ok=0
  [ $(( $2 * 100 )) -le $(( $1 * 60 )) ] || ok=0
  i=$((i + 1))
done
for pid in $pids; do kill "$pid"; done
[ "$ok" = 1 ] || fail "need: guest page cache < 2 MiB, base mapping RSS >= 8 MiB and PSS <= 0.6 RSS in each VM"
echo "PASS: two VMs read one DAX filesystem image from one host copy, with no guest page cache"
