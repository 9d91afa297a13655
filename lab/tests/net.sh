#!/bin/sh
# lab-seconds: 72
# virtio-net on a tap (densevm run --net), stock Debian guest, one L2 boot:
#  - bad --net options fail before a VM exists: a missing tap names `ip tuntap add`;
#  - L1 makes tap0 (192.168.77.1/24) and serves a 4 MiB random file with busybox httpd;
#    the guest gets eth0 with the MAC given on the command line, sets 192.168.77.2/24,
#    fetches the file (sha256 must match L1's) and serves its own 4 MiB file, which L1
#    fetches (sha256 must match the guest's);
#  - the guest's driver accepted the offloads (checksum and TSO both ways, mergeable
#    receive buffers, MAC, status), read from /sys/bus/virtio/devices/*/features;
#  - snapshot and restore: L1 pauses the VM, snapshots it, kills it and restores it in a new
#    densevm, which opens tap0 again; L1 fetches the guest's file once more (sha256 again);
#  - clones: a clone of the restored VM without a tap of its own is refused; two clones with
#    --net-override net0=tapc{index} each open their own tap (tapc0, tapc1) and serve the
#    guest's file to L1 over it (L1's address moved from tap to tap), sha256 again;
#  - the fleet: `densevm fleet create --restore` of the same snapshot with --net-override
#    net0=tapf0 (Firecracker's network_overrides) and a 24 MiB DRAM budget serves the
#    guest's file over tapf0 (sha256 again); its tier read pages from the snapshot on first
#    access and holds its RAM within the budget (this guest touches only a few MiB after
#    the restore: budgets that bite are lab/tests/tiering.sh's);
#  - a tap that vanishes: L1 deletes tap0 under the restored VM; the guest sees its link go
#    down and ends normally, densevm logs the failure and exits 0.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_cmd tunctl ip httpd wget sha256sum timeout
[ -c /dev/net/tun ] || fail "/dev/net/tun missing in L1 (the tun module: lab/l1/modules.txt)"
W=/tmp/net
tmpfs_workdir "$W"
same() { # same WHAT EXPECTED ACTUAL
  [ -n "$2" ] && [ "$2" = "$3" ] || fail "$1: expected '$2', got '$3'"
  echo "ok: $1"
}

# ---- bad options ------------------------------------------------------------------------
bad_net() { # bad_net WHAT EXPECTED-TEXT ARGS...
  _what=$1 _want=$2
  shift 2
  densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 64M "$@" > bad.log 2>&1 &&
    fail "$_what: densevm run succeeded"
  grep -qF -- "$_want" bad.log || { cat bad.log; fail "$_what: the error does not say '$_want'"; }
  echo "ok: $_what: $(grep -m1 -i error bad.log | cut -c1-160)"
}
bad_net "a missing tap" "ip tuntap add nosuch0 mode tap" --net tap=nosuch0
bad_net "an invalid MAC" "six hex bytes" --net tap=tap0,mac=06:00:zz:00:00:01
bad_net "a tap given twice" "two --net options use tap 'tap0'" --net tap=tap0 --net tap=tap0
out=$(densevm run --probe --net tap=tap0 2>&1) && fail "--net with the probe guest succeeded"
case "$out" in *"add --kernel"*) echo "ok: --net with the probe guest is refused" ;;
  *) fail "--net with the probe guest: '$out'" ;; esac

# ---- the network ---------------------------------------------------------------------------
tunctl -t tap0 > /dev/null || fail "tunctl -t tap0"
ip addr add 192.168.77.1/24 dev tap0 || fail "ip addr add on tap0"
ip link set tap0 up || fail "ip link set tap0 up"
mkdir -p www
head -c 4194304 /dev/urandom > www/from-l1.bin || fail "www/from-l1.bin"
l1_sum=$(sha256sum < www/from-l1.bin | cut -d' ' -f1)
httpd -f -p 192.168.77.1:8080 -h "$W/www" &
HTTPD_PID=$!
trap 'kill $HTTPD_PID 2>/dev/null' EXIT

MAC=06:00:c0:a8:4d:02
SCRIPT=$(printf '%s\n' "$GUEST_FNS"; cat <<'SH'
wait_dev /sys/class/net/eth0
mark MAC "$(cat /sys/class/net/eth0/address)"
mark FEATURES "$(cat /sys/class/net/eth0/device/features)"
ip link set lo up
ip addr add 192.168.77.2/24 dev eth0 || exit 10
ip link set eth0 up || exit 11
step fetch from L1
t0=$(now)
i=0
until wget -q -O /tmp/from-l1.bin http://192.168.77.1:8080/from-l1.bin; do
  i=$((i + 1)); [ $i -lt 10 ] || exit 12; sleep 1
done
mark FETCH-S "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')"
mark GOT-SUM "$(sha256sum < /tmp/from-l1.bin | cut -d' ' -f1)"
mkdir -p /www
head -c 4194304 /dev/urandom > /www/from-l2.bin || exit 13
mark L2-SUM "$(sha256sum < /www/from-l2.bin | cut -d' ' -f1)"
httpd -p 192.168.77.2:8080 -h /www || exit 14
echo DENSEVM-NET-READY
# Pings go on (through the snapshot and the restore) until L1 deletes tap0.
i=0
while [ "$(cat /sys/class/net/eth0/carrier)" = 1 ]; do
  i=$((i + 1)); [ $i -lt 600 ] || exit 15
  ping -c 1 -W 1 192.168.77.1 > /dev/null 2>&1
  sleep 0.5
done
mark LINK "$(cat /sys/class/net/eth0/operstate)"
if timeout 5 wget -q -O /tmp/x http://192.168.77.1:8080/from-l1.bin 2>/dev/null; then
  mark AFTER-DOWN fetched
else
  mark AFTER-DOWN failed
fi
mark RX-PACKETS "$(cat /sys/class/net/eth0/statistics/rx_packets)"
mark TX-PACKETS "$(cat /sys/class/net/eth0/statistics/tx_packets)"
mark RX-ERRORS "$(cat /sys/class/net/eth0/statistics/rx_errors)"
SH
)
L2_MODULES=virtio_pci,virtio_net
log=/tmp/net-l2.log
echo "--- one L2 guest on tap0"
l2_start "$log" "$GUEST_INITRD" "$SCRIPT" --net "tap=tap0,mac=$MAC" --api-sock "$W/api.sock"
wait_for_line_pid "$log" DENSEVM-NET-READY 400 "$L2_PID"
ready=$?
l2_follow "$log"
if [ "$ready" != 0 ]; then
  kill -9 "$L2_PID" 2>/dev/null
  l2_rejected "$log"
  tail -n 20 "$log"
  fail "the guest did not get to serving its file (status $ready)"
fi
fetch_from_guest() { # fetch_from_guest OUT
  t0=$(uptime_s)
  _i=0
  until timeout 60 wget -q -O "$1" http://192.168.77.2:8080/from-l2.bin; do
    _i=$((_i + 1))
    [ $_i -lt 5 ] || { kill -9 "$L2_PID"; fail "L1 could not fetch from the guest"; }
    sleep 2
  done
  echo "L1 fetched 4 MiB from the guest in $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { print b - a }') s"
}
fetch_from_guest from-l2.bin
same "the guest's eth0 has the MAC given with --net" "$MAC" "$(guest_value "$log" MAC)"
same "guest <- L1: sha256 of the 4 MiB file matches ($(guest_value "$log" FETCH-S) s)" "$l1_sum" "$(guest_value "$log" GOT-SUM)"
l2_sum=$(guest_value "$log" L2-SUM)
same "L1 <- guest: sha256 of the 4 MiB file matches" "$l2_sum" "$(sha256sum < from-l2.bin | cut -d' ' -f1)"
feat=$(guest_value "$log" FEATURES)
# Bits: 0 CSUM, 1 GUEST_CSUM, 5 MAC, 7/8 GUEST_TSO4/6, 11/12 HOST_TSO4/6, 15 MRG_RXBUF, 16 STATUS.
for b in 0 1 5 7 8 11 12 15 16; do
  [ "$(echo "$feat" | cut -c$((b + 1)))" = 1 ] || fail "the guest did not accept virtio-net feature bit $b (features $feat)"
done
echo "ok: the guest accepted checksum and TSO offloads both ways, mergeable buffers, MAC and status"

# ---- snapshot, restore in a new densevm -------------------------------------------------
densevm vm pause --api-sock "$W/api.sock" > /dev/null || fail "pause"
densevm vm snapshot --api-sock "$W/api.sock" --dir "$W/snap" --json > snap.json || fail "snapshot: $(cat snap.json)"
kill -9 "$L2_PID"
wait "$L2_PID" 2>/dev/null
echo "ok: snapshot of the VM ($(json_number snap.json ms) ms), its densevm killed"
log=/tmp/net-restored.log
densevm run --restore "$W/snap" --api-sock "$W/api2.sock" > "$log" 2>&1 &
L2_PID=$!
L2_LINES=0
L2_START=$(cut -d. -f1 /proc/uptime)
fetch_from_guest again.bin
same "after the restore, L1 <- guest: sha256 matches again" "$l2_sum" "$(sha256sum < again.bin | cut -d' ' -f1)"

# ---- clones, each on its own tap (--net-override net0=tapc{index}) ------------------------
if densevm vm clone --api-sock "$W/api2.sock" --count 1 --dir "$W/c-refused" > clone.err 2>&1; then
  fail "a clone of a VM with --net and no tap of its own was started"
fi
grep -q "a tap serves one VM" clone.err || fail "clone without --net-override: $(cat clone.err)"
echo "ok: a clone without a tap of its own is refused: $(grep -o 'cannot clone.*' clone.err | cut -c1-120)..."
for k in 0 1; do
  tunctl -t tapc$k > /dev/null || fail "tunctl -t tapc$k"
  ip link set tapc$k up || fail "ip link set tapc$k up"
done
densevm vm clone --api-sock "$W/api2.sock" --count 2 --dir "$W/clones" --net-override 'net0=tapc{index}' --json > clone.json 2> clone.err ||
  fail "densevm vm clone --net-override: $(cat clone.json clone.err)"
CLONE_PIDS=$(grep -o '"pid": *[0-9]*' clone.json | grep -o '[0-9]*$' | tr '\n' ' ')
trap 'kill $HTTPD_PID $CLONE_PIDS 2>/dev/null' EXIT
# L1's address moves from tap to tap: each clone's guest (same address, same MAC) answers
# on its own tap only.
ip addr del 192.168.77.1/24 dev tap0 || fail "ip addr del on tap0"
for k in 0 1; do
  ip addr add 192.168.77.1/24 dev tapc$k || fail "ip addr add on tapc$k"
  fetch_from_guest clone$k.bin
  same "clone $k on tapc$k: L1 <- guest sha256 matches" "$l2_sum" "$(sha256sum < clone$k.bin | cut -d' ' -f1)"
  rx=$(cat /sys/class/net/tapc$k/statistics/tx_packets)
  [ "$rx" -gt 0 ] || fail "tapc$k carried no packets to clone $k"
  ip addr del 192.168.77.1/24 dev tapc$k
done
# shellcheck disable=SC2086
kill $CLONE_PIDS 2>/dev/null
ip addr add 192.168.77.1/24 dev tap0 || fail "ip addr add on tap0 again"
echo "ok: two clones of the restored VM, each on its own tap, served their file"

# ---- the fleet restores the snapshot on a tap of its own, under a DRAM budget -------------
tunctl -t tapf0 > /dev/null || fail "tunctl -t tapf0"
ip link set tapf0 up || fail "ip link set tapf0 up"
FS=$W/fleet.sock
densevm fleet serve --sock "$FS" --state-dir "$W/fleet" --cgroup off > fleet.log 2>&1 &
FLEETD=$!
trap 'kill $HTTPD_PID $FLEETD 2>/dev/null' EXIT
i=0
until densevm fleet list --sock "$FS" > /dev/null 2>&1; do
  kill -0 $FLEETD 2>/dev/null || { cat fleet.log; fail "the fleet daemon exited"; }
  i=$((i + 1))
  [ $i -lt 100 ] || { cat fleet.log; fail "the fleet daemon does not answer on $FS"; }
  sleep 0.2
done
densevm fleet create --sock "$FS" --id r0 --restore "$W/snap" --memory 256M --net-override net0=tapf0 \
  --memory-budget 24M > fcreate.txt 2>&1 || fail "fleet create --restore --net-override: $(cat fcreate.txt)"
ip addr del 192.168.77.1/24 dev tap0 || fail "ip addr del on tap0"
ip addr add 192.168.77.1/24 dev tapf0 || fail "ip addr add on tapf0"
fetch_from_guest fleet0.bin
same "the fleet's restore on tapf0: L1 <- guest sha256 matches" "$l2_sum" "$(sha256sum < fleet0.bin | cut -d' ' -f1)"
[ "$(cat /sys/class/net/tapf0/statistics/tx_packets)" -gt 0 ] || fail "tapf0 carried no packets to the fleet's VM"
densevm vm memory-tier --api-sock "$W/fleet/vms/r0/api.sock" --json > ftier.json || fail "GET /memory-tier of the fleet's VM"
res=$(json_number ftier.json resident_kib) base=$(json_number ftier.json faults_base)
# The budget plus the tier's slack (1/32 of it, at least 1 MiB).
[ "$res" -le $((25 * 1024)) ] || fail "the fleet's VM holds $res KiB of RAM, over its 24 MiB budget + slack"
[ "$base" -gt 0 ] || fail "the fleet's VM read no page from its snapshot: $(cat ftier.json)"
echo "ok: the fleet's restore under a 24 MiB budget: $res KiB resident, $base faults served from the snapshot"
densevm fleet delete --sock "$FS" r0 > /dev/null || fail "fleet delete r0"
kill $FLEETD
ip addr del 192.168.77.1/24 dev tapf0
ip addr add 192.168.77.1/24 dev tap0 || fail "ip addr add on tap0 again"

# ---- the tap vanishes ------------------------------------------------------------------------
ip link del tap0 || fail "ip link del tap0"
echo "tap0 deleted under the restored VM"
l2_wait "$log" "the restored guest" 300
same "the guest's link went down with the tap" down "$(guest_value "$log" LINK)"
same "nothing gets through once the tap is gone" failed "$(guest_value "$log" AFTER-DOWN)"
grep -q "tap 'tap0' failed" "$log" || { tail -n 20 "$log"; fail "densevm did not log the tap's failure"; }
echo "ok: densevm logged: $(grep -m1 -o "virtio-net: tap 'tap0' failed.*" "$log" | cut -c1-200)"
same "no receive errors in the guest" 0 "$(guest_value "$log" RX-ERRORS)"
echo "guest eth0: $(guest_value "$log" RX-PACKETS) packets in, $(guest_value "$log" TX-PACKETS) out"
echo "PASS: virtio-net on a tap"
