//! KVM state: the VM file descriptor with its memory slots and interrupt controllers,
//! and the vCPU threads with their exit handling.

pub mod capture;
pub mod irq_routes;
pub mod kick;
pub mod pause;
pub mod readonly_slots;
pub mod vcpu;
pub mod vm;
