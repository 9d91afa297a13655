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
