//! `SharedChain`: a thread-safe handle on a [`Chain`] for the mapping service, where many
//! fault-handling threads look up, allocate and mark clusters concurrently.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::chain::{AllocInit, Allocation, Chain, ClusterLocation, LayerFile, UnitSource};
use crate::error::Result;
use crate::storage::Storage;

/// A chain shared between threads. Lookups take a read lock; allocation and bitmap
/// updates take the write lock, so each logical cluster is allocated exactly once.
pub struct SharedChain {
    inner: RwLock<Chain>,
    top: Arc<dyn Storage>,
}

impl SharedChain {
    /// Wraps an open chain.
    pub fn new(chain: Chain) -> Arc<Self> {
        let top = chain.images()[0].storage().clone();
        Arc::new(SharedChain {
            inner: RwLock::new(chain),
            top,
        })
    }
    /// Read access to the chain.
    pub fn read(&self) -> RwLockReadGuard<'_, Chain> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }
    /// Exclusive access to the chain.
    pub fn write(&self) -> RwLockWriteGuard<'_, Chain> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
    /// Topmost holder of `logical` (O(1)).
    pub fn lookup(&self, logical: u64) -> Option<ClusterLocation> {
        self.read().lookup(logical)
    }
    /// Source of one 4 KiB unit.
    pub fn resolve_unit(&self, logical: u64, unit: u32) -> UnitSource {
        self.read().resolve_unit(logical, unit)
    }
    /// Allocates `logical` in the writable layer exactly once (see [`Chain::allocate`]).
    pub fn allocate(&self, logical: u64, init: AllocInit) -> Result<Allocation> {
        self.write().allocate(logical, init)
    }
    /// Marks units valid after their data is durable (see [`Chain::mark_valid`]).
    pub fn mark_valid(&self, logical: u64, units: &[u64]) -> Result<()> {
        self.write().mark_valid(logical, units)
    }
    /// Pre-allocates `count` clusters at the end of the top file (pool refill).
    pub fn preallocate(&self, count: u64) -> Result<()> {
        self.write().preallocate(count)
    }
    /// Sync point: makes all entries written so far durable (fdatasync), without holding
    /// the lock, so faults continue meanwhile.
    pub fn sync(&self) -> Result<()> {
        self.top.flush()
    }
    /// Files of the chain, top first.
    pub fn layer_files(&self) -> Vec<LayerFile> {
        self.read().layer_files()
    }
}
