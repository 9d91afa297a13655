//! Fuzzes virtio-net: the input is a script a hostile driver and a peer on the tap play
//! against the device's worker (receive and transmit buffers, raw descriptors, frames up to
//! past the largest, header fields, accepted features; layout:
//! `densevm_virtio::net::fuzz`). No panic or hang; every queue served passes the audit (no
//! more chains returned than offered, used lengths within the writable bytes, no guest
//! memory written outside the writable buffers offered); frames put on the tap are well
//! sized with headers the accepted features allow.
//! Corpus: `fuzz/corpus/virtio_net`; `cargo test -p densevm-virtio` replays it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    densevm_virtio::net::fuzz::net(data);
});
