//! Guest writes to read-only host pages of service-mapped regions (pmem copy-on-write).
//!
//! A component that maps parts of an external region read-only (densevm-pmem maps snapshot
//! and base-image clusters `PROT_READ` so VMs share them) registers a handler for the region's
//! guest-physical range. KVM does not raise a signal for such a write: PVM reports it as a
//! `KVM_EXIT_MMIO` write, hardware KVM as `KVM_EXIT_MEMORY_FAULT` (EFAULT). The vCPU loop
//! calls [`handle`] for both; the handler makes the page writable (and, for MMIO, stores the
//! bytes, which KVM then considers written).

use std::sync::{Arc, RwLock};

/// Serves a write at `offset` into the region; `data` are the MMIO bytes, if any. Returns
/// false if the write cannot be served (the vCPU then fails as before).
pub type Handler = Arc<dyn Fn(u64, Option<&[u8]>) -> bool + Send + Sync>;

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

/// Offers a faulting guest write to the registered handlers; true if one served it.
pub fn handle(gpa: u64, data: Option<&[u8]>) -> bool {
    let h = HANDLERS.read().unwrap_or_else(|p| p.into_inner());
    for (_, base, size, f) in h.iter() {
        if gpa >= *base && gpa - base < *size {
            return f(gpa - base, data);
        }
    }
    false
}
