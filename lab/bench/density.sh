#!/bin/sh
# lab-mem: 1G
# Density benchmark (issue #12), run inside L1 by `make bench-density` (lab/run
# lab/bench/density.sh; the line above gives L1 1 GiB unless LAB_MEM says otherwise):
# how many idle 256 MiB VMs running the same workload one L1 holds before it runs out of
# memory, QEMU 7.2 with free page reporting against the densevm fleet, in the same L1.
#
# Every VM: the Debian L2 kernel (vmlinux, PVH), 256 MiB, 1 vCPU, modules virtio_pci and
# virtio_balloon, and the same guest script: write 64 MiB (a pattern) into a tmpfs, print
# its md5 (WORK-DONE-md5), delete it, then tick on its console every 5 s (TICK n).
#   qemu     qemu-system-x86_64 -enable-kvm -cpu host -m 256 -device
#            virtio-balloon-pci,free-page-reporting=on, booted one after another.
#   densevm  `densevm fleet serve` (--low-watermark FLOOR+64M --high-watermark FLOOR+192M
#            --idle-cpu-pct 5): one VM is booted through the fleet to the script's
#            READY-FOR-GO, snapshotted (full) through its API socket and deleted; then each
#            VM is `fleet create --restore` of that snapshot (sharing its memory file
#            copy-on-write, with the fleet's balloon: free page reporting, deflate on OOM,
#            statistics) and starts the workload when "go" is typed on its console.
# VMs are started one at a time; after each one's WORK-DONE (checked against the md5) and
# $BENCH_DENSITY_SETTLE_S s (free page reporting), L1's MemAvailable and the PSS of every
# VMM process are read. A VMM "holds" N VMs when MemAvailable is still >= the floor
# ($BENCH_DENSITY_FLOOR_MIB, 256) after the N-th VM settled, the N VMs all tick on their
# consoles afterwards, and no start failed; the run stops at the first VM that brings
# MemAvailable under the floor, fails to start or finish its workload, or at the cap.
# QEMU runs first; densevm's cap is BENCH_DENSITY_DENSEVM_MAX, by default 6x QEMU's count
# (the goal is 3x; each densevm VM costs L1 CPU under TCG). Output: a markdown table and
# "DENSITY vmm n avail_mib pss_sum_mib" lines, n = 0 before the VMM's first VM (densevm's
# includes its template snapshot on L1's tmpfs from n = 1 on); scripts/density-plot.py
# draws them.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_cmd qemu-system-x86_64 awk md5sum yes head
FLOOR=${BENCH_DENSITY_FLOOR_MIB:-256}
SETTLE=${BENCH_DENSITY_SETTLE_S:-4}
QEMU_MAX=${BENCH_DENSITY_QEMU_MAX:-30}
VMMS=${BENCH_DENSITY_VMMS:-qemu densevm}
BOOT_TIMEOUT=${BENCH_DENSITY_BOOT_TIMEOUT:-300}
W=/tmp/density
tmpfs_workdir "$W"
S=$W/fleet.sock
ST=$W/s
KSM=/sys/kernel/mm/ksm
[ -w "$KSM/run" ] && echo 0 > "$KSM/run"

avail_mib() { awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo; }
pss_kb() { awk '$1 == "Pss:" { print $2 }' "/proc/$1/smaps_rollup" 2>/dev/null; }
note() { echo "# $*"; }
ticks() { tr -d '\r' < "$1" 2>/dev/null | grep -c '^TICK [0-9]'; }

GUEST=$(cat <<'EOF'
grep -q density.wait /proc/cmdline && { echo READY-FOR-GO; read -r go; }
mkdir -p /mnt/t && mount -t tmpfs -o size=100m tmpfs /mnt/t || echo WORK-FAILED-mount
yes DENSEVM-DENSITY | head -c 67108864 > /mnt/t/f || echo WORK-FAILED-write
echo "WORK-DONE-$(md5sum < /mnt/t/f | cut -c1-32)"
rm /mnt/t/f
i=0; while :; do i=$((i + 1)); echo "TICK $i"; sleep 5; done
EOF
)
B64=$(printf '%s\n' "$GUEST" | gzip -9 | base64 | tr -d '\n')
CMDLINE="console=ttyS0 panic=-1 quiet modules=virtio_pci,virtio_balloon densevm.script=$B64"
expected=$(yes DENSEVM-DENSITY | head -c 67108864 | md5sum | cut -c1-32)

# wait_done LOG PID: waits for the workload's WORK-DONE on LOG; 1 when it fails or the
# process PID ends.
wait_done() {
  _end=$(($(cut -d. -f1 /proc/uptime) + BOOT_TIMEOUT))
  while ! grep -q -e WORK-DONE- -e WORK-FAILED "$1" 2>/dev/null; do
    kill -0 "$2" 2>/dev/null || { note "pid $2 ended: $(tail -n 3 "$1" | tr -d '\r' | tr '\n' '|')"; return 1; }
    [ "$(cut -d. -f1 /proc/uptime)" -lt $_end ] || { note "no WORK-DONE within ${BOOT_TIMEOUT}s: $(tail -n 3 "$1" | tr -d '\r' | tr '\n' '|')"; return 1; }
    sleep 0.5
  done
  _got=$(tr -d '\r' < "$1" | sed -n 's/^WORK-DONE-\([0-9a-f]\{32\}\)$/\1/p' | tail -n 1)
  [ "$_got" = "$expected" ] || { note "wrong workload output '$_got' (expected $expected): $(grep WORK "$1" | tr -d '\r')"; return 1; }
}

# all_tick LOG...: every console gains a TICK line within 15 s.
all_tick() {
  _before=""
  for l in "$@"; do _before="$_before $(ticks "$l")"; done
  sleep 15
  _k=1
  for l in "$@"; do
    _b=$(echo $_before | cut -d' ' -f$_k)
    [ "$(ticks "$l")" -gt "$_b" ] || { note "$l stopped ticking at $_b: $(tail -n 2 "$l" | tr -d '\r' | tr '\n' '|')"; return 1; }
    _k=$((_k + 1))
  done
}

echo "# density: $(date -u +%Y-%m-%dT%H:%MZ), L1 $(nproc) vCPUs, MemTotal $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) MiB, MemAvailable $(avail_mib) MiB, floor $FLOOR MiB, ksmd off, kernel $GUEST_KERNEL_RELEASE"
status=0
QEMU_COUNT=""
RESULTS=$W/results.md
: > "$RESULTS"

run_qemu() {
  pids="" logs="" n=0 count=0 why="cap ($QEMU_MAX)"
  echo "DENSITY qemu 0 $(avail_mib) 0"
  while [ $n -lt $QEMU_MAX ]; do
    n=$((n + 1))
    log=$W/q$n.log
    qemu-system-x86_64 -enable-kvm -cpu host -smp 1 -m 256 -nodefaults -no-user-config -display none \
      -no-reboot -serial "file:$log" -kernel "$GUEST_VMLINUX" -initrd "$GUEST_INITRD" -append "$CMDLINE" \
      -device virtio-balloon-pci,free-page-reporting=on > "$log.err" 2>&1 &
    pid=$!
    t0=$(uptime_s)
    wait_done "$log" $pid || { why="VM $n did not finish its workload: $(cat "$log.err")"; kill $pid 2>/dev/null; break; }
    sleep "$SETTLE"
    pids="$pids $pid" logs="$logs $log"
    a=$(avail_mib)
    pss=0; for p in $pids; do pss=$((pss + $(pss_kb $p))); done
    echo "DENSITY qemu $n $a $((pss / 1024))"
    note "qemu VM $n: workload done $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.0f", b - a }') s after launch; MemAvailable $a MiB; PSS of all QEMU processes $((pss / 1024)) MiB"
    [ "$a" -ge "$FLOOR" ] || { why="VM $n brought MemAvailable to $a MiB, under the floor"; break; }
    count=$n last_pss=$pss
  done
  # shellcheck disable=SC2086
  if [ $count -gt 0 ] && ! all_tick $(echo $logs | cut -d' ' -f1-$count); then
    why="$why; and a VM stopped answering"; status=1
  fi
  note "qemu holds $count VMs (stopped: $why)"
  echo "| QEMU 7.2, virtio-balloon-pci free-page-reporting=on | $count | $(( ${last_pss:-0} / 1024 / (count > 0 ? count : 1) )) | $why |" >> "$RESULTS"
  QEMU_COUNT=$count
  # shellcheck disable=SC2086
  kill $pids 2>/dev/null
  sleep 5
}

run_densevm() {
  max=${BENCH_DENSITY_DENSEVM_MAX:-$(( ${QEMU_COUNT:-10} * 6 ))}
  [ "$max" -ge 1 ] || max=40
  echo "DENSITY densevm 0 $(avail_mib) 0"
  densevm --log densevm_fleet=info fleet serve --sock "$S" --state-dir "$ST" \
    --low-watermark $((FLOOR + 64))M --high-watermark $((FLOOR + 192))M --idle-cpu-pct 5 > "$W/fleet.log" 2>&1 &
  fleetd=$!
  i=0
  until densevm fleet list --sock "$S" > /dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 100 ] || { cat "$W/fleet.log"; fail "the fleet daemon does not answer"; }
    sleep 0.2
  done
  densevm fleet create --sock "$S" --id tpl --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" \
    --cmdline "$CMDLINE density.wait" --memory 256M --priority low > "$W/create.txt" 2>&1 ||
    fail "fleet create tpl: $(cat "$W/create.txt")"
  wait_for_line "$ST/vms/tpl/console.log" READY-FOR-GO "$BOOT_TIMEOUT" || { tail "$ST/vms/tpl/console.log"; fail "the template VM never got ready"; }
  sleep 3
  densevm vm pause --api-sock "$ST/vms/tpl/api.sock" > /dev/null || fail "pause tpl"
  densevm vm snapshot --api-sock "$ST/vms/tpl/api.sock" --dir "$W/snap" > /dev/null || fail "snapshot tpl"
  densevm fleet delete --sock "$S" tpl > /dev/null || fail "delete tpl"
  note "densevm: template booted through the fleet and snapshotted ($(du -m "$W/snap" | tail -n 1 | cut -f1) MiB on L1's tmpfs); cap $max VMs"
  pids="" logs="" n=0 count=0 why="cap ($max)"
  while [ $n -lt "$max" ]; do
    n=$((n + 1))
    t0=$(uptime_s)
    densevm fleet create --sock "$S" --id v$n --restore "$W/snap" --memory 256M --priority low > "$W/create.txt" 2>&1 ||
      { why="VM $n did not start: $(cat "$W/create.txt")"; break; }
    log=$ST/vms/v$n/console.log
    densevm fleet show --sock "$S" v$n --json > "$W/show.json" || { why="GET /vms/v$n: $(cat "$W/show.json")"; break; }
    pid=$(json_number "$W/show.json" pid)
    [ -n "$pid" ] || { why="no pid for VM $n: $(cat "$W/show.json")"; break; }
    densevm console --sock "$ST/vms/v$n/console.sock" --send='go\n' > /dev/null || { why="cannot type on VM $n's console"; break; }
    wait_done "$log" "$pid" || { why="VM $n did not finish its workload"; break; }
    sleep "$SETTLE"
    pids="$pids $pid" logs="$logs $log"
    a=$(avail_mib)
    pss=0; for p in $pids; do pss=$((pss + $(pss_kb $p))); done
    echo "DENSITY densevm $n $a $((pss / 1024))"
    note "densevm VM $n: workload done $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.0f", b - a }') s after create; MemAvailable $a MiB; PSS of all VMM processes $((pss / 1024)) MiB"
    [ "$a" -ge "$FLOOR" ] || { why="VM $n brought MemAvailable to $a MiB, under the floor"; break; }
    count=$n last_pss=$pss
  done
  # shellcheck disable=SC2086
  if [ $count -gt 0 ] && ! all_tick $(echo $logs | cut -d' ' -f1-$count); then
    why="$why; and a VM stopped answering"; status=1
  fi
  densevm fleet list --sock "$S" > "$W/list.txt"
  exits=$(densevm fleet metrics --sock "$S" | awk '$1 == "densevm_fleet_vm_exits_total" { print $2 }')
  note "fleet: $exits VM exits; policy actions: $(densevm fleet metrics --sock "$S" | grep '^densevm_fleet_policy_actions_total' | grep -v ' 0$' | sed 's/densevm_fleet_policy_actions_total//' | tr '\n' ' ')"
  note "fleet daemon PSS $(($(pss_kb $fleetd) / 1024)) MiB"
  note "densevm holds $count VMs (stopped: $why)"
  echo "| densevm fleet (clones of a snapshot, balloon, free page reporting) | $count | $(( ${last_pss:-0} / 1024 / (count > 0 ? count : 1) )) | $why |" >> "$RESULTS"
  for id in $(awk '{ print $1 }' "$W/list.txt"); do densevm fleet delete --sock "$S" "$id" > /dev/null 2>&1; done
  kill $fleetd 2>/dev/null
}

for vmm in $VMMS; do
  case $vmm in
    qemu) run_qemu ;;
    densevm) last_pss=0; run_densevm ;;
    *) fail "BENCH_DENSITY_VMMS: unknown VMM $vmm" ;;
  esac
done
echo
echo "| VMM | VMs held | per-VM PSS MiB | why it stopped |"
echo "|---|---:|---:|---|"
cat "$RESULTS"
exit $status
