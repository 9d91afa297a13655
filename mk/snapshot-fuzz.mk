# Snapshot state files (crates/vmm/src/snapshot, persist/file.rs) are untrusted input: a
# restore reads whatever `DIR/state` holds. `cargo test` replays the fuzz seeds and 2,000
# seeded random and mutated inputs through the same entry point (snapshot/fuzz.rs).
#   make fuzz-snapshot   bounded cargo-fuzz run of the state-file container decoder, the JSON
#                        decode into SnapshotState and the restore checks that need no KVM,
#                        from crates/vmm/fuzz/corpus/snapshot_state (needs cargo-fuzz;
#                        installed if missing); new inputs go to crates/vmm/fuzz/found (not
#                        committed). FUZZ_SECONDS (or SNAPSHOT_FUZZ_SECONDS) bounds the run.
#   crates/vmm/fuzz/make_seeds.py OUT_DIR   writes the seeds again (needs /dev/kvm)
FUZZ_SECONDS ?= 60
SNAPSHOT_FUZZ_SECONDS ?= $(FUZZ_SECONDS)

.PHONY: fuzz-snapshot

# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
# densevm-vmm embeds the freestanding probe guest: the cc crate adds -fsanitize=address to
# its C build under cargo-fuzz's ASan, which cannot link without the runtime, so
# CFLAGS=-fno-sanitize=address turns that off again (C code only; Rust stays instrumented).
# The valid seeds are 13-38 KiB state files, so inputs may be up to 64 KiB.
fuzz-snapshot:
	@command -v cargo-fuzz >/dev/null || { echo "fuzz-snapshot: installing cargo-fuzz"; $(CARGO) install cargo-fuzz --locked; }
	mkdir -p crates/vmm/fuzz/found/snapshot_state
	cd crates/vmm/fuzz && CFLAGS=-fno-sanitize=address RUSTC_BOOTSTRAP=1 cargo fuzz run snapshot_state found/snapshot_state corpus/snapshot_state \
	  -- -max_total_time=$(SNAPSHOT_FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048
