#!/bin/sh
# lab-seconds: 49
# densevm run --jail (issue #16 item 2) with the stock Debian guest, in one L1 boot:
#  - L1 mounts cgroup v2 (the jail's cgroup goes to /sys/fs/cgroup/densevm/lab);
#  - a Linux VM boots jailed as uid/gid 64200 (no passwd entry) with a 9p share (owned by
#    that uid), a pcow disk over a root-owned base image and a tap owned by the uid (so in
#    L1's network namespace, the default with --net); the guest makes ext4 on the disk,
#    writes and reads it back, mounts the share, reads L1's file and writes its own, and
#    pings L1 over the tap;
#  - while the guest waits (for a file L1 creates in the share), L1 lists the VMM's root
#    through /proc/PID/root: exactly the files `--jail-list` names (plus the share's
#    contents), and the same list written out independently here; the VMM runs as
#    64200:64200 with no capabilities and no new privileges, in its own mount, PID and IPC
#    namespaces (L1's network namespace) and in its cgroup;
#  - the guest powers off: densevm exits 0, the cgroup is gone, the jail directory on L1 is
#    empty, and the guest's file is in the share with the jail's uid.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_file "$GUEST_INITRD_TOOLS"
need_cmd find sort diff gzip base64 iproute2-ip ip
W=/tmp/jail
tmpfs_workdir "$W"
U=64200
G=64200

[ -e /sys/fs/cgroup/cgroup.controllers ] || mount -t cgroup2 none /sys/fs/cgroup || fail "cannot mount cgroup2"

mkdir -p root share || fail "mkdir"
echo "hello from L1" > share/hello
chown -R "$U:$G" share || fail "chown share"
densevm image create base.pcow 64M > /dev/null || fail "image create base"
densevm image create disk.pcow 64M -b base.pcow > /dev/null || fail "image create disk"
chown "$U:$G" disk.pcow || fail "chown disk.pcow"
iproute2-ip tuntap add jt0 mode tap user "$U" || fail "ip tuntap add jt0 mode tap user $U"
ip addr add 192.168.78.1/24 dev jt0 && ip link set jt0 up || fail "cannot configure jt0"

SCRIPT=$(printf '%s\n' "$GUEST_FNS"; cat <<'SH'
wait_dev /dev/vda
mkdir -p /mnt/disk /mnt/share
step ext4 on the disk
mkfs.ext4 -q -F /dev/vda || exit 10
mount -t ext4 /dev/vda /mnt/disk || exit 11
head -c 1048576 /dev/urandom > /mnt/disk/data || exit 12
sync
mark DISK-SUM "$(md5sum < /mnt/disk/data | cut -d' ' -f1)"
umount /mnt/disk && mount -t ext4 /dev/vda /mnt/disk || exit 13
mark DISK-READ "$(md5sum < /mnt/disk/data | cut -d' ' -f1)"
umount /mnt/disk || exit 14
step 9p share
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 host0 /mnt/share || exit 20
mark SHARE-READ "$(cat /mnt/share/hello)"
echo "hello from the jailed guest" > /mnt/share/from-guest || exit 21
step net
wait_dev /sys/class/net/eth0
ip link set lo up; ip addr add 192.168.78.2/24 dev eth0 && ip link set eth0 up || exit 30
i=0; until ping -c 1 -W 2 192.168.78.1 > /dev/null 2>&1 || [ $i -ge 10 ]; do i=$((i + 1)); done
mark PING "$(ping -c 3 -W 2 192.168.78.1 | grep -c 'bytes from')"
echo DENSEVM-JAIL-WAITING
i=0; while [ ! -e /mnt/share/go ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i + 1)); done
[ -e /mnt/share/go ] || exit 22
umount /mnt/share || exit 23
SH
)
b64=$(printf '%s\n' "$SCRIPT" | gzip -9 | base64 | tr -d '\n')
CMDLINE="console=ttyS0 panic=-1 $L2_KERNEL_ARGS quiet modules=$L2_MODULES,virtio_net densevm.script=$b64"
[ ${#CMDLINE} -le 2040 ] || fail "guest script too long: ${#CMDLINE} bytes of command line"
set -- --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD_TOOLS" --memory 256M --cmdline "$CMDLINE" \
  --share "$W/share,tag=host0" --disk "$W/disk.pcow" --net tap=jt0 \
  --jail "$W/root" --uid "$U" --gid "$G" --jail-id lab

densevm run "$@" --jail-list > list.json || { cat list.json; fail "densevm run --jail-list"; }
echo "--- the jail's list (--jail-list):"
sed -n 's/.*"path": "\(.*\)",$/\1/p' list.json | sed 's/^/  /'

log=$W/vm.log
densevm run "$@" > "$log" 2>&1 &
OUTER=$!
L2_START=$(cut -d. -f1 /proc/uptime)
L2_LINES=0
i=0
while [ -z "$(cat /proc/$OUTER/task/$OUTER/children 2>/dev/null)" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
C=$(tr -d ' ' < /proc/$OUTER/task/$OUTER/children)
[ -n "$C" ] || { cat "$log"; fail "no jailed process under densevm ($OUTER)"; }
echo "ok: densevm $OUTER forked the jailed VMM $C"
i=0
until grep -q DENSEVM-JAIL-WAITING "$log"; do
  l2_follow "$log"
  kill -0 "$OUTER" 2>/dev/null || { cat "$log"; fail "densevm ended before the guest mounted its devices"; }
  [ $i -lt 300 ] || fail "the guest did not mount its disk and share within 600 s"
  sleep 2; i=$((i + 1))
done
l2_follow "$log"

# What the VMM can reach, seen from L1.
(cd "/proc/$C/root" && find .) | sed 's|^\.||' | grep -v '^$' | grep -v '^/proc/' | sort > found.txt
# The contents of the bound directories: the share, and the tap's sysfs directory.
contents() {
  (cd share && find . | sed "s|^\.|$W/share|" | grep -v "^$W/share\$")
  (cd /sys/class/net/jt0/ && find . | sed "s|^\.|/sys/class/net/jt0|" | grep -v "^/sys/class/net/jt0\$")
}
{ sed -n 's/.*"path": "\(.*\)",$/\1/p' list.json; contents; } | sort -u > listed.txt
{ for p in /dev /dev/kvm /dev/null /dev/userfaultfd /dev/net /dev/net/tun /proc /guest "$GUEST_VMLINUX" \
    "$GUEST_INITRD_TOOLS" /tmp "$W" "$W/share" "$W/disk.pcow" "$W/base.pcow" /sys /sys/class \
    /sys/class/net /sys/class/net/jt0; do echo "$p"; done
  contents; } | sort -u > expected.txt
echo "--- /proc/$C/root (L1's view, /proc/1.. left out):"
sed 's/^/  /' found.txt
diff listed.txt found.txt || fail "the jail holds other files than --jail-list names"
echo "ok: the jail holds exactly the files --jail-list names (and the share's contents)"
diff expected.txt found.txt || fail "the jail holds other files than the VM needs"
echo "ok: the jail holds exactly the kernel, initrd, share, disk and its base, jt0's sysfs directory, /dev/{kvm,null,userfaultfd,net/tun} and /proc"
ls /proc/$C/root/proc | tr '\n' ' ' | grep -q '^1 self thread-self $' || fail "the jail's /proc shows: $(ls /proc/$C/root/proc | tr '\n' ' ')"
echo "ok: the jail's /proc holds its own process only"
grep '/tmp/jail/base.pcow' /proc/$C/mountinfo | grep -q ' ro,' || fail "the base image is not read-only in the jail: $(grep base.pcow /proc/$C/mountinfo)"
echo "ok: the base image is mounted read-only"

st() { sed -n "s/^$1:[[:space:]]*//p" /proc/$C/status | tr -s ' \t' ' ' | sed 's/ $//'; }
[ "$(st Uid)" = "$U $U $U $U" ] || fail "uid: $(st Uid)"
[ "$(st Gid)" = "$G $G $G $G" ] || fail "gid: $(st Gid)"
[ -z "$(st Groups)" ] || fail "groups: $(st Groups)"
for cap in CapInh CapPrm CapEff CapBnd CapAmb; do
  [ "$(st $cap)" = 0000000000000000 ] || fail "$cap: $(st $cap)"
done
[ "$(st NoNewPrivs)" = 1 ] || fail "NoNewPrivs: $(st NoNewPrivs)"
echo "ok: the VMM runs as $U:$G, no groups, no capabilities, no new privileges"
for ns in mnt pid ipc; do
  [ "$(readlink /proc/$C/ns/$ns)" != "$(readlink /proc/self/ns/$ns)" ] || fail "the VMM shares L1's $ns namespace"
done
[ "$(readlink /proc/$C/ns/net)" = "$(readlink /proc/self/ns/net)" ] || fail "with --net the VMM should be in L1's network namespace (where jt0 is)"
echo "ok: own mount, PID and IPC namespaces, L1's network namespace for its tap (NSpid: $(st NSpid))"
grep -q '^0::/densevm/lab$' /proc/$C/cgroup || fail "cgroup: $(cat /proc/$C/cgroup)"
[ -d /sys/fs/cgroup/densevm/lab ] || fail "no /sys/fs/cgroup/densevm/lab"
echo "ok: in its cgroup /sys/fs/cgroup/densevm/lab"

touch share/go
i=0
while kill -0 "$OUTER" 2>/dev/null && [ $i -lt 300 ]; do l2_follow "$log"; sleep 2; i=$((i + 1)); done
l2_follow "$log"
kill -0 "$OUTER" 2>/dev/null && { kill -9 "$OUTER"; fail "the VM did not power off"; }
wait "$OUTER"
status=$?
[ "$status" = 0 ] || { tail -n 20 "$log"; fail "densevm --jail exited with $status"; }
grep -q 'DENSEVM-GUEST-EXIT=0' "$log" || { tail -n 20 "$log"; fail "the guest script failed: $(guest_value "$log" GUEST-EXIT)"; }
echo "ok: the guest powered off, densevm exited 0"
[ "$(guest_value "$log" SHARE-READ)" = "hello from L1" ] || fail "9p read: $(guest_value "$log" SHARE-READ)"
[ "$(cat share/from-guest)" = "hello from the jailed guest" ] || fail "the guest's file is not in the share"
[ "$(ls -ln share/from-guest | awk '{print $3}')" = "$U" ] || fail "the guest's file is not owned by $U"
echo "ok: 9p: the guest read L1's file and wrote its own (owned by uid $U)"
[ "$(guest_value "$log" PING)" = 3 ] || fail "net: the guest's pings to L1 over jt0: $(guest_value "$log" PING) of 3 answered"
echo "ok: net: the guest pinged L1 over the tap the jailed VMM opened"
sum=$(guest_value "$log" DISK-SUM)
[ -n "$sum" ] && [ "$sum" = "$(guest_value "$log" DISK-READ)" ] || fail "disk: wrote $sum, read $(guest_value "$log" DISK-READ)"
densevm image check disk.pcow > check.txt 2>&1 || { cat check.txt; fail "densevm image check disk.pcow"; }
echo "ok: blk: ext4 on the pcow disk written and read back, image clean"
[ ! -e /sys/fs/cgroup/densevm/lab ] || fail "the cgroup is left"
[ -z "$(ls -A root)" ] || fail "the jail directory on L1 is not empty: $(ls -A root)"
echo "ok: cgroup removed, the jail directory is empty on L1"
echo "PASS: a jailed Linux VM (uid $U) mounted its share and disk, used its tap and powered off, reaching only its listed files"
