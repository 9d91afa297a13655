#!/bin/sh
# lab-seconds: 68
# virtio-vsock and the guest agent (issue #14 part 2): a stock Debian L2 with
# `--vsock cid=3,uds=...` boots with `densevm.agent` (init loads the vsock modules and
# starts /bin/densevm-agent on port 52), then `densevm exec --api-sock` runs:
#   `uname -r` (must print the guest kernel's release), a command that fails (its exit
#   code comes back), `sha256sum` of 1 MiB sent on stdin (must match L1's), 10 MiB of
#   output (L1's checksum of what arrived must match the guest's), a command past its
#   --timeout (124), a port nobody serves (a clear error);
# and bad --vsock options are refused before a VM starts; 10 `exec true` round trips are
# timed (TCG-nested: a ratio to compare, not a figure). Then a snapshot of the VM is
# restored in a new process (all connections reset, the guest told with a transport-reset
# event) and exec works there, and in two clones of it (each its own socket
# <uds>.clone-K), without a reboot. Last, a fleet daemon restores the snapshot as VM f1 and
# `densevm fleet exec` (POST /vms/f1/exec) runs uname -r, a failing command, one reading
# stdin and one past its timeout.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_cmd sha256sum head cut
W=/tmp/vsock-exec
tmpfs_workdir "$W"
t0=$(uptime_s)

# ---- bad options: refused at once ---------------------------------------------------------
expect_refused() { # expect_refused WHAT PATTERN ARGS...
  _what=$1 _pat=$2; shift 2
  if densevm run "$@" > bad.log 2>&1; then fail "$_what: densevm run succeeded"; fi
  grep -q -- "$_pat" bad.log || { cat bad.log; fail "$_what: no '$_pat' in the error"; }
  echo "ok: $_what refused: $(grep -m1 error bad.log)"
}
expect_refused "--vsock with the probe guest" "Linux guest" --probe --vsock cid=3,uds=$W/p.sock
expect_refused "cid=2" "reserved" --kernel "$GUEST_VMLINUX" --vsock cid=2,uds=$W/p.sock
echo x > file
expect_refused "a uds path that is a file" "remove it" --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --vsock cid=3,uds=$W/file
expect_refused "a uds path in a missing directory" "writable directory" --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --vsock cid=3,uds=$W/no/dir.sock

# ---- the VM -----------------------------------------------------------------------------------
densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M \
  --vsock cid=3,uds=$W/v.sock --api-sock $W/api.sock \
  --cmdline "console=ttyS0 panic=-1 $L2_KERNEL_ARGS densevm.agent hold" > vm.log 2>&1 &
vm=$!
restored=
clones=
fleet=
trap 'kill $vm $restored $clones $fleet 2>/dev/null' EXIT
wait_for_line_pid vm.log "densevm-agent: listening" 300 $vm || {
  tail -n 30 vm.log; fail "the guest agent did not start (densevm exited, or 300 s passed)"
}
grep -q "DENSEVM-GUEST-MODULE-FAILED" vm.log && { grep MODULE-FAILED vm.log; fail "a vsock module did not load"; }
echo "agent up at $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { print b - a }') s"
expect_refused "a uds path in use" "in use" --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --vsock cid=4,uds=$W/v.sock
X="densevm exec --api-sock $W/api.sock --wait 30"

# uname -r
kver=$($X --no-stdin -- uname -r) || fail "densevm exec uname -r: exit $?"
[ "$kver" = "$GUEST_KERNEL_RELEASE" ] || fail "uname -r: '$kver', expected '$GUEST_KERNEL_RELEASE'"
echo "ok: uname -r = $kver"

# A failing command: its exit code and stderr come back.
$X --no-stdin -- sh -c 'echo to-stderr >&2; exit 7' 2> err.txt
rc=$?
[ "$rc" = 7 ] || fail "exit 7 came back as $rc"
grep -q to-stderr err.txt || fail "stderr lost: $(cat err.txt)"
$X --no-stdin -- /no/such/cmd 2> err.txt
rc=$?
[ "$rc" = 127 ] && grep -q "cannot execute" err.txt || fail "a missing command: exit $rc, $(cat err.txt)"
echo "ok: exit codes 7 and 127 propagated"

# stdin: 1 MiB in, its checksum out.
head -c 1048576 /dev/urandom > in.bin
want=$(sha256sum < in.bin | cut -d' ' -f1)
got=$($X -- sha256sum < in.bin | cut -d' ' -f1) || fail "sha256sum over exec failed"
[ "$got" = "$want" ] || fail "sha256 of 1 MiB through stdin: guest $got, L1 $want"
echo "ok: 1 MiB of stdin reached the guest intact"

# 10 MiB of output: the guest's checksum (stderr) must match what arrived (stdout).
t1=$(uptime_s)
$X --no-stdin -- sh -c 'head -c 10485760 /dev/urandom > /tmp/big && sha256sum /tmp/big >&2 && cat /tmp/big && rm /tmp/big' > out.bin 2> out.sum ||
  fail "10 MiB output: exit $? ($(cat out.sum))"
size=$(wc -c < out.bin)
[ "$size" = 10485760 ] || fail "10 MiB output: $size bytes arrived"
[ "$(sha256sum < out.bin | cut -d' ' -f1)" = "$(cut -d' ' -f1 out.sum)" ] || fail "10 MiB output: checksums differ"
echo "ok: 10 MiB of output intact ($(awk -v a="$t1" -v b="$(uptime_s)" 'BEGIN { print b - a }') s)"

# Round trips of `exec true` (a densevm process, GET /vsock, CONNECT, the agent's fork).
t1=$(uptime_s)
i=0
while [ $i -lt 10 ]; do $X --no-stdin -- true || fail "exec true: exit $?"; i=$((i + 1)); done
echo "exec true round trip: $(awk -v a="$t1" -v b="$(uptime_s)" 'BEGIN { printf "%.0f", (b - a) * 100 }') ms (mean of 10, TCG-nested L2)"

# A timeout, and a port nobody serves.
$X --no-stdin --timeout 2 -- sleep 60 2> err.txt
rc=$?
[ "$rc" = 124 ] || fail "--timeout 2 on sleep 60: exit $rc ($(cat err.txt))"
echo "ok: --timeout kills the command (124)"
if densevm exec --api-sock $W/api.sock --port 4444 --no-stdin -- true 2> err.txt; then fail "exec to port 4444 succeeded"; fi
grep -q "no agent answered" err.txt || fail "no agent: $(cat err.txt)"
echo "ok: no agent on port 4444: $(head -c 100 err.txt)..."

# ---- snapshot, restore in a new process, exec again ---------------------------------------
densevm vm snapshot --api-sock $W/api.sock --dir $W/snap > snap.log 2>&1 || { cat snap.log; fail "snapshot failed"; }
kill -9 $vm; wait $vm 2>/dev/null
densevm run --restore $W/snap --api-sock $W/api2.sock > restored.log 2>&1 &
restored=$!
out=$(densevm exec --api-sock $W/api2.sock --wait 60 --no-stdin -- sh -c 'echo restored-$((6*7))')
rc=$?
[ "$rc" = 0 ] || { tail -n 20 restored.log; fail "exec after restore: exit $rc"; }
[ "$out" = restored-42 ] || fail "exec after restore printed '$out'"
echo "ok: exec works in the restored VM (stale socket replaced, connections reset)"

# ---- clones of the restored VM: each its own socket, the agent answers without a reboot ----
densevm vm clone --api-sock $W/api2.sock --count 2 --dir $W/clones --json > clone.json 2> clone.err ||
  fail "densevm vm clone: $(cat clone.json clone.err)"
clones=$(grep -o '"pid": *[0-9]*' clone.json | grep -o '[0-9]*$' | tr '\n' ' ')
n=0
for s in $(grep -o '"api_sock": *"[^"]*"' clone.json | sed 's/.*"\([^"]*\)"$/\1/'); do
  out=$(densevm exec --api-sock "$s" --wait 60 --no-stdin -- sh -c 'echo clone-$((6*7))')
  rc=$?
  [ "$rc" = 0 ] && [ "$out" = clone-42 ] || fail "exec in the clone of $s: exit $rc, '$out'"
  n=$((n + 1))
done
[ "$n" = 2 ] || fail "expected 2 clones, found $n in: $(cat clone.json)"
ls $W/v.sock.clone-0 $W/v.sock.clone-1 > /dev/null || fail "no per-clone vsock sockets: $(ls $W)"
echo "ok: exec works in both clones (sockets v.sock.clone-0/1)"
kill $restored $clones; wait $restored 2>/dev/null
clones=

# ---- the fleet's exec: a VM the fleet restores from the snapshot, POST /vms/{id}/exec -------
densevm fleet serve --sock $W/fleet.sock --state-dir $W/fleet --cgroup off > fleet.log 2>&1 &
fleet=$!
trap 'kill $vm $restored $clones $fleet 2>/dev/null' EXIT
i=0
until [ -S $W/fleet.sock ]; do
  i=$((i + 1)); [ $i -lt 100 ] || { cat fleet.log; fail "the fleet daemon did not start"; }
  sleep 0.1
done
densevm fleet create --sock $W/fleet.sock --id f1 --restore $W/snap --memory 256M > fc.log 2>&1 ||
  fail "fleet create --restore: $(cat fc.log)"
F="densevm fleet exec --sock $W/fleet.sock f1"
i=0
until out=$($F --timeout 10 -- uname -r 2> fe.err); do
  i=$((i + 1)); [ $i -lt 30 ] || fail "fleet exec uname -r: $(cat fe.err)"
  sleep 2
done
[ "$out" = "$GUEST_KERNEL_RELEASE" ] || fail "fleet exec uname -r: '$out'"
$F -- sh -c 'echo fleet-err >&2; exit 9' 2> fe.err
rc=$?
[ "$rc" = 9 ] && grep -q fleet-err fe.err || fail "fleet exec exit 9: exit $rc, stderr $(cat fe.err)"
printf 'one\ntwo\nthree\n' > lines.txt
out=$($F --stdin lines.txt -- wc -l) || fail "fleet exec with stdin: exit $?"
[ "$out" = 3 ] || fail "fleet exec wc -l of 3 lines printed '$out'"
$F --json --timeout 1 -- sleep 30 > fe.json
grep -q '"status": *"timed_out"' fe.json && grep -q '"exit_code": *124' fe.json || fail "fleet exec timeout: $(cat fe.json)"
echo "ok: the fleet's exec (POST /vms/f1/exec): uname -r, exit code 9 and stderr, stdin, timeout"
densevm fleet delete --sock $W/fleet.sock f1 > /dev/null || fail "fleet delete f1"
kill $fleet; wait $fleet 2>/dev/null
echo "PASS: vsock + guest agent: uname -r, exit codes, 1 MiB stdin, 10 MiB stdout, timeout, no agent, restore, clones, fleet exec ($(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { print b - a }') s)"
