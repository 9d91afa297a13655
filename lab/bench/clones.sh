#!/bin/bash
# Clone benchmark (issue #11), run inside L1 by `make bench-clones`
# (lab/run lab/bench/clones.sh). Both VMMs in one L1 run; every L2 is the Debian kernel
# (vmlinux through PVH), 1 vCPU, no devices (modules=virtio_pci only), running a guest
# script that prints "TICK n" every $BENCH_CLONE_TICK_S s, so a clone that keeps ticking
# is a working clone.
#
# Phase 1, clone latency, for each guest size in $BENCH_CLONE_SIZES (default 256M 2G):
#   densevm  `densevm vm clone --count 1` on the same running parent, $BENCH_CLONE_REPS
#            times, each into a new --dir: its "ms" field (pause, state save, freezing the
#            RAM file, starting the clone process, until the clone answers on its API
#            socket); then one `--count $BENCH_CLONE_BATCH` call (total ms / count).
#            Only the first call finds the parent's RAM still in its own shared file;
#            later calls first copy the parent's current RAM into a new template file
#            (docs/snapshots.md).
#   qemu     QEMU 7.2 templating (/work/shared/notes recipe): the template's RAM is a
#            memory-backend-file share=on; "save" = QMP stop + migrate "exec:cat > FILE"
#            with x-ignore-shared until query-migrate says completed; "start" = launching
#            the clone QEMU (the same command line with share=off and -incoming defer)
#            until query-status says running after migrate-incoming "exec:cat FILE" and a
#            cont (the template was stopped, so the clone arrives paused).
#            One clone = save + start. Repeated $BENCH_CLONE_REPS times (the template is
#            resumed with cont between repetitions, once the previous clone is gone: a
#            share=on template must stay stopped while its clones live).
#   Each clone's console must show $BENCH_CLONE_MIN_TICKS TICK lines (it keeps running)
#   before it is killed.
# Phase 2, per-clone memory, for N in $BENCH_CLONE_COUNTS (default 8 32): a fresh 256 MiB
#   parent/template booted to its tick loop; densevm: one `densevm vm clone --count N`;
#   QEMU: one migrate, then N clone QEMUs started one after another. $BENCH_CLONE_SETTLE_S
#   (30) s after the last clone started, /proc/PID/smaps_rollup of every clone process and
#   of the parent/template: per-clone average and max of PSS, RSS, Private_Dirty, and the
#   part of each in the guest RAM mappings (from smaps: densevm's RAM memfd, QEMU's
#   template file).
# Every VM is killed between phases. A failing phase prints why (a FAIL line) and the script
# goes on with the next one; the exit status is 1 when any phase failed. L1's ksmd is off.
# Times in L1 are TCG-distorted: compare the ratios, not the absolute figures.
. "$LAB_SRC/lib/test-lib.sh"
need_l2_densevm
need_cmd qemu-system-x86_64 timeout gzip base64

SIZES="${BENCH_CLONE_SIZES:-256M 2G}"
REPS="${BENCH_CLONE_REPS:-5}"
BATCH="${BENCH_CLONE_BATCH:-8}"
COUNTS="${BENCH_CLONE_COUNTS:-8 32}"
VMMS="${BENCH_CLONE_VMMS:-densevm qemu}"
SETTLE="${BENCH_CLONE_SETTLE_S:-30}"
TICK_S="${BENCH_CLONE_TICK_S:-1}"
MIN_TICKS="${BENCH_CLONE_MIN_TICKS:-3}"
BOOT_TIMEOUT="${BENCH_CLONE_BOOT_TIMEOUT:-600}"
CLONE_TIMEOUT="${BENCH_CLONE_TIMEOUT:-300}"
TICK_TIMEOUT="${BENCH_CLONE_TICK_TIMEOUT:-120}"
PORT0=4500
L2_MODULES=virtio_pci
TICK_SCRIPT="i=0; while true; do i=\$((i+1)); echo \"TICK \$i\"; sleep $TICK_S; done"
TICK_B64=$(printf '%s\n' "$TICK_SCRIPT" | gzip -9 | base64 | tr -d '\n')
# The same command line l2_start gives densevm's parents.
CMDLINE="console=ttyS0 panic=-1 quiet modules=$L2_MODULES densevm.script=$TICK_B64"

W="${BENCH_CLONE_WORK:-/tmp/bc}"
if [ -z "${BENCH_CLONE_WORK:-}" ]; then
  # One tmpfs for sockets, consoles, state files and QEMU's template RAM files (a 2 GiB
  # sparse file must fit the size limit).
  mkdir -p "$W" && mount -t tmpfs -o size=90% tmpfs "$W" || fail "cannot mount a tmpfs on $W"
fi
cd "$W" || fail "cd $W"
RES=$W/results
: > "$RES"
KSM=/sys/kernel/mm/ksm
[ -w "$KSM/run" ] && echo 0 > "$KSM/run"

# ---- helpers ----
res() { echo "$1=$2" >> "$RES"; }
val() { sed -n "s/^$1=//p" "$RES" | tail -n 1; }
note() { echo "# $*"; }
ms_since() { awk -v a="$1" -v b="${2:-$EPOCHREALTIME}" 'BEGIN { printf "%.1f", (b - a) * 1000 }'; }

# alive PID: the process exists and is not a zombie.
alive() {
  [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# stop_pids PID...: SIGTERM, up to 5 s, then SIGKILL for what is left.
stop_pids() {
  local p left i=0
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null
  while [ $i -lt 50 ]; do
    left=""
    for p in "$@"; do alive "$p" && left="$left $p"; done
    [ -z "$left" ] && break
    sleep 0.1; i=$((i + 1))
  done
  for p in $left; do kill -9 "$p" 2>/dev/null; done
  for p in "$@"; do wait "$p" 2>/dev/null; done
  return 0
}

# kill_vms: ends every process this script started whose command line names the work
# directory (parents, templates, clones, clone clients), by PID.
kill_vms() {
  local p pids=""
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] && continue
    tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qF "$W/" && pids="$pids $p"
  done
  # shellcheck disable=SC2086
  stop_pids $pids
}

# ticks FILE: how many TICK lines FILE holds.
ticks() { tr -d '\r' < "$1" 2>/dev/null | grep -c '^TICK [0-9]'; }
# tick_range FILE: "first..last" tick number in FILE.
tick_range() { tr -d '\r' < "$1" 2>/dev/null | awk '/^TICK [0-9]+$/ { if (f == "") f = $2; l = $2 } END { print f ".." l }'; }

# wait_ticks FILE COUNT SECONDS [PID]: until FILE holds COUNT TICK lines; 1 on timeout,
# 2 when PID ended first.
wait_ticks() {
  local end=$((EPOCHSECONDS + $3))
  while [ "$(ticks "$1")" -lt "$2" ]; do
    [ -n "$4" ] && ! alive "$4" && return 2
    [ "$EPOCHSECONDS" -ge "$end" ] && return 1
    sleep 0.2
  done
}

# check_clone WHAT CONSOLE PID: fails unless the clone's console gains MIN_TICKS ticks.
check_clone() {
  wait_ticks "$2" "$MIN_TICKS" "$TICK_TIMEOUT" "$3"
  case $? in
    0) return 0 ;;
    2) fail "$1 (pid $3) exited after $(ticks "$2") ticks; its console ends: $(tail -n 5 "$2" | tr -d '\r' | tr '\n' '|')" ;;
    *) fail "$1 (pid $3) printed $(ticks "$2") TICK lines in ${TICK_TIMEOUT}s, not $MIN_TICKS; console ends: $(tail -n 5 "$2" | tr -d '\r' | tr '\n' '|')" ;;
  esac
}

# boot_ticking WHAT LOG PID: waits for the parent/template's third tick.
boot_ticking() {
  wait_ticks "$2" 3 "$BOOT_TIMEOUT" "$3"
  case $? in
    0) note "$1: ticking after $(($(cut -d. -f1 /proc/uptime) - L2_START)) s" ;;
    2) fail "$1 exited before ticking: $(cat "$2.err" 2>/dev/null; tail -n 8 "$2" | tr -d '\r' | tr '\n' '|')" ;;
    *) fail "$1: no 3 TICK lines within ${BOOT_TIMEOUT}s; console ends: $(tail -n 8 "$2" | tr -d '\r' | tr '\n' '|')" ;;
  esac
}

# rollup PID: "pss rss private_dirty" in kB from smaps_rollup (empty when unreadable).
rollup() {
  awk '$1 == "Pss:" { p = $2 } $1 == "Rss:" { r = $2 } $1 == "Private_Dirty:" { d = $2 }
    END { if (r != "") print p, r, d }' "/proc/$1/smaps_rollup" 2>/dev/null
}

# ram_rollup PID PATH: "pss rss private_dirty" in kB of the mappings whose smaps line names
# PATH: the guest RAM (densevm: its RAM memfd, "/memfd:densevm-ram", the frozen template
# file in a clone, holding the boot-image windows too; QEMU: the template's RAM file).
ram_rollup() {
  awk -v path="$2" '
    /^[0-9a-f]+-[0-9a-f]+ / { inside = index($0, path) > 0; next }
    inside && $1 == "Pss:" { p += $2 }
    inside && $1 == "Rss:" { r += $2 }
    inside && $1 == "Private_Dirty:" { d += $2 }
    END { print p + 0, r + 0, d + 0 }' "/proc/$1/smaps" 2>/dev/null
}

# stats V...: "median min max" of the numbers (n/a when none).
stats() {
  printf '%s\n' "$@" | awk 'NF { v[n++] = $1 + 0 }
    END {
      if (!n) { print "n/a n/a n/a"; exit }
      for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      m = (n % 2) ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2
      printf "%.1f %.1f %.1f\n", m, v[0], v[n - 1]
    }'
}

# densevm_parent DIR SIZE: boots a ticking densevm parent with an API socket DIR/api.sock.
densevm_parent() {
  export L2_MEM=$2
  l2_start "$1/parent.log" "$GUEST_INITRD" "$TICK_SCRIPT" --cpus 1 --api-sock "$1/api.sock"
  PARENT_PID=$L2_PID
  boot_ticking "densevm parent ($2)" "$1/parent.log" "$PARENT_PID"
}

# densevm_clone SOCK DIR COUNT: one `densevm vm clone` call; sets CLONE_MS (the API's
# running_ms: request to every clone's vCPUs running), CLONE_ANSWER_MS (its round trip "ms",
# which also covers the parent moving its RAM off the template), CLONE_PIDS, CLONE_CONSOLES
# and CLONE_WALL_MS (the client's wall time, process start included).
densevm_clone() {
  local t0 out
  t0=$EPOCHREALTIME
  out=$(timeout "$CLONE_TIMEOUT" densevm vm clone --api-sock "$1" --count "$3" --dir "$2" --json 2>&1)
  local status=$?
  CLONE_WALL_MS=$(ms_since "$t0")
  CLONE_PIDS=$(echo "$out" | sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p' | xargs)
  CLONE_CONSOLES=$(echo "$out" | sed -n 's/.*"console": *"\([^"]*\)".*/\1/p' | xargs)
  CLONE_ANSWER_MS=$(echo "$out" | sed -n 's/^ *"ms": *\([0-9.eE+-]*\).*/\1/p' | head -n 1)
  CLONE_MS=$(echo "$out" | sed -n 's/^ *"running_ms": *\([0-9.eE+-]*\).*/\1/p' | head -n 1)
  [ -n "$CLONE_MS" ] || CLONE_MS=$CLONE_ANSWER_MS
  [ -n "$CLONE_MS" ] && CLONE_MS=$(awk -v v="$CLONE_MS" 'BEGIN { printf "%.1f", v }')
  if [ "$status" != 0 ] || [ -z "$CLONE_MS" ]; then
    fail "densevm vm clone --count $3 failed (status $status after $CLONE_WALL_MS ms): $(echo "$out" | tail -n 5 | tr '\n' ' ')"
  fi
  [ "$(echo "$CLONE_PIDS" | wc -w)" = "$3" ] || fail "densevm vm clone --count $3 named $(echo "$CLONE_PIDS" | wc -w) clones: $out"
}

# ---- QEMU through QMP (TCP on lo; bash's /dev/tcp) ----
# qmp_open PORT PID SECONDS: connects to QEMU's QMP server, retrying while QEMU starts, and
# negotiates capabilities; the descriptor is left in QFD. Status 1 with QERR set on failure.
qmp_open() {
  local end=$((EPOCHSECONDS + $3)) greeting
  until { exec {QFD}<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null; do
    alive "$2" || { QERR="QEMU (pid $2) exited before its QMP port $1 opened"; return 1; }
    [ "$EPOCHSECONDS" -lt "$end" ] || { QERR="QMP port $1 not open within $3 s"; return 1; }
    sleep 0.02
  done
  IFS= read -r -t "$3" -u "$QFD" greeting || { QERR="no QMP greeting on port $1"; return 1; }
  case $greeting in *'"QMP"'*) ;; *) QERR="unexpected QMP greeting: $greeting"; return 1 ;; esac
  qmp "$QFD" '{"execute": "qmp_capabilities"}' 30
}

# qmp FD JSON SECONDS: sends one command, reads lines (skipping events) until its answer,
# which is left in QREPLY. Status 1 with QERR set on an error answer, a timeout or EOF.
qmp() {
  printf '%s\n' "$2" >&"$1" 2>/dev/null || { QERR="QMP: cannot send $2"; return 1; }
  while :; do
    IFS= read -r -t "$3" -u "$1" QREPLY || { QERR="QMP: no answer to $2 within $3 s"; return 1; }
    QREPLY=${QREPLY%$'\r'}
    case $QREPLY in
      '{"return"'*) return 0 ;;
      '{"error"'*) QERR="QMP $2: $QREPLY"; return 1 ;;
    esac
  done
}

# qmp_until FD QUERY GOOD BAD SECONDS [WHEN THEN]: repeats QUERY until the answer contains
# GOOD; status 1 (QERR set) when it contains BAD, on a QMP failure, or after SECONDS. An
# answer containing WHEN makes it send the command THEN once.
qmp_until() {
  local end=$((EPOCHSECONDS + $5)) sent=""
  while :; do
    qmp "$1" "$2" 30 || return 1
    case $QREPLY in *"$3"*) return 0 ;; esac
    case $QREPLY in *"$4"*) QERR="$2 answered $QREPLY"; return 1 ;; esac
    if [ -n "$6" ] && [ -z "$sent" ]; then
      case $QREPLY in *"$6"*) qmp "$1" "$7" 30 || return 1; sent=1; continue ;; esac
    fi
    [ "$EPOCHSECONDS" -lt "$end" ] || { QERR="$2 still answers $QREPLY after $5 s"; return 1; }
    sleep 0.01
  done
}

IGNORE_SHARED='{"execute": "migrate-set-capabilities", "arguments": {"capabilities": [{"capability": "x-ignore-shared", "state": true}]}}'

# qemu_vm LOG SIZE RAMFILE SHARE PORT [ARG...]: starts one L2 QEMU in the background whose
# guest RAM is RAMFILE (memory-backend-file, share=on|off), QMP on 127.0.0.1:PORT; sets QEMU_PID.
qemu_vm() {
  local log=$1 size=$2 ram=$3 share=$4 port=$5
  shift 5
  : > "$log"
  # shellcheck disable=SC2086
  qemu-system-x86_64 $L2_QEMU_ACCEL -smp 1 -m "$size" -nodefaults -no-user-config -display none \
    -no-reboot -object "memory-backend-file,id=mem,size=$size,mem-path=$ram,share=$share" \
    -machine memory-backend=mem -serial "file:$log" -kernel "$GUEST_VMLINUX" -initrd "$GUEST_INITRD" \
    -append "$CMDLINE" -qmp "tcp:127.0.0.1:$port,server=on,wait=off" "$@" > "$log.err" 2>&1 &
  QEMU_PID=$!
  L2_START=$(cut -d. -f1 /proc/uptime)
}

# qemu_template DIR SIZE: boots the ticking template (QMP connection in TFD, PID in TMPL_PID)
# with x-ignore-shared set.
qemu_template() {
  qemu_vm "$1/tmpl.log" "$2" "$1/ram" on "$PORT0"
  TMPL_PID=$QEMU_PID
  qmp_open "$PORT0" "$TMPL_PID" 120 || fail "QEMU template ($2): $QERR; $(tail -n 3 "$1/tmpl.log.err")"
  TFD=$QFD
  boot_ticking "QEMU template ($2)" "$1/tmpl.log" "$TMPL_PID"
  qmp "$TFD" "$IGNORE_SHARED" 30 || fail "QEMU template: $QERR"
}

# qemu_save DIR STATE: stop + migrate the template into STATE; sets SAVE_MS.
qemu_save() {
  local t0=$EPOCHREALTIME
  qmp "$TFD" '{"execute": "stop"}' 60 || fail "QEMU template stop: $QERR"
  qmp "$TFD" "{\"execute\": \"migrate\", \"arguments\": {\"uri\": \"exec:cat > $2\"}}" 60 ||
    fail "QEMU template migrate: $QERR"
  qmp_until "$TFD" '{"execute": "query-migrate"}' '"status": "completed"' '"status": "failed"' "$CLONE_TIMEOUT" ||
    fail "QEMU template migration to $2: $QERR"
  SAVE_MS=$(ms_since "$t0")
}

# qemu_clone DIR SIZE STATE K: starts clone K from STATE and waits until it runs; sets
# START_MS, CLONE_PID (its QMP connection is closed again).
qemu_clone() {
  local t0=$EPOCHREALTIME port=$((PORT0 + 1 + $4)) cfd
  qemu_vm "$1/clone$4.log" "$2" "$1/ram" off "$port" -incoming defer
  CLONE_PID=$QEMU_PID
  qmp_open "$port" "$CLONE_PID" 120 || fail "QEMU clone $4: $QERR; $(tail -n 3 "$1/clone$4.log.err")"
  cfd=$QFD
  qmp "$cfd" "$IGNORE_SHARED" 30 || fail "QEMU clone $4: $QERR"
  qmp "$cfd" "{\"execute\": \"migrate-incoming\", \"arguments\": {\"uri\": \"exec:cat $3\"}}" 60 ||
    fail "QEMU clone $4 migrate-incoming: $QERR"
  # The template was stopped before its migration, so the clone ends the incoming migration
  # paused (QEMU migrates the run state): it needs a cont.
  qmp_until "$cfd" '{"execute": "query-status"}' '"running": true' '"status": "internal-error"' "$CLONE_TIMEOUT" \
    '"status": "paused"' '{"execute": "cont"}' ||
    fail "QEMU clone $4 did not run: $QERR; $(tail -n 3 "$1/clone$4.log.err")"
  START_MS=$(ms_since "$t0")
  exec {cfd}>&-
}

# ---- phase 1: latency ----
lat_densevm() { # SIZE
  local size=$1 d=$W/lat-densevm-$1 r pids before
  mkdir -p "$d"
  densevm_parent "$d" "$size"
  for r in $(seq 1 "$REPS"); do
    before=$(ticks "$d/parent.log")
    densevm_clone "$d/api.sock" "$d/c$r" 1
    res "LAT_densevm_${size}_R$r" "$CLONE_MS"
    check_clone "densevm clone $r ($size)" "$CLONE_CONSOLES" "$CLONE_PIDS"
    note "densevm $size: clone $r: running after $CLONE_MS ms (answer $CLONE_ANSWER_MS ms, client wall $CLONE_WALL_MS ms), clone ticks $(tick_range "$CLONE_CONSOLES")"
    res "LAT_densevm_${size}_OK" "$r"
    # shellcheck disable=SC2086
    stop_pids $CLONE_PIDS
    [ "$(ticks "$d/parent.log")" -gt "$before" ] || fail "densevm parent ($size) stopped ticking after clone $r"
  done
  densevm_clone "$d/api.sock" "$d/batch" "$BATCH"
  res "LAT_densevm_${size}_BATCH" "$CLONE_MS"
  pids=($CLONE_PIDS)
  r=0
  for c in $CLONE_CONSOLES; do
    check_clone "densevm batch clone $r ($size)" "$c" "${pids[$r]}"
    r=$((r + 1))
  done
  note "densevm $size: $BATCH clones in one call: $CLONE_MS ms, all $BATCH ticking"
  res "LAT_densevm_${size}_BATCH_OK" "$BATCH"
  # shellcheck disable=SC2086
  stop_pids $CLONE_PIDS
  ticks_now=$(ticks "$d/parent.log")
  wait_ticks "$d/parent.log" $((ticks_now + 2)) "$TICK_TIMEOUT" "$PARENT_PID" ||
    fail "densevm parent ($size) stopped ticking after the clones"
  note "densevm $size: parent kept ticking ($(tick_range "$d/parent.log"))"
}

lat_qemu() { # SIZE
  local size=$1 d=$W/lat-qemu-$1 r before
  mkdir -p "$d"
  qemu_template "$d" "$size"
  for r in $(seq 1 "$REPS"); do
    qemu_save "$d" "$d/state$r"
    qemu_clone "$d" "$size" "$d/state$r" "$r"
    res "LAT_qemu_${size}_SAVE_R$r" "$SAVE_MS"
    res "LAT_qemu_${size}_START_R$r" "$START_MS"
    res "LAT_qemu_${size}_R$r" "$(awk -v a="$SAVE_MS" -v b="$START_MS" 'BEGIN { printf "%.1f", a + b }')"
    check_clone "QEMU clone $r ($size)" "$d/clone$r.log" "$CLONE_PID"
    note "qemu $size: clone $r: stop+migrate $SAVE_MS ms + clone start $START_MS ms (state file $(($(stat -c %s "$d/state$r") / 1024)) KiB), clone ticks $(tick_range "$d/clone$r.log")"
    res "LAT_qemu_${size}_OK" "$r"
    stop_pids "$CLONE_PID"
    # The template may run again only once its clone is gone.
    before=$(ticks "$d/tmpl.log")
    qmp "$TFD" '{"execute": "cont"}' 60 || fail "QEMU template cont: $QERR"
    wait_ticks "$d/tmpl.log" $((before + 1)) "$TICK_TIMEOUT" "$TMPL_PID" ||
      fail "QEMU template ($size) did not tick again after cont"
  done
}

# ---- phase 2: memory ----
# mem_measure VMM N PARENT_PID: reads the rollup of every clone in MEM_PIDS and of the
# parent, checks that every console in MEM_CONSOLES ticks; results as MEM_VMM_N_*.
mem_measure() {
  local vmm=$1 n=$2 ppid=$3 p alive_n=0 line
  : > "$W/rollups"
  for p in $MEM_PIDS; do
    line=$(rollup "$p")
    [ -n "$line" ] || fail "$vmm N=$n: cannot read /proc/$p/smaps_rollup (clone gone?)"
    echo "$line $(ram_rollup "$p" "$MEM_RAM")" >> "$W/rollups"
  done
  line=$(rollup "$ppid")
  [ -n "$line" ] || fail "$vmm N=$n: cannot read the parent's /proc/$ppid/smaps_rollup"
  set -- $line
  res "MEM_${vmm}_${n}_P_PSS" "$1"; res "MEM_${vmm}_${n}_P_RSS" "$2"; res "MEM_${vmm}_${n}_P_PD" "$3"
  awk -v k="MEM_${vmm}_${n}" '
    { for (f = 1; f <= 6; f++) { s[f] += $f; if ($f > m[f]) m[f] = $f } c++ }
    END {
      split("PSS RSS PD RAM_PSS RAM_RSS RAM_PD", name, " ")
      for (f = 1; f <= 6; f++) printf "%s_%s_AVG=%.0f\n%s_%s_MAX=%d\n", k, name[f], s[f] / c, k, name[f], m[f]
    }' "$W/rollups" >> "$RES"
  for c in $MEM_CONSOLES; do
    [ "$(ticks "$c")" -ge "$MIN_TICKS" ] && alive_n=$((alive_n + 1))
  done
  res "MEM_${vmm}_${n}_ALIVE" "$alive_n"
  note "$vmm N=$n: $alive_n of $n clones show >= $MIN_TICKS ticks; per-clone kB (pss rss private_dirty, then the same for guest RAM): $(tr '\n' ',' < "$W/rollups" | cut -c1-1200)"
  [ "$alive_n" = "$n" ] || fail "$vmm N=$n: only $alive_n of $n clones kept ticking"
}

mem_densevm() { # N
  local n=$1 d=$W/mem-densevm-$1
  mkdir -p "$d"
  densevm_parent "$d" 256M
  densevm_clone "$d/api.sock" "$d/c" "$n"
  res "MEM_densevm_${n}_MS" "$CLONE_MS"
  note "densevm N=$n: one clone call: $CLONE_MS ms (fresh parent); measuring in ${SETTLE}s"
  MEM_PIDS=$CLONE_PIDS MEM_CONSOLES=$CLONE_CONSOLES MEM_RAM=/memfd:densevm-ram
  sleep "$SETTLE"
  mem_measure densevm "$n" "$PARENT_PID"
}

mem_qemu() { # N
  local n=$1 d=$W/mem-qemu-$1 k t0
  mkdir -p "$d"
  qemu_template "$d" 256M
  t0=$EPOCHREALTIME
  qemu_save "$d" "$d/state"
  MEM_PIDS="" MEM_CONSOLES="" MEM_RAM="$d/ram"
  for k in $(seq 1 "$n"); do
    qemu_clone "$d" 256M "$d/state" "$k"
    MEM_PIDS="$MEM_PIDS $CLONE_PID" MEM_CONSOLES="$MEM_CONSOLES $d/clone$k.log"
  done
  res "MEM_qemu_${n}_MS" "$(ms_since "$t0")"
  note "qemu N=$n: stop+migrate $SAVE_MS ms, all $n clones running after $(ms_since "$t0") ms; measuring in ${SETTLE}s"
  sleep "$SETTLE"
  mem_measure qemu "$n" "$TMPL_PID"
}

# run_phase NAME FUNCTION ARG...: runs one phase in a subshell (its fail ends only the
# phase), then kills every VM and removes the phase's files.
FAILED=""
run_phase() {
  local name=$1 t0=$EPOCHSECONDS
  shift
  echo "# == $name"
  ("$@")
  local status=$?
  kill_vms
  rm -rf "$W"/lat-* "$W"/mem-*
  if [ "$status" != 0 ]; then
    FAILED="$FAILED, $name"
    echo "# $name FAILED (see the FAIL line above); going on"
  fi
  note "$name: $((EPOCHSECONDS - t0)) s; L1 free memory now $(awk '/MemAvailable/ { print int($2 / 1024) }' /proc/meminfo) MiB"
}

echo "# clones: $(date -u +%Y-%m-%dT%H:%MZ), L1 $(nproc) vCPUs, $(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo) MiB, kernel $GUEST_KERNEL_RELEASE, VMMs: $VMMS, sizes: $SIZES, reps $REPS, batch $BATCH, N: $COUNTS"
for size in $SIZES; do
  for vmm in $VMMS; do run_phase "latency $vmm $size" "lat_$vmm" "$size"; done
done
for n in $COUNTS; do
  for vmm in $VMMS; do run_phase "memory $vmm N=$n" "mem_$vmm" "$n"; done
done

# ---- tables ----
name_of() { case $1 in densevm) echo "densevm" ;; qemu) echo "QEMU 7.2 templating" ;; esac; }
na() { echo "${1:-n/a}"; }
mib() { awk -v v="$1" 'BEGIN { if (v == "") print "n/a"; else printf "%.1f", v / 1024 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }
reps_of() { # KEY_PREFIX: the recorded repetitions
  local r out=""
  for r in $(seq 1 "$REPS"); do out="$out $(val "$1_R$r")"; done
  echo "$out"
}

echo
echo "## Clone latency (API call -> clone running), ms; TCG-distorted, read the ratios"
echo
echo "| VMM | guest RAM | first clone | one clone, median of $REPS (min-max) | $BATCH clones in one call: per clone (total) | clones seen ticking |"
echo "|---|---|---:|---:|---:|---:|"
for size in $SIZES; do
  for vmm in $VMMS; do
    set -- $(stats $(reps_of "LAT_${vmm}_$size"))
    first=$(val "LAT_${vmm}_${size}_R1"); first=${first:-n/a}
    if [ "$vmm" = densevm ]; then
      b=$(val "LAT_densevm_${size}_BATCH")
      batch=$( [ -n "$b" ] && awk -v b="$b" -v n="$BATCH" 'BEGIN { printf "%.1f (%.1f)", b / n, b }' || echo n/a)
      okb=$(val "LAT_densevm_${size}_BATCH_OK")
      ok="$(( $(val "LAT_densevm_${size}_OK") + 0 ))/$REPS + ${okb:-0}/$BATCH"
    else
      batch="-"
      ok="$(( $(val "LAT_qemu_${size}_OK") + 0 ))/$REPS"
    fi
    echo "| $(name_of "$vmm") | $size | $first | $1 ($2-$3) | $batch | $ok |"
    if [ "$vmm" = qemu ]; then
      set -- $(stats $(reps_of "LAT_qemu_${size}_SAVE"))
      echo "| - of which template stop + migrate | $size | $(na "$(val "LAT_qemu_${size}_SAVE_R1")") | $1 ($2-$3) | | |"
      set -- $(stats $(reps_of "LAT_qemu_${size}_START"))
      echo "| - of which clone launch -> running | $size | $(na "$(val "LAT_qemu_${size}_START_R1")") | $1 ($2-$3) | | |"
    fi
  done
done
echo
echo "| ratio (medians of one clone) | value |"
echo "|---|---:|"
for size in $SIZES; do
  d=$(stats $(reps_of "LAT_densevm_$size") | cut -d' ' -f1)
  q=$(stats $(reps_of "LAT_qemu_$size") | cut -d' ' -f1)
  echo "| densevm / QEMU, $size | $(ratio "$d" "$q") |"
  d1=$(val "LAT_densevm_${size}_R1"); q1=$(val "LAT_qemu_${size}_R1")
  echo "| densevm / QEMU, first clone, $size | $(ratio "$d1" "$q1") |"
done
set -- $SIZES
if [ $# -ge 2 ]; then
  for vmm in $VMMS; do
    a=$(stats $(reps_of "LAT_${vmm}_$1") | cut -d' ' -f1)
    b=$(stats $(reps_of "LAT_${vmm}_$2") | cut -d' ' -f1)
    echo "| $(name_of "$vmm"): $1 / $2 | $(ratio "$a" "$b") |"
    [ "$vmm" = densevm ] && echo "| densevm first clone: $1 / $2 | $(ratio "$(val "LAT_densevm_${1}_R1")" "$(val "LAT_densevm_${2}_R1")") |"
  done
fi
echo
echo "## Memory of idle clones of a 256 MiB guest, ${SETTLE} s after the last clone started (MiB, smaps_rollup)"
echo
echo "| VMM | N | clones ticking | per-clone PSS avg / max | per-clone RSS avg / max | per-clone Private_Dirty avg / max | of which guest RAM: PSS / RSS / Private_Dirty (avg) | parent/template PSS / RSS / Private_Dirty | starting all N clones, ms |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in $COUNTS; do
  for vmm in $VMMS; do
    k="MEM_${vmm}_$n"
    echo "| $(name_of "$vmm") | $n | $(na "$(val "${k}_ALIVE")")/$n | $(mib "$(val "${k}_PSS_AVG")") / $(mib "$(val "${k}_PSS_MAX")") | $(mib "$(val "${k}_RSS_AVG")") / $(mib "$(val "${k}_RSS_MAX")") | $(mib "$(val "${k}_PD_AVG")") / $(mib "$(val "${k}_PD_MAX")") | $(mib "$(val "${k}_RAM_PSS_AVG")") / $(mib "$(val "${k}_RAM_RSS_AVG")") / $(mib "$(val "${k}_RAM_PD_AVG")") | $(mib "$(val "${k}_P_PSS")") / $(mib "$(val "${k}_P_RSS")") / $(mib "$(val "${k}_P_PD")") | $(na "$(val "${k}_MS")") |"
  done
  echo "| densevm / QEMU | $n | | $(ratio "$(val "MEM_densevm_${n}_PSS_AVG")" "$(val "MEM_qemu_${n}_PSS_AVG")") | $(ratio "$(val "MEM_densevm_${n}_RSS_AVG")" "$(val "MEM_qemu_${n}_RSS_AVG")") | $(ratio "$(val "MEM_densevm_${n}_PD_AVG")" "$(val "MEM_qemu_${n}_PD_AVG")") | | | |"
done
echo
echo "Anchors (issue #11): Firecracker restore 4-8 ms, Cloud Hypervisor ~6 ms, hypeman 8 GiB fork 317 ms; goals: clone <= 5 ms whatever the guest RAM, <= 3 MiB PSS per idle clone."
if [ -n "$FAILED" ]; then
  echo
  echo "FAIL: phases that did not complete: ${FAILED#, }"
  exit 1
fi
