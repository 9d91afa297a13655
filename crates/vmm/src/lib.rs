//! densevm's VMM core: KVM VM and vCPU state, guest memory layout, payload loading,
//! the run loop, boot trace points and memory accounting.

pub mod arch;
pub mod balloon;
pub mod boot;
pub mod builder;
pub mod config;
pub mod control;
pub mod device_manager;
mod external;
pub mod memory;
pub mod persist;
pub mod report;
pub mod snapshot;
pub mod text_trim;
pub mod tiering;
pub mod trace;
pub mod vmm;
pub mod vstate;
pub mod write_fault;

pub use config::{place_external_regions, BootImages, ExternalRegion, Payload, VmConfig};
pub use control::{ControlError, RunState, SnapshotInfo, Template, TemplateHook, VmmHandle};
pub use memory::MergePolicy;
pub use snapshot::restore::{build_restored, Reopened, RestoreSource};
pub use vmm::{run_vm, RunOutcome, VmEnd, Vmm, VmmError};
