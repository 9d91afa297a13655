//! Fuzzes virtio-vsock: the input is a script played against the device's muxer by a
//! hostile driver (transmitted packets with any header fields, receive and event buffers,
//! raw descriptors) and by host programs on real unix sockets (connects, `CONNECT` lines,
//! listeners, data, half-closes, closes, timeouts); layout: `densevm_virtio::vsock::fuzz`.
//! No panic or hang; every queue served passes the audit (no more chains returned than
//! offered, used lengths within the writable bytes, no guest memory written outside the
//! writable buffers offered); receive buffers come back empty or with a header.
//! Corpus: `fuzz/corpus/virtio_vsock`; `cargo test -p densevm-virtio` replays it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    densevm_virtio::vsock::fuzz::vsock(data);
});
