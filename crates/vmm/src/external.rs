//! External regions (`--pmem`): memory another component maps and serves, placed above RAM.
//! What a fresh boot and a restore both attach to them: the memory specs, the write-fault
//! hooks for vCPU writes KVM cannot complete, the read-only slot tracker, each region's
//! flush (called before a snapshot refers to its image) and, for Linux, a virtio-pmem
//! device per region.

use crate::config::ExternalRegion;
use crate::memory::{Backing, GuestMemory, RegionSpec};
use crate::vstate::readonly_slots::ReadonlySlots;
use densevm_virtio::pmem::{FlushFn, Pmem};
use densevm_virtio::VirtioDevice;

/// `(name, gpa, size)` of each external region, as placed.
pub(crate) type Placement = (String, u64, u64);

/// The memory spec of each region at its place.
pub(crate) fn region_specs(regions: &[ExternalRegion], placed: &[Placement]) -> Vec<RegionSpec> {
    regions
        .iter()
        .zip(placed)
        .map(|(region, (name, gpa, size))| RegionSpec {
            name: name.clone(),
            gpa: *gpa,
            size: *size,
            backing: Backing::External {
                host_addr: region.host_addr,
                kvm_readonly: region.kvm_readonly.clone(),
            },
        })
        .collect()
}

/// What serves the external regions of a built VM.
pub(crate) struct ExternalParts {
    /// Write-fault hooks, registered for the VM's lifetime.
    pub hooks: Vec<crate::write_fault::Registration>,
    /// Regions whose read-only ranges shrink as pages are copied up.
    pub slots: ReadonlySlots,
    /// Each region's flush.
    pub flush: Vec<FlushFn>,
    /// One virtio-pmem device per flushable region (Linux guests), in region order: a
    /// fresh boot adds them before the other virtio devices, so a restore does too.
    pub devices: Vec<Box<dyn VirtioDevice>>,
}

/// Attaches hooks, slot tracking and flushes to `regions` placed at `placed` in `memory`.
pub(crate) fn attach(
    regions: &[ExternalRegion],
    placed: &[Placement],
    memory: &GuestMemory,
    linux: bool,
) -> ExternalParts {
    let hooks = regions
        .iter()
        .zip(placed)
        .filter_map(|(region, &(_, gpa, size))| {
            let handler = region.write_fault.clone()?;
            Some(crate::write_fault::register(gpa, size, handler))
        })
        .collect();
    let slots = ReadonlySlots::new(
        regions
            .iter()
            .filter_map(|region| {
                let ranges = region.readonly_ranges.clone()?;
                let index = memory
                    .regions()
                    .iter()
                    .position(|r| r.name == region.name)?;
                Some((index, memory.regions()[index].clone(), ranges))
            })
            .collect(),
    );
    let flush = regions.iter().filter_map(|r| r.flush.clone()).collect();
    let devices = if linux {
        regions
            .iter()
            .zip(placed)
            .filter_map(|(region, &(_, gpa, size))| {
                let flush = region.flush.clone()?;
                Some(Box::new(Pmem::new(gpa, size, flush)) as Box<dyn VirtioDevice>)
            })
            .collect()
    } else {
        Vec::new()
    };
    ExternalParts {
        hooks,
        slots,
        flush,
        devices,
    }
}
