#!/bin/sh
# TEMPLATE for the densevm Linux-boot lab test (issue 3). Move it to lab/tests/ once
# `densevm run --kernel` boots Linux; until then it fails (that is why it lives here).
# Checks: PVH boot of the ELF vmlinux with 2 vCPUs reaches init and powers off with exit
# code 0; the bzImage path does the same; two VMs mapping the same vmlinux share its pages.
. "$LAB_SRC/lib/test-lib.sh"
need_cmd densevm
need_file "$GUEST_VMLINUX" "$GUEST_BZIMAGE" "$GUEST_INITRD"
[ -c /dev/kvm ] || fail "/dev/kvm missing in L1"
CMDLINE="console=ttyS0 panic=-1 quiet"

boot() { # boot NAME KERNEL : one VM to poweroff, 2 vCPUs
  log="/tmp/$1.log"
  start=$(uptime_s)
  timeout 300 densevm run --kernel "$2" --initrd "$GUEST_INITRD" --memory 256M --cpus 2 \
    --cmdline "$CMDLINE" > "$log" 2>&1
  status=$?
  echo "--- $1 (exit $status, $(awk -v a="$start" -v b="$(uptime_s)" 'BEGIN{printf "%.1f", b-a}') s) ---"
  tail -n 20 "$log"
  [ "$status" = 0 ] || fail "$1: densevm exited with $status (124 = timeout)"
  grep -q DENSEVM-GUEST-INIT "$log" || fail "$1: no DENSEVM-GUEST-INIT"
  grep -q 'smpboot: Total of 2 processors activated' "$log" || echo "note: $1: second vCPU not reported (quiet console?)"
}
boot pvh "$GUEST_VMLINUX"
boot bzimage "$GUEST_BZIMAGE"

# Sharing: two held VMs, then the vmlinux mapping's PSS must be well under its RSS.
pids=""
for i in 1 2; do
  densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M --cpus 1 \
    --cmdline "$CMDLINE hold" > "/tmp/share$i.log" 2>&1 &
  pids="$pids $!"
done
for i in 1 2; do
  wait_for_line "/tmp/share$i.log" DENSEVM-GUEST-INIT 300 || fail "share VM $i: no init marker"
done
sleep 2
ok=1
for pid in $pids; do
  set -- $(mapping_kb "$pid" "$GUEST_VMLINUX")
  echo "pid $pid vmlinux mapping: rss ${1} kB pss ${2} kB shared_clean ${3} kB private ${4}+${5} kB"
  [ "${3:-0}" -gt 8192 ] || ok=0
  [ $(( ${2:-0} * 100 / (${1:-0} + 1) )) -lt 80 ] || ok=0
done
for pid in $pids; do kill "$pid"; done
[ "$ok" = 1 ] || fail "vmlinux pages are not shared between the two VMs"
echo "PASS: densevm boots the Debian kernel (PVH and bzImage) and shares its pages"
