//! Fuzzes the virtqueue request paths: the input is decoded into guest memory, a descriptor
//! table, an available ring and buffer contents (layout: `densevm_virtio::block::fuzz`), and
//! a device (virtio-blk, virtio-rng or virtio-9p, chosen by the input) serves the queue. Any
//! input must be served without a panic or a hang, a read-only disk must never be written,
//! and no more chains returned than were offered.
//! Corpus: `fuzz/corpus/virtqueue` (the named seeds: `python3 fuzz/make_virtqueue_seeds.py
//! fuzz/corpus/virtqueue`); `cargo test -p densevm-virtio` replays it through the same entry
//! point.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    densevm_virtio::block::fuzz::virtqueue(data);
});
