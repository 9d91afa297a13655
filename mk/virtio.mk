# virtio devices (crates/virtio): the device model, virtio-pci and the devices; their unit
# and hostile-driver tests run in `cargo test` (which also replays the fuzz seeds).
#   make fuzz-virtio   bounded cargo-fuzz run of the virtqueue request paths (virtio-blk,
#                      virtio-rng, virtio-9p) from crates/virtio/fuzz/seeds (needs cargo-fuzz;
#                      installed if missing)
#   make fuzz-virtio-balloon   the same for virtio-balloon's queues (inflate, deflate,
#                      statistics, free page reports) from crates/virtio/fuzz/seeds-balloon
VIRTIO_FUZZ_SECONDS ?= 60

.PHONY: fuzz-virtio fuzz-virtio-balloon

# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
fuzz-virtio:
	@command -v cargo-fuzz >/dev/null || { echo "fuzz-virtio: installing cargo-fuzz"; $(CARGO) install cargo-fuzz --locked; }
	mkdir -p crates/virtio/fuzz/corpus/virtqueue
	cd crates/virtio/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run virtqueue corpus/virtqueue seeds \
	  -- -max_total_time=$(VIRTIO_FUZZ_SECONDS) -max_len=20000 -rss_limit_mb=2048

fuzz-virtio-balloon:
	@command -v cargo-fuzz >/dev/null || { echo "fuzz-virtio-balloon: installing cargo-fuzz"; $(CARGO) install cargo-fuzz --locked; }
	mkdir -p crates/virtio/fuzz/corpus/balloon
	cd crates/virtio/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run balloon corpus/balloon seeds-balloon \
	  -- -max_total_time=$(VIRTIO_FUZZ_SECONDS) -max_len=20000 -rss_limit_mb=2048
