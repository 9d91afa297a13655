#!/bin/sh
# A Linux guest writes a pcow image through persistent memory (issue 5's "later issue":
# --pmem as an e820 type-12 range, /dev/pmem0 through the kernel's nd_e820 + nd_pmem).
# The image is an overlay on a base that a probe guest filled: Linux must read the base's
# bytes, its writes over them are copied up through the read-only KVM slots, its writes
# past them expand the overlay thinly, and the base stays unchanged.
. "$LAB_SRC/lib/test-lib.sh"
need_cmd densevm
need_file "$GUEST_VMLINUX" "$GUEST_INITRD"
[ -c /dev/kvm ] || fail "/dev/kvm missing in L1"
dir=/tmp/pmem-linux
mkdir -p "$dir" && mount -t tmpfs tmpfs "$dir" || fail "cannot mount a tmpfs on $dir"
cd "$dir" || fail "cd $dir"

densevm image create base.pcow 16M || fail "image create"
timeout 120 densevm run --pmem base.pcow --probe 'write pmem0 0 1M 0x11; exit 0' ||
  fail "probe could not fill the base image"
densevm image create top.pcow 16M -b base.pcow || fail "image create -b"

# In the guest: the first bytes come from the base; then 64 KiB of 'C' over the base
# (copy-up) and 1 MiB of 'E' at 4 MiB (expansion), each flushed.
GUEST_SCRIPT=$(cat <<'SH' | base64 | tr -d '\n'
i=0; while [ ! -b /dev/pmem0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ -b /dev/pmem0 ] || { echo "no /dev/pmem0"; grep -i persist /proc/iomem; dmesg | grep -i -E 'e820|pmem|nvdimm|nd_|pram' | tail -n 20; exit 3; }
echo "DENSEVM-PMEM-SIZE=$(cat /sys/block/pmem0/size)"
first=$(dd if=/dev/pmem0 bs=4096 count=1 2>/dev/null | od -An -tx1 | head -n 1 | tr -s ' ')
echo "DENSEVM-PMEM-FIRST=$first"
head -c 65536 /dev/zero | tr '\0' 'C' | dd of=/dev/pmem0 bs=4096 seek=16 conv=notrunc,fsync 2>/dev/null || exit 4
head -c 1048576 /dev/zero | tr '\0' 'E' | dd of=/dev/pmem0 bs=65536 seek=64 conv=notrunc,fsync 2>/dev/null || exit 5
sync
exit 0
SH
)
log=/tmp/pmem-linux.log
timeout 300 densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M \
  --pmem top.pcow --cmdline "console=ttyS0 panic=-1 quiet modules=nd_e820,nd_pmem densevm.script=$GUEST_SCRIPT" \
  > "$log" 2>&1
status=$?
grep -E 'DENSEVM|pmem|nd_|e820' "$log" | head -n 30
[ "$status" = 0 ] || { tail -n 30 "$log"; fail "densevm exited with $status"; }
grep -q 'DENSEVM-GUEST-EXIT=0' "$log" || fail "the guest script failed"
grep -q 'DENSEVM-PMEM-SIZE=32768' "$log" || fail "/dev/pmem0 is not 16 MiB (32768 sectors)"
grep -q 'DENSEVM-PMEM-FIRST= 11 11 11 11' "$log" || fail "the guest does not read the base image's bytes"

fill() { # fill FILE OFFSET LEN OCTAL (4 KiB units)
  head -c "$(($3 * 4096))" /dev/zero | tr '\0' "\\$4" |
    dd of="$1" bs=4096 seek="$2" conv=notrunc 2>/dev/null || fail "dd into $1"
}
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
