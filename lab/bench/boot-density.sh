#!/bin/sh
# Boot-density benchmark, run inside L1 by `make bench-lab` (lab/run lab/bench/boot-density.sh).
# For each VMM variant and N in $BENCH_COUNTS, boots N idle L2 VMs (256 MiB, 1 vCPU, the
# same kernel + initrd, `hold` on the cmdline), waits for each VM's DENSEVM-GUEST-INIT,
# then reads /proc/PID/smaps_rollup of every VMM process and prints per-VM averages:
# USS (Private_Clean + Private_Dirty), PSS, RSS, and the time from launch to L2 init.
# Variants (BENCH_VMMS):
#   qemu-bz    QEMU 7.2 -enable-kvm -kernel bzImage -initrd (decompresses into guest RAM)
#   qemu-pvh   QEMU 7.2 -enable-kvm -kernel vmlinux (PVH; QEMU maps the ELF file)
#   densevm    densevm run --kernel vmlinux (PVH, segments mmap'd from the file; the default
#              --merge boot marks the kernel/initrd windows for KSM)
#   densevm-all  the same with --merge all (guest RAM too)
# BENCH_KSM=1 runs L1's ksmd (QEMU marks its guest RAM mergeable by default, densevm its boot
# windows) and measures once ksmd has finished 3 full scans after the last VM reached init;
# otherwise ksmd is off.
. "$LAB_SRC/lib/test-lib.sh"
need_file "$GUEST_BZIMAGE" "$GUEST_VMLINUX" "$GUEST_INITRD"
need_cmd qemu-system-x86_64 densevm
[ -c /dev/kvm ] || fail "/dev/kvm missing in L1"

COUNTS="${BENCH_COUNTS:-1 2 4}"
VMMS="${BENCH_VMMS:-qemu-bz qemu-pvh densevm}"
INIT_TIMEOUT="${BENCH_INIT_TIMEOUT:-240}"
CMDLINE="console=ttyS0 panic=-1 quiet hold"
work=/tmp/bench
mkdir -p "$work"
KSM=/sys/kernel/mm/ksm
if [ "${BENCH_KSM:-0}" = 1 ]; then
  [ -w "$KSM/run" ] || fail "BENCH_KSM=1 but $KSM/run is missing (L1 kernel without CONFIG_KSM)"
  echo 2000 > "$KSM/pages_to_scan"; echo 20 > "$KSM/sleep_millisecs"; echo 1 > "$KSM/run"
elif [ -w "$KSM/run" ]; then
  echo 0 > "$KSM/run"
fi

# ksm_settle: with ksmd on, waits (at most 300 s) for 3 more full scans.
ksm_settle() {
  [ "${BENCH_KSM:-0}" = 1 ] || return 0
  _target=$(($(cat "$KSM/full_scans") + 3)); _w=0
  while [ "$(cat "$KSM/full_scans")" -lt "$_target" ] && [ "$_w" -lt 300 ]; do sleep 1; _w=$((_w + 1)); done
}

launch() { # launch VARIANT INDEX : starts one VM in the background, prints its PID
  log="$work/vm$2.log"
  : > "$log"
  case "$1" in
    qemu-bz)
      qemu-system-x86_64 -enable-kvm -cpu host -smp 1 -m 256 -nodefaults -no-user-config \
        -display none -serial "file:$log" -kernel "$GUEST_BZIMAGE" -initrd "$GUEST_INITRD" \
        -append "$CMDLINE" > "$work/vm$2.err" 2>&1 &
      ;;
    qemu-pvh)
      qemu-system-x86_64 -enable-kvm -cpu host -smp 1 -m 256 -nodefaults -no-user-config \
        -display none -serial "file:$log" -kernel "$GUEST_VMLINUX" -initrd "$GUEST_INITRD" \
        -append "$CMDLINE" > "$work/vm$2.err" 2>&1 &
      ;;
    densevm | densevm-all)
      merge=boot; [ "$1" = densevm-all ] && merge=all
      densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M --cpus 1 \
        --merge "$merge" --cmdline "$CMDLINE" > "$log" 2> "$work/vm$2.err" &
      ;;
  esac
  echo $!
}

rollup() { # rollup PID FIELD : kB value of FIELD in smaps_rollup
  awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/smaps_rollup" 2>/dev/null
}

echo "# boot density: $(date -u +%Y-%m-%dT%H:%MZ), ksmd ${BENCH_KSM:-0}, L1 $(nproc) vCPUs, $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) MiB, kernel $GUEST_KERNEL_RELEASE"
echo "| VMM | N | per-VM USS MiB | per-VM PSS MiB | per-VM RSS MiB | init s (mean) | init s (max) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
status=0
for vmm in $VMMS; do
  for n in $COUNTS; do
    pids=""
    start=$(uptime_s)
    i=1
    while [ "$i" -le "$n" ]; do
      pids="$pids $(launch "$vmm" "$i")"
      i=$((i + 1))
    done
    # Wait for every marker; record each VM's time to init.
    times=""
    i=1
    failed=""
    for pid in $pids; do
      wait_for_line_pid "$work/vm$i.log" DENSEVM-GUEST-INIT "$INIT_TIMEOUT" "$pid"
      case $? in
        0) times="$times $(awk -v a="$start" -v b="$(uptime_s)" 'BEGIN{printf "%.2f", b-a}')" ;;
        2)
          failed="exited before init: $(cat "$work/vm$i.err" "$work/vm$i.log" 2>/dev/null | tail -n 3 | tr '\n' ' ' | cut -c1-300)"
          break
          ;;
        *)
          failed="no DENSEVM-GUEST-INIT within ${INIT_TIMEOUT}s"
          break
          ;;
      esac
      i=$((i + 1))
    done
    # The init marker comes before the guest settles; let it go idle before measuring.
    [ -z "$failed" ] && sleep 3 && ksm_settle
    uss=0; pss=0; rss=0
    for pid in $pids; do
      [ -z "$failed" ] || break
      pc=$(rollup "$pid" Private_Clean); pd=$(rollup "$pid" Private_Dirty)
      p=$(rollup "$pid" Pss); r=$(rollup "$pid" Rss)
      [ -n "$p" ] || { failed="cannot read /proc/$pid/smaps_rollup"; break; }
      uss=$((uss + pc + pd)); pss=$((pss + p)); rss=$((rss + r))
    done
    for pid in $pids; do kill "$pid" 2>/dev/null; done
    sleep 2
    for pid in $pids; do kill -9 "$pid" 2>/dev/null; done
    for pid in $pids; do wait "$pid" 2>/dev/null; done
    if [ -n "$failed" ]; then
      echo "| $vmm | $n | n/a | n/a | n/a | n/a | n/a |"
      echo "<!-- $vmm N=$n failed: $failed -->"
      # densevm's Linux boot may not have landed yet; QEMU must work.
      case "$vmm" in qemu*) status=1 ;; esac
      break
    fi
    echo "$times" | awk -v vmm="$vmm" -v n="$n" -v uss="$uss" -v pss="$pss" -v rss="$rss" '{
      s = 0; m = 0
      for (i = 1; i <= NF; i++) { s += $i; if ($i > m) m = $i }
      printf "| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n", vmm, n, uss/n/1024, pss/n/1024, rss/n/1024, s/NF, m
    }'
  done
done
exit "$status"
