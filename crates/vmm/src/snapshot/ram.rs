//! Guest RAM as a file: the memfd a VM's RAM lives in, writing it into a snapshot's
//! memory file without filling holes, and freezing it as a clone template.
//!
//! RAM regions sit in their file at offset = guest-physical address, so the 3–4 GiB hole
//! and never-touched pages cost nothing. A VM maps its own RAM file `MAP_SHARED`; a clone
//! template is that file frozen: its owner remaps the same file `MAP_PRIVATE` at the same
//! addresses (KVM's memory slots keep their host addresses; the kernel's MMU notifiers
//! drop the old translations), so from then on every writer, parent included, writes
//! private copies and the file never changes again.

use super::holes::AnonHoles;
use super::pagemap;
use crate::memory::{is_ram, RegionInfo, RegionKind};
use std::fs::File;
use std::io;
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

const PAGE: u64 = 4096;

/// A new, empty memfd of `size` bytes for guest RAM (sparse: pages appear when written).
pub fn create_ram_file(size: u64) -> io::Result<File> {
    // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor (or
    // -1), which is owned by the File from here on.
    let fd = unsafe { libc::memfd_create(c"densevm-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)?;
    Ok(file)
}

/// Maps `file` over `region`'s host range (`MAP_FIXED`, at offset = its guest address),
/// shared or private. The caller keeps every vCPU parked and the device workers from
/// touching guest memory while it runs.
pub fn remap(region: &RegionInfo, file: &File, shared: bool) -> io::Result<()> {
    let flags = libc::MAP_FIXED
        | libc::MAP_NORESERVE
        | if shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
    // SAFETY: [host_addr, host_addr + size) is the region's own mapping, created by
    // GuestMemory and alive for the VM's lifetime; MAP_FIXED replaces it in one step with
    // a mapping of the same size and protection holding the same bytes (the file has
    // them), so every pointer into it (vm-memory, KVM's slot) stays valid.
    let ptr = unsafe {
        libc::mmap(
            region.host_addr as *mut libc::c_void,
            region.size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            file.as_raw_fd(),
            region.gpa as libc::off_t,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn is_zero(buf: &[u8]) -> bool {
    buf.iter().all(|&b| b == 0)
}

/// The data ranges of a file inside `[from, to)` (SEEK_DATA / SEEK_HOLE).
pub(super) use densevm_tier::data_ranges;

/// Copies `[from, to)` of `src` to the same offsets of `out`, skipping zero pages: each
/// data range of `src` is mapped read-only and its runs of non-zero pages written out
/// from the mapping, one call per run (no copy through a buffer).
fn copy_file_data(src: &File, out: &File, from: u64, to: u64) -> io::Result<u64> {
    let mut written = 0;
    for (start, end) in data_ranges(src, from, to)? {
        let start = start / PAGE * PAGE;
        let end = end.next_multiple_of(PAGE).min(to.next_multiple_of(PAGE));
        let len = (end - start) as usize;
        // SAFETY: a fresh read-only shared mapping of `src` (its own VMA, nobody else's
        // memory); unmapped below before it goes out of scope.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                src.as_raw_fd(),
                start as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the mapping above is `len` readable bytes until the munmap below; the
        // file is a frozen template or the paused VM's own RAM file, so nothing writes it.
        let data = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        let result = write_nonzero_runs(data, out, start);
        // SAFETY: unmapping the mapping made above; `data` is not used after this.
        unsafe { libc::munmap(ptr, len) };
        written += result?;
    }
    Ok(written)
}

/// Writes the runs of non-zero pages of `data` to `out` at `offset` + their position.
fn write_nonzero_runs(data: &[u8], out: &File, offset: u64) -> io::Result<u64> {
    let mut written = 0;
    let mut run: Option<usize> = None;
    let pages = data.len().div_ceil(PAGE as usize);
    for i in 0..=pages {
        let zero = i == pages || {
            let page = &data[i * PAGE as usize..((i + 1) * PAGE as usize).min(data.len())];
            is_zero(page)
        };
        match (zero, run) {
            (false, None) => run = Some(i),
            (true, Some(first)) => {
                let (a, b) = (first * PAGE as usize, (i * PAGE as usize).min(data.len()));
                out.write_all_at(&data[a..b], offset + a as u64)?;
                written += (b - a) as u64;
                run = None;
            }
            _ => {}
        }
    }
    Ok(written)
}

/// Which pages of a region to copy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pages {
    /// Those this process holds privately (written copies over a file, or anonymous
    /// memory), per [`pagemap::private_runs`].
    Private,
    /// Every page (a boot-image window: its clean pages come from a file the snapshot
    /// does not reference).
    All,
}

/// Copies pages of `region` to `out` at offset = guest address. All-zero pages whose
/// guest address `skip_zero` accepts are left out (the file is sparse there); over a
/// template they must be written, since the template may hold data at that offset, except
/// over its holes.
fn copy_pages(
    region: &RegionInfo,
    out: &File,
    which: Pages,
    skip_zero: &dyn Fn(u64) -> bool,
) -> io::Result<u64> {
    let mut written = 0;
    // A run of pages to copy, `[first, end)` in pages from the region's start: written
    // with one call from the mapping (the VM is paused, nothing writes it meanwhile).
    let mut run: Option<(u64, u64)> = None;
    let mut flush = |run: &mut Option<(u64, u64)>| -> io::Result<()> {
        if let Some((first, end)) = run.take() {
            let len = ((end - first) * PAGE) as usize;
            // SAFETY: [first, end) pages lie inside the region's live mapping (end <= its
            // pages); the VM is paused so nothing writes them while they are read.
            let data = unsafe {
                std::slice::from_raw_parts((region.host_addr + first * PAGE) as *const u8, len)
            };
            out.write_all_at(data, region.gpa + first * PAGE)?;
            written += len as u64;
        }
        Ok(())
    };
    let mut candidates = |first: u64, end: u64| -> io::Result<ControlFlow<()>> {
        for index in first..end {
            let mut copy = true;
            if skip_zero(region.gpa + index * PAGE) {
                // SAFETY: inside the region's live mapping, as above.
                let data = unsafe {
                    std::slice::from_raw_parts(
                        (region.host_addr + index * PAGE) as *const u8,
                        PAGE as usize,
                    )
                };
                copy = !is_zero(data);
            }
            match (copy, run) {
                (true, Some((a, b))) if b == index => run = Some((a, index + 1)),
                (true, _) => {
                    flush(&mut run)?;
                    run = Some((index, index + 1));
                }
                (false, _) => flush(&mut run)?,
            }
        }
        Ok(ControlFlow::Continue(()))
    };
    match which {
        Pages::All => {
            let _ = candidates(0, region.size / PAGE)?;
        }
        Pages::Private => {
            pagemap::private_runs(region.host_addr, region.size / PAGE * PAGE, &mut candidates)?;
        }
    }
    flush(&mut run)?;
    Ok(written)
}

/// How a VM's RAM is held.
pub struct RamFile {
    /// The file RAM regions map (none when RAM is anonymous).
    pub file: Option<std::sync::Arc<File>>,
    /// Whether the regions map it `MAP_SHARED` (the VM owns the file) or private (the
    /// file is a frozen template).
    pub shared: bool,
    /// Guest ranges `(gpa, len)` discarded while mapped private over a template: they
    /// read as zeros whatever the template holds there.
    discarded: Vec<(u64, u64)>,
    /// The memory tier keeping a shared RAM file under a DRAM budget (`--memory-budget`,
    /// crate::tiering): pages it moved out are holes in the file.
    pub tier: Option<densevm_tier::Tier>,
    /// RAM mapped private over the file's holes is anonymous memory there
    /// (crate::snapshot::holes).
    anon_holes: AnonHoles,
}

impl std::fmt::Debug for RamFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamFile")
            .field("file", &self.file)
            .field("shared", &self.shared)
            .field("discarded", &self.discarded)
            .field("tier", &self.tier.as_ref().map(|t| t.budget()))
            .finish()
    }
}

impl RamFile {
    /// RAM in `file` (mapped shared or private), or anonymous RAM without one.
    pub fn new(file: Option<std::sync::Arc<File>>, shared: bool) -> Self {
        Self {
            file,
            shared,
            discarded: Vec::new(),
            tier: None,
            anon_holes: AnonHoles::default(),
        }
    }

    /// Records the ranges [`cover_holes`](super::holes::cover_holes) made anonymous.
    pub fn set_anon_holes(&mut self, holes: AnonHoles) {
        self.anon_holes = holes;
    }

    /// The ranges of RAM that are anonymous memory over the file's holes.
    pub fn anon_holes(&self) -> &AnonHoles {
        &self.anon_holes
    }

    /// Moves every page the tier holds back into the RAM file and ends the tier, so that
    /// the file alone holds guest RAM (before it becomes a clone template). Returns the
    /// bytes moved.
    pub fn end_tier(&mut self) -> io::Result<u64> {
        match self.tier.take() {
            Some(tier) => tier.dissolve(),
            None => Ok(0),
        }
    }

    /// Gives `[gpa, gpa + len)` of RAM region `region` back to the host, so the guest reads
    /// zeros there from now on (a balloon or free-page report; page aligned). How depends
    /// on the backing: a shared RAM file gets a hole punched (`MADV_REMOVE`); anonymous
    /// RAM drops its pages (`MADV_DONTNEED`); RAM mapped private over a clone template must
    /// not re-expose the template's bytes (`MADV_DONTNEED` would), so fresh anonymous
    /// memory is mapped over the range and the range is remembered, so that snapshots and
    /// templates write zeros there too.
    pub fn discard(&mut self, region: &RegionInfo, gpa: u64, len: u64) -> io::Result<()> {
        let inside = gpa >= region.gpa
            && len > 0
            && gpa
                .checked_add(len)
                .is_some_and(|end| end <= region.gpa + region.size);
        if !is_ram(&region.name) || !inside || gpa % PAGE != 0 || len % PAGE != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cannot discard {gpa:#x}+{len:#x}: not page-aligned guest RAM inside region `{}`",
                    region.name
                ),
            ));
        }
        if let (Some(tier), true) = (&self.tier, self.shared) {
            // The tier forgets what it holds there and punches the file (RAM sits in it
            // at offset = guest address).
            return tier.discard(gpa, len);
        }
        let addr = (region.host_addr + (gpa - region.gpa)) as *mut libc::c_void;
        // SAFETY: [addr, addr + len) lies inside the region's own live mapping (checked
        // above). MADV_REMOVE / MADV_DONTNEED only drop pages (they read as zeros after),
        // and the MAP_FIXED anonymous mapping replaces part of the region's mapping with
        // zero-filled memory of the same protection: every pointer into it stays valid.
        let rc = unsafe {
            match (&self.file, self.shared) {
                (Some(_), true) => libc::madvise(addr, len as usize, libc::MADV_REMOVE),
                (None, _) => libc::madvise(addr, len as usize, libc::MADV_DONTNEED),
                (Some(_), false) => {
                    let p = libc::mmap(
                        addr,
                        len as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_FIXED
                            | libc::MAP_PRIVATE
                            | libc::MAP_ANONYMOUS
                            | libc::MAP_NORESERVE,
                        -1,
                        0,
                    );
                    if p == libc::MAP_FAILED {
                        -1
                    } else {
                        0
                    }
                }
            }
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        if self.file.is_some() && !self.shared {
            self.remember_discard(gpa, len);
        }
        Ok(())
    }

    /// Adds `[gpa, gpa + len)` to the discarded ranges, kept sorted and merged: a guest
    /// that reports the same free blocks again and again (free page reporting does) never
    /// grows the list, which holds at most one entry per distinct range.
    fn remember_discard(&mut self, gpa: u64, len: u64) {
        let (mut start, mut end) = (gpa, gpa + len);
        // The first range that ends at or after `start` (sorted and disjoint: ends too).
        let first = self.discarded.partition_point(|&(g, l)| g + l < start);
        let mut last = first;
        while let Some(&(g, l)) = self.discarded.get(last) {
            if g > end {
                break;
            }
            start = start.min(g);
            end = end.max(g + l);
            last += 1;
        }
        self.discarded.splice(first..last, [(start, end - start)]);
    }

    /// The ranges discarded over a template, sorted and merged.
    pub fn discarded(&self) -> &[(u64, u64)] {
        &self.discarded
    }
}

/// Zeros `[off, off + len)` of `out` (a hole where the file system can punch one).
fn zero_range(out: &File, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on a descriptor `out` owns; punching a hole only changes the file.
    let rc = unsafe {
        libc::fallocate(
            out.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let zeros = vec![0u8; 64 << 10];
    let mut pos = off;
    while pos < off + len {
        let n = ((off + len - pos) as usize).min(zeros.len());
        out.write_all_at(&zeros[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

/// Writes the content of every guest region except external ones (pmem) into `out` at
/// offset = guest address, sparse: RAM from the RAM file's data plus this VM's private
/// pages, boot-image windows page by page. Returns the bytes written.
pub fn write_memory(regions: &[RegionInfo], ram: &RamFile, out: &File) -> io::Result<u64> {
    // A tier is held still while RAM is copied: the pages it moved out are holes in the
    // file, written from the tier after the file's data.
    let frozen = ram.tier.as_ref().map(|t| t.freeze());
    let mut written = 0;
    let mut end = 0;
    for r in regions.iter().filter(|r| r.kind != RegionKind::External) {
        end = end.max(r.gpa + r.size);
        if !is_ram(&r.name) {
            written += copy_pages(r, out, Pages::All, &|_| true)?;
            continue;
        }
        // With a RAM file every RAM region maps it (shared, or private once frozen).
        match &ram.file {
            Some(file) => {
                written += copy_file_data(file, out, r.gpa, r.gpa + r.size)?;
                if let Some(frozen) = &frozen {
                    written += frozen.write_tiered(out, r.gpa, r.gpa + r.size)?;
                }
                if !ram.shared {
                    // Discarded ranges read as zeros, not as the template: clear them,
                    // then lay the pages written since on top.
                    for &(gpa, len) in &ram.discarded {
                        let from = gpa.max(r.gpa);
                        let to = (gpa + len).min(r.gpa + r.size);
                        if from < to {
                            zero_range(out, from, to - from)?;
                        }
                    }
                    let holes = &ram.anon_holes;
                    written += copy_pages(r, out, Pages::Private, &|gpa| holes.covers(gpa))?;
                }
            }
            None => written += copy_pages(r, out, Pages::Private, &|_| true)?,
        }
    }
    if out.metadata()?.len() < end {
        out.set_len(end)?;
    }
    Ok(written)
}

/// Whether the regions (RAM and boot-image windows) of a VM mapped private over a frozen
/// template still read exactly the template: no page written since (no private page, per
/// [`pagemap::private_runs`]) and none discarded. Such a VM (e.g. one kept paused since its
/// last clone) can be cloned again from the same template without a copy.
pub fn matches_template(regions: &[RegionInfo], ram: &RamFile) -> io::Result<bool> {
    if ram.file.is_none() || ram.shared || !ram.discarded.is_empty() {
        return Ok(false);
    }
    let mut unchanged = true;
    for r in regions.iter().filter(|r| r.kind != RegionKind::External) {
        pagemap::private_runs(r.host_addr, r.size / PAGE * PAGE, &mut |first, end| {
            for index in first..end {
                // A page only read over a hole (or written back to zeros) still reads as
                // the template there.
                let gpa = r.gpa + index * PAGE;
                // SAFETY: inside the region's live mapping; the VM is paused.
                let data = unsafe {
                    std::slice::from_raw_parts(
                        (r.host_addr + index * PAGE) as *const u8,
                        PAGE as usize,
                    )
                };
                if !(ram.anon_holes.covers(gpa) && is_zero(data)) {
                    unchanged = false;
                    return Ok(ControlFlow::Break(()));
                }
            }
            Ok(ControlFlow::Continue(()))
        })?;
        if !unchanged {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Writes the boot-image windows (every non-RAM, non-external region) into the VM's own
/// RAM file, at their guest addresses (holes there: RAM is cut around them), so that the
/// file alone holds all guest memory for a template.
pub fn write_windows(regions: &[RegionInfo], file: &File) -> io::Result<u64> {
    let mut written = 0;
    for r in regions
        .iter()
        .filter(|r| !is_ram(&r.name) && r.kind != RegionKind::External)
    {
        written += copy_pages(r, file, Pages::All, &|_| true)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{back_ram_with_file, ram_with_windows, GuestMemory};
    use std::sync::Arc;
    use vm_memory::{Bytes, GuestAddress};

    fn layout(size: u64) -> Vec<crate::memory::RegionSpec> {
        ram_with_windows(size, 0, 4 << 30, Vec::new())
    }

    /// A VM private over its template matches it until it writes a page or discards one.
    #[test]
    fn a_vm_that_wrote_nothing_since_its_freeze_matches_its_template() {
        let size = 4 << 20;
        let file = Arc::new(create_ram_file(size).unwrap());
        let mut specs = layout(size);
        back_ram_with_file(&mut specs, &file, true);
        let memory = GuestMemory::new(specs).unwrap();
        let mem = memory.mem();
        mem.write_slice(&[0xaa; 4096], GuestAddress(0x1000))
            .unwrap();
        let shared = RamFile::new(Some(file.clone()), true);
        assert!(
            !matches_template(memory.regions(), &shared).unwrap(),
            "not frozen yet"
        );
        for r in memory.regions() {
            remap(r, &file, false).unwrap();
        }
        let mut ram = RamFile::new(Some(file.clone()), false);
        // Reads fault in the template's pages: still the template.
        let mut buf = [0u8; 4096];
        mem.read_slice(&mut buf, GuestAddress(0x1000)).unwrap();
        mem.read_slice(&mut buf, GuestAddress(0x30_0000)).unwrap();
        assert!(matches_template(memory.regions(), &ram).unwrap());
        // One write anywhere, or a discard, and it does not.
        mem.write_slice(&[1], GuestAddress(0x20_0000)).unwrap();
        assert!(!matches_template(memory.regions(), &ram).unwrap());
        for r in memory.regions() {
            remap(r, &file, false).unwrap();
        }
        assert!(matches_template(memory.regions(), &ram).unwrap());
        ram.discard(&memory.regions()[0], 0x1000, PAGE).unwrap();
        assert!(!matches_template(memory.regions(), &ram).unwrap());
        assert!(!matches_template(memory.regions(), &RamFile::new(None, false)).unwrap());
    }

    /// Shared RAM file → frozen template → private writes: the template keeps the bytes
    /// from before the freeze, the VM sees its own writes, and a snapshot of the VM
    /// holds template data overlaid with the private pages (including a page written
    /// back to zeros), with holes where nothing was ever written.
    #[test]
    fn freeze_keeps_the_template_and_snapshots_merge_private_pages() {
        let size = 4 << 20;
        let file = Arc::new(create_ram_file(size).unwrap());
        let mut specs = layout(size);
        back_ram_with_file(&mut specs, &file, true);
        let memory = GuestMemory::new(specs).unwrap();
        let mem = memory.mem();
        mem.write_slice(&[0xaa; 4096], GuestAddress(0x1000))
            .unwrap();
        mem.write_slice(&[0xbb; 4096], GuestAddress(0x3000))
            .unwrap();
        for r in memory.regions() {
            remap(r, &file, false).unwrap();
        }
        mem.write_slice(&[0xcc; 4096], GuestAddress(0x1000))
            .unwrap();
        mem.write_slice(&[0x00; 4096], GuestAddress(0x3000))
            .unwrap();
        mem.write_slice(&[0xdd; 4096], GuestAddress(0x20_0000))
            .unwrap();

        let mut page = [0u8; 4096];
        file.read_exact_at(&mut page, 0x1000).unwrap();
        assert!(page.iter().all(|&b| b == 0xaa), "template changed");
        file.read_exact_at(&mut page, 0x20_0000).unwrap();
        assert!(is_zero(&page), "a private write reached the template");

        let dir = tempfile_dir();
        let out = rw_file(&dir.join("memory"));
        let ram = RamFile::new(Some(file.clone()), false);
        write_memory(memory.regions(), &ram, &out).unwrap();
        let read = |off: u64| {
            let mut p = [0u8; 4096];
            out.read_exact_at(&mut p, off).unwrap();
            p
        };
        assert!(read(0x1000).iter().all(|&b| b == 0xcc));
        assert!(is_zero(&read(0x3000)));
        assert!(read(0x20_0000).iter().all(|&b| b == 0xdd));
        assert_eq!(out.metadata().unwrap().len(), size);
        let data = data_ranges(&out, 0, size).unwrap();
        let stored: u64 = data.iter().map(|(s, e)| e - s).sum();
        assert!(stored <= 4 * PAGE, "snapshot not sparse: {data:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Anonymous RAM: only non-zero pages are written.
    #[test]
    fn anonymous_ram_snapshot_is_sparse() {
        let memory = GuestMemory::new(layout(2 << 20)).unwrap();
        memory
            .mem()
            .write_slice(&[7u8; 4096], GuestAddress(0x5000))
            .unwrap();
        let mut zero = [0u8; 4096];
        memory
            .mem()
            .read_slice(&mut zero, GuestAddress(0x9000))
            .unwrap();
        let dir = tempfile_dir();
        let out = rw_file(&dir.join("memory"));
        let ram = RamFile::new(None, false);
        assert_eq!(write_memory(memory.regions(), &ram, &out).unwrap(), PAGE);
        let mut p = [0u8; 4096];
        out.read_exact_at(&mut p, 0x5000).unwrap();
        assert!(p.iter().all(|&b| b == 7));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Discarded RAM reads as zeros under every backing and its host memory goes: a hole
    /// in a shared RAM file, dropped anonymous pages, and over a template fresh zero
    /// memory that snapshots also write as zeros (the template keeps its bytes); pages
    /// written after the discard are kept. Bad ranges are refused.
    #[test]
    fn discarded_ram_reads_zero_under_every_backing() {
        let size = 2 << 20;
        let page = |mem: &vm_memory::GuestMemoryMmap, at: u64| {
            let mut p = [0u8; 4096];
            mem.read_slice(&mut p, GuestAddress(at)).unwrap();
            p
        };
        // Shared RAM file.
        let file = Arc::new(create_ram_file(size).unwrap());
        let mut specs = layout(size);
        back_ram_with_file(&mut specs, &file, true);
        let memory = GuestMemory::new(specs).unwrap();
        let r = memory.regions()[0].clone();
        memory
            .mem()
            .write_slice(&[9u8; 8192], GuestAddress(0x4000))
            .unwrap();
        let mut ram = RamFile::new(Some(file.clone()), true);
        ram.discard(&r, 0x4000, 8192).unwrap();
        // (Reading a hole through a shared mapping allocates it again: check the file first.)
        assert!(
            data_ranges(&file, 0, size).unwrap().is_empty(),
            "no hole punched"
        );
        assert!(is_zero(&page(memory.mem(), 0x5000)));

        // Private over a template.
        memory
            .mem()
            .write_slice(&[0xaa; 3 * 4096], GuestAddress(0x8000))
            .unwrap();
        remap(&r, &file, false).unwrap();
        let mut ram = RamFile::new(Some(file.clone()), false);
        memory
            .mem()
            .write_slice(&[0xcc; 4096], GuestAddress(0x9000))
            .unwrap();
        ram.discard(&r, 0x8000, 3 * 4096).unwrap();
        for at in [0x8000, 0x9000, 0xa000] {
            assert!(
                is_zero(&page(memory.mem(), at)),
                "{at:#x} not zero after discard"
            );
        }
        memory
            .mem()
            .write_slice(&[0x77; 4096], GuestAddress(0xa000))
            .unwrap();
        let mut t = [0u8; 4096];
        file.read_exact_at(&mut t, 0x8000).unwrap();
        assert!(t.iter().all(|&b| b == 0xaa), "the template changed");
        let dir = tempfile_dir();
        let out = rw_file(&dir.join("memory"));
        write_memory(memory.regions(), &ram, &out).unwrap();
        let read = |off: u64| {
            let mut p = [0u8; 4096];
            out.read_exact_at(&mut p, off).unwrap();
            p
        };
        assert!(
            is_zero(&read(0x8000)) && is_zero(&read(0x9000)),
            "snapshot shows the template"
        );
        assert!(
            read(0xa000).iter().all(|&b| b == 0x77),
            "a write after the discard is lost"
        );

        // Anonymous RAM.
        let anon = GuestMemory::new(layout(size)).unwrap();
        let ar = anon.regions()[0].clone();
        anon.mem()
            .write_slice(&[5u8; 4096], GuestAddress(0x3000))
            .unwrap();
        let mut ram = RamFile::new(None, false);
        ram.discard(&ar, 0x3000, 4096).unwrap();
        assert!(is_zero(&page(anon.mem(), 0x3000)));

        // Refused: misaligned, empty, past the region.
        for (gpa, len) in [
            (0x3001, 4096),
            (0x3000, 0),
            (size - 4096, 8192),
            (u64::MAX - 4095, 4096),
        ] {
            assert!(
                ram.discard(&ar, gpa, len).is_err(),
                "{gpa:#x}+{len:#x} accepted"
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Discarded ranges stay sorted and merged however they arrive.
    #[test]
    fn discarded_ranges_are_merged() {
        let mut ram = RamFile::new(None, false);
        for (g, l) in [
            (0x10000, 0x1000),
            (0x30000, 0x1000),
            (0x10000, 0x1000),
            (0x20000, 0x1000),
            (0x11000, 0x2000),
            (0x0, 0x1000),
            (0x1f000, 0x12000),
        ] {
            ram.remember_discard(g, l);
        }
        assert_eq!(
            ram.discarded(),
            &[(0x0, 0x1000), (0x10000, 0x3000), (0x1f000, 0x12000)]
        );
        ram.remember_discard(0x0, 0x40000);
        assert_eq!(ram.discarded(), &[(0x0, 0x40000)]);
    }

    fn rw_file(path: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap()
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "densevm-ram-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
