//! The pre-mapped expansion pool: the refill thread maps the next tail clusters of the top
//! file `MAP_SHARED` at private staging addresses (outside the region) and pre-faults them
//! writable (`MADV_POPULATE_WRITE`), so their page-cache pages and writable PTEs exist
//! before any guest touches them. An expansion then moves a staged cluster into place with
//! `mremap` (the PTEs move with it: the faulting thread's retry does not fault again).
//!
//! Staging changes nothing in the image: the slot is allocated (entry written) by the fault
//! path exactly as without staging. A staged mapping is only another `MAP_SHARED` view of
//! the file at a given offset (coherent with the page cache like any other), and it is used
//! only where the fault path would have mapped exactly that file offset; so using it is
//! equivalent to a fresh `mmap`, whatever happened to the slot since it was staged.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::Mutex;

use crate::error::{sys, Result};

/// `MADV_POPULATE_WRITE` (Linux 5.14).
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Bytes of clusters kept staged at most (bounds the memory mapped ahead of use).
pub(crate) const STAGED_BYTES: u64 = 4 << 20;
/// Clusters kept staged at most.
pub(crate) const STAGED_CLUSTERS: u64 = 64;

/// One staged cluster: where it is mapped now and which part of the file it shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Staged {
    addr: u64,
    file_offset: u64,
}

/// Staged clusters of the top file, by slot.
pub(crate) struct Staging {
    cluster: u64,
    fd: RawFd,
    enabled: bool,
    clusters: Mutex<BTreeMap<u64, Staged>>,
}

/// Pre-faults `[addr, addr+len)` writable. Errors are returned, not fatal: the pages then
/// fault on first use as without pre-faulting.
pub(crate) fn populate_write(addr: u64, len: u64) -> Result<()> {
    // SAFETY: madvise on a range of a live mapping of ours; POPULATE_WRITE only faults pages
    // in (as a write would) and never changes their contents.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, MADV_POPULATE_WRITE) } != 0 {
        return Err(sys("madvise(MADV_POPULATE_WRITE)", addr, len));
    }
    Ok(())
}

fn unmap(addr: u64, len: u64) {
    // SAFETY: unmapping a staging mapping we made and nobody else references.
    unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
}

impl Staging {
    /// An empty staging pool for clusters of `cluster` bytes of the file `fd`; `enabled`
    /// false keeps it empty (target 0).
    pub fn new(cluster: u64, fd: RawFd, enabled: bool) -> Staging {
        Staging {
            cluster,
            fd,
            enabled,
            clusters: Mutex::new(BTreeMap::new()),
        }
    }

    /// How many clusters to keep staged (0 when disabled).
    pub fn target(&self) -> u64 {
        if !self.enabled {
            return 0;
        }
        (STAGED_BYTES / self.cluster).clamp(1, STAGED_CLUSTERS)
    }

    /// Number of clusters staged now.
    pub fn len(&self) -> u64 {
        self.lock().len() as u64
    }

    /// One past the highest staged slot (0 if none).
    pub fn end(&self) -> u64 {
        self.lock().last_key_value().map_or(0, |(s, _)| s + 1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Staged>> {
        self.clusters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps the clusters of `slots` (consecutive slots whose data clusters are consecutive
    /// in the file, starting at `file_offset`) at a fresh staging address, pre-faults them
    /// writable and records them (slots already staged keep their first mapping).
    pub fn stage(&self, slots: std::ops::Range<u64>, file_offset: u64) -> Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let len = (slots.end - slots.start) * self.cluster;
        // SAFETY: a fresh shared mapping of the top file at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd,
                file_offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys("mmap of staged pool clusters", 0, len));
        }
        let addr = p as u64;
        if let Err(e) = populate_write(addr, len) {
            unmap(addr, len);
            return Err(e);
        }
        let mut map = self.lock();
        for (i, slot) in slots.enumerate() {
            let c = Staged {
                addr: addr + i as u64 * self.cluster,
                file_offset: file_offset + i as u64 * self.cluster,
            };
            match map.entry(slot) {
                std::collections::btree_map::Entry::Occupied(_) => unmap(c.addr, self.cluster),
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(c);
                }
            }
        }
        Ok(())
    }

    /// Takes the staged cluster of `slot` if it shows `file_offset`; drops staged clusters of
    /// lower slots (the image allocated past them: they were taken by another path).
    pub fn take(&self, slot: u64, file_offset: u64) -> Option<u64> {
        let mut map = self.lock();
        while let Some((&s, c)) = map.first_key_value() {
            if s >= slot {
                break;
            }
            unmap(c.addr, self.cluster);
            map.remove(&s);
        }
        let c = map.remove(&slot)?;
        if c.file_offset != file_offset {
            unmap(c.addr, self.cluster);
            return None;
        }
        Some(c.addr)
    }

    /// Moves the staged cluster at `from` to `to` (in the region), replacing what is mapped
    /// there. On failure the staged mapping is unmapped.
    pub fn move_to(&self, from: u64, to: u64) -> Result<()> {
        // SAFETY: `from` is a staged cluster we own (taken out of the pool); `to` is a
        // cluster-aligned range inside our reserved region, which no Rust object references.
        let p = unsafe {
            libc::mremap(
                from as *mut libc::c_void,
                self.cluster as usize,
                self.cluster as usize,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                to as *mut libc::c_void,
            )
        };
        if p == libc::MAP_FAILED {
            let e = sys(
                "mremap of a staged cluster into the region",
                to,
                self.cluster,
            );
            unmap(from, self.cluster);
            return Err(e);
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for c in self.lock().values() {
            unmap(c.addr, self.cluster);
        }
    }
}
