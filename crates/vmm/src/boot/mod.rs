//! Guest payloads and how each is placed in memory and entered.

pub mod linux;
pub mod probe;

use kvm_bindings::{kvm_regs, kvm_sregs};

/// How to start one vCPU.
pub trait EntryState {
    /// Special registers for vCPU `index`, starting from KVM's defaults.
    fn sregs(&self, index: u32, defaults: kvm_sregs) -> kvm_sregs;
    /// General registers for vCPU `index`.
    fn regs(&self, index: u32) -> kvm_regs;
}
