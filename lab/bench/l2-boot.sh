#!/bin/sh
# Linux boot time under nested virtualization, run inside L1 by `make bench-l2-boot`: boots
# the Debian L2 (PVH vmlinux, 256 MiB, 1 vCPU, the lab's guest initrd, which powers off at
# once) BENCH_L2BOOT_N times (default 3) and prints, per boot, the wall time from launch to
# the VMM's exit, the guest's uptime at init, and L1 KVM's counters for the VM (all exits,
# port I/O exits, intercepted `invlpg`s, shadow page faults fixed), read from debugfs.
# BENCH_L2BOOT_ALT=/lab/extra/NAME (a densevm binary passed with LAB_EXTRA) boots that
# binary too, taking turns with the built one, for before/after pairs in one L1.
# BENCH_L2BOOT_APPEND adds kernel parameters to every boot; BENCH_L2BOOT_ALT_APPEND to the
# alternate's boots only (without BENCH_L2BOOT_ALT the alternate is the built binary: pairs
# of boots with and without the parameters).
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
[ -d /sys/kernel/debug/kvm ] || fail "no /sys/kernel/debug/kvm in L1 (debugfs)"
L2_MODULES=virtio_pci
mkdir -p /tmp/l2boot/built /tmp/l2boot/alt
cp "$(command -v densevm)" /tmp/l2boot/built/densevm
variants=built
if [ -n "${BENCH_L2BOOT_ALT:-}" ]; then
  need_file "$BENCH_L2BOOT_ALT"
  cp "$BENCH_L2BOOT_ALT" /tmp/l2boot/alt/densevm && chmod +x /tmp/l2boot/alt/densevm
  variants="built alt"
elif [ -n "${BENCH_L2BOOT_ALT_APPEND:-}" ]; then
  cp /tmp/l2boot/built/densevm /tmp/l2boot/alt/densevm
  variants="built alt"
fi
i=0
while [ "$i" -lt "${BENCH_L2BOOT_N:-3}" ]; do
  i=$((i + 1))
  for v in $variants; do
    L2_APPEND="${BENCH_L2BOOT_APPEND:-}"
    [ "$v" = alt ] && L2_APPEND="$L2_APPEND ${BENCH_L2BOOT_ALT_APPEND:-}"
    t0=$(uptime_s)
    PATH=/tmp/l2boot/$v:$PATH l2_start /tmp/l2boot/vm.log "$GUEST_INITRD" \
      'echo DENSEVM-UPTIME=$(cut -d" " -f1 /proc/uptime)
echo DENSEVM-MPTABLE=$(dmesg | grep -c "found SMP MP-table")'
    # The VM's debugfs directory appears once KVM_CREATE_VM has run.
    d=""
    while kill -0 "$L2_PID" 2>/dev/null; do
      [ -n "$d" ] || d=$(ls -d /sys/kernel/debug/kvm/"$L2_PID"-* 2>/dev/null | head -n 1)
      if [ -n "$d" ]; then
        for f in exits io_exits invlpg pf_fixed; do
          v_=$(cat "$d/$f" 2>/dev/null) && eval "k_$f=\$v_"
        done
      fi
      sleep 0.5
    done
    wait "$L2_PID" || fail "boot $i ($v): the VMM exited with $?"
    grep -q DENSEVM-GUEST-EXIT=0 /tmp/l2boot/vm.log || fail "boot $i ($v): the guest did not finish"
    printf 'boot %d %s: wall %.1f s, guest uptime at init %s s, MP table found %s; exits %s, io %s, invlpg %s, pf_fixed %s\n' \
      "$i" "$v" "$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { print b - a }')" \
      "$(guest_value /tmp/l2boot/vm.log UPTIME)" "$(guest_value /tmp/l2boot/vm.log MPTABLE)" \
      "${k_exits:-?}" "${k_io_exits:-?}" "${k_invlpg:-?}" "${k_pf_fixed:-?}"
    unset k_exits k_io_exits k_invlpg k_pf_fixed
  done
done
