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
