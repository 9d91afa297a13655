# densevm: two commands matter on a fresh machine — `make run` and `make test`.
CARGO ?= cargo
DENSEVM := target/release/densevm
export CARGO_TERM_COLOR ?= never

# Each subsystem adds its own targets in mk/<name>.mk and appends them to
# TEST_TARGETS (run by `make test`) and BENCH_TARGETS (run by `make bench`).
TEST_TARGETS :=
BENCH_TARGETS :=
.DEFAULT_GOAL := all
-include mk/*.mk

.PHONY: all deps build run test test-unit test-kvm lint bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace

# The default demo: a 128 MiB probe VM on /dev/kvm that touches 64 MiB,
# then prints the boot trace table and the VMM memory report.
run: build
	$(DENSEVM) run --memory 128M --probe 'touch 64M; sum ram 0 1M; exit 0' --trace --report

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

test-unit: build
	$(CARGO) test --profile test-release --workspace

test: lint test-unit $(TEST_TARGETS)
	@echo "make test: all suites passed"

bench: build $(BENCH_TARGETS)

clean:
	$(CARGO) clean
