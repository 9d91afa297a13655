# Mapped pcow regions served by userfaultfd (issue 5; crates/pmem).
#   Tests run with `cargo test` (crates/pmem/tests, crates/densevm/tests/pmem_*.rs).
#   make bench-pmem   fault latencies vs peers in the same run (MAP_SHARED file, anonymous,
#                     kernel MAP_PRIVATE CoW, qcow2 CoW via qemu-io), 64 GiB start-up, VMA
#                     counts, probe-guest writes; results: docs/benchmarks.md "## pmem".
#                     One part only: cargo bench -p densevm-pmem --bench pmem_bench -- expansion
#                     (parts: expansion, read, cow, startup, probe).
PMEM_DENSEVM ?= $(abspath $(or $(CARGO_TARGET_DIR),target)/release/densevm)

.PHONY: bench-pmem

bench-pmem: build
	@mkdir -p build
	DENSEVM_BIN=$(PMEM_DENSEVM) $(CARGO) bench -p densevm-pmem --bench pmem_bench | tee build/pmem-bench.md

BENCH_TARGETS += bench-pmem
