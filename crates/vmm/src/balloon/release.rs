//! What releasing a guest page means, per region (the VMM's [`BalloonMemory`]).
//!
//! | region | backing | a release |
//! |---|---|---|
//! | RAM (`ram`, `ram.N`, `ram.high`) | the VM's own RAM file, `MAP_SHARED` | hole punched (`MADV_REMOVE`): the memfd pages are freed |
//! | RAM | anonymous (`--merge all`) | `MADV_DONTNEED`: the pages are freed |
//! | RAM | `MAP_PRIVATE` over a clone template or a snapshot's memory file (a clone, a restored VM, a parent after `POST /clones`) | fresh anonymous memory mapped over the range and the range remembered, so the guest and later snapshots see zeros, never the template again; the private copies are freed |
//! | boot-image window (`kernel.N`, `initrd`) | `MAP_PRIVATE` file mapping (the vmlinux/initrd file; after a freeze or restore, the template or the snapshot's memory file) | `MADV_DONTNEED`: the private copy the guest wrote is freed and the window shows the file's bytes again |
//! | pmem (external) | owned by the pmem service | refused: never released (a pmem page is the guest's disk) |
//!
//! All three RAM cases are [`RamFile::discard`]. Windows are not RAM to the `RamFile` (it
//! refuses them): Linux frees its init sections and, after unpacking, the initrd, and may
//! then report or inflate those pages. Releasing them with `MADV_DONTNEED` re-exposes the
//! image file's bytes rather than zeros. That is what a balloon page may hold: Linux
//! treats the contents of a ballooned or reported page as lost (it zeroes on allocation
//! where it must), and only a guest poisoning free pages expects a pattern, which it
//! cannot ask for (densevm does not offer `VIRTIO_BALLOON_F_PAGE_POISON`, so such a guest
//! does not report). It never shows another VM's data (the file is the VM's own boot image
//! or snapshot), and snapshots copy windows page by page from the mapping, so they record
//! exactly what the guest would read. A range that is pmem, outside every region or across
//! two regions is refused (an error the device counts) and counted here.

use super::{lock_ram, SharedRam};
use crate::memory::{is_ram, RegionInfo, RegionKind};
use densevm_virtio::balloon::BalloonMemory;
use serde::Serialize;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the releases did, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReleaseCounters {
    /// Guest RAM given back to the host.
    pub ram_bytes: u64,
    /// Boot-image window pages whose private copies were dropped.
    pub window_bytes: u64,
    /// Ranges refused: pmem, outside guest memory, or across regions.
    pub refused_bytes: u64,
    /// Releases that failed on the host (madvise/mmap errors).
    pub failed_bytes: u64,
}

/// The VMM's [`BalloonMemory`]: releases guest pages as each region's backing needs.
pub struct GuestRamRelease {
    /// The VM's regions, sorted by guest address (host addresses never change: a
    /// template remaps RAM in place).
    regions: Vec<RegionInfo>,
    ram: SharedRam,
    ram_bytes: AtomicU64,
    window_bytes: AtomicU64,
    refused_bytes: AtomicU64,
    failed_bytes: AtomicU64,
}

fn refused(gpa: u64, len: u64, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not released: {gpa:#x}+{len:#x} {why}"),
    )
}

impl GuestRamRelease {
    /// Releases into `regions` (the VM's [`crate::memory::GuestMemory::regions`], which
    /// must stay mapped while the device can call it: the device's worker is joined before
    /// guest memory is unmapped) and `ram`.
    pub fn new(mut regions: Vec<RegionInfo>, ram: SharedRam) -> Self {
        regions.sort_by_key(|r| r.gpa);
        Self {
            regions,
            ram,
            ram_bytes: AtomicU64::new(0),
            window_bytes: AtomicU64::new(0),
            refused_bytes: AtomicU64::new(0),
            failed_bytes: AtomicU64::new(0),
        }
    }

    /// What was released so far.
    pub fn counters(&self) -> ReleaseCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ReleaseCounters {
            ram_bytes: get(&self.ram_bytes),
            window_bytes: get(&self.window_bytes),
            refused_bytes: get(&self.refused_bytes),
            failed_bytes: get(&self.failed_bytes),
        }
    }

    /// The region holding all of `[gpa, gpa + len)`.
    fn region(&self, gpa: u64, len: u64) -> Option<&RegionInfo> {
        let end = gpa.checked_add(len)?;
        let i = self
            .regions
            .partition_point(|r| r.gpa <= gpa)
            .checked_sub(1)?;
        let r = &self.regions[i];
        (len > 0 && end <= r.gpa + r.size).then_some(r)
    }

    fn release_range(&self, gpa: u64, len: u64) -> io::Result<&AtomicU64> {
        let Some(region) = self.region(gpa, len) else {
            self.refused_bytes.fetch_add(len, Ordering::Relaxed);
            return Err(refused(gpa, len, "is not inside one guest memory region"));
        };
        if region.kind == RegionKind::External {
            self.refused_bytes.fetch_add(len, Ordering::Relaxed);
            return Err(refused(
                gpa,
                len,
                &format!("is in `{}`, a --pmem region", region.name),
            ));
        }
        if gpa % 4096 != 0 || len % 4096 != 0 {
            self.refused_bytes.fetch_add(len, Ordering::Relaxed);
            return Err(refused(gpa, len, "is not whole 4 KiB pages"));
        }
        let failed = |e: io::Error| {
            self.failed_bytes.fetch_add(len, Ordering::Relaxed);
            e
        };
        // Held for windows too: a template remaps them (private over the template) as well,
        // and a release must act on the mapping that is there.
        let mut ram = lock_ram(&self.ram);
        if is_ram(&region.name) {
            ram.discard(region, gpa, len).map_err(failed)?;
            return Ok(&self.ram_bytes);
        }
        // A boot-image window: a private file mapping (see the module documentation).
        let addr = region.host_addr + (gpa - region.gpa);
        // SAFETY: [addr, addr + len) lies inside the region's own live mapping (the range
        // is inside the region, checked above), which is private: MADV_DONTNEED drops this
        // process's private copies only, and the mapping stays valid for vm-memory and KVM.
        let rc =
            unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED) };
        drop(ram);
        if rc != 0 {
            return Err(failed(io::Error::last_os_error()));
        }
        Ok(&self.window_bytes)
    }
}

impl BalloonMemory for GuestRamRelease {
    fn release(&self, gpa: u64, len: u64) -> io::Result<()> {
        let counter = self.release_range(gpa, len)?;
        counter.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
}
