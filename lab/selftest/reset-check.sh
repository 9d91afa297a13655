#!/bin/sh
# Self-test of the shared L1, second half: nothing reset-leave.sh left is still there.
. "$LAB_SRC/lib/test-lib.sh"
left=""
ps -o pid,args | grep -q "[s]leep 100[01]" && left="$left processes;"
grep -q " /tmp/reset-mess " /proc/mounts && left="$left tmpfs-mount;"
[ -e /tmp/reset-mess ] || [ -e /tmp/reset-file ] && left="$left /tmp-files;"
[ -e reset-junk ] && left="$left work-dir-file;"
[ -e /run/reset-run ] && left="$left /run-file;"
grep -q "^[^ ]* /sys/fs/cgroup cgroup2 " /proc/mounts && left="$left cgroup2-mount;"
if mount -t cgroup2 none /sys/fs/cgroup; then
  [ -d /sys/fs/cgroup/reset ] && left="$left cgroup-dirs;"
  umount /sys/fs/cgroup
else
  left="$left cgroup2-cannot-mount;"
fi
[ -e /sys/class/net/resettap ] && left="$left tap;"
[ "$(cat /sys/kernel/mm/ksm/run)" = 0 ] || left="$left ksm-run;"
[ "$(cat /sys/kernel/mm/ksm/pages_to_scan)" != 77 ] || left="$left ksm-pages_to_scan;"
dmesg | grep -q lab-reset-selftest && left="$left kernel-log;"
[ -z "$left" ] || fail "L1's reset between lab tests left:$left"
echo "PASS: L1's init undid everything the previous script left behind"
