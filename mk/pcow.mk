# pcow image format (issue 4): library crate crates/pcow, `densevm image`, docs/pcow.md.
#   make test-pcow    CLI-level tests of `densevm image` (crates/pcow/tests/cli.sh); the
#                     library's model, crash-injection and corpus tests run in `cargo test`.
#   make bench-pcow   open/map build (1M clusters), snapshot create, convert vs qemu-img
#                     (docs/benchmarks.md "## pcow"); output also in build/pcow-bench.md
#   make bench-convert  convert/commit/rebase vs qemu-img, alternated (scripts/bench-convert.sh)
#   make fuzz-pcow    cargo-fuzz run of the metadata parser (target open_image in fuzz/; mk/fuzz.mk)
PCOW_DENSEVM ?= $(abspath $(or $(CARGO_TARGET_DIR),target)/release/densevm)

.PHONY: test-pcow bench-pcow

test-pcow: build
	DENSEVM=$(PCOW_DENSEVM) crates/pcow/tests/cli.sh

bench-pcow: build
	@mkdir -p build
	DENSEVM_BIN=$(PCOW_DENSEVM) PCOW_BENCH_DIR=$(CURDIR)/build/pcow-bench \
	  $(CARGO) bench -p pcow --bench pcow_bench > build/pcow-bench.md; rc=$$?; \
	  rm -rf build/pcow-bench; cat build/pcow-bench.md; exit $$rc

TEST_TARGETS += test-pcow
BENCH_TARGETS += bench-pcow

# densevm image convert/commit/rebase vs qemu-img, alternated, medians (scripts/bench-convert.sh;
# docs/benchmarks.md "### pcow convert, commit, rebase vs qemu-img").
.PHONY: bench-convert
bench-convert: build
	$(CARGO) build --release -p pcow --example bench_overlay
	DENSEVM=$(PCOW_DENSEVM) OVERLAY=$(abspath $(or $(CARGO_TARGET_DIR),target)/release/examples/bench_overlay) \
	  DIR=$(CURDIR)/build/bench-convert scripts/bench-convert.sh | tee build/bench-convert.md
BENCH_TARGETS += bench-convert
