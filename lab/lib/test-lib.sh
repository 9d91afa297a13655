# Helpers for lab tests and benchmarks (sourced inside L1 from $LAB_SRC/lib/test-lib.sh).
# shellcheck shell=sh

fail() {
  echo "FAIL: $*"
  # What L1's kernel said last (OOM kills, KVM complaints) often explains a failure.
  echo "--- last L1 kernel messages:"
  dmesg 2>/dev/null | tail -n 6
  exit 1
}

# need_file PATH...: fails loudly when an artifact is missing.
need_file() {
  for f in "$@"; do
    [ -s "$f" ] || fail "missing $f (the lab image lacks an artifact; run 'make guest' on the host)"
  done
}

# need_cmd NAME...: fails loudly when a command is not on PATH.
need_cmd() {
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || fail "command '$c' not found in L1"
  done
}

# wait_for_line FILE PATTERN SECONDS: waits until FILE contains PATTERN (grep -F).
wait_for_line() {
  _i=0
  while [ "$_i" -lt "$(($3 * 10))" ]; do
    grep -qF "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
    _i=$((_i + 1))
  done
  return 1
}

# uptime_s: seconds since L1 boot with two decimals (monotonic across the run).
uptime_s() {
  cut -d' ' -f1 /proc/uptime
}

# mapping_kb PID PATH: sums the smaps fields of every mapping of file PATH in process
# PID and prints "rss pss shared_clean private_clean private_dirty" in kB.
mapping_kb() {
  awk -v path="$2" '
    /^[0-9a-f]+-[0-9a-f]+ / { inside = ($6 == path); next }
    inside && $1 == "Rss:" { rss += $2 }
    inside && $1 == "Pss:" { pss += $2 }
    inside && $1 == "Shared_Clean:" { sc += $2 }
    inside && $1 == "Private_Clean:" { pc += $2 }
    inside && $1 == "Private_Dirty:" { pd += $2 }
    END { printf "%d %d %d %d %d\n", rss, pss, sc, pc, pd }' "/proc/$1/smaps"
}

# uss_kb PID: Private_Clean + Private_Dirty of the whole process, in kB.
uss_kb() {
  awk '$1 == "Private_Clean:" || $1 == "Private_Dirty:" { s += $2 } END { print s + 0 }' "/proc/$1/smaps_rollup"
}

# wait_for_line_pid FILE PATTERN SECONDS PID: like wait_for_line, but gives up at once
# (status 2) when process PID has exited without FILE containing PATTERN.
wait_for_line_pid() {
  _i=0
  while [ "$_i" -lt "$(($3 * 10))" ]; do
    grep -qF "$2" "$1" 2>/dev/null && return 0
    if ! kill -0 "$4" 2>/dev/null; then
      grep -qF "$2" "$1" 2>/dev/null && return 0
      return 2
    fi
    sleep 0.1
    _i=$((_i + 1))
  done
  return 1
}

# tmpfs_workdir DIR: mounts a fresh tmpfs on DIR (pcow images need fallocate, which the
# initramfs's ramfs lacks) and changes into it.
tmpfs_workdir() {
  mkdir -p "$1" && mount -t tmpfs tmpfs "$1" || fail "cannot mount a tmpfs on $1"
  cd "$1" || fail "cd $1"
}

# fill FILE OFFSET LEN OCTAL: overwrites LEN 4 KiB blocks of FILE from block OFFSET with
# the byte OCTAL (e.g. 021 for 0x11); the expected contents of an image.
fill() {
  head -c "$(($3 * 4096))" /dev/zero | tr '\0' "\\$4" |
    dd of="$1" bs=4096 seek="$2" conv=notrunc 2>/dev/null || fail "dd into $1"
}

# guest_pmem_script: shell text for an L2 guest script's start: waits up to 5 s for
# /dev/pmem0 (nd_pmem probes asynchronously) and exits 3 without it.
guest_pmem_script() {
  echo 'i=0; while [ ! -b /dev/pmem0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done'
  echo '[ -b /dev/pmem0 ] || { echo "no /dev/pmem0"; exit 3; }'
}

# run_pmem_guest LOG IMAGE MODULES SCRIPT: boots the L2 kernel with --pmem IMAGE, loads
# MODULES (comma-separated) and runs the guest shell SCRIPT (plain text); fails unless
# densevm exits 0 and the script reports status 0. Prints the log's DENSEVM lines; densevm's
# JSON report goes to LOG.json (see json_number).
run_pmem_guest() {
  _b64=$(printf '%s\n' "$4" | base64 | tr -d '\n')
  timeout 600 densevm run --kernel "$GUEST_VMLINUX" --initrd "$GUEST_INITRD" --memory 256M \
    --report-json "$1.json" --pmem "$2" --cmdline "console=ttyS0 panic=-1 quiet modules=$3 densevm.script=$_b64" > "$1" 2>&1
  _status=$?
  grep -E 'DENSEVM|/mnt' "$1" | head -n 20
  [ "$_status" = 0 ] || { tail -n 30 "$1"; fail "densevm run --pmem $2 exited with $_status"; }
  grep -q 'DENSEVM-GUEST-EXIT=0' "$1" || { tail -n 30 "$1"; fail "the guest script failed"; }
}

# json_number FILE KEY: the first number stored under "KEY" in densevm's JSON report FILE.
json_number() {
  sed -n "s/.*\"$2\": \([0-9][0-9]*\).*/\1/p" "$1" | head -n 1
}

# guest_value LOG NAME: the value the guest printed as DENSEVM-NAME=value (the serial
# console ends lines with CR LF).
guest_value() {
  tr -d '\r' < "$1" | sed -n "s/.*DENSEVM-$2=\\(.*\\)\$/\\1/p" | head -n 1
}

# need_l2_densevm: what every densevm L2 test needs in L1 (densevm, the L2 kernel and
# initrd, /dev/kvm); fails naming what is missing.
need_l2_densevm() {
  need_cmd densevm
  need_file "$GUEST_VMLINUX" "$GUEST_INITRD"
  [ -c /dev/kvm ] || fail "/dev/kvm missing in L1"
}
