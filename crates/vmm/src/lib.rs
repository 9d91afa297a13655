//! densevm's VMM core: KVM VM and vCPU state, guest memory layout, payload loading,
//! the run loop, boot trace points and memory accounting.

pub mod arch;
pub mod boot;
pub mod memory;
pub mod report;
pub mod trace;
pub mod vmm;
pub mod vstate;
pub mod write_fault;

pub use memory::MergePolicy;
pub use vmm::{
    place_external_regions, run_vm, ExternalRegion, Payload, RunOutcome, VmConfig, VmEnd, VmmError,
};
