//! Snapshots (issue #11): the KVM state of vCPUs and of the VM, the host CPU a snapshot was
//! taken on, and the state-file container they are written in.
//!
//! - [`vcpu`] — [`VcpuState`]: registers, FPU/XSAVE, LAPIC, MSRs, pending events, CPUID
//!   and TSC frequency of one vCPU ([`save_vcpu`], [`restore_vcpu`]).
//! - [`vm`] — [`VmState`]: the in-kernel PIC/IOAPIC and PIT, and the guest clock
//!   ([`save_vm`], [`restore_vm`]).
//! - [`cpu_id`] — [`HostCpu`]: vendor, family/model/stepping and XCR0 mask of the host;
//!   [`check_same_cpu`] refuses a snapshot from another CPU model.
//! - [`file`] — the state file: a fixed header (magic, format version, payload length,
//!   CRC32C) followed by the payload as JSON ([`write_state`], [`read_state`]).
//!
//! # Order
//!
//! Saving: stop every vCPU outside `KVM_RUN` first (`vstate::pause::PauseGate`), then
//! [`save_vm`] and [`save_vcpu`] for each vCPU. Restoring: create the target VM as
//! `builder.rs` does — memory, irqchip and PIT (the irqchip must exist before
//! [`restore_vm`] can fill it) and the vCPUs — then [`restore_vm`] and then
//! [`restore_vcpu`] for each vCPU, before any vCPU runs. The VM goes first so that the
//! guest clock and the IOAPIC are in place when the vCPUs' kvmclock MSRs and LAPICs are
//! restored.

pub mod bounded;
pub mod cpu_id;
pub mod file;
pub mod vcpu;
pub mod vm;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use thiserror::Error;

pub use cpu_id::{check_same_cpu, HostCpu};
pub use file::{
    read_state, write_state, write_state_volatile, FORMAT_VERSION, HEADER_LEN, MAGIC, MAX_PAYLOAD,
};
pub use vcpu::{restore_vcpu, save_vcpu, VcpuState};
pub use vm::{restore_vm, save_vm, IrqchipState, VmState};

/// Why a snapshot could not be saved, read or restored.
///
/// Every message names its cause once (errors carry the underlying error in their text and
/// do not chain it again as a `source`) and says what to do about it.
#[derive(Debug, Error)]
pub enum PersistError {
    /// A KVM ioctl failed.
    #[error("{what} failed ({errno}): this host's KVM does not support saving or restoring that state; take and restore snapshots on the same host kernel")]
    Kvm {
        /// The ioctl.
        what: &'static str,
        /// What KVM returned.
        errno: kvm_ioctls::Error,
    },
    /// KVM_SET_MSRS stopped at an MSR.
    #[error("KVM refused to restore MSR {index:#x} (value {value:#x}): this host's KVM does not accept it; restore on the host kernel the snapshot was taken on")]
    MsrRejected {
        /// The MSR.
        index: u32,
        /// The value that was refused.
        value: u64,
    },
    /// The target VM has no in-kernel irqchip (or PIT) to restore into.
    #[error("the snapshot has an in-kernel irqchip and PIT but the target VM has none: create them (Vm::create_irqchip) before restoring the VM state")]
    NoIrqchip,
    /// The saved TSC frequency differs from this host's and KVM cannot scale the guest TSC.
    #[error("the snapshot's guest TSC runs at {saved_khz} kHz, this host's at {host_khz} kHz, and this host cannot scale a guest TSC (no KVM_CAP_TSC_CONTROL): restore on a host with the same TSC frequency")]
    TscFrequency {
        /// From the snapshot.
        saved_khz: u32,
        /// This host's vCPU.
        host_khz: u32,
    },
    /// A saved state that KVM cannot be given as it is.
    #[error("the saved {what} is invalid ({detail}): the state file was not written by this densevm; take the snapshot again")]
    InvalidState {
        /// Which part of the state.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The snapshot comes from another CPU model.
    #[error("snapshot taken on {saved}, this host is {host}: restore it on the same CPU model")]
    CpuMismatch {
        /// The CPU in the snapshot.
        saved: HostCpu,
        /// This host's CPU.
        host: HostCpu,
    },
    /// A file operation failed.
    #[error("cannot {what} {}: {error}", path.display())]
    Io {
        /// What was being done ("create", "read", ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The file does not start with the densevm snapshot magic.
    #[error("{} is not a densevm snapshot state file (it does not start with \"DENSEVM-SNAPSHOT\"): give the state file a densevm snapshot wrote", path.display())]
    NotASnapshot {
        /// The file.
        path: PathBuf,
    },
    /// The file is shorter than its header says.
    #[error("{} is truncated: it should hold {expected} bytes but holds {actual}; the snapshot was not completely written or copied, take it again", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the header (or the header itself) needs.
        expected: u64,
        /// Bytes the file holds.
        actual: u64,
    },
    /// The payload does not match its checksum, or the file has bytes after it.
    #[error("{} is corrupt ({detail}): the file changed after densevm wrote it; take the snapshot again", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What does not match.
        detail: String,
    },
    /// The file is in another format version.
    #[error("{} is snapshot format version {found}, this densevm reads version {supported} only: restore it with the densevm version that took it", path.display())]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version in the header.
        found: u32,
        /// [`FORMAT_VERSION`].
        supported: u32,
    },
    /// The header announces more payload than densevm ever writes.
    #[error("{} announces a {len}-byte payload, more than the {limit}-byte limit of densevm state files: it was not written by densevm", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Payload length in the header.
        len: u64,
        /// [`MAX_PAYLOAD`].
        limit: u64,
    },
    /// The payload is valid JSON-in-a-container but not the state this densevm expects.
    #[error("the state in {} does not parse ({detail}): it was written by an incompatible densevm; restore it with the densevm version that took it", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// serde_json's description (with line and column).
        detail: String,
    },
    /// The state could not be encoded (or is too large to write).
    #[error("cannot encode the snapshot state for {} ({detail}); this is a densevm bug, please report it", path.display())]
    Encode {
        /// The file that was to be written.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// Maps a KVM ioctl error to [`PersistError::Kvm`] naming the ioctl.
pub(crate) fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> PersistError {
    move |errno| PersistError::Kvm { what, errno }
}
