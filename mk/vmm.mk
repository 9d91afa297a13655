# VMM core: probe VM start-up and memory overhead benchmark.
.PHONY: bench-probe
bench-probe: build
	scripts/bench-probe.sh 20
BENCH_TARGETS += bench-probe

# make bench-clone-latency: POST /clones to clones running, 256 MiB and 2 GiB probe guests
# on this host's /dev/kvm (issue #11); results in build/bench-clone-latency.md.
.PHONY: bench-clone-latency
bench-clone-latency: build
	scripts/bench-clone-latency.sh 9
BENCH_TARGETS += bench-clone-latency
