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

#   make bench-redis-tier   Redis inside a Debian L2 guest (nested lab): a zipfian YCSB-B
#                     client (lab/guest/kvzipf.c) at DRAM = 1/1..1/4 of the guest's working
#                     set, under densevm's tier and under L1's kernel (cgroup v2 memory.high,
#                     zswap charged to the cgroup, swap file on a scratch disk) in the same
#                     L1 run; knobs BENCH_REDIS_* (lab/bench/redis-tier.sh).
#                     Results in build/lab/redis-tier.txt (~35 min: 180 s warm-up a window).
.PHONY: bench-redis-tier
bench-redis-tier: guest
	lab/guest/build-redis.sh
	@mkdir -p build/lab
	DENSEVM=$(LAB_DENSEVM) LAB_EXTRA=build/guest/initrd-redis.cpio.gz LAB_TIMEOUT=$${LAB_TIMEOUT:-3600} \
	  lab/run lab/bench/redis-tier.sh > build/lab/redis-tier.txt; \
	  status=$$?; cat build/lab/redis-tier.txt; exit $$status
BENCH_TARGETS += bench-redis-tier
