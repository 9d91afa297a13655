# Memory tiering (crates/tier, issue #13).
#   make bench-tier   zipfian key-value workload: all-DRAM, densevm-tier at DRAM = 1/1..1/4
#                     of the working set, and the kernel's answer (cgroup v1 limit + zswap)
#                     in the same run; needs root. Raw results in build/bench-tier/, table in
#                     build/bench-tier.md, plot build/bench-tier/tier-zipf.svg
#                     (docs/benchmarks.md "## Memory tiering"). Harness options, e.g.
#                     BENCH_TIER_ARGS="--size 256 --secs 15 --warmup 10".
.PHONY: bench-tier
BENCH_TIER_ARGS ?=
bench-tier:
	scripts/bench-tier.sh $(BENCH_TIER_ARGS)
BENCH_TARGETS += bench-tier

#   make bench-restore-budget   a probe VM's snapshot (64 MiB of data) restored plain and
#                     under --memory-budget 16M and 8M: wall time, peak RSS, USS, the
#                     tier's counters (docs/benchmarks.md "### Restoring under a budget").
.PHONY: bench-restore-budget
bench-restore-budget: build
	scripts/bench-restore-budget.sh $(abspath $(or $(CARGO_TARGET_DIR),target))/release/densevm
BENCH_TARGETS += bench-restore-budget
