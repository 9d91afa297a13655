//! Fuzzes virtio-pmem's flush queue: a hostile driver's script (requests of any type and
//! response room, raw descriptors) against the worker handler, with a host flush that can
//! fail; layout: `densevm_virtio::pmem::fuzz`. No panic or hang; the audit holds (no more
//! chains returned than offered, used lengths within the writable bytes, no guest memory
//! written outside the writable buffers offered); no more host flushes than completions.
//! Corpus: `fuzz/corpus/virtio_pmem`; `cargo test -p densevm-virtio` replays it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    densevm_virtio::pmem::fuzz::pmem(data);
});
