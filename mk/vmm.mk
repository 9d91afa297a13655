# VMM core: probe VM start-up and memory overhead benchmark.
.PHONY: bench-probe
bench-probe: build
	scripts/bench-probe.sh 20
BENCH_TARGETS += bench-probe
