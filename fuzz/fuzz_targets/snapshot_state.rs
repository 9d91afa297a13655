//! Fuzzes what a snapshot directory's `state` file can hold: the input is the file's bytes,
//! taken through the container decoder (magic, version, length, CRC32C), the JSON decode
//! into `SnapshotState` and the checks a restore makes before it needs KVM
//! (`densevm_vmm::snapshot::fuzz::fuzz_snapshot_state`; each input is also decoded behind a
//! header resealed to match it, so mutated payloads get past the checksum). No input may
//! panic. Corpus: `fuzz/corpus/snapshot_state` (state files densevm wrote and
//! damaged or edited ones, from `fuzz/make_snapshot_seeds.py`); `cargo test -p densevm-vmm` replays them,
//! and seeded random and mutated inputs, through the same entry point.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    densevm_vmm::snapshot::fuzz::fuzz_snapshot_state(data);
});
