//! What a VM is made of: its configuration, as the CLI (or an API) hands it to the VMM.

use crate::memory::MergePolicy;
use crate::vstate::readonly_slots::RangesFn;
use densevm_probe::Command;
use densevm_virtio::VirtioDevice;
use std::io::Write;
use std::time::{Duration, Instant};

/// Guest RAM below the 32-bit MMIO hole; RAM beyond it continues at 4 GiB.
pub const LOW_RAM_END: u64 = 3 << 30;
/// Where RAM above the hole starts.
pub const HIGH_RAM_START: u64 = 4 << 30;

/// What the VM runs.
pub enum Payload {
    /// The built-in probe guest with a parsed script.
    Probe(Vec<Command>),
    /// A Linux kernel (PVH ELF vmlinux or bzImage), optional initrd, command line.
    Linux {
        /// Kernel image path.
        kernel: std::path::PathBuf,
        /// Initrd path.
        initrd: Option<std::path::PathBuf>,
        /// Kernel command line.
        cmdline: String,
        /// Whether the kernel and initrd are mapped from their files or copied into RAM
        /// (always copied under a memory budget).
        images: BootImages,
    },
}

/// Where a Linux guest's kernel and initrd live (`--boot-images`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BootImages {
    /// Mapped `MAP_PRIVATE` from their files, cut out of RAM: every VM booted from the same
    /// files shares the pages its guest never writes (the host's page cache); the pages it
    /// writes — boot-time patches, and the initrd's memory once the guest has unpacked and
    /// freed it — become private copies outside the guest's RAM file.
    #[default]
    Mapped,
    /// Copied into guest RAM: all guest memory is in RAM's file, so a memory budget covers
    /// it all (the tier pages out cold kernel and initrd pages like any others); each VM
    /// holds its own copy of the pages its guest keeps.
    Copied,
}

/// A guest-physical region whose host memory another component maps and serves
/// (a pcow pmem region): densevm places it above RAM and registers it with KVM.
#[derive(Clone)]
pub struct ExternalRegion {
    /// Name (`pmem0`, `pmem1`, ...), addressable by the probe script.
    pub name: String,
    /// Host virtual address of the live mapping (page aligned); must outlive the VM.
    pub host_addr: u64,
    /// Size in bytes (page aligned).
    pub size: u64,
    /// Ranges `(offset, len)` that KVM must map read-only (e.g. pmem clusters of snapshots
    /// and base images): guest writes there reach the VMM as MMIO writes, which the
    /// region's [`crate::write_fault`] handler serves.
    pub kvm_readonly: Vec<(u64, u64)>,
    /// Serves vCPU writes into the region that KVM cannot complete (offsets are relative to
    /// the region); registered at the region's guest-physical place for the VM's lifetime.
    pub write_fault: Option<crate::write_fault::Handler>,
    /// The ranges that are read-only *now* (`kvm_readonly` minus pages copied up since):
    /// when the write-fault handler reports stale exits, the VMM re-registers the region's
    /// slots from this (`vstate::readonly_slots`). `None` keeps the slots as registered.
    pub readonly_ranges: Option<RangesFn>,
    /// Makes the guest's writes to the region durable. With it, a Linux guest gets the
    /// region as a virtio-pmem device whose flush requests call it (each `fsync` on a DAX
    /// filesystem there); the probe addresses regions by name and needs no device.
    pub flush: Option<densevm_virtio::pmem::FlushFn>,
}

/// Alignment of external regions in guest-physical space.
pub const EXTERNAL_REGION_ALIGN: u64 = 1 << 30;

/// Places external regions above RAM (and above 4 GiB), each 1 GiB aligned; returns
/// `(name, gpa, size)` for each.
pub fn place_external_regions(
    memory_bytes: u64,
    regions: &[ExternalRegion],
) -> Vec<(String, u64, u64)> {
    let ram_top = if memory_bytes > LOW_RAM_END {
        HIGH_RAM_START + memory_bytes - LOW_RAM_END
    } else {
        memory_bytes
    };
    let mut next = ram_top
        .max(HIGH_RAM_START)
        .next_multiple_of(EXTERNAL_REGION_ALIGN);
    regions
        .iter()
        .map(|r| {
            let gpa = next;
            next = (gpa + r.size).next_multiple_of(EXTERNAL_REGION_ALIGN);
            (r.name.clone(), gpa, r.size)
        })
        .collect()
}

/// Everything needed to build and run one VM.
pub struct VmConfig {
    /// Guest RAM in bytes.
    pub memory_bytes: u64,
    /// Number of vCPUs.
    pub cpus: u32,
    /// The guest.
    pub payload: Payload,
    /// Where serial output goes.
    pub console: Box<dyn Write + Send>,
    /// Stop the VM with an error after this long.
    pub timeout: Option<Duration>,
    /// When the VMM process started (the trace origin).
    pub origin: Instant,
    /// Take a memory report just before the VM is torn down.
    pub report_memory: bool,
    /// Regions mapped by other components (pmem), placed above RAM.
    pub external_regions: Vec<ExternalRegion>,
    /// Which guest regions the host's same-page merging (KSM) may fold together.
    pub merge: MergePolicy,
    /// Virtio devices (Linux guests): each becomes a virtio-pci function on bus 0.
    pub devices: Vec<Box<dyn VirtioDevice>>,
    /// How the caller opened `devices` (opaque to the VMM): saved in snapshots and given
    /// back at restore, so the caller can open the same devices again.
    pub device_specs: serde_json::Value,
    /// A virtio-balloon device (Linux guests), created by the VMM after `devices`: it
    /// releases guest memory through the VM's own RAM backing ([`crate::balloon`]). Its
    /// handle is [`crate::Vmm::balloon`].
    pub balloon: Option<densevm_virtio::balloon::BalloonConfig>,
    /// Keep guest RAM under a DRAM budget (`--memory-budget`, [`crate::tiering`]).
    pub memory_budget: Option<crate::tiering::TierSettings>,
}
