# Fuzzing (issue 16; docs/security.md "## Fuzzing"): every cargo-fuzz target is in fuzz/, one
# project with its own workspace, so the dependency tree is built once; each target's
# minimized corpus is committed in fuzz/corpus/<target>, and `cargo test` replays it.
#   make test-fuzz   (in `make test`) builds the targets once and runs each for
#                    TEST_FUZZ_SECONDS (TEST_FUZZ_JOBS at a time, default 2) from its corpus into a scratch corpus that is removed
#                    afterwards; fails on any panic, hang or out-of-memory, printing the reproducer
#                    (kept in fuzz/artifacts/<target>/, not committed)
#   make fuzz TARGET=virtio_net SECONDS=600   one campaign; new inputs go to
#                    fuzz/found/<target> (not committed; merge the ones that add coverage
#                    with `make fuzz-merge TARGET=x`)
#   make fuzz-<target>   the same with SECONDS (default 60); the old names stay:
#                    fuzz-api, fuzz-9p, fuzz-pcow, fuzz-snapshot, fuzz-virtio,
#                    fuzz-virtio-balloon
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
# The build is optimized with debug assertions and overflow checks, and no sanitizer
# (`--sanitizer none`): the fuzzed code is safe Rust, where ASan finds little, and it would
# cost executions and a C toolchain that can link its runtime.
FUZZ_TARGETS := api_request balloon codec open_image snapshot_state virtqueue \
	virtio_net virtio_pci virtio_pmem virtio_vsock
TEST_FUZZ_SECONDS ?= 10
SECONDS ?= 60
FUZZ_TARGET_DIR ?= $(CURDIR)/fuzz/target
FUZZ_BIN = $(FUZZ_TARGET_DIR)/x86_64-unknown-linux-gnu/release
FUZZ_ARGS = -rss_limit_mb=2048 -timeout=10 -print_final_stats=1

.PHONY: deps-fuzz build-fuzz test-fuzz fuzz fuzz-merge fuzz-api fuzz-9p fuzz-pcow \
	fuzz-snapshot fuzz-virtio fuzz-virtio-balloon

# scripts/install-deps.sh installs cargo-fuzz; this checks again for a PATH without it.
deps-fuzz: deps
	@command -v cargo-fuzz >/dev/null || { echo "deps-fuzz: installing cargo-fuzz"; \
	  $(CARGO) install cargo-fuzz --locked; }

build-fuzz: deps-fuzz
	cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz build --sanitizer none --target-dir $(FUZZ_TARGET_DIR)

test-fuzz: build-fuzz
	FUZZ_BIN=$(FUZZ_BIN) scripts/test-fuzz.sh $(TEST_FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz: build-fuzz
	@test -n "$(TARGET)" || { echo "fuzz: give TARGET=one of: $(FUZZ_TARGETS)"; exit 1; }
	mkdir -p fuzz/found/$(TARGET) fuzz/artifacts/$(TARGET)
	$(FUZZ_BIN)/$(TARGET) fuzz/found/$(TARGET) fuzz/corpus/$(TARGET) $(FUZZ_ARGS) \
	  -max_total_time=$(SECONDS) -artifact_prefix=fuzz/artifacts/$(TARGET)/ $(FUZZ_FLAGS)

# Adds to the committed corpus a smallest set of found inputs that covers the code they
# reach beyond it (edges, not hit counts: the corpus stays small); named seeds stay.
fuzz-merge: build-fuzz
	@test -n "$(TARGET)" || { echo "fuzz-merge: give TARGET=one of: $(FUZZ_TARGETS)"; exit 1; }
	$(FUZZ_BIN)/$(TARGET) -set_cover_merge=1 -use_counters=0 fuzz/corpus/$(TARGET) fuzz/found/$(TARGET)

fuzz-%:
	$(MAKE) fuzz TARGET=$*

fuzz-api: ; $(MAKE) fuzz TARGET=api_request
fuzz-9p: ; $(MAKE) fuzz TARGET=codec
fuzz-pcow: ; $(MAKE) fuzz TARGET=open_image
fuzz-snapshot: ; $(MAKE) fuzz TARGET=snapshot_state
fuzz-virtio: ; $(MAKE) fuzz TARGET=virtqueue
fuzz-virtio-balloon: ; $(MAKE) fuzz TARGET=balloon

TEST_TARGETS += test-fuzz
