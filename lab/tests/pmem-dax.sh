#!/bin/sh
# lab-seconds: 45
# A guest filesystem on DAX pmem backed by a host pcow file (mission item 3: page-cache
# sharing instead of double caching). Linux formats /dev/pmem0 (ext2, 4 KiB blocks), mounts
# it with -o dax, writes and reads an 8 MiB file: with DAX the guest page cache must not
# hold the file (its loads and stores go straight to the host file's pages); mounted again
# without DAX, reading it does fill the guest page cache (the control). The host then finds
# the file's bytes in the image, which checks clean.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
tmpfs_workdir /tmp/pmem-dax
densevm image create fs.pcow 64M || fail "image create"

log=/tmp/pmem-dax.log
run_pmem_guest "$log" fs.pcow virtio_pci,virtio_pmem,nd_pmem,crc32c_generic,ext4 "$(guest_pmem_script)
cached() { awk '/^Cached:/ { print \$2 }' /proc/meminfo; }
mke2fs -b 4096 /dev/pmem0 > /dev/null || exit 4
mkdir -p /mnt
mount -t ext2 -o dax /dev/pmem0 /mnt || { dmesg | tail -n 5; exit 5; }
grep ' /mnt ' /proc/mounts
echo 3 > /proc/sys/vm/drop_caches
c0=\$(cached)
head -c 8388608 /dev/zero | tr '\\0' 'D' > /mnt/file || exit 6
sync
cat /mnt/file > /dev/null; cat /mnt/file > /dev/null
c1=\$(cached)
echo \"DENSEVM-DAX-CACHED-KB=\$((c1 - c0))\"
umount /mnt || exit 7
mount -t ext2 /dev/pmem0 /mnt || exit 8
echo 3 > /proc/sys/vm/drop_caches
c2=\$(cached)
cat /mnt/file > /dev/null
c3=\$(cached)
echo \"DENSEVM-NODAX-CACHED-KB=\$((c3 - c2))\"
umount /mnt || exit 9"
dax=$(guest_value "$log" DAX-CACHED-KB)
nodax=$(guest_value "$log" NODAX-CACHED-KB)
[ -n "$dax" ] && [ -n "$nodax" ] || fail "the guest did not report its page cache growth"
echo "guest page cache growth reading an 8 MiB file: DAX ${dax} kB, without DAX ${nodax} kB"
[ "$dax" -lt 2048 ] || fail "with DAX the guest page cache grew by ${dax} kB (the file is 8192 kB)"
[ "$nodax" -ge 6144 ] || fail "control: without DAX the page cache grew only ${nodax} kB"

densevm image check fs.pcow || fail "image check: exit $?"
densevm image convert -f pcow -O raw fs.pcow fs.raw || fail "convert"
found=$(tr -cd 'D' < fs.raw | wc -c)
[ "$found" -ge 8388608 ] || fail "the image holds only $found of the file's 8388608 bytes"
echo "PASS: a DAX filesystem on /dev/pmem0 bypasses the guest page cache and lands in the pcow image"
