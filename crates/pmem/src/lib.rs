//! densevm-pmem: a pcow chain mapped at a contiguous host range whose faults are served in
//! user space, so guest loads and stores reach the image clusters directly.
//!
//! * Clusters of the writable layer are mapped `MAP_SHARED` read-write from the top file;
//!   clusters (or 4 KiB units) held by snapshots and base images are mapped `MAP_SHARED`
//!   read-only from their file, so every VM on one base shares the host page cache.
//! * Everything else is an anonymous placeholder registered with userfaultfd
//!   (MISSING + WP). A read is answered with a write-protected zero page (nothing is
//!   allocated in the image); a write allocates a cluster (thin expansion) and maps it.
//! * A write to a read-only lower-layer page is copied up (4 KiB, or the whole cluster when
//!   it is that small) into the top file and remapped writable. Host threads reach this
//!   through SIGSEGV, served inside the handler on the faulting thread
//!   ([`MapOptions::cow_on_faulting_thread`]); vCPUs through the VMM's exit path
//!   ([`WriteFaultHandle`]) because KVM reports such writes as an MMIO exit (PVM) or EFAULT
//!   (hardware KVM), not as a signal.
//! * Userfaultfd faults (and SIGSEGV faults the handler cannot serve) go to the service
//!   thread; both ends of that round trip poll briefly before sleeping
//!   ([`MapOptions::spin`]); opt-in: pre-faulting the written page before the wake
//!   ([`MapOptions::prefault`]) and a staged pool of pre-mapped clusters
//!   ([`MapOptions::staging`]). `fault-trace` builds record each step's time ([`trace`]).
//! * [`PmemRegion::flush`] is the sync point that acknowledges writes (docs/pcow.md §6).
//!
//! The design and its measurements are in docs/architecture.md (`## pmem`).

mod error;
mod fault;
mod region;
mod segv;
mod service;
mod staging;
pub mod trace;
/// The userfaultfd binding (shared with the memory tier).
pub use densevm_uffd as uffd;

pub use error::{PmemError, Result};
pub use region::{GuestWrite, MapOptions, PmemRegion, PmemStats, WriteFaultHandle};

/// The pool refill thread runs after this many allocations.
pub(crate) const REFILL_EVERY: u64 = 32;
