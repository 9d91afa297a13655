//! densevm's virtio devices and the virtio-pci transport that presents them to a guest.
//!
//! A device ([`VirtioDevice`]) sees guest memory only through `vm-memory` ([`Mem`]), parses
//! its virtqueues with rust-vmm's `virtio-queue`, serves its requests on a worker thread of
//! its own (never a vCPU thread) and raises interrupts through the [`Interrupt`] trait. It
//! knows nothing of KVM or the VMM: the transport (`transport::pci`) turns guest accesses to
//! its PCI configuration space and BAR into feature negotiation, queue setup, activation and
//! reset, and the VMM wires the transport's notification eventfds (ioeventfd) and interrupt
//! eventfds (irqfd on MSI routes) to KVM.
//!
//! Where things are:
//! - `device.rs` — the [`VirtioDevice`] trait, [`DeviceQueue`], activation errors;
//! - `queue.rs` — popping chains and completing them (the one place a virtqueue is parsed,
//!   through `virtio-queue`);
//! - `worker.rs` — the epoll thread that runs a device's queue handler (parked and resumed
//!   around a snapshot);
//! - `state.rs` — [`StateError`] and [`QueuePosition`]: saving and restoring devices;
//! - `transport/pci.rs` — virtio-pci (modern, MSI-X);
//! - `balloon/`, `block/`, `net/`, `pmem/`, `p9/`, `rng/`, `vsock/` — the devices.

pub mod balloon;
pub mod block;
pub mod device;
#[cfg(any(test, feature = "test-utils"))]
pub mod fuzzing;
pub mod interrupt;
pub mod net;
pub mod p9;
pub mod pmem;
pub mod queue;
pub mod rng;
pub mod state;
#[cfg(any(test, feature = "test-utils"))]
pub mod testing;
pub mod transport;
pub mod vsock;
pub mod worker;

pub use device::{ActivateError, DeviceQueue, VirtioDevice};
pub use interrupt::Interrupt;
pub use state::{QueuePosition, StateError};

/// Guest memory as devices see it.
pub type Mem = vm_memory::GuestMemoryMmap;

/// Virtio device type numbers (virtio 1.2 §5).
pub mod device_type {
    /// virtio-net.
    pub const NET: u32 = 1;
    /// virtio-blk.
    pub const BLOCK: u32 = 2;
    /// virtio-rng (entropy).
    pub const RNG: u32 = 4;
    /// virtio-balloon (traditional memory balloon).
    pub const BALLOON: u32 = 5;
    /// virtio-9p.
    pub const P9: u32 = 9;
    /// virtio-vsock.
    pub const VSOCK: u32 = 19;
    /// virtio-pmem.
    pub const PMEM: u32 = 27;
}

/// Feature bits common to every device.
pub mod features {
    /// VIRTIO_F_VERSION_1: a modern (1.x) device.
    pub const VERSION_1: u64 = 1 << 32;
    /// VIRTIO_RING_F_INDIRECT_DESC.
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    /// VIRTIO_RING_F_EVENT_IDX.
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    /// What every densevm device offers.
    pub const COMMON: u64 = VERSION_1 | RING_INDIRECT_DESC | RING_EVENT_IDX;
}
