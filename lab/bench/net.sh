#!/bin/sh
# Networking and exec benchmark (issue #14), run inside L1 by `make bench-net`
# (lab/run lab/bench/net.sh). One L1 run, one L2 boot per VMM in $BENCH_NET_VMMS
# (default "densevm qemu qemu-vhost"): the Debian L2 kernel (vmlinux via PVH, 256 MiB,
# 1 vCPU) with one virtio-net on L1's tap0 (192.168.77.1/24; the guest is .2):
#   densevm     --net tap=tap0,mac=...  (plus --vsock and the guest agent, for exec below)
#   qemu        -netdev tap,ifname=tap0,script=no,downscript=no,vhost=off -device virtio-net-pci
#   qemu-vhost  the same with vhost=on (only when /dev/vhost-net exists in L1)
# Measured (busybox on both sides, times taken by the side that finishes):
#   guest -> L1 TCP: dd $BENCH_NET_MB MiB of zeros (64 KiB blocks) | nc L1 5001, L1 runs nc -l;
#   L1 -> guest TCP: L1 serves $BENCH_NET_MB MiB with nc -l -p 5002, the guest reads it with nc;
#   small packets: ping -A (next request as soon as the reply is in) -c $BENCH_NET_PINGS,
#     guest -> L1 and L1 -> guest: round trips per second (each one 84-byte ICMP packet each way).
# exec (densevm only, same boot): $BENCH_EXEC_N runs of `densevm exec --no-stdin -- true`
# against $BENCH_EXEC_N console round trips (`densevm console --send 'echo ...' --wait-for`),
# each a fresh densevm process, timed by bash's EPOCHREALTIME in L1: medians and their ratio.
# Paired small packets and TCP (first, before the sequential boots): the two VMMs of $BENCH_NET_PAIR
# (default "densevm qemu", i.e. QEMU vhost=off) run at the same time on tap0 and tap1, and
# short ping -A bursts alternate between them ($BENCH_NET_PAIR_ROUNDS rounds, default 30, of
# $BENCH_NET_PAIR_PINGS, default 100, each way; the order flips every round): per-VMM medians
# and the median and range of the per-round ratios, of the rate (wall time) and of ping's own
# min and avg round-trip times (less hit by L1 stalls than the wall time of a burst). Then,
# in the same round and order, one TCP transfer of $BENCH_NET_PAIR_MB MiB (default 8) guest ->
# L1 for each VMM, then one L1 -> guest for each (busybox nc, as in the sequential part, a
# fresh L1 port each): per-VMM median MiB/s and the per-round ratios. BENCH_NET_PAIR_MB=0
# skips the TCP transfers, BENCH_NET_PAIR_ROUNDS=0 the whole paired phase, BENCH_NET_VMMS=
# (empty) the sequential boots.
# Everything is nested (L1 is QEMU TCG): compare the ratios, not the absolute figures.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_cmd tunctl ip nc ping bash
[ -c /dev/net/tun ] || fail "/dev/net/tun missing in L1 (the tun module: lab/l1/modules.txt)"
VMMS="${BENCH_NET_VMMS-densevm qemu qemu-vhost}"
MB="${BENCH_NET_MB:-64}"
PINGS="${BENCH_NET_PINGS:-2000}"
EXEC_N="${BENCH_EXEC_N:-20}"
PAIR="${BENCH_NET_PAIR:-densevm qemu}"
ROUNDS="${BENCH_NET_PAIR_ROUNDS:-30}"
PP="${BENCH_NET_PAIR_PINGS:-100}"
PMB="${BENCH_NET_PAIR_MB:-8}"
W=/tmp/bench-net
tmpfs_workdir "$W"
MAC=06:00:c0:a8:4d:02
el() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }'; }

echo "# net + exec: $(date -u +%Y-%m-%dT%H:%MZ), L1 $(nproc) vCPUs, load $(cut -d' ' -f1-3 /proc/loadavg), kernel $GUEST_KERNEL_RELEASE, VMMs: ${VMMS:-none}, $MB MiB per TCP transfer, $PINGS pings; paired: $PAIR, $ROUNDS rounds of $PP pings and $PMB MiB TCP each way"
tunctl -t tap0 > /dev/null || fail "tunctl -t tap0"
ip addr add 192.168.77.1/24 dev tap0 || fail "ip addr add on tap0"
ip link set tap0 up || fail "ip link set tap0 up"
# A fifo held open for writing: an nc reading it never sees EOF (busybox nc shuts its
# sending half, and the peer then ends, as soon as its stdin ends).
mkfifo "$W/hold" || fail "mkfifo"
exec 7<> "$W/hold"

GUEST=$(printf '%s\n' "$GUEST_FNS"; cat <<SH
el() { awk -v a="\$1" -v b="\$(now)" 'BEGIN { printf "%.2f", b - a }'; }
wait_dev /sys/class/net/eth0
ip link set lo up
ip addr add 192.168.77.2/24 dev eth0 || exit 10
ip link set eth0 up || exit 11
i=0; until ping -c 1 -W 1 192.168.77.1 > /dev/null 2>&1; do i=\$((i + 1)); [ \$i -lt 60 ] || exit 12; done
mkfifo /tmp/hold; exec 3<> /tmp/hold
step tx
t=\$(now); dd if=/dev/zero bs=64k count=$((MB * 16)) 2> /dev/null | timeout 600 nc 192.168.77.1 5001 || exit 13
mark TX-S "\$(el \$t)"
step rx
t=\$(now); n=\$(timeout 600 nc 192.168.77.1 5002 < /tmp/hold | wc -c); mark RX-S "\$(el \$t)"; mark RX-BYTES "\$n"
step ping
t=\$(now); ping -A -q -c $PINGS 192.168.77.1 > /tmp/p 2>&1 || { cat /tmp/p; exit 14; }
mark PING-S "\$(el \$t)"; mark PING-RECV "\$(sed -n 's/.* \([0-9]*\) packets received.*/\1/p' /tmp/p)"
echo DENSEVM-NET-DONE
timeout 900 nc -l -p 5003 < /tmp/hold > /dev/null
if grep -q densevm.agent /proc/cmdline; then
  echo READY-FOR-INPUT
  while read -r line; do eval "\$line"; done
fi
exit 0
SH
)

bench_vmm() { # bench_vmm NAME: one boot; KEY=VALUE results in $W/res.NAME
  res="$W/res.$1"
  : > "$res"
  export L2_MODULES=virtio_pci,virtio_net L2_MEM=256M
  extra=""
  case $1 in
    densevm) L2_VMM=densevm; L2_APPEND=densevm.agent
      extra="--vsock cid=3,uds=$W/v.sock --api-sock $W/api.sock --console-sock $W/console.sock" ;;
    qemu) L2_VMM=qemu L2_QEMU_VHOST=off L2_APPEND= ;;
    qemu-vhost) L2_VMM=qemu L2_QEMU_VHOST=on L2_APPEND=
      [ -c /dev/vhost-net ] || modprobe vhost_net 2> /dev/null
      [ -c /dev/vhost-net ] || { echo "# qemu-vhost: no /dev/vhost-net in L1, skipped"; return 0; } ;;
  esac
  export L2_VMM L2_QEMU_VHOST L2_APPEND
  rm -f "$W"/*.sock "$W/rx"
  # L1's ends: a receiver for guest -> L1, a sender for L1 -> guest (both wait for the guest).
  (nc -l -p 5001 < "$W/hold" | wc -c > "$W/rx") &
  rxpid=$!
  (dd if=/dev/zero bs=64k count=$((MB * 16)) 2> /dev/null | nc -l -p 5002 > /dev/null) &
  txpid=$!
  log="$W/$1.log"
  echo "# $1: boot"
  # shellcheck disable=SC2086
  l2_start "$log" "$GUEST_INITRD" "$GUEST" --net "tap=tap0,mac=$MAC" $extra
  vm=$L2_PID
  echo "$vm" > "$W/vm.pid"
  wait_for_line_pid "$log" DENSEVM-NET-DONE 900 "$vm"
  st=$?
  l2_follow "$log"
  if [ $st != 0 ]; then
    kill -9 "$vm" 2> /dev/null; kill $rxpid $txpid 2> /dev/null
    tail -n 5 "$log.err" 2> /dev/null
    fail "$1: the guest did not finish its network measurements (status $st)"
  fi
  wait $rxpid
  got=$(cat "$W/rx")
  [ "$got" = $((MB * 1048576)) ] || fail "$1: L1 received $got bytes, not $((MB * 1048576))"
  [ "$(guest_value "$log" RX-BYTES)" = $((MB * 1048576)) ] || fail "$1: the guest received $(guest_value "$log" RX-BYTES) bytes"
  for k in TX-S RX-S PING-S; do echo "$k=$(guest_value "$log" $k)" | tr - _ >> "$res"; done
  [ "$(guest_value "$log" PING-RECV)" = "$PINGS" ] || echo "# $1: guest ping: $(guest_value "$log" PING-RECV) of $PINGS replies"
  t=$(uptime_s)
  ping -A -q -c "$PINGS" 192.168.77.2 > ping.out 2>&1 || { cat ping.out; fail "$1: L1 -> guest ping"; }
  echo "L1PING_S=$(el "$t")" >> "$res"
  i=0; until echo x | nc 192.168.77.2 5003 > /dev/null 2>&1; do i=$((i + 1)); [ $i -lt 30 ] || fail "$1: cannot reach the guest's port 5003"; sleep 1; done
  if [ "$1" = densevm ]; then
    wait_for_line_pid "$log" READY-FOR-INPUT 120 "$vm" || fail "densevm: the guest did not get to its console loop"
    densevm exec --api-sock "$W/api.sock" --wait 120 --no-stdin -- true || fail "densevm exec true: exit $?"
    # shellcheck disable=SC2016
    densevm console --sock "$W/console.sock" --send='echo W-$((1000+1))\n' --wait-for=W-1001 --console-file "$log" \
      --timeout 120 > /dev/null || fail "console warm-up: no W-1001"
    # shellcheck disable=SC2016
    bash -c '
      n=$1 api=$2 sock=$3 log=$4
      us() { echo $(( ${1/./} )); }
      for i in $(seq 1 "$n"); do
        s=$EPOCHREALTIME; densevm exec --api-sock "$api" --no-stdin -- true || exit 1; e=$EPOCHREALTIME
        echo "exec $(( $(us $e) - $(us $s) ))"
        k=$((2000 + i))
        s=$EPOCHREALTIME
        densevm console --sock "$sock" --send="echo C-\$(($k+1))\n" --wait-for="C-$((k + 1))" --console-file "$log" --timeout 60 > /dev/null || exit 2
        e=$EPOCHREALTIME
        echo "console $(( $(us $e) - $(us $s) ))"
      done' rt "$EXEC_N" "$W/api.sock" "$W/console.sock" "$log" > rt.txt || { cat rt.txt; fail "exec/console round trips: status $?"; }
    med() { awk -v k="$1" '$1 == k { print $2 }' rt.txt | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
    echo "EXEC_US=$(med exec)" >> "$res"
    echo "CONSOLE_US=$(med console)" >> "$res"
    echo "# exec true, us: $(awk '$1 == "exec" { printf "%s ", $2 }' rt.txt)"
    echo "# console, us:   $(awk '$1 == "console" { printf "%s ", $2 }' rt.txt)"
    densevm console --sock "$W/console.sock" --send='exit 0\n' --timeout 10 > /dev/null 2>&1
  fi
  l2_wait "$log" "$1" 300
  wait $txpid 2> /dev/null
}

# ---- Paired phase: two VMMs at once, ping bursts and TCP transfers alternated between them ----
# Sequential boots minutes apart measured L1 -> guest ping -A at 0.21-2.78x QEMU over three
# runs: L1 (TCG on a shared host) changes speed between them. Here the first VMM of
# $BENCH_NET_PAIR runs on tap0 (192.168.77.0/24), the second on tap1 (192.168.78.0/24), both
# guests idle in `nc -l` between bursts; each of $BENCH_NET_PAIR_ROUNDS rounds sends
# $BENCH_NET_PAIR_PINGS `ping -A` from L1 to each guest (AB, then BA the next round, ...),
# then tells each guest in the same order (a line on its port 5004) to ping L1 as many times,
# timed in the guest. Per-round ratios A/B are taken between bursts seconds apart. Then, same
# order, $BENCH_NET_PAIR_MB MiB over TCP from each guest to L1 (`tx`: dd | nc in the guest,
# nc -l | wc -c in L1), then from L1 to each guest (`rx`: dd | nc -l in L1, nc | wc -c in the
# guest), both timed in the guest; sequential boots minutes apart gave 0.78-2.17x QEMU for TCP.

# summ FILE: "REPLIES MIN AVG" from a busybox ping summary (RTTs in ms; L1 and the guests).
# shellcheck disable=SC2016
PING_SUMM_FN='summ() { sed -n -e "s/.* \([0-9]*\) packets received.*/\1/p" -e "s|.*= \([0-9.]*\)/\([0-9.]*\)/.*|\1 \2|p" "$1" | tr "\n" " "; }'
eval "$PING_SUMM_FN"

pair_guest() { # pair_guest NET: the paired guest's script on 192.168.NET.0/24
  printf '%s\n' "$GUEST_FNS"; cat <<SH
el() { awk -v a="\$1" -v b="\$(now)" 'BEGIN { printf "%.2f", b - a }'; }
$PING_SUMM_FN
wait_dev /sys/class/net/eth0
ip link set lo up
ip addr add 192.168.$1.2/24 dev eth0 || exit 10
ip link set eth0 up || exit 11
i=0; until ping -c 1 -W 1 192.168.$1.1 > /dev/null 2>&1; do i=\$((i + 1)); [ \$i -lt 60 ] || exit 12; done
mkfifo /tmp/hold; exec 3<> /tmp/hold
echo DENSEVM-PAIR-READY
while :; do
  timeout 1800 nc -l -p 5004 < /tmp/hold > /tmp/cmd || exit 13
  read -r c k n p < /tmp/cmd
  case \$c in
    ping) t=\$(now); ping -A -q -c "\$n" 192.168.$1.1 > /tmp/p 2>&1
      mark "GPING-\$k" "\$(el \$t) \$(summ /tmp/p)" ;;
    tx) t=\$(now); dd if=/dev/zero bs=64k count=\$((n * 16)) 2> /dev/null | timeout 600 nc 192.168.$1.1 "\$p"
      s=\$?; mark "GTX-\$k" "\$(el \$t) \$s" ;;
    rx) t=\$(now); b=\$(timeout 600 nc 192.168.$1.1 "\$n" < /tmp/hold | wc -c)
      mark "GRX-\$k" "\$(el \$t) \$b" ;;
    exit) exit 0 ;;
  esac
done
SH
}

pair_start() { # pair_start VMM TAP NET: boots VMM on TAP; its log is $W/pair.VMM.log
  export L2_MODULES=virtio_pci,virtio_net L2_MEM=256M L2_APPEND=
  case $1 in
    densevm) L2_VMM=densevm ;;
    qemu) L2_VMM=qemu L2_QEMU_VHOST=off ;;
    qemu-vhost) L2_VMM=qemu L2_QEMU_VHOST=on ;;
    *) fail "BENCH_NET_PAIR: unknown VMM $1" ;;
  esac
  export L2_VMM L2_QEMU_VHOST
  echo "# paired: $1 on $2 (192.168.$3.2): boot"
  l2_start "$W/pair.$1.log" "$GUEST_INITRD" "$(pair_guest "$3")" --net "tap=$2,mac=06:00:c0:a8:$(printf %x "$3"):02"
  echo "$L2_PID" > "$W/pair.$1.pid"
}

pair_send() { # pair_send NET LINE: sends LINE to the guest's port 5004 (retried while it is busy)
  _j=0
  until echo "$2" | nc "192.168.$1.2" 5004 > /dev/null 2>&1; do
    _j=$((_j + 1)); [ $_j -lt 100 ] || return 1; sleep 0.2
  done
}

pair_l1_ping() { # pair_l1_ping VMM NET ROUND: one L1 -> guest burst; appends to $W/pair.txt
  _t=$(uptime_s)
  ping -A -q -c "$PP" "192.168.$2.2" > "$W/pping.out" 2>&1
  _s=$(el "$_t")
  echo "$3 $1 l1-guest $_s $(summ "$W/pping.out")" >> "$W/pair.txt"
}

pair_guest_ping() { # pair_guest_ping VMM NET ROUND: one guest -> L1 burst, timed in the guest
  pair_send "$2" "ping $3 $PP" || fail "paired: $1 does not take commands on 192.168.$2.2:5004"
  wait_for_line_pid "$W/pair.$1.log" "DENSEVM-GPING-$3=" 300 "$(cat "$W/pair.$1.pid")" ||
    fail "paired: $1's guest did not report its ping burst $3"
  echo "$3 $1 guest-l1 $(guest_value "$W/pair.$1.log" "GPING-$3")" >> "$W/pair.txt"
}

pair_listening() { # pair_listening PORT: waits up to 20 s until a TCP socket listens on PORT in L1
  _h=$(printf ':%04X' "$1")
  _j=0
  until cat /proc/net/tcp /proc/net/tcp6 2> /dev/null |
    awk -v h="$_h" '$4 == "0A" && substr($2, length($2) - 4) == h { f = 1 } END { exit !f }'; do
    _j=$((_j + 1)); [ $_j -lt 200 ] || return 1; sleep 0.1
  done
}

# pair_tcp VMM NET ROUND tx|rx PORT: one TCP transfer of $PMB MiB, guest -> L1 (tx) or
# L1 -> guest (rx), timed in the guest; L1's end listens on PORT before the guest is told to
# connect. Both ends' byte counts are checked. Appends "ROUND VMM tcp-tx|tcp-rx SECONDS BYTES".
pair_tcp() {
  _want=$((PMB * 1048576))
  _pid=$(cat "$W/pair.$1.pid")
  rm -f "$W/ptcp.n"
  if [ "$4" = tx ]; then
    (timeout 900 nc -l -p "$5" < "$W/hold" | wc -c > "$W/ptcp.n") &
    _cmd="tx $3 $PMB $5" _key=GTX
  else
    (dd if=/dev/zero bs=64k count=$((PMB * 16)) 2> /dev/null | timeout 900 nc -l -p "$5" > /dev/null) &
    _cmd="rx $3 $5" _key=GRX
  fi
  _lp=$!
  pair_listening "$5" || fail "paired: L1's nc did not listen on port $5 within 20 s ($1, round $3, $4)"
  pair_send "$2" "$_cmd" || fail "paired: $1 does not take commands on 192.168.$2.2:5004"
  wait_for_line_pid "$W/pair.$1.log" "DENSEVM-$_key-$3=" 700 "$_pid" ||
    fail "paired: $1's guest did not report its TCP $4 $3"
  # L1's end is done once the guest's nc has ended (it closed the connection, or the guest
  # received L1's close); a failed transfer can leave it waiting, so it gets 30 s.
  _j=0
  while kill -0 $_lp 2> /dev/null && [ $_j -lt 300 ]; do sleep 0.1; _j=$((_j + 1)); done
  kill -0 $_lp 2> /dev/null && fail "paired: $1, round $3: L1's end of the TCP $4 on port $5 did not finish"
  wait $_lp
  # shellcheck disable=SC2046
  set -- "$1" "$3" "$4" $(guest_value "$W/pair.$1.log" "$_key-$3")
  if [ "$3" = tx ]; then
    _got=$(tr -d ' ' < "$W/ptcp.n" 2> /dev/null)
    { [ "$_got" = "$_want" ] && [ "$5" = 0 ]; } ||
      fail "paired: $1, round $2: L1 received ${_got:-no} bytes from the guest, not $_want (guest nc status ${5:-?})"
  else
    _got=$5
    [ "$_got" = "$_want" ] || fail "paired: $1, round $2: the guest received ${_got:-no} bytes from L1, not $_want"
  fi
  echo "$2 $1 tcp-$3 $4 $_got" >> "$W/pair.txt"
}

bench_pair() {
  # shellcheck disable=SC2086
  set -- $PAIR
  [ $# = 2 ] || fail "BENCH_NET_PAIR must name two VMMs, not '$PAIR'"
  a=$1 b=$2
  [ "$a" != "$b" ] || fail "BENCH_NET_PAIR: two different VMMs"
  case " $PAIR " in *" qemu-vhost "*) [ -c /dev/vhost-net ] || modprobe vhost_net 2> /dev/null ;; esac
  tunctl -t tap1 > /dev/null || fail "tunctl -t tap1"
  ip addr add 192.168.78.1/24 dev tap1 || fail "ip addr add on tap1"
  ip link set tap1 up || fail "ip link set tap1 up"
  : > "$W/pair.txt"
  pair_start "$a" tap0 77
  pair_start "$b" tap1 78
  for v in "$a" "$b"; do
    wait_for_line_pid "$W/pair.$v.log" DENSEVM-PAIR-READY 900 "$(cat "$W/pair.$v.pid")" || {
      tr -d '\r' < "$W/pair.$v.log" | tail -n 5; tail -n 5 "$W/pair.$v.log.err" 2> /dev/null
      fail "paired: $v's guest did not get its network up"; }
  done
  echo "# paired: both guests up at $(uptime_s) s; $ROUNDS rounds of $PP pings and $PMB MiB TCP each way, load $(cut -d' ' -f1-3 /proc/loadavg)"
  # Warm-up (untimed): ARP entries, the first wake-ups.
  ping -A -q -c 20 192.168.77.2 > /dev/null 2>&1; ping -A -q -c 20 192.168.78.2 > /dev/null 2>&1
  r=1
  while [ $r -le "$ROUNDS" ]; do
    if [ $((r % 2)) = 1 ]; then o="$a:77 $b:78"; else o="$b:78 $a:77"; fi
    for x in $o; do pair_l1_ping "${x%:*}" "${x#*:}" $r; done
    for x in $o; do pair_guest_ping "${x%:*}" "${x#*:}" $r; done
    if [ "$PMB" -gt 0 ]; then
      j=0
      for d in tx rx; do
        for x in $o; do pair_tcp "${x%:*}" "${x#*:}" $r $d $((6000 + 4 * r + j)); j=$((j + 1)); done
      done
    fi
    r=$((r + 1))
  done
  for x in "$a:77" "$b:78"; do pair_send "${x#*:}" exit || echo "# paired: ${x%:*} did not take exit"; done
  for v in "$a" "$b"; do
    p=$(cat "$W/pair.$v.pid")
    wait_for_line_pid "$W/pair.$v.log" DENSEVM-GUEST-EXIT= 60 "$p" || echo "# paired: $v's guest did not exit"
    sleep 2; kill -9 "$p" 2> /dev/null; wait "$p" 2> /dev/null
  done
  ip link del tap1 2> /dev/null
  echo "# paired: done at $(uptime_s) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# paired raw (round vmm direction seconds replies min-rtt-ms avg-rtt-ms; tcp-tx, tcp-rx: round vmm direction seconds bytes):"
  sed 's/^/#   /' "$W/pair.txt"
  pair_table "$a" "$b" > "$W/pair.md"
}

pair_table() { # pair_table A B: per-VMM medians, median and range of the per-round ratios A/B
  awk -v a="$1" -v b="$2" -v n="$PP" -v rounds="$ROUNDS" -v mb="$PMB" '
    function median(v, k,   i, j, t) {
      for (i = 2; i <= k; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
      return (k % 2) ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
    }
    # TCP lines: ROUND VMM tcp-tx|tcp-rx SECONDS BYTES (MiB/s from the guest-timed seconds)
    $3 ~ /^tcp-/ {
      if ($4 > 0) mibs[$1, $2, $3] = $5 / 1048576 / $4
      if ($1 > last) last = $1
      next
    }
    {
      if ($4 > 0) rate[$1, $2, $3] = n / $4
      # (a guest ping has reported a min RTT of 0.000 ms: such a figure is left out)
      if (NF >= 6 && $6 > 0) minrtt[$1, $2, $3] = $6 * 1000
      if (NF >= 7 && $7 > 0) avgrtt[$1, $2, $3] = $7 * 1000
      if ($5 != n) lost[$2, $3] += n - $5
      if ($1 > last) last = $1
    }
    # row LABEL DIR WHAT: per-VMM medians of WHAT (rate: round trips/s from the wall time;
    # min, avg: ping RTTs in us; mibs: TCP MiB/s) and the per-round speed ratios A/B (B/A for
    # RTTs).
    function row(label, dir, what,   r, k, x, y, z, lo, hi, u, v, w, f) {
      k = 0; w = 0
      for (r = 1; r <= last; r++) {
        if (what == "rate") { u = rate[r, a, dir]; v = rate[r, b, dir] }
        else if (what == "mibs") { u = mibs[r, a, dir]; v = mibs[r, b, dir] }
        else if (what == "min") { u = minrtt[r, a, dir]; v = minrtt[r, b, dir] }
        else { u = avgrtt[r, a, dir]; v = avgrtt[r, b, dir] }
        if (u == "" || v == "" || u == 0 || v == 0) continue
        k++; x[k] = u; y[k] = v; z[k] = (what == "rate" || what == "mibs") ? u / v : v / u; if (z[k] > 1) w++
        if (k == 1 || z[k] < lo) lo = z[k]; if (k == 1 || z[k] > hi) hi = z[k]
      }
      if (k == 0) { printf "| %s | n/a | n/a | n/a | n/a | 0 of 0 |\n", label; return }
      f = (what == "mibs") ? "%.2f" : "%.0f"
      printf "| %s | " f " | " f " | %.2f | %.2f-%.2f | %d of %d |\n", label, median(x, k), median(y, k), median(z, k), lo, hi, w, k
      if (what == "rate" && (((a, dir) in lost) || ((b, dir) in lost))) note = note sprintf("lost replies, %s: %s %d, %s %d\n", label, a, lost[a, dir], b, lost[b, dir])
    }
    END {
      printf "| paired: %d rounds x %d ping -A%s | %s (median) | %s (median) | median of per-round %s/%s speed | per-round range | rounds %s faster |\n", rounds, n, (mb > 0) ? sprintf(", %d MiB TCP", mb) : "", a, b, a, b, a
      print "|---|---:|---:|---:|---:|---:|"
      row("L1 -> guest, round trips/s", "l1-guest", "rate")
      row("L1 -> guest, min RTT us", "l1-guest", "min")
      row("L1 -> guest, avg RTT us", "l1-guest", "avg")
      row("guest -> L1, round trips/s", "guest-l1", "rate")
      row("guest -> L1, min RTT us", "guest-l1", "min")
      row("guest -> L1, avg RTT us", "guest-l1", "avg")
      if (mb > 0) {
        row("TCP guest -> L1, MiB/s", "tcp-tx", "mibs")
        row("TCP L1 -> guest, MiB/s", "tcp-rx", "mibs")
      }
      printf "%s", note
    }' "$W/pair.txt"
}

failed=""
if [ "$ROUNDS" -gt 0 ]; then
  (bench_pair) || { failed="$failed paired"; for v in $PAIR; do kill -9 "$(cat "$W/pair.$v.pid" 2> /dev/null)" 2> /dev/null; done
    ip link del tap1 2> /dev/null; sleep 1; echo "# paired phase FAILED (see the FAIL line above)"; }
fi
for vmm in $VMMS; do
  if ! (bench_vmm "$vmm"); then
    failed="$failed $vmm"
    kill -9 "$(cat "$W/vm.pid" 2> /dev/null)" 2> /dev/null
    sleep 1
    echo "# $vmm FAILED (see the FAIL line above)"
  fi
done

val() { [ -f "$W/res.$1" ] && sed -n "s/^$2=//p" "$W/res.$1" | head -n 1; }
row() { # row LABEL KEY AWK-EXPR(v): densevm | QEMU vhost=off | densevm/QEMU | QEMU vhost=on
  d=$(val densevm "$2"); q=$(val qemu "$2"); h=$(val qemu-vhost "$2")
  awk -v label="$1" -v d="$d" -v q="$q" -v h="$h" -v mb="$MB" -v n="$PINGS" "
    function f(v) { return $3 }
    BEGIN {
      dv = (d == \"\") ? \"n/a\" : sprintf(\"%.1f\", f(d))
      qv = (q == \"\") ? \"n/a\" : sprintf(\"%.1f\", f(q))
      hv = (h == \"\") ? \"n/a\" : sprintf(\"%.1f\", f(h))
      r = (d == \"\" || q == \"\" || f(q) == 0) ? \"n/a\" : sprintf(\"%.2f\", f(d) / f(q))
      printf \"| %s | %s | %s | %s | %s |\n\", label, dv, qv, r, hv
    }"
}
if [ -s "$W/pair.md" ]; then
  echo
  cat "$W/pair.md"
fi
echo
echo "| sequential, one VMM after the other (higher is better) | densevm | QEMU 7.2 vhost=off | densevm/QEMU | QEMU 7.2 vhost=on |"
echo "|---|---:|---:|---:|---:|"
row "TCP guest -> L1, MiB/s" TX_S "mb / v"
row "TCP L1 -> guest, MiB/s" RX_S "mb / v"
row "ping -A guest -> L1, round trips/s" PING_S "n / v"
row "ping -A L1 -> guest, round trips/s" L1PING_S "n / v"
e=$(val densevm EXEC_US); c=$(val densevm CONSOLE_US)
echo
echo "| densevm, median of $EXEC_N | ms |"
echo "|---|---:|"
awk -v e="$e" -v c="$c" 'BEGIN {
  printf "| densevm exec -- true | %s |\n", e == "" ? "n/a" : sprintf("%.1f", e / 1000)
  printf "| console round trip (densevm console --send/--wait-for) | %s |\n", c == "" ? "n/a" : sprintf("%.1f", c / 1000)
  printf "| ratio exec / console | %s |\n", (e == "" || c == "" || c == 0) ? "n/a" : sprintf("%.2f", e / c)
}'
if [ -n "$failed" ]; then
  echo
  echo "FAIL: the benchmark did not complete for:$failed"
  exit 1
fi
