#!/bin/sh
# densevm boots the stock Debian kernel in the nested lab (issue 3).
# Checks: PVH boot of the ELF vmlinux with 2 vCPUs reaches init and powers off with exit
# code 0; the bzImage path does the same; two VMs mapping the same vmlinux share its pages.
. "$LAB_SRC/lib/test-lib.sh"
need_cmd densevm
need_file "$GUEST_VMLINUX" "$GUEST_BZIMAGE" "$GUEST_INITRD"
[ -c /dev/kvm ] || fail "/dev/kvm missing in L1"
CMDLINE="console=ttyS0 panic=-1 quiet"

# The guest reports how many CPUs it runs on (init runs this script, then powers off).
CPU_SCRIPT=$(printf 'echo DENSEVM-CPUS=$(grep -c ^processor /proc/cpuinfo)\n' | base64 | tr -d '\n')

boot() { # boot NAME KERNEL : one VM to poweroff, 2 vCPUs
  log="/tmp/$1.log"
  start=$(uptime_s)
  timeout 300 densevm run --kernel "$2" --initrd "$GUEST_INITRD" --memory 256M --cpus 2 \
    --cmdline "$CMDLINE densevm.script=$CPU_SCRIPT" --trace > "$log" 2>&1
  status=$?
  echo "--- $1 (exit $status, $(awk -v a="$start" -v b="$(uptime_s)" 'BEGIN{printf "%.1f", b-a}') s) ---"
  tail -n 20 "$log"
  [ "$status" = 0 ] || fail "$1: densevm exited with $status (124 = timeout)"
  grep -q DENSEVM-GUEST-INIT "$log" || fail "$1: no DENSEVM-GUEST-INIT"
  grep -q 'DENSEVM-CPUS=2' "$log" || fail "$1: the guest does not see 2 CPUs"
  grep -q '^linux_init ' "$log" || fail "$1: no linux_init trace point (init's port 0x502 mark)"
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
# In L1 the files live in the initramfs (ramfs), whose page-cache pages count as
# Shared_Dirty, so "shared" here is RSS minus the private (copied-on-write) pages.
ok=1
for pid in $pids; do
  set -- $(mapping_kb "$pid" "$GUEST_VMLINUX")
  shared=$(( ${1:-0} - ${4:-0} - ${5:-0} ))
  echo "pid $pid vmlinux mapping: rss ${1} kB pss ${2} kB private ${4}+${5} kB shared ${shared} kB"
  awk -v path="$GUEST_VMLINUX" '/^[0-9a-f]+-[0-9a-f]+ / { inside = ($6 == path); if (inside) printf "  %s", $1; next }
    inside && ($1 == "Rss:" || $1 == "Pss:") { printf " %s %s", $1, $2 } inside && $1 == "Private_Dirty:" { printf " Private_Dirty: %s\n", $2 }' "/proc/$pid/smaps"
  [ "$shared" -gt 8192 ] || ok=0
  [ "${2:-0}" -lt "${1:-0}" ] || ok=0
done
for pid in $pids; do kill "$pid"; done
[ "$ok" = 1 ] || fail "vmlinux pages are not shared between the two VMs (need > 8 MiB shared and PSS < RSS)"
echo "PASS: densevm boots the Debian kernel (PVH and bzImage) and shares its pages"
