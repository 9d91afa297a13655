//! Guest writes to read-only host pages of service-mapped regions (pmem copy-on-write).
//!
//! A component that maps parts of an external region read-only (densevm-pmem maps snapshot
//! and base-image clusters `PROT_READ` so VMs share them) registers a handler for the region's
//! guest-physical range. KVM does not raise a signal for such a write: PVM reports it as a
//! `KVM_EXIT_MMIO` write, hardware KVM as `KVM_EXIT_MEMORY_FAULT` (EFAULT). The vCPU loop
//! calls [`handle`] for both; the handler makes the page writable (and, for MMIO, stores the
//! bytes, which KVM then considers written). A handler that finds the page writable already
//! says so ([`Outcome::Stale`]): the read-only KVM slot over it is out of date, and the VMM
//! re-registers the region's slots (`vstate::readonly_slots`).

use std::sync::{Arc, RwLock};

/// What a handler did with a faulting guest write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The page was made writable (copied up or allocated) and the bytes stored.
    Served,
    /// The page was writable already: the bytes were stored, but KVM's read-only view of
    /// the page is out of date.
    Stale,
    /// A handler covers the address but could not serve the write (e.g. the image's
    /// filesystem is full): the vCPU fails rather than drop the store.
    Failed,
    /// No handler covers the address (an ordinary MMIO access).
    NotCovered,
}

/// Serves a write at `offset` into the region; `data` are the MMIO bytes, if any.
pub type Handler = Arc<dyn Fn(u64, Option<&[u8]>) -> Outcome + Send + Sync>;

type Entry = (u64, u64, u64, Handler);
static HANDLERS: RwLock<Vec<Entry>> = RwLock::new(Vec::new());
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Keeps a handler registered; dropping it unregisters.
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        let mut h = HANDLERS.write().unwrap_or_else(|p| p.into_inner());
        h.retain(|e| e.0 != self.0);
    }
}

/// Registers `handler` for guest-physical `[gpa, gpa+size)`.
pub fn register(gpa: u64, size: u64, handler: Handler) -> Registration {
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut h = HANDLERS.write().unwrap_or_else(|p| p.into_inner());
    h.push((id, gpa, size, handler));
    Registration(id)
}

/// Offers a faulting guest write to the registered handlers.
pub fn handle(gpa: u64, data: Option<&[u8]>) -> Outcome {
    let h = HANDLERS.read().unwrap_or_else(|p| p.into_inner());
    for (_, base, size, f) in h.iter() {
        if gpa >= *base && gpa - base < *size {
            return f(gpa - base, data);
        }
    }
    Outcome::NotCovered
}
