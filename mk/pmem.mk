# Mapped pcow regions served by userfaultfd (issue 5; crates/pmem).
#   Tests run with `cargo test` (crates/pmem/tests, crates/densevm/tests/pmem_*.rs).
#   make bench-pmem   fault latencies vs peers in the same run (MAP_SHARED file, anonymous,
#                     kernel MAP_PRIVATE CoW, qcow2 CoW via qemu-io), 64 GiB start-up, VMA
#                     counts, probe-guest writes; results: docs/benchmarks.md "## pmem".
#                     One part only: cargo bench -p densevm-pmem --bench pmem_bench -- expansion
#                     (parts: expansion, read, cow, startup, probe).
#   make bench-pmem-profile   where one host-thread 4 KiB CoW and one expansion spend their
#                     time, step by step (built with the `fault-trace` feature; not part of
#                     bench-pmem, whose fault paths carry no timestamps).
PMEM_DENSEVM ?= $(abspath $(or $(CARGO_TARGET_DIR),target)/release/densevm)

.PHONY: bench-pmem bench-pmem-profile

bench-pmem: build
	@mkdir -p build
	DENSEVM_BIN=$(PMEM_DENSEVM) $(CARGO) bench -p densevm-pmem --bench pmem_bench | tee build/pmem-bench.md

bench-pmem-profile:
	$(CARGO) bench -p densevm-pmem --features fault-trace --bench pmem_bench -- profile

BENCH_TARGETS += bench-pmem
