#!/bin/sh
# lab-seconds: 48
# A Linux guest writes a pcow image through persistent memory (issue 5's "later issue":
# --pmem as a virtio-pmem device, /dev/pmem0 through the kernel's virtio_pmem + nd_pmem).
# The image is an overlay on a base that a probe guest filled: Linux must read the base's
# bytes, its writes over them are copied up through the read-only KVM slots, its writes
# past them expand the overlay thinly, and the base stays unchanged.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
tmpfs_workdir /tmp/pmem-linux

densevm image create base.pcow 16M || fail "image create"
timeout 300 densevm run --pmem base.pcow --probe 'write pmem0 0 1M 0x11; exit 0' ||
  fail "probe could not fill the base image"
densevm image create top.pcow 16M -b base.pcow || fail "image create -b"

# In the guest: the first bytes come from the base; then 64 KiB of 'C' over the base
# (copy-up) and 1 MiB of 'E' at 4 MiB (expansion), each flushed.
log=/tmp/pmem-linux.log
run_pmem_guest "$log" top.pcow virtio_pci,virtio_pmem,nd_pmem "$(guest_pmem_script)
echo \"DENSEVM-PMEM-SIZE=\$(cat /sys/block/pmem0/size)\"
first=\$(dd if=/dev/pmem0 bs=4096 count=1 2>/dev/null | od -An -tx1 | head -n 1 | tr -s ' ')
echo \"DENSEVM-PMEM-FIRST=\$first\"
head -c 65536 /dev/zero | tr '\\0' 'C' | dd of=/dev/pmem0 bs=4096 seek=16 conv=notrunc,fsync 2>/dev/null || exit 4
head -c 1048576 /dev/zero | tr '\\0' 'E' | dd of=/dev/pmem0 bs=65536 seek=64 conv=notrunc,fsync 2>/dev/null || exit 5
sync"
[ "$(guest_value "$log" PMEM-SIZE)" = 32768 ] || fail "/dev/pmem0 is not 16 MiB (32768 sectors)"
case "$(guest_value "$log" PMEM-FIRST)" in
  " 11 11 11 11"*) ;;
  *) fail "the guest does not read the base image's bytes" ;;
esac

# The 64 KiB over the base is 8192 8-byte stores; each page costs its copy-up exit and 16
# stale exits before densevm makes the copied-up pages writable in KVM (re-registered
# read-only slots). Without that, every store would exit.
exits=$(json_number "$log.json" guest_write_exits)
cow=$(json_number "$log.json" cow_units)
refreshes=$(json_number "$log.json" refreshes)
echo "write exits $exits, copy-ups $cow, slot refreshes $refreshes, paused $(json_number "$log.json" paused_us) us"
[ "$cow" = 16 ] || fail "expected 16 pages copied up, got '$cow'"
[ -n "$refreshes" ] && [ "$refreshes" -ge 1 ] || fail "the read-only slots were never refreshed"
[ "$exits" -le 2048 ] || fail "$exits write exits for 16 copied-up pages: the slots do not follow the copy-ups"

head -c 16777216 /dev/zero > base.expect
fill base.expect 0 256 021
cp base.expect top.expect
fill top.expect 16 16 103
fill top.expect 1024 256 105
for img in base.pcow top.pcow; do
  densevm image check "$img" || fail "image check $img: exit $?"
done
densevm image convert -f pcow -O raw top.pcow top.raw || fail "convert top"
densevm image convert -f pcow -O raw base.pcow base.raw || fail "convert base"
cmp top.expect top.raw || fail "the overlay does not hold what the guest wrote"
cmp base.expect base.raw || fail "the base image changed"
echo "PASS: Linux reads a base image and writes an overlay through /dev/pmem0"
