# Helpers for lab tests and benchmarks (sourced inside L1 from $LAB_SRC/lib/test-lib.sh).
# shellcheck shell=sh

fail() {
  echo "FAIL: $*"
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
