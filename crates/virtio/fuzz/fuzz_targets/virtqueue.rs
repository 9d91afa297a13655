//! Fuzzes the virtqueue request path: the input is decoded into guest memory, a descriptor
//! table, an available ring and buffer contents (layout: `densevm_virtio::block::fuzz`), and
//! a block device serves the queue. Any input must be served without a panic or a hang, a
//! read-only disk must never be written, and no more chains returned than were offered.
//! Seeds: `../seeds` (regenerate with `python3 make_seeds.py seeds`); the same entry point
//! replays them in `cargo test -p densevm-virtio`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    densevm_virtio::block::fuzz::virtqueue(data);
    // The rng and 9p devices join here once they have a synchronous queue entry point
    // (see the TODO at the end of `block::fuzz::virtqueue`).
});
