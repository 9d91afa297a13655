//! The balloon's VMM side: where a page the guest gives back (inflate, free page report)
//! leaves the host.
//!
//! The virtio-balloon device (`densevm_virtio::balloon`) parses the guest's queues and
//! hands checked ranges to a [`BalloonMemory`]; [`release::GuestRamRelease`] is the VMM's,
//! and decides per region what a release means (see its documentation for each backing).
//! [`create`] builds the device for a VM: a fresh boot (`builder.rs`) and a restore
//! (`snapshot/restore.rs`) both call it, so a restored VM or a clone gets the same device,
//! releasing into its own RAM.
//!
//! - `release.rs` — [`GuestRamRelease`]: RAM through [`RamFile::discard`], boot-image
//!   windows with `MADV_DONTNEED`, pmem never; counters of each.
//!
//! Locking: the [`RamFile`] is shared (`SharedRam`) by the control loop (snapshots,
//! templates: they read it, and a template remaps RAM and replaces it) and the balloon's
//! worker thread (releases). A release holds the lock across its `discard` or `madvise`, and a
//! template holds it from copying RAM until RAM and windows are remapped and the new `RamFile`
//! is in place, so a
//! release always acts on the mapping its `RamFile` describes (a hole punched into a file
//! that has just become a clone template would corrupt every clone). The control loop
//! takes the lock only after quiescing the devices (the worker is parked then), so the two
//! never wait on each other.

pub mod release;
#[cfg(test)]
mod tests;

pub use release::{GuestRamRelease, ReleaseCounters};

use crate::memory::RegionInfo;
use crate::snapshot::ram::RamFile;
use crate::vmm::VmmError;
use densevm_virtio::balloon::{Balloon, BalloonConfig, BalloonCounters, BalloonHandle};
use serde::Serialize;
use std::sync::{Arc, Mutex, MutexGuard};

/// The VM's RAM file, shared by the control loop and the balloon's worker.
pub type SharedRam = Arc<Mutex<RamFile>>;

/// Locks `ram`, ignoring poisoning (a panic elsewhere leaves the `RamFile` consistent:
/// every change to it is a single assignment or push).
pub fn lock_ram(ram: &Mutex<RamFile>) -> MutexGuard<'_, RamFile> {
    ram.lock().unwrap_or_else(|p| p.into_inner())
}

/// A VM's balloon as the VMM keeps it.
pub struct VmBalloon {
    /// How the device was created (saved in snapshots: a restore creates it alike, then
    /// applies its saved state).
    pub config: BalloonConfig,
    /// The API's hold on it.
    pub handle: BalloonHandle,
    /// Where its releases went.
    pub release: Arc<GuestRamRelease>,
}

/// Checks `config` against a VM with `memory_bytes` of RAM.
pub fn check_config(config: &BalloonConfig, memory_bytes: u64) -> Result<(), VmmError> {
    let ram_mib = memory_bytes >> 20;
    if u64::from(config.amount_mib) > ram_mib {
        return Err(VmmError::Config(format!(
            "a balloon of {} MiB is more than the guest's RAM ({ram_mib} MiB): give \
             amount_mib from 0 to {ram_mib}",
            config.amount_mib
        )));
    }
    Ok(())
}

/// A balloon device for a VM whose guest regions are `regions` and whose RAM is `ram`.
pub fn create(
    config: &BalloonConfig,
    memory_bytes: u64,
    regions: &[RegionInfo],
    ram: SharedRam,
) -> Result<(Balloon, VmBalloon), VmmError> {
    check_config(config, memory_bytes)?;
    let release = Arc::new(GuestRamRelease::new(regions.to_vec(), ram));
    let (device, handle) = Balloon::new(config, release.clone())
        .map_err(|e| VmmError::Config(format!("balloon: {e}")))?;
    Ok((
        device,
        VmBalloon {
            config: *config,
            handle,
            release,
        },
    ))
}

/// What a VM's balloon did, for the run summary.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BalloonReport {
    /// The device's counters (pages inflated, deflated, reported; bytes released).
    pub device: BalloonCounters,
    /// Where the releases went (RAM, boot-image windows, refused).
    pub released: ReleaseCounters,
    /// The target and the guest's `actual`, in 4 KiB pages, when the VM ended.
    pub target_pages: u32,
    /// See `target_pages`.
    pub actual_pages: u32,
}

impl VmBalloon {
    /// Its counters now.
    pub fn report(&self) -> BalloonReport {
        BalloonReport {
            device: self.handle.counters(),
            released: self.release.counters(),
            target_pages: self.handle.target_pages(),
            actual_pages: self.handle.actual_pages(),
        }
    }
}
