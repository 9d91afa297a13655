#!/bin/sh
# lab-seconds: 147
# lab-cpus: all
# densevm boots the stock Debian kernel in the nested lab (issue 3).
# Checks: PVH boot of the ELF vmlinux with 2 vCPUs reaches init and powers off with exit
# code 0, having found densevm's MP table at 0x9fc00; the bzImage path does the same; with
# `acpi=off` the guest finds its 2 CPUs and the IOAPIC in the MP table alone (its serial
# console works: ISA IRQ 4 on IOAPIC pin 4); two VMs mapping the same vmlinux share its pages,
# through the page cache and, with ksmd on, through KSM (`--merge boot`; `--merge off` is the control).
. "$LAB_SRC/lib/test-lib.sh"
need_cmd densevm
need_file "$GUEST_VMLINUX" "$GUEST_BZIMAGE" "$GUEST_INITRD"
[ -c /dev/kvm ] || fail "/dev/kvm missing in L1"
CMDLINE="console=ttyS0 panic=-1 $L2_KERNEL_ARGS quiet"

# The guest reports how many CPUs it runs on (init runs this script, then powers off).
CPU_SCRIPT=$(printf '%s\n' 'echo DENSEVM-CPUS=$(grep -c ^processor /proc/cpuinfo)' \
  'echo DENSEVM-MPTABLE=$(dmesg | grep -c "found SMP MP-table at .mem 0x0009fc00-")' \
  'echo DENSEVM-IOAPIC=$(dmesg | grep -c "IOAPIC.0.: apic_id 2,")' | base64 | tr -d '\n')

boot() { # boot NAME KERNEL : one VM to poweroff, 2 vCPUs
  log="/tmp/$1.log"
  start=$(uptime_s)
  timeout 600 densevm run --kernel "$2" --initrd "$GUEST_INITRD" --memory 256M --cpus 2 \
    --cmdline "$CMDLINE densevm.script=$CPU_SCRIPT" --trace > "$log" 2>&1
  status=$?
  echo "--- $1 (exit $status, $(awk -v a="$start" -v b="$(uptime_s)" 'BEGIN{printf "%.1f", b-a}') s) ---"
  tail -n 20 "$log"
  [ "$status" = 0 ] || fail "$1: densevm exited with $status (124 = timeout)"
  grep -q DENSEVM-GUEST-INIT "$log" || fail "$1: no DENSEVM-GUEST-INIT"
  grep -q 'DENSEVM-CPUS=2' "$log" || fail "$1: the guest does not see 2 CPUs"
  grep -q '^linux_init ' "$log" || fail "$1: no linux_init trace point (init's port 0x502 mark)"
  grep -q 'DENSEVM-MPTABLE=1' "$log" || fail "$1: the guest did not find the MP table at 0x9fc00"
}
boot pvh "$GUEST_VMLINUX"
boot bzimage "$GUEST_BZIMAGE"

# acpi=off: no MADT, so the CPUs and the IOAPIC come from the MP table; without ACPI the
# guest has no way to power the VM off, so the VM is killed once the guest has reported.
log=/tmp/acpi-off.log
densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M --cpus 2 \
  --cmdline "$CMDLINE acpi=off densevm.script=$CPU_SCRIPT" > "$log" 2>&1 &
off_pid=$!
wait_for_line "$log" DENSEVM-IOAPIC= 600
kill -9 "$off_pid" 2>/dev/null; wait "$off_pid" 2>/dev/null
echo "--- acpi=off ---"; tail -n 4 "$log"
grep -q 'DENSEVM-CPUS=2' "$log" || fail "acpi=off: the guest does not see 2 CPUs (MP table processor entries)"
grep -q 'DENSEVM-MPTABLE=1' "$log" || fail "acpi=off: the guest did not find the MP table"
grep -q 'DENSEVM-IOAPIC=1' "$log" || fail "acpi=off: the guest did not find the IOAPIC (id 2) in the MP table"

# Sharing. Three held VMs on one vmlinux: two with the default `--merge boot`, one with
# `--merge off` as the control. ksmd stays off until the first measurement.
KSM=/sys/kernel/mm/ksm
[ -w "$KSM/run" ] || fail "$KSM/run missing: the L1 kernel lacks KSM (CONFIG_KSM)"
echo 0 > "$KSM/run"
pids=""
for i in 1 2 3; do
  merge=boot; [ "$i" = 3 ] && merge=off
  densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M --cpus 1 \
    --merge "$merge" --cmdline "$CMDLINE hold" > "/tmp/share$i.log" 2>&1 &
  pids="$pids $!"
done
for i in 1 2 3; do
  wait_for_line "/tmp/share$i.log" DENSEVM-GUEST-INIT 600 || fail "share VM $i: no init marker"
done
sleep 2
set -- $pids
pid1=$1 pid2=$2 pid_off=$3
show() { # show LABEL PID: the vmlinux mapping of PID, summed and per VMA
  set -- "$1" "$2" $(mapping_kb "$2" "$GUEST_VMLINUX")
  echo "$1 (pid $2) vmlinux mapping: rss $3 kB pss $4 kB private $6+$7 kB"
  awk -v path="$GUEST_VMLINUX" '/^[0-9a-f]+-[0-9a-f]+ / { inside = ($6 == path); if (inside) printf "  %s", $1; next }
    inside && ($1 == "Rss:" || $1 == "Pss:") { printf " %s %s", $1, $2 } inside && $1 == "Private_Dirty:" { printf " Private_Dirty: %s\n", $2 }' "/proc/$2/smaps"
}
# 1. Page cache: pages the guest never writes stay shared. In L1 the files live in the
#    initramfs (ramfs), whose page-cache pages count as Shared_Dirty, so "shared" here is
#    RSS minus the private (copied-on-write) pages: ~10.5 MiB in every run so far; the bound
#    leaves room because the guest reuses freed kernel-image pages (init memory) as it runs.
ok=1
for pid in $pid1 $pid2; do
  show "page cache only" "$pid"
  set -- $(mapping_kb "$pid" "$GUEST_VMLINUX")
  [ $(( $1 - $4 - $5 )) -gt 4096 ] || ok=0
  [ "$2" -lt "$1" ] || ok=0
done
[ "$ok" = 1 ] || fail "vmlinux pages are not shared between the VMs (need > 4 MiB shared and PSS < RSS)"
# 2. KSM: what each kernel patched or cleared at boot is the same in every VM, so with
#    ksmd on, the `--merge boot` VMs fold those pages together; the control keeps its copies.
scans=$(cat "$KSM/full_scans")
echo 2000 > "$KSM/pages_to_scan"; echo 20 > "$KSM/sleep_millisecs"; echo 1 > "$KSM/run"
waited=0
while [ "$(cat "$KSM/full_scans")" -lt $((scans + 3)) ]; do
  [ "$waited" -lt 300 ] || fail "ksmd did not finish 3 full scans in 300 s"
  sleep 1; waited=$((waited + 1))
done
echo "ksmd: $(($(cat "$KSM/full_scans") - scans)) full scans in ${waited}s, pages_sharing $(cat "$KSM/pages_sharing")"
for pid in $pid1 $pid2; do
  show "merged" "$pid"
  set -- $(mapping_kb "$pid" "$GUEST_VMLINUX")
  [ $(( $2 * 100 )) -le $(( $1 * 55 )) ] || ok=0
  [ $(( ($4 + $5) * 100 )) -le $(( $1 * 20 )) ] || ok=0
done
show "control --merge off" "$pid_off"
set -- $(mapping_kb "$pid_off" "$GUEST_VMLINUX")
[ $(( ($4 + $5) * 100 )) -ge $(( $1 * 50 )) ] || fail "the --merge off VM lost its private kernel pages: is something else merging them?"
echo 0 > "$KSM/run"
for pid in $pids; do kill "$pid"; done
[ "$ok" = 1 ] || fail "with ksmd on, --merge boot VMs must have vmlinux PSS <= 0.55 RSS and <= 20% private"
echo "PASS: densevm boots the Debian kernel (PVH and bzImage) and shares its pages"
