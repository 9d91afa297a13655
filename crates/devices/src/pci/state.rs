//! Saved state of the PCI pieces (snapshots, issue #11): a function's configuration space,
//! its MSI-X table and pending bits, and the root's address latch and host bridge.
//!
//! A state comes back from a snapshot file, so restoring checks it against the freshly built
//! device instead of trusting it: the bits the guest cannot write must be the ones this
//! device has, table sizes must match, and nothing panics on a damaged file.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A function's configuration space as the guest left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigSpaceState {
    /// The 64 dwords (BAR 0 holds its address, not the sizing mask).
    pub regs: Vec<u32>,
    /// The guest wrote all ones to BAR 0 and has not written an address since: BAR 0
    /// reads back the size mask.
    pub bar_sizing: bool,
}

/// An MSI-X table, its pending bits and the capability's control bits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsixState {
    /// Per vector: message address low, address high, data, vector control.
    pub entries: Vec<[u32; 4]>,
    /// Per vector: raised while masked, delivered on unmask.
    pub pending: Vec<bool>,
    /// MSI-X enable (capability control bit 15).
    pub enabled: bool,
    /// Function mask (capability control bit 14).
    pub function_masked: bool,
}

/// The configuration-mechanism ports and the host bridge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciRootState {
    /// The address latch (port 0xcf8).
    pub address: u32,
    /// The host bridge's configuration space (64 dwords, read-only to the guest).
    pub host_bridge: Vec<u32>,
    /// Device numbers on bus 0 that held a function.
    pub slots: Vec<u8>,
}

/// Why a saved PCI state cannot be applied.
#[derive(Debug, Error)]
pub enum PciStateError {
    /// The configuration space is not 64 dwords long.
    #[error(
        "the saved PCI configuration space has {got} dwords instead of 64: the snapshot's \
         state file is damaged"
    )]
    ConfigLength {
        /// Dwords in the state.
        got: usize,
    },
    /// Bits the guest cannot write differ from this device's.
    #[error(
        "PCI configuration dword {reg:#x} of the snapshot ({saved:#010x}) differs from this \
         device's ({current:#010x}) in bits the guest cannot write: restore with the same \
         device options and densevm version as the snapshot's VM"
    )]
    ReadOnlyBits {
        /// Dword index.
        reg: usize,
        /// Saved value.
        saved: u32,
        /// This device's value.
        current: u32,
    },
    /// BAR 0 is elsewhere than densevm placed this device's.
    #[error(
        "the snapshot's BAR 0 is at {saved:#x}, this device's at {current:#x}: add the devices \
         in the order of the snapshot's VM"
    )]
    BarMoved {
        /// Saved BAR 0 address.
        saved: u32,
        /// This device's.
        current: u32,
    },
    /// The MSI-X table size differs from the device's vector count.
    #[error(
        "the snapshot's MSI-X table has {saved} vectors, this device has {current}: the \
         snapshot was taken with another device here; restore with the same devices"
    )]
    MsixTableSize {
        /// Saved table entries.
        saved: usize,
        /// This device's vectors.
        current: usize,
    },
    /// The pending bits do not cover the table.
    #[error(
        "the snapshot's MSI-X pending bits cover {pending} vectors but its table has {table}: \
         the snapshot's state file is damaged"
    )]
    MsixPendingSize {
        /// Pending bits saved.
        pending: usize,
        /// Table entries saved.
        table: usize,
    },
    /// A vector's route could not be programmed.
    #[error("cannot route MSI-X vector {vector} of the restored device: {source}")]
    Route {
        /// Vector number.
        vector: usize,
        /// What the VMM's router said.
        source: std::io::Error,
    },
    /// The host bridge's configuration differs.
    #[error(
        "the snapshot's PCI host bridge differs at dword {reg:#x} ({saved:#010x} saved, \
         {current:#010x} here): it was taken by another densevm version"
    )]
    HostBridge {
        /// Dword index.
        reg: usize,
        /// Saved value.
        saved: u32,
        /// This root's value.
        current: u32,
    },
    /// Functions sit at other device numbers than in the snapshot.
    #[error(
        "the snapshot's VM had PCI functions at device numbers {saved:?}, this one has them at \
         {current:?}: add the same devices in the same order before restoring the PCI root"
    )]
    Slots {
        /// Saved device numbers.
        saved: Vec<u8>,
        /// This root's.
        current: Vec<u8>,
    },
}
