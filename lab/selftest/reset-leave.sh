#!/bin/sh
# Self-test of the shared L1 (lab/test-all runs it first, reset-check.sh right after it):
# leaves behind what a lab test might, for L1's init to undo between the two (lab/l1/init,
# reset_l1): a process, one in a session of its own, a tmpfs mount under /tmp, files in /run,
# /tmp and in the working directory, a cgroup v2 mount with nested cgroups, a tap, KSM
# switched on with another scan rate, and a kernel log line.
. "$LAB_SRC/lib/test-lib.sh"
sleep 1000 &
setsid sleep 1001 &
mkdir -p /tmp/reset-mess && mount -t tmpfs tmpfs /tmp/reset-mess || fail "mount a tmpfs"
echo x > /tmp/reset-mess/f && echo y > /tmp/reset-file && echo w > /run/reset-run && echo z > reset-junk || fail "write files"
mount -t cgroup2 none /sys/fs/cgroup && mkdir -p /sys/fs/cgroup/reset/inner || fail "cgroup2"
iproute2-ip tuntap add resettap mode tap || fail "ip tuntap add resettap"
echo 77 > /sys/kernel/mm/ksm/pages_to_scan && echo 1 > /sys/kernel/mm/ksm/run || fail "KSM"
echo "lab-reset-selftest" > /dev/kmsg
echo "left behind: 2 sleeps, /tmp/reset-mess (tmpfs), /tmp/reset-file, /run/reset-run, ./reset-junk, cgroup2 with reset/inner, tap resettap, KSM run=1 pages_to_scan=77"
