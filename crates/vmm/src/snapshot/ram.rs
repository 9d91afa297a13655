//! Guest RAM as a file: the memfd a VM's RAM lives in, writing it into a snapshot's
//! memory file without filling holes, and freezing it as a clone template.
//!
//! RAM regions sit in their file at offset = guest-physical address, so the 3–4 GiB hole
//! and never-touched pages cost nothing. A VM maps its own RAM file `MAP_SHARED`; a clone
//! template is that file frozen: its owner remaps the same file `MAP_PRIVATE` at the same
//! addresses (KVM's memory slots keep their host addresses; the kernel's MMU notifiers
//! drop the old translations), so from then on every writer, parent included, writes
//! private copies and the file never changes again.

use crate::memory::{is_ram, RegionInfo, RegionKind};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

const PAGE: u64 = 4096;
/// pagemap: page present / swapped / file-backed (or shared anonymous).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAP: u64 = 1 << 62;
const PM_FILE: u64 = 1 << 61;

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

/// The data ranges of `file` inside `[from, to)` (SEEK_DATA / SEEK_HOLE).
fn data_ranges(file: &File, from: u64, to: u64) -> io::Result<Vec<(u64, u64)>> {
    let fd = file.as_raw_fd();
    let mut ranges = Vec::new();
    let mut pos = from;
    while pos < to {
        // SAFETY: lseek on a descriptor this File owns; it only moves the file offset.
        let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return Err(err);
        }
        let data = data as u64;
        if data >= to {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let end = (hole as u64).min(to);
        ranges.push((data, end));
        pos = end;
    }
    Ok(ranges)
}

/// Copies `[from, to)` of `src` to the same offsets of `out`, skipping zero pages.
fn copy_file_data(src: &File, out: &File, from: u64, to: u64) -> io::Result<u64> {
    let mut written = 0;
    let mut buf = vec![0u8; 256 << 10];
    for (start, end) in data_ranges(src, from, to)? {
        let mut pos = start;
        while pos < end {
            let n = ((end - pos) as usize).min(buf.len());
            src.read_exact_at(&mut buf[..n], pos)?;
            for (i, page) in buf[..n].chunks(PAGE as usize).enumerate() {
                if !is_zero(page) {
                    out.write_all_at(page, pos + (i as u64) * PAGE)?;
                    written += page.len() as u64;
                }
            }
            pos += n as u64;
        }
    }
    Ok(written)
}

/// Which pages of a region to copy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pages {
    /// Those this process holds privately (written copies over a file, or anonymous
    /// memory), per /proc/self/pagemap.
    Private,
    /// Every page (a boot-image window: its clean pages come from a file the snapshot
    /// does not reference).
    All,
}

/// Copies pages of `region` to `out` at offset = guest address. With `skip_zero`,
/// all-zero pages are left out (the file is sparse there); over a template they must be
/// written, since the template may hold data at that offset.
fn copy_pages(region: &RegionInfo, out: &File, which: Pages, skip_zero: bool) -> io::Result<u64> {
    let pagemap = File::open("/proc/self/pagemap")?;
    let pages = region.size / PAGE;
    let mut entries = vec![0u8; 8 * 4096];
    let mut written = 0;
    let mut page = 0;
    while page < pages {
        let n = (pages - page).min(4096);
        let bytes = &mut entries[..(8 * n) as usize];
        if which == Pages::Private {
            pagemap.read_exact_at(bytes, (region.host_addr / PAGE + page) * 8)?;
        }
        for (i, entry) in bytes.chunks_exact(8).enumerate() {
            let e = u64::from_le_bytes(entry.try_into().unwrap_or([0; 8]));
            if which == Pages::Private && (e & (PM_PRESENT | PM_SWAP) == 0 || e & PM_FILE != 0) {
                continue;
            }
            let off = (page + i as u64) * PAGE;
            // SAFETY: off < region.size, inside the region's live mapping; the VM is paused
            // so nothing writes the page while it is read.
            let data = unsafe {
                std::slice::from_raw_parts((region.host_addr + off) as *const u8, PAGE as usize)
            };
            if skip_zero && is_zero(data) {
                continue;
            }
            out.write_all_at(data, region.gpa + off)?;
            written += PAGE;
        }
        page += n;
    }
    Ok(written)
}

/// How a VM's RAM is held.
#[derive(Debug)]
pub struct RamFile {
    /// The file RAM regions map (none when RAM is anonymous).
    pub file: Option<std::sync::Arc<File>>,
    /// Whether the regions map it `MAP_SHARED` (the VM owns the file) or private (the
    /// file is a frozen template).
    pub shared: bool,
}

/// Writes the content of every guest region except external ones (pmem) into `out` at
/// offset = guest address, sparse: RAM from the RAM file's data plus this VM's private
/// pages, boot-image windows page by page. Returns the bytes written.
pub fn write_memory(regions: &[RegionInfo], ram: &RamFile, out: &File) -> io::Result<u64> {
    let mut written = 0;
    let mut end = 0;
    for r in regions.iter().filter(|r| r.kind != RegionKind::External) {
        end = end.max(r.gpa + r.size);
        if !is_ram(&r.name) {
            written += copy_pages(r, out, Pages::All, true)?;
            continue;
        }
        // With a RAM file every RAM region maps it (shared, or private once frozen).
        match &ram.file {
            Some(file) => {
                written += copy_file_data(file, out, r.gpa, r.gpa + r.size)?;
                if !ram.shared {
                    written += copy_pages(r, out, Pages::Private, false)?;
                }
            }
            None => written += copy_pages(r, out, Pages::Private, true)?,
        }
    }
    if out.metadata()?.len() < end {
        out.set_len(end)?;
    }
    Ok(written)
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
        written += copy_pages(r, file, Pages::All, true)?;
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
        let ram = RamFile {
            file: Some(file.clone()),
            shared: false,
        };
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
        let ram = RamFile {
            file: None,
            shared: false,
        };
        assert_eq!(write_memory(memory.regions(), &ram, &out).unwrap(), PAGE);
        let mut p = [0u8; 4096];
        out.read_exact_at(&mut p, 0x5000).unwrap();
        assert!(p.iter().all(|&b| b == 7));
        std::fs::remove_dir_all(dir).unwrap();
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
