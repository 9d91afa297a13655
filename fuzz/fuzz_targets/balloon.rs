//! Fuzzes virtio-balloon's queues: the input lays out one queue (inflate, deflate,
//! statistics or reporting) with its descriptors and buffers (layout:
//! `densevm_virtio::balloon::fuzz`), and the device's worker handler serves it. Any input
//! must be served without a panic or a hang, no more chains returned than were offered, and
//! every range released is page aligned and inside one guest memory region.
//! Corpus: `fuzz/corpus/balloon` (the named seeds: `python3 fuzz/make_balloon_seeds.py
//! fuzz/corpus/balloon`); `cargo test -p densevm-virtio` replays it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    densevm_virtio::balloon::fuzz::balloon(data);
});
