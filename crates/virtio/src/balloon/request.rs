//! The page queues: inflate and deflate chains (arrays of little-endian u32 PFNs in 4 KiB
//! units, in device-readable buffers) and free page reports (each device-writable buffer
//! *is* a free block: its address and length, never its contents).
//!
//! Nothing the guest names is trusted: every range is checked against guest memory and
//! split at region boundaries, pages outside RAM (beyond its end, over a hole) are skipped
//! and counted, and a chain can name at most [`MAX_PFNS_PER_CHAIN`] pages, so one request
//! costs the worker a bounded amount of work. Every chain is returned with length 0.

use super::handle::Counters;
use super::{BalloonMemory, PAGE_SIZE, PFN_SHIFT};
use crate::Mem;
use std::sync::atomic::Ordering;
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryRegion};

/// Most PFNs read from one inflate or deflate chain (Linux sends at most 256); the rest of
/// a longer chain is ignored and the chain counted as malformed.
pub const MAX_PFNS_PER_CHAIN: usize = 4096;

/// Which page queue a chain came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PageOp {
    /// The guest gives pages: release them.
    Inflate,
    /// The guest takes pages back: reclaim them.
    Deflate,
}

/// Calls `f` for each part of `[start, start + len)` that is guest memory, split at region
/// boundaries and trimmed to whole pages; returns the bytes that are not (holes, beyond the
/// end, a range that wraps around the address space, partial pages at unaligned region
/// edges).
pub(super) fn ram_ranges(mem: &Mem, start: u64, len: u64, mut f: impl FnMut(u64, u64)) -> u64 {
    let end = start.saturating_add(len);
    let mut skipped = len - (end - start);
    let mut addr = start;
    while addr < end {
        let Some(region) = mem.find_region(GuestAddress(addr)) else {
            // Skip to the next region above `addr` (or the end): one step per hole.
            let next = mem
                .iter()
                .map(|r| r.start_addr().0)
                .filter(|&s| s > addr)
                .min()
                .unwrap_or(end)
                .min(end);
            skipped += next - addr;
            addr = next;
            continue;
        };
        let region_end = region.start_addr().0.saturating_add(region.len());
        let stop = end.min(region_end);
        let first = addr.next_multiple_of(PAGE_SIZE).min(stop);
        let last = stop & !(PAGE_SIZE - 1);
        if last > first {
            f(first, last - first);
            skipped += (first - addr) + (stop - last);
        } else {
            skipped += stop - addr;
        }
        addr = stop;
    }
    skipped
}

/// Hands one range to the VMM and counts the outcome.
fn apply(memory: &dyn BalloonMemory, counters: &Counters, op: PageOp, gpa: u64, len: u64) {
    let result = match op {
        PageOp::Inflate => memory.release(gpa, len),
        PageOp::Deflate => memory.reclaim(gpa, len),
    };
    match result {
        Ok(()) if op == PageOp::Inflate => Counters::add(&counters.bytes_released, len),
        Ok(()) => {}
        Err(e) => {
            let what = if op == PageOp::Inflate {
                "release"
            } else {
                "reclaim"
            };
            if counters.release_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!("virtio-balloon: cannot {what} {len:#x} bytes at {gpa:#x}: {e} (further failures are counted, not logged)");
            } else {
                tracing::debug!("virtio-balloon: cannot {what} {len:#x} bytes at {gpa:#x}: {e}");
            }
        }
    }
}

/// Reads the PFNs of an inflate or deflate chain (device-readable buffers only, whole u32s,
/// at most [`MAX_PFNS_PER_CHAIN`]), sorted and without duplicates. Returns them and how
/// many of the chain's descriptors were wrong.
pub(super) fn read_pfns<M>(chain: DescriptorChain<M>, mem: &Mem) -> (Vec<u32>, u64)
where
    M: std::ops::Deref,
    M::Target: GuestMemory,
{
    let mut pfns = Vec::new();
    let mut bytes = Vec::new();
    let mut malformed = 0u64;
    for desc in chain {
        if desc.is_write_only() {
            malformed += 1;
            continue;
        }
        let len = desc.len() as usize;
        let room = MAX_PFNS_PER_CHAIN - pfns.len();
        let mut n = len / 4;
        if len % 4 != 0 || n > room {
            malformed += 1;
            n = n.min(room);
        }
        if n == 0 {
            continue;
        }
        bytes.resize(n * 4, 0);
        if mem.read_slice(&mut bytes, desc.addr()).is_err() {
            malformed += 1;
            continue;
        }
        pfns.extend(
            bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }
    pfns.sort_unstable();
    pfns.dedup();
    (pfns, malformed)
}

/// Runs of consecutive PFNs in a sorted, duplicate-free list: `(first, count)`.
pub(super) fn runs(pfns: &[u32]) -> impl Iterator<Item = (u32, u64)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = *pfns.get(i)?;
        let mut n = 1u64;
        while pfns
            .get(i + n as usize)
            .is_some_and(|&p| u64::from(p) == u64::from(first) + n)
        {
            n += 1;
        }
        i += n as usize;
        Some((first, n))
    })
}

/// Serves one inflate or deflate chain: coalesces its PFNs into ranges, releases or
/// reclaims the guest RAM among them, counts the rest. Returns the used length (0).
pub(super) fn serve_pages(
    chain: DescriptorChain<&Mem>,
    mem: &Mem,
    memory: &dyn BalloonMemory,
    counters: &Counters,
    op: PageOp,
) -> u32 {
    let (pfns, malformed) = read_pfns(chain, mem);
    Counters::add(&counters.malformed, malformed);
    let mut valid = 0u64;
    let mut invalid = 0u64;
    for (first, count) in runs(&pfns) {
        let gpa = u64::from(first) << PFN_SHIFT;
        let skipped = ram_ranges(mem, gpa, count << PFN_SHIFT, |a, l| {
            valid += l / PAGE_SIZE;
            apply(memory, counters, op, a, l);
        });
        invalid += skipped.div_ceil(PAGE_SIZE);
    }
    Counters::add(&counters.invalid_pages, invalid);
    match op {
        PageOp::Inflate => counters.inflated(valid),
        PageOp::Deflate => counters.deflated(valid),
    }
    0
}

/// Serves one free page report: every device-writable buffer is a free block to release
/// (its contents are never read). A readable, empty or unaligned buffer is counted as
/// malformed; of an unaligned one only the whole pages inside it are released. Returns the
/// used length (0: the device writes nothing).
pub(super) fn serve_report(
    chain: DescriptorChain<&Mem>,
    mem: &Mem,
    memory: &dyn BalloonMemory,
    counters: &Counters,
) -> u32 {
    let mut malformed = 0u64;
    let mut invalid = 0u64;
    let mut reported = 0u64;
    for desc in chain {
        let (start, len) = (desc.addr().0, u64::from(desc.len()));
        if !desc.is_write_only() || len == 0 {
            malformed += 1;
            continue;
        }
        if start % PAGE_SIZE != 0 || len % PAGE_SIZE != 0 {
            malformed += 1;
        }
        let skipped = ram_ranges(mem, start, len, |a, l| {
            reported += l / PAGE_SIZE;
            apply(memory, counters, PageOp::Inflate, a, l);
        });
        // Partial pages at an unaligned edge are the guest's mistake, not missing RAM.
        if start % PAGE_SIZE == 0 && len % PAGE_SIZE == 0 {
            invalid += skipped / PAGE_SIZE;
        }
    }
    Counters::add(&counters.malformed, malformed);
    Counters::add(&counters.invalid_pages, invalid);
    Counters::add(&counters.pages_reported, reported);
    0
}
