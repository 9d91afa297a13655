//! Which pages of a mapping this process holds privately: written copies over a file, or
//! anonymous memory (present or swapped, and not a file page).
//!
//! A snapshot of a VM mapped private over a template copies exactly those pages, and a
//! paused parent can be cloned again from its template when it holds none of them. Both
//! used to read `/proc/self/pagemap` whole: 8 bytes per page of guest RAM, 4 MiB and
//! ~3.5 ms for 2 GiB here, paid on a second clone's way to running even when the parent
//! wrote nothing. The `PAGEMAP_SCAN` ioctl (Linux ≥ 6.7) asks the kernel for the matching
//! ranges instead: it skips unmapped and file-only page tables and returns a few ranges.
//! Kernels without it (the nested lab's Debian 6.1) get the pagemap read, with the same
//! answer (tested against each other below).

use std::fs::File;
use std::io;
use std::ops::ControlFlow;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

const PAGE: u64 = 4096;
/// pagemap entry: page present / swapped / file-backed (or shared anonymous).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAP: u64 = 1 << 62;
const PM_FILE: u64 = 1 << 61;

/// `PAGEMAP_SCAN`'s page categories (include/uapi/linux/fs.h).
const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;

/// `struct pm_scan_arg` (include/uapi/linux/fs.h).
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as libc::c_ulong) << 16) | (0x66 << 8) | 16;

/// Ranges asked for per `PAGEMAP_SCAN` call (a 6 KiB buffer).
const SCAN_BATCH: usize = 256;
/// Pagemap entries read per `pread` on the fallback path (a 32 KiB buffer).
const READ_BATCH: u64 = 4096;

/// Calls `f(first, end)` for each run `[first, end)` (in pages from `addr`) of pages in
/// `[addr, addr + len)` this process holds privately, in order, until `f` breaks.
/// `addr` and `len` are page-aligned.
pub fn private_runs(
    addr: u64,
    len: u64,
    f: &mut dyn FnMut(u64, u64) -> io::Result<ControlFlow<()>>,
) -> io::Result<()> {
    let pagemap = File::open("/proc/self/pagemap")?;
    match scan_runs(&pagemap, addr, len, f) {
        Ok(()) => Ok(()),
        // ENOTTY: no such ioctl before 6.7. EINVAL: a kernel that knows it but refuses this
        // form of the argument. Neither has called `f` (refused on the first call).
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY) | Some(libc::EINVAL)) => {
            read_runs(&pagemap, addr, len, f)
        }
        Err(e) => Err(e),
    }
}

/// [`private_runs`] through `PAGEMAP_SCAN`: pages with `PRESENT` or `SWAPPED` and without
/// `FILE`, the same test as the pagemap path's.
fn scan_runs(
    pagemap: &File,
    addr: u64,
    len: u64,
    f: &mut dyn FnMut(u64, u64) -> io::Result<ControlFlow<()>>,
) -> io::Result<()> {
    let end = addr + len;
    let mut regions = [PageRegion::default(); SCAN_BATCH];
    let mut start = addr;
    while start < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start,
            end,
            vec: regions.as_mut_ptr() as u64,
            vec_len: SCAN_BATCH as u64,
            // FILE inverted and required: not a file page; then present or swapped.
            category_inverted: PAGE_IS_FILE,
            category_mask: PAGE_IS_FILE,
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            ..Default::default()
        };
        // SAFETY: PAGEMAP_SCAN on a pagemap descriptor reads `arg` and writes `arg` and at
        // most `vec_len` entries of `regions`, which both outlive the call; it only reads
        // this process's page tables.
        let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for r in &regions[..(n as usize).min(SCAN_BATCH)] {
            let (a, b) = (r.start.max(start), r.end.min(end));
            if a < b && f((a - addr) / PAGE, (b - addr) / PAGE)?.is_break() {
                return Ok(());
            }
        }
        if arg.walk_end <= start || arg.walk_end > end {
            // The kernel always moves on (or ends at `end`); anything else is not a
            // PAGEMAP_SCAN we understand, and looping on it would never end.
            return Err(io::Error::other(format!(
                "PAGEMAP_SCAN stopped at {:#x}, inside [{start:#x}, {end:#x})",
                arg.walk_end
            )));
        }
        start = arg.walk_end;
    }
    Ok(())
}

/// [`private_runs`] by reading `/proc/self/pagemap`.
fn read_runs(
    pagemap: &File,
    addr: u64,
    len: u64,
    f: &mut dyn FnMut(u64, u64) -> io::Result<ControlFlow<()>>,
) -> io::Result<()> {
    let pages = len / PAGE;
    let mut entries = vec![0u8; (8 * READ_BATCH) as usize];
    let mut run: Option<(u64, u64)> = None;
    let mut page = 0;
    while page < pages {
        let n = (pages - page).min(READ_BATCH);
        let bytes = &mut entries[..(8 * n) as usize];
        pagemap.read_exact_at(bytes, (addr / PAGE + page) * 8)?;
        for (i, entry) in bytes.chunks_exact(8).enumerate() {
            let index = page + i as u64;
            let e = u64::from_le_bytes(entry.try_into().unwrap_or([0; 8]));
            let private = e & (PM_PRESENT | PM_SWAP) != 0 && e & PM_FILE == 0;
            match (private, run) {
                (true, Some((first, end))) if end == index => run = Some((first, index + 1)),
                (true, _) => {
                    if let Some((a, b)) = run.replace((index, index + 1)) {
                        if f(a, b)?.is_break() {
                            return Ok(());
                        }
                    }
                }
                (false, Some((a, b))) => {
                    run = None;
                    if f(a, b)?.is_break() {
                        return Ok(());
                    }
                }
                (false, None) => {}
            }
        }
        page += n;
    }
    if let Some((a, b)) = run {
        // The last run: there is nothing left for a break to skip.
        let _ = f(a, b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    type Runs = Vec<(u64, u64)>;

    /// The runs each method finds over `[addr, addr + len)`: the scan's (`None` if the
    /// kernel has no `PAGEMAP_SCAN`) and the pagemap read's.
    fn runs(addr: u64, len: u64) -> (Option<Runs>, Runs) {
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let mut scanned = Vec::new();
        let scan = match scan_runs(&pagemap, addr, len, &mut |a, b| {
            scanned.push((a, b));
            Ok(ControlFlow::Continue(()))
        }) {
            Ok(()) => Some(scanned),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY) | Some(libc::EINVAL)) => None,
            Err(e) => panic!("PAGEMAP_SCAN: {e}"),
        };
        let mut read = Vec::new();
        read_runs(&pagemap, addr, len, &mut |a, b| {
            read.push((a, b));
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
        (scan, read)
    }

    /// Whether this kernel must have PAGEMAP_SCAN (≥ 6.7).
    fn kernel_has_scan() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release.trim().split(['.', '-']);
        let major: u32 = parts.next().unwrap().parse().unwrap();
        let minor: u32 = parts.next().unwrap().parse().unwrap();
        (major, minor) >= (6, 7)
    }

    fn mmap(len: usize, flags: libc::c_int, fd: libc::c_int) -> *mut u8 {
        // SAFETY: a fresh mapping of our own (anonymous or of a memfd this test owns).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as *mut u8
    }

    /// A memfd half full of data mapped private (pages read: file pages; pages written:
    /// private copies; holes read: file pages of the now-filled hole), then an anonymous
    /// mapping (pages read: the zero page, private; pages written: private): both methods
    /// find the same runs, and the scan is there on kernels that have it.
    #[test]
    fn the_scan_and_the_pagemap_read_find_the_same_private_pages() {
        let pages = 3 * 4096 + 77; // spans several read batches and scan calls
        let len = pages * PAGE as usize;
        let file = super::super::ram::create_ram_file(len as u64).unwrap();
        for p in (0..pages / 2).step_by(3) {
            file.write_all_at(&[p as u8 | 1; 16], (p as u64) * PAGE)
                .unwrap();
        }
        let private = mmap(len, libc::MAP_PRIVATE, file.as_raw_fd());
        let anon = mmap(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
        let mut expect_private = Vec::new();
        let mut expect_anon = Vec::new();
        // A pseudo-random mix: read, write or leave each page, with runs of each.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut p = 0;
        while p < pages {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let run = 1 + (x % 37) as usize;
            for q in p..(p + run).min(pages) {
                let off = q * PAGE as usize;
                // SAFETY: inside the two mappings made above, `len` bytes each.
                unsafe {
                    match (x >> 8) % 3 {
                        0 => {}
                        1 => {
                            std::ptr::read_volatile(private.add(off));
                            std::ptr::read_volatile(anon.add(off));
                            expect_anon.push(q as u64); // the zero page: private
                        }
                        _ => {
                            std::ptr::write_volatile(private.add(off), 7);
                            std::ptr::write_volatile(anon.add(off), 7);
                            expect_private.push(q as u64);
                            expect_anon.push(q as u64);
                        }
                    }
                }
            }
            p += run;
        }
        let flatten =
            |runs: &[(u64, u64)]| runs.iter().flat_map(|&(a, b)| a..b).collect::<Vec<_>>();
        for (base, expect) in [(private, &expect_private), (anon, &expect_anon)] {
            let (scan, read) = runs(base as u64, len as u64);
            assert_eq!(&flatten(&read), expect, "pagemap read");
            assert!(read.windows(2).all(|w| w[0].1 < w[1].0), "runs are maximal");
            match scan {
                Some(scan) => assert_eq!(flatten(&scan), flatten(&read), "PAGEMAP_SCAN"),
                None => assert!(!kernel_has_scan(), "a kernel ≥ 6.7 refused PAGEMAP_SCAN"),
            }
        }
        // Stopping early: the first run only.
        let mut seen = Vec::new();
        private_runs(anon as u64, len as u64, &mut |a, b| {
            seen.push((a, b));
            Ok(ControlFlow::Break(()))
        })
        .unwrap();
        assert_eq!(seen.len(), 1);
        // SAFETY: unmapping the two mappings made above; nothing uses them after this.
        unsafe {
            libc::munmap(private as *mut libc::c_void, len);
            libc::munmap(anon as *mut libc::c_void, len);
        }
    }

    /// The request number the seccomp filter of the control thread admits
    /// (densevm-seccomp's `PAGEMAP_SCAN`, which cannot see this crate).
    #[test]
    fn the_request_number_is_the_one_the_filter_admits() {
        assert_eq!(PAGEMAP_SCAN, 0xC060_6610);
        assert_eq!(std::mem::size_of::<PmScanArg>(), 96);
        assert_eq!(std::mem::size_of::<PageRegion>(), 24);
    }

    /// A range with nothing private gives no runs, by either method.
    #[test]
    fn an_untouched_mapping_has_no_private_pages() {
        let len = 1 << 24;
        let anon = mmap(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
        let (scan, read) = runs(anon as u64, len as u64);
        assert!(read.is_empty());
        assert!(scan.is_none_or(|s| s.is_empty()));
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(anon as *mut libc::c_void, len) };
    }
}
