//! Anonymous memory over the holes of a template.
//!
//! A VM mapped `MAP_PRIVATE` over a file (a clone over its template, a restored VM over
//! its snapshot's memory file, a parent over the template it just froze) pays twice for a
//! page it writes where the file has a hole: the write fault first fills the hole in the
//! file (shmem allocates a page even for a private mapping's fault, charged to whoever
//! faults, and never given back while the file lives), then copies it into a private page.
//! A Linux guest zeroes every page it allocates, so this is most of what a clone touches.
//! Fresh anonymous memory mapped over the holes instead costs one page per page written
//! and nothing per page read (the shared zero page).
//!
//! What the VM's RAM reads does not change (a hole reads as zeros, so does new anonymous
//! memory), and snapshots stay right: pages written there are private (not file pages in
//! /proc/self/pagemap) and are copied like any other private page; pages only read are
//! zero and are skipped, since the file holds zeros there too ([`AnonHoles::covers`]).

use crate::memory::{is_ram, RegionInfo};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

const PAGE: u64 = 4096;

/// Holes smaller than this keep the file mapping (a mapping each would cost more in
/// kernel VMAs and start-up time than the pages it may save).
pub const MIN_HOLE: u64 = 256 << 10;

/// At most this many holes (the largest) get anonymous memory: each is a VMA (a process
/// may have 65,530 in all) and an `mmap` on the clone's way to its first guest entry.
pub const MAX_HOLES: usize = 512;

/// The scan's granularity: after data is found, the search goes on at the next multiple
/// of this, so its cost is bounded by the file's size over this, not by its data (finding
/// the end of each data run with `SEEK_HOLE` walks every page of it: 12 ms for 512 MiB of
/// 4 KiB pages here, too slow on a clone's way to running). Holes inside the rest of such
/// a chunk keep the file mapping.
pub const SCAN_STEP: u64 = 2 << 20;

/// The guest ranges `(gpa, len)` of a VM's RAM that are anonymous memory over holes of
/// its file, sorted and disjoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnonHoles(Vec<(u64, u64)>);

impl AnonHoles {
    /// Whether the page at `gpa` lies in one of the ranges.
    pub fn covers(&self, gpa: u64) -> bool {
        let i = self.0.partition_point(|&(g, l)| g + l <= gpa);
        self.0.get(i).is_some_and(|&(g, _)| g <= gpa)
    }

    /// The ranges.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// Bytes covered.
    pub fn bytes(&self) -> u64 {
        self.0.iter().map(|&(_, l)| l).sum()
    }
}

/// Holes of `file` inside `[from, to)`, page-aligned, of at least [`MIN_HOLE`] bytes,
/// the [`MAX_HOLES`] largest of them, sorted by offset. Each starts at `from` or at a
/// multiple of [`SCAN_STEP`] and ends where data starts: one `SEEK_DATA` per hole and per
/// chunk holding data.
pub fn hole_ranges(file: &File, from: u64, to: u64) -> io::Result<Vec<(u64, u64)>> {
    let fd = file.as_raw_fd();
    let to = to / PAGE * PAGE;
    let mut holes = Vec::new();
    let mut pos = from.next_multiple_of(PAGE);
    while pos < to {
        // SAFETY: lseek on a descriptor `file` owns; it only moves the file offset.
        let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        let data = if data < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ENXIO) {
                return Err(err);
            }
            to
        } else {
            (data as u64 / PAGE * PAGE).min(to)
        };
        if data > pos && data - pos >= MIN_HOLE {
            holes.push((pos, data - pos));
        }
        pos = (data / SCAN_STEP + 1) * SCAN_STEP;
    }
    if holes.len() > MAX_HOLES {
        holes.sort_unstable_by_key(|&(off, len)| (std::cmp::Reverse(len), off));
        holes.truncate(MAX_HOLES);
        holes.sort_unstable();
    }
    Ok(holes)
}

/// Maps fresh anonymous memory over the holes of `file` in every RAM region of `regions`
/// (each mapped private over `file` at offset = guest address). The caller keeps every
/// vCPU and device off guest memory meanwhile. Returns the ranges now anonymous; on an
/// error, those done so far are kept (the rest keep the file mapping, which is only
/// dearer, not wrong) and the error is logged.
pub fn cover_holes(regions: &[RegionInfo], file: &File) -> AnonHoles {
    let t0 = std::time::Instant::now();
    let mut done = Vec::new();
    for r in regions.iter().filter(|r| is_ram(&r.name)) {
        let holes = match hole_ranges(file, r.gpa, r.gpa + r.size) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(
                    "RAM region {}: cannot find the template's holes: {e}",
                    r.name
                );
                continue;
            }
        };
        for (gpa, len) in holes {
            if let Err(e) = map_anonymous(r, gpa, len) {
                tracing::warn!(
                    "RAM region {}: cannot map anonymous memory over {gpa:#x}+{len:#x}: {e}",
                    r.name
                );
                break;
            }
            done.push((gpa, len));
        }
    }
    let holes = AnonHoles(done);
    tracing::debug!(
        "anonymous memory over {} holes of the template ({} MiB) in {:?}",
        holes.0.len(),
        holes.bytes() >> 20,
        t0.elapsed()
    );
    holes
}

/// Replaces `[gpa, gpa + len)` of region `r`'s mapping with fresh anonymous memory.
fn map_anonymous(r: &RegionInfo, gpa: u64, len: u64) -> io::Result<()> {
    if gpa < r.gpa || gpa + len > r.gpa + r.size || gpa % PAGE != 0 || len % PAGE != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "range outside the region or not page-aligned",
        ));
    }
    let addr = (r.host_addr + (gpa - r.gpa)) as *mut libc::c_void;
    // SAFETY: [addr, addr + len) lies inside the region's own live mapping (checked
    // above); MAP_FIXED replaces that part with zero-filled memory of the same protection,
    // which reads as the hole it covers did, so every pointer into it stays valid.
    let p = unsafe {
        libc::mmap(
            addr,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: advice on the mapping just made; it changes no contents. A guest touching
    // one page of a large hole must not get a 2 MiB huge page where THP is "always".
    unsafe { libc::madvise(addr, len as usize, libc::MADV_NOHUGEPAGE) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{back_ram_with_file, ram_with_windows, GuestMemory};
    use crate::snapshot::ram::{create_ram_file, matches_template, remap, write_memory, RamFile};
    use std::os::unix::fs::{FileExt, MetadataExt};
    use std::sync::Arc;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn holes_are_the_gaps_before_data_large_enough() {
        let f = create_ram_file(8 << 20).unwrap();
        f.write_all_at(&[1; 4096], 0x10_0000).unwrap();
        f.write_all_at(&[1; 4096], 0x30_0000).unwrap();
        f.write_all_at(&[1; 4096], 0x42_0000).unwrap(); // 128 KiB after 4 MiB: too small
        let holes = hole_ranges(&f, 0, 8 << 20).unwrap();
        // The rest of a chunk after its data keeps the file mapping (the scan goes on at
        // the next 2 MiB).
        assert_eq!(
            holes,
            [
                (0, 0x10_0000),
                (0x20_0000, 0x10_0000),
                (0x60_0000, 0x20_0000)
            ]
        );
        let none = create_ram_file(1 << 20).unwrap();
        assert_eq!(hole_ranges(&none, 0, 1 << 20).unwrap(), [(0, 1 << 20)]);
        // A region starting inside the file: holes are found from its start.
        assert_eq!(
            hole_ranges(&f, 0x50_0000, 0x58_0000).unwrap(),
            [(0x50_0000, 0x8_0000)]
        );
        let h = AnonHoles(holes);
        assert!(h.covers(0) && h.covers(0xf_f000) && !h.covers(0x10_0000));
        assert!(h.covers(0x20_0000) && !h.covers(0x30_0000) && h.covers((8 << 20) - PAGE));
        assert!(!h.covers(8 << 20));
    }

    /// A VM private over a template with holes: writes into the holes do not grow the
    /// template, reads there are zeros and leave it matching its template, and a snapshot
    /// holds exactly what the VM sees.
    #[test]
    fn writes_into_holes_do_not_grow_the_template_and_snapshots_hold_them() {
        let size = 8 << 20;
        let file = Arc::new(create_ram_file(size).unwrap());
        let mut specs = ram_with_windows(size, 0, 4 << 30, Vec::new());
        back_ram_with_file(&mut specs, &file, true);
        let memory = GuestMemory::new(specs).unwrap();
        let mem = memory.mem();
        mem.write_slice(&[0xaa; 4096], GuestAddress(0x1000))
            .unwrap();
        mem.write_slice(&[0xbb; 4096], GuestAddress(0x40_0000))
            .unwrap();
        for r in memory.regions() {
            remap(r, &file, false).unwrap();
        }
        let holes = cover_holes(memory.regions(), &file);
        assert_eq!(
            holes.ranges(),
            [(0x20_0000, 0x20_0000), (0x60_0000, 0x20_0000)]
        );
        assert!(!holes.covers(0x1000) && !holes.covers(0x40_0000));
        let mut ram = RamFile::new(Some(file.clone()), false);
        ram.set_anon_holes(holes);
        let blocks = file.metadata().unwrap().blocks();
        // Reads of holes: zeros, and still the template.
        let mut page = [1u8; 4096];
        mem.read_slice(&mut page, GuestAddress(0x60_0000)).unwrap();
        assert!(page.iter().all(|&b| b == 0));
        assert!(matches_template(memory.regions(), &ram).unwrap());
        // 1 MiB written into a hole: the template does not grow.
        mem.write_slice(&vec![0xcc; 1 << 20], GuestAddress(0x20_0000))
            .unwrap();
        assert_eq!(
            file.metadata().unwrap().blocks(),
            blocks,
            "the template grew"
        );
        assert!(!matches_template(memory.regions(), &ram).unwrap());
        // The snapshot: template data, the written hole, zeros elsewhere, sparse.
        let dir = tempfile_dir();
        let out = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("memory"))
            .unwrap();
        let written = write_memory(memory.regions(), &ram, &out).unwrap();
        assert_eq!(
            written,
            2 * 4096 + (1 << 20),
            "zero pages read in holes are skipped"
        );
        for (gpa, byte) in [
            (0x1000, 0xaa),
            (0x40_0000, 0xbb),
            (0x20_0000, 0xcc),
            (0x60_0000, 0),
        ] {
            out.read_exact_at(&mut page, gpa).unwrap();
            assert!(page.iter().all(|&b| b == byte), "{gpa:#x}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("densevm-holes-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
