#!/bin/sh
# lab-seconds: 29
# lab-cpus: all
# Lab proof: QEMU 7.2 with KVM inside L1 boots the stock Debian L2 kernel (bzImage)
# with the densevm guest initrd; init must print DENSEVM-GUEST-INIT and power off.
. "$LAB_SRC/lib/test-lib.sh"
need_cmd qemu-system-x86_64
need_file "$GUEST_BZIMAGE" "$GUEST_INITRD"
[ -c /dev/kvm ] || fail "/dev/kvm missing in L1"

log=/tmp/qemu-l2.log
start=$(uptime_s)
timeout 480 qemu-system-x86_64 -enable-kvm -cpu host -smp 2 -m 256 -nodefaults -no-user-config \
  -display none -no-reboot -serial "file:$log" \
  -kernel "$GUEST_BZIMAGE" -initrd "$GUEST_INITRD" \
  -append "console=ttyS0 panic=-1 quiet modules=virtio_pci,9pnet_virtio,virtio_pmem"
status=$?
end=$(uptime_s)
echo "--- L2 serial console ---"
cat "$log"
echo "--- end of L2 console (QEMU status $status, $(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}') s) ---"
[ "$status" = 0 ] || fail "QEMU exited with status $status (124 = timeout)"
grep -q DENSEVM-GUEST-INIT "$log" || fail "L2 init marker DENSEVM-GUEST-INIT not seen"
grep -q DENSEVM-GUEST-MODULES-LOADED "$log" || fail "L2 did not finish loading modules"
if grep -q DENSEVM-GUEST-MODULE-FAILED "$log"; then fail "an L2 module failed to load"; fi
grep -q 'reboot: Power down' "$log" || fail "L2 did not power off cleanly"
echo "PASS: QEMU booted the Debian L2 kernel to init in L1"
