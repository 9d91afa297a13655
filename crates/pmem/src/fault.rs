//! The fault logic shared by every path (userfaultfd thread, SIGSEGV requests, vCPU hook):
//! thin expansion, 4 KiB / whole-cluster copy-on-write, and the flush that acknowledges writes.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use pcow::{AllocInit, EntryKind, SharedChain, UNIT_SIZE};

use crate::error::{sys, PmemError, Result};
use crate::staging::{populate_write, Staging};
use crate::trace::{mark, Step};

/// Host page size assumed by the mapping (x86-64).
pub const PAGE: u64 = 4096;

/// Counters of the fault service.
#[derive(Default)]
pub(crate) struct Counters {
    pub expansions: AtomicU64,
    pub cow_faults: AtomicU64,
    pub cow_units: AtomicU64,
    pub read_faults: AtomicU64,
    pub uffd_write_faults: AtomicU64,
    pub segv_faults: AtomicU64,
    pub segv_in_handler: AtomicU64,
    pub guest_hook_faults: AtomicU64,
    pub guest_writes_already_writable: AtomicU64,
    pub raced: AtomicU64,
    pub staged_hits: AtomicU64,
    pub spin_hits: AtomicU64,
}

/// Copied units not yet recorded in the image (made valid at the next flush), and which
/// read-only lower-layer pages have been copied up since the region was mapped.
#[derive(Default)]
pub(crate) struct State {
    pub copied: HashMap<u64, [u64; 8]>,
    /// `(offset, len)` copied up since the region was mapped (merged lazily by
    /// [`Inner::readonly_ranges`]).
    pub copied_up: Vec<(u64, u64)>,
}

/// Whether a write fault had to change the mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteFault {
    /// The page was allocated or copied up and is now mapped writable.
    Served,
    /// The page was already writable (a racing fault, or a copy-up served earlier).
    AlreadyWritable,
}

/// Everything the fault paths need; shared by the region, its threads and hook handles.
pub(crate) struct Inner {
    pub base: u64,
    pub size: u64,
    pub reserved: u64,
    pub cluster: u64,
    pub units: u32,
    pub chain: Arc<SharedChain>,
    /// Descriptors of the chain files, top first.
    pub fds: Vec<RawFd>,
    pub writable: bool,
    /// Clusters of at most this many units are copied whole on the first write.
    pub whole_cluster_units: u32,
    /// `(offset, len)` mapped read-only from lower layers when the region was mapped.
    pub initial_readonly: Vec<(u64, u64)>,
    pub state: Mutex<State>,
    pub counters: Counters,
    /// Allocations since the last pool refill; the refill thread waits on `refill_cv`.
    pub refill: Mutex<(u64, bool)>,
    pub refill_cv: Condvar,
    /// The predicted next tail slot of the top file (where the next `Zeroed` allocation
    /// lands): one past the highest slot allocated through this region, or the image's tail
    /// at start. The pool is zero-filled and staged from there on.
    pub next_tail: AtomicU64,
    /// Tail clusters mapped and pre-faulted ahead of their allocation.
    pub staging: Staging,
    /// Pre-fault the written page writable before the fault returns ([`crate::MapOptions`]
    /// `prefault`), so the retried store does not fault again.
    pub prefault: bool,
}

/// A run of contiguous host pages mapped from one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub offset: u64,
    pub len: u64,
    pub image: usize,
    pub file_offset: u64,
    pub writable: bool,
}

/// Appends `r` to `runs`, merging it with the last run when both are contiguous in the
/// region and in the same file with the same protection.
pub(crate) fn push_run(runs: &mut Vec<Run>, r: Run) {
    if let Some(last) = runs.last_mut() {
        if last.image == r.image
            && last.writable == r.writable
            && last.offset + last.len == r.offset
            && last.file_offset + last.len == r.file_offset
        {
            last.len += r.len;
            return;
        }
    }
    runs.push(r);
}

fn bit(bm: &[u64; 8], u: u32) -> bool {
    bm[(u / 64) as usize] & (1 << (u % 64)) != 0
}

impl Inner {
    /// Maps `len` bytes of file `image` at region offset `offset` (MAP_SHARED|MAP_FIXED).
    pub fn map_run(&self, r: &Run) -> Result<()> {
        let len = r.len.min(self.reserved - r.offset);
        let prot = if r.writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let addr = self.base + r.offset;
        // SAFETY: MAP_FIXED inside our own reserved range [base, base+reserved), which no
        // Rust object references; the file descriptor belongs to the open chain.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len as usize,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.fds[r.image],
                r.file_offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys(
                "mmap(MAP_SHARED|MAP_FIXED) of an image cluster",
                addr,
                len,
            ));
        }
        Ok(())
    }

    /// Maps a read-only zero page over `page` after a fault could not be served, so the
    /// faulting thread is not left blocked: reads see zeros, writes fault for good.
    pub fn poison(&self, page: u64) {
        // SAFETY: MAP_FIXED of one page inside our reserved range.
        unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                PAGE as usize,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
        }
    }

    /// Checks that `addr` is inside the region and returns its offset.
    pub fn offset_of(&self, addr: u64) -> Result<u64> {
        if addr < self.base || addr >= self.base + self.size {
            return Err(PmemError::OutOfRegion {
                addr,
                base: self.base,
                size: self.size,
            });
        }
        Ok(addr - self.base)
    }

    /// Serves a write to region offset `offset`: after it returns Ok, the page is mapped
    /// writable from the top file. Idempotent and safe to call from many threads at once:
    /// each cluster is allocated, and each unit copied, exactly once.
    pub fn write_fault(&self, offset: u64) -> Result<WriteFault> {
        self.serve_write(offset, false)
    }

    /// [`Inner::write_fault`] for a host thread's SIGSEGV: the faulting page is mapped
    /// read-only with exactly the data a copy-up must copy (a lower-layer file page, or a
    /// read-only zero page where the unit reads as zeros), so a 4 KiB copy-up writes it to
    /// the top file straight from the mapping instead of reading it through the chain first.
    pub fn write_fault_segv(&self, offset: u64) -> Result<WriteFault> {
        self.serve_write(offset, true)
    }

    fn serve_write(&self, offset: u64, from_mapping: bool) -> Result<WriteFault> {
        if offset >= self.size {
            return Err(PmemError::OutOfRegion {
                addr: self.base + offset,
                base: self.base,
                size: self.size,
            });
        }
        if !self.writable {
            return Err(PmemError::Invalid(
                "write to a region mapped from a read-only chain".into(),
            ));
        }
        let logical = offset / self.cluster;
        let unit = ((offset % self.cluster) / UNIT_SIZE) as u32;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let loc = self.chain.lookup(logical);
        let copied = state.copied.get(&logical).copied().unwrap_or([0; 8]);
        match loc {
            Some(l) if l.writable && l.kind == EntryKind::Data => {
                if l.unit_valid(unit) || bit(&copied, unit) {
                    // A racing fault already served this page.
                    self.counters.raced.fetch_add(1, Ordering::Relaxed);
                    return Ok(WriteFault::AlreadyWritable);
                }
                let top = Some(l.bitmap);
                self.copy_on_write(&mut state, logical, unit, top, copied, from_mapping)?;
            }
            None => self.expand(logical, offset)?,
            Some(l) if l.kind == EntryKind::Zero => self.expand(logical, offset)?,
            Some(_) => self.copy_on_write(&mut state, logical, unit, None, copied, from_mapping)?,
        }
        Ok(WriteFault::Served)
    }

    /// The `(offset, len)` ranges still mapped read-only from lower layers: those of the
    /// initial mapping minus every page copied up since. Sorted and disjoint.
    pub fn readonly_ranges(&self) -> Vec<(u64, u64)> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let merged = merge_ranges(std::mem::take(&mut state.copied_up));
        let now = subtract_ranges(&self.initial_readonly, &merged);
        state.copied_up = merged;
        now
    }

    /// Thin expansion of `logical` for a write at region offset `offset`: allocate a zeroed
    /// cluster (entry written), then map it writable: the staged, pre-faulted cluster of that
    /// slot moved into place if there is one, else a fresh mapping (whose faulting page is
    /// pre-faulted here with [`Inner::prefault`]; by default the retried store faults it in).
    fn expand(&self, logical: u64, offset: u64) -> Result<()> {
        let a = self.chain.allocate(logical, AllocInit::Zeroed)?;
        mark(Step::Allocated);
        self.next_tail.fetch_max(a.slot + 1, Ordering::Relaxed);
        let target = self.base + logical * self.cluster;
        let staged = self.staging.take(a.slot, a.file_offset);
        let moved = staged.is_some_and(|from| match self.staging.move_to(from, target) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("pmem: {e}; mapping the cluster directly");
                false
            }
        });
        if moved {
            self.counters.staged_hits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.map_run(&Run {
                offset: logical * self.cluster,
                len: self.cluster,
                image: 0,
                file_offset: a.file_offset,
                writable: true,
            })?;
            mark(Step::Mapped);
            if self.prefault {
                // Best effort: without it the retry faults the page in itself.
                let _ = populate_write(self.base + (offset & !(PAGE - 1)), PAGE);
            }
        }
        mark(Step::WorkDone);
        self.counters.expansions.fetch_add(1, Ordering::Relaxed);
        self.note_allocation();
        Ok(())
    }

    fn copy_on_write(
        &self,
        state: &mut State,
        logical: u64,
        unit: u32,
        top_bitmap: Option<[u64; 8]>,
        copied: [u64; 8],
        from_mapping: bool,
    ) -> Result<()> {
        let valid = |u: u32| top_bitmap.is_some_and(|b| bit(&b, u)) || bit(&copied, u);
        let units: Vec<u32> = if self.units <= self.whole_cluster_units {
            (0..self.units).filter(|&u| !valid(u)).collect()
        } else {
            vec![unit]
        };
        let a = self.chain.allocate(logical, AllocInit::Empty)?;
        mark(Step::Allocated);
        self.next_tail.fetch_max(a.slot + 1, Ordering::Relaxed);
        if a.newly_allocated {
            self.note_allocation();
        }
        let mut bits = copied;
        let mut i = 0;
        while i < units.len() {
            let mut j = i + 1;
            while j < units.len() && units[j] == units[j - 1] + 1 {
                j += 1;
            }
            let first = units[i] as u64;
            let n = (j - i) as u64;
            let file_off = a.file_offset + first * UNIT_SIZE;
            let here = self.base + logical * self.cluster + first * UNIT_SIZE;
            if from_mapping && n == 1 && units[i] == unit {
                mark(Step::Read);
                // SAFETY: `here` is the faulting page, mapped read-only (see
                // `write_fault_segv`) and not replaced before the `mmap` below, which this
                // thread does while holding the fault lock.
                unsafe {
                    pwrite_raw(self.fds[0], here as *const u8, UNIT_SIZE as usize, file_off)?
                };
            } else {
                let mut buf = vec![0u8; (n * UNIT_SIZE) as usize];
                // Read through the chain: the top holds none of these units yet, so this
                // reads the lower layers (or zeros).
                self.chain
                    .read()
                    .read(logical * self.cluster + first * UNIT_SIZE, &mut buf)?;
                mark(Step::Read);
                pwrite_all(self.fds[0], &buf, file_off)?;
            }
            mark(Step::Written);
            self.map_run(&Run {
                offset: logical * self.cluster + first * UNIT_SIZE,
                len: n * UNIT_SIZE,
                image: 0,
                file_offset: file_off,
                writable: true,
            })?;
            mark(Step::Mapped);
            state
                .copied_up
                .push((logical * self.cluster + first * UNIT_SIZE, n * UNIT_SIZE));
            for u in &units[i..j] {
                bits[(u / 64) as usize] |= 1 << (u % 64);
            }
            i = j;
        }
        if self.prefault {
            // Best effort: without it the retry faults the page in itself.
            let page = self.base + logical * self.cluster + unit as u64 * UNIT_SIZE;
            let _ = populate_write(page, PAGE);
        }
        mark(Step::WorkDone);
        state.copied.insert(logical, bits);
        self.counters.cow_faults.fetch_add(1, Ordering::Relaxed);
        self.counters
            .cow_units
            .fetch_add(units.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Allocations after which the pool refill thread runs: every `REFILL_EVERY`, or sooner
    /// when that would empty the staged clusters first.
    pub fn refill_every(&self) -> u64 {
        match self.staging.target() {
            0 => crate::REFILL_EVERY,
            t => crate::REFILL_EVERY.min(t.div_ceil(2)),
        }
    }

    fn note_allocation(&self) {
        let mut r = self.refill.lock().unwrap_or_else(|p| p.into_inner());
        r.0 += 1;
        if r.0 >= self.refill_every() {
            self.refill_cv.notify_one();
        }
    }

    /// The sync point: data of copied units durable, then their bits recorded, then durable.
    /// Every write that completed before the call is durable when it returns.
    pub fn flush(&self) -> Result<()> {
        let pending: Vec<(u64, [u64; 8])> = {
            let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.copied.iter().map(|(k, v)| (*k, *v)).collect()
        };
        // F (data): guest stores through MAP_SHARED and copied units.
        self.chain.sync()?;
        if pending.is_empty() {
            return Ok(());
        }
        let words = self.units.div_ceil(64) as usize;
        for (logical, bm) in &pending {
            self.chain.mark_valid(*logical, &bm[..words])?;
        }
        // F (metadata): the bitmap updates.
        self.chain.sync()?;
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for (logical, bm) in pending {
            if let Some(cur) = s.copied.get_mut(&logical) {
                for (c, b) in cur.iter_mut().zip(bm) {
                    *c &= !b;
                }
                if cur.iter().all(|&w| w == 0) {
                    s.copied.remove(&logical);
                }
            }
        }
        Ok(())
    }
}

/// Sorts `ranges` and merges the overlapping and touching ones.
pub(crate) fn merge_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (off, len) in ranges {
        match out.last_mut() {
            Some(last) if off <= last.0 + last.1 => {
                last.1 = last.1.max(off + len - last.0);
            }
            _ => out.push((off, len)),
        }
    }
    out
}

/// `from` minus `holes`; both sorted and disjoint.
pub(crate) fn subtract_ranges(from: &[(u64, u64)], holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(from.len());
    let mut h = 0;
    for &(off, len) in from {
        let (mut cur, end) = (off, off + len);
        while h < holes.len() && holes[h].0 + holes[h].1 <= cur {
            h += 1;
        }
        let mut i = h;
        while cur < end && i < holes.len() && holes[i].0 < end {
            let (hs, he) = (holes[i].0, holes[i].0 + holes[i].1);
            if hs > cur {
                out.push((cur, hs - cur));
            }
            cur = cur.max(he);
            i += 1;
        }
        if cur < end {
            out.push((cur, end - cur));
        }
    }
    out
}

pub(crate) fn pwrite_all(fd: RawFd, buf: &[u8], offset: u64) -> Result<()> {
    // SAFETY: `buf` is readable for its length.
    unsafe { pwrite_raw(fd, buf.as_ptr(), buf.len(), offset) }
}

/// Writes `len` bytes from `src` at `offset` of `fd`, retrying short writes.
///
/// # Safety
/// `src` must be readable for `len` bytes for the whole call.
unsafe fn pwrite_raw(fd: RawFd, src: *const u8, len: usize, offset: u64) -> Result<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: the caller guarantees `src..src+len` is readable; the descriptor belongs
        // to the open chain.
        let n = unsafe {
            libc::pwrite(
                fd,
                src.add(done).cast(),
                len - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(sys("pwrite of a copied unit", offset, len as u64));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{merge_ranges, subtract_ranges};

    #[test]
    fn merge_sorts_and_joins_touching_and_overlapping_ranges() {
        assert_eq!(
            merge_ranges(vec![(8, 4), (0, 4), (4, 2), (20, 1), (10, 5)]),
            vec![(0, 6), (8, 7), (20, 1)]
        );
        assert_eq!(merge_ranges(vec![]), vec![]);
    }

    #[test]
    fn subtract_punches_holes_and_drops_covered_ranges() {
        let from = [(0, 10), (20, 10), (40, 10)];
        assert_eq!(
            subtract_ranges(&from, &[(2, 3), (8, 14), (45, 100)]),
            vec![(0, 2), (5, 3), (22, 8), (40, 5)]
        );
        assert_eq!(subtract_ranges(&from, &[]), from.to_vec());
        assert_eq!(subtract_ranges(&from, &[(0, 100)]), vec![]);
        // A hole spanning two ranges, and holes between ranges.
        assert_eq!(
            subtract_ranges(&from, &[(12, 2), (25, 20)]),
            vec![(0, 10), (20, 5), (45, 5)]
        );
    }
}
