//! Snapshots, restore and clone templates of a whole VM (issue #11).
//!
//! A snapshot directory holds `state` (the [`SnapshotState`] in the checksummed container
//! of [`crate::persist::file`]) and, for a full snapshot, `memory`: guest RAM at offset =
//! guest-physical address, sparse. A clone template has the same `state`; its RAM is the
//! VM's frozen RAM file, handed to each clone as an inherited descriptor.
//!
//! - [`ram`] — the RAM file: creation, freezing, writing it sparse.
//! - [`pagemap`] — which pages of a mapping the process holds privately (what a snapshot
//!   over a template copies).
//! - [`create`] — pausing, saving every part of the VM, templates (on the control loop).
//! - [`restore`] — building a VM from a snapshot.
//!
//! What is saved: every vCPU ([`crate::persist::VcpuState`]), the in-kernel irqchip, PIT
//! and clock ([`crate::persist::VmState`]), the UART and CMOS, and the memory layout with
//! every region's contents (RAM and the boot-image windows), the PCI root and every
//! virtio-pci function (transport, queues, MSI-X, each device's state), and how the VMM
//! created its own balloon device. External (`--pmem`)
//! regions are saved by reference: their place in the layout, flushed images that the
//! caller opens again (a clone: its own overlay) and hands to the restore.

pub mod create;
pub mod fuzz;
pub mod holes;
pub mod pagemap;
pub mod ram;
pub mod restore;

use crate::device_manager::LegacyState;
use crate::persist::{HostCpu, VcpuState, VmState};
use densevm_devices::pci::PciRootState;
use densevm_virtio::transport::pci::VirtioPciState;
use serde::{Deserialize, Serialize};

/// The state file's name inside a snapshot directory.
pub const STATE_FILE: &str = "state";
/// The memory file's name inside a snapshot directory (full snapshots).
pub const MEMORY_FILE: &str = "memory";

/// One guest-physical region of the saved layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionRecord {
    /// Region name (`ram`, `ram.high`, ...).
    pub name: String,
    /// Guest-physical start.
    pub gpa: u64,
    /// Size in bytes.
    pub size: u64,
    /// Mapped by another component (`--pmem`): not in the memory file; the restore gets
    /// the region from its caller and checks it lands at the same place.
    #[serde(default)]
    pub external: bool,
}

/// Everything a VM needs besides its memory contents.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotState {
    /// The densevm version that wrote it.
    pub densevm_version: String,
    /// The CPU it was taken on (a restore elsewhere is refused).
    pub host_cpu: HostCpu,
    /// Guest RAM in bytes (as `--memory`).
    pub memory_bytes: u64,
    /// The memory layout; RAM regions live in the memory file at offset = `gpa`.
    #[serde(deserialize_with = "crate::persist::bounded::vec::<_, _, 256>")]
    pub regions: Vec<RegionRecord>,
    /// Whether the VM has the in-kernel irqchip and PIT.
    pub irqchip: bool,
    /// A Linux guest (CMOS, ACPI PM, PCI root) rather than the probe.
    pub linux: bool,
    /// Irqchip, PIT, clock.
    pub vm: VmState,
    /// Every vCPU, in order (at most 254, as `--cpus`).
    #[serde(deserialize_with = "crate::persist::bounded::vec::<_, _, 254>")]
    pub vcpus: Vec<VcpuState>,
    /// COM1 and, for Linux, the CMOS.
    pub legacy: LegacyState,
    /// The PCI root (Linux guests).
    pub pci: Option<PciRootState>,
    /// Every virtio-pci function, in bus order (bus 0 has 32 slots).
    #[serde(deserialize_with = "crate::persist::bounded::vec::<_, _, 32>")]
    pub virtio: Vec<VirtioPciState>,
    /// How the VMM's caller opened the virtio devices (`VmConfig::device_specs`).
    pub device_specs: serde_json::Value,
    /// How the VMM created its balloon device (`VmConfig::balloon`), if the VM has one: a
    /// restore creates it alike after the caller's devices (the last virtio function),
    /// then applies its saved state (target, `actual`, statistics interval).
    #[serde(default)]
    pub balloon: Option<densevm_virtio::balloon::BalloonConfig>,
}
