//! Fuzzes the virtio-pci transport: a hostile driver's configuration-space and BAR 0
//! accesses (common configuration, ISR, device configuration, notifications, MSI-X table
//! and pending bits) to a function with a virtio-pmem device behind it, with guest memory
//! writes and bring-ups in between; layout: `densevm_virtio::transport::pci::fuzz`. No panic
//! or hang; the status register reads back; a driver reset stops the device.
//! Corpus: `fuzz/corpus/virtio_pci`; `cargo test -p densevm-virtio` replays it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    densevm_virtio::transport::pci::fuzz::virtio_pci(data);
});
