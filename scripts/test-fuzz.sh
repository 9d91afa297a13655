#!/usr/bin/env bash
# Bounded fuzz runs for `make test` (mk/fuzz.mk): each target, TEST_FUZZ_JOBS at a time, for SECONDS
# from its committed corpus (fuzz/corpus/<target>) into a scratch corpus. The scratch
# directory is also the targets' TMPDIR and is removed at the end, so a run leaves nothing
# behind in the repository or the temp dir; a panic, a hang (10 s) or an out-of-memory (2 GiB) fails the
# run, and its reproducer is kept in fuzz/artifacts/<target>/ and printed.
#   FUZZ_BIN=fuzz/target/x86_64-unknown-linux-gnu/release scripts/test-fuzz.sh SECONDS TARGET...
set -uo pipefail
cd "$(dirname "$0")/.."
secs="$1"; shift
bin="${FUZZ_BIN:-fuzz/target/x86_64-unknown-linux-gnu/release}"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/densevm-test-fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
# run_target T: one bounded run of target T; what it has to say goes to $scratch/T.report,
# and $scratch/T.ok is made when it passed.
run_target() {
  local t="$1"
  mkdir -p "$scratch/corpus/$t" "$scratch/artifacts/$t" "$scratch/tmp/$t"
  local log="$scratch/$t.log" seeds=()
  [ -d "fuzz/corpus/$t" ] && seeds=("fuzz/corpus/$t")
  TMPDIR="$scratch/tmp/$t" "$bin/$t" "$scratch/corpus/$t" "${seeds[@]}" \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$scratch/artifacts/$t/" >"$log" 2>&1
  local rc=$?
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  exec > "$scratch/$t.report"
  if [ "$rc" -eq 0 ]; then
    : > "$scratch/$t.ok"
    echo "test-fuzz: $t: ok, ${execs:-?} executions in ${secs}s"
  else
    mkdir -p "fuzz/artifacts/$t"
    cp "$scratch/artifacts/$t/"* "fuzz/artifacts/$t/" 2>/dev/null
    grep -E -A12 "panicked|ERROR: libFuzzer" "$log" | head -30
    local kept=0 a
    for a in "$scratch/artifacts/$t/"*; do
      [ -e "$a" ] || continue
      kept=1
      echo "test-fuzz: $t FAILED (exit $rc); reproducer: fuzz/artifacts/$t/$(basename "$a")" \
        "(replay: $bin/$t fuzz/artifacts/$t/$(basename "$a"))"
    done
    [ "$kept" -eq 1 ] || echo "test-fuzz: $t FAILED (exit $rc), no reproducer written"
  fi
}
# TEST_FUZZ_JOBS targets at a time (default 2, one per core here; each fuzzer is one
# process on one core: two at once took half the wall time, each target making 74-120 % of
# the executions it made alone, docs/security.md); reports in the order they were given.
jobs="${TEST_FUZZ_JOBS:-2}"
running=0
for t in "$@"; do
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  run_target "$t" &
  running=$((running + 1))
done
wait
failed=0; passed=0
for t in "$@"; do
  cat "$scratch/$t.report" 2>/dev/null
  if [ -e "$scratch/$t.ok" ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "test-fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
