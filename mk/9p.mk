# 9P2000.L file server (issue 6).
#   make test-9p     Go client workload suite (tests/9p) + Linux v9fs in the nested lab
#   make bench-9p    densevm vs diod, same Go client, same run (docs/benchmarks.md "## 9p")
#   make fuzz-9p     cargo-fuzz run of the codec (target codec in fuzz/; mk/fuzz.mk)
NINEP_DENSEVM ?= $(abspath $(or $(CARGO_TARGET_DIR),target)/release/densevm)
NINEP_GO ?= go
# Benchmark tree (generated once, cached): ~100k small files + a 1 GiB file.
NINEP_BENCH_DIR ?= $(CURDIR)/build/9p-bench
NINEP_BENCH_FILES ?= 100000
# trans=unix needs 9pnet_fd.ko, which the lab's L1 image does not load by default.
ninep_fd_ko = $(shell ls build/guest/pkg/lib/modules/*/kernel/net/9p/9pnet_fd.ko 2>/dev/null | head -1)

.PHONY: deps-9p test-9p test-9p-go test-9p-lab bench-9p

# Go (tests/9p pins its modules in go.mod/go.sum) and diod (apt, for the benchmark).
deps-9p: deps
	@command -v $(NINEP_GO) >/dev/null || { echo "deps-9p: installing golang-go"; \
	  apt-get install -y -qq --no-install-recommends golang-go >/dev/null; }
	@command -v diod >/dev/null || { echo "deps-9p: installing diod"; \
	  apt-get install -y -qq --no-install-recommends diod >/dev/null; }
	cd tests/9p && $(NINEP_GO) mod download

test-9p-go: build deps-9p
	cd tests/9p && DENSEVM_BIN=$(NINEP_DENSEVM) $(NINEP_GO) test -count=1 -timeout 600s ./...

test-9p-lab: guest
	@ko="$(ninep_fd_ko)"; [ -n "$$ko" ] || { echo "test-9p-lab: 9pnet_fd.ko not found under build/guest/pkg (run 'make guest')"; exit 1; }; \
	DENSEVM=$(NINEP_DENSEVM) LAB_EXTRA="$$ko" LAB_TIMEOUT=$${LAB_TIMEOUT:-900} lab/run lab/tests/9p-v9fs.sh

# The v9fs lab test (lab/tests/9p-v9fs.sh) runs in test-lab with every other lab test.
test-9p: test-9p-go

# lab.mk's test-lab runs every lab/tests/*.sh, ours included: hand it the module too.
test-lab lab: export LAB_EXTRA += $(ninep_fd_ko)

# Extra flags, e.g. NINEP_BENCH_ARGS="-baseline /path/to/old/densevm -rounds 5"
# or the issue-15 CPU workload: "-files 2000 -big-mib 1 -passes 10 -workloads many"
# (with NINEP_BENCH_DIR=build/9p-bench-2k).
NINEP_BENCH_ARGS ?=

bench-9p: build deps-9p
	cd tests/9p && $(NINEP_GO) run ./cmd/bench -densevm $(NINEP_DENSEVM) -dir $(NINEP_BENCH_DIR) \
	  -files $(NINEP_BENCH_FILES) -out $(CURDIR)/build/9p-bench.md $(NINEP_BENCH_ARGS)
	@cat build/9p-bench.md


TEST_TARGETS += test-9p
BENCH_TARGETS += bench-9p
