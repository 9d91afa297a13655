//! Bulk import of a raw file into a **new** pcow image (`densevm image convert -f raw`).
//!
//! A new file that nobody else has open needs none of the per-step ordering of §6 of
//! `docs/pcow.md`: it only has to be complete and durable when the import returns, and an
//! interrupted import must never be taken for a complete image. So:
//!
//! * the image is built in a temporary file next to the destination
//!   (`.NAME.PID.convert.tmp`), never under the destination's name;
//! * the source's data extents are found with `SEEK_DATA`/`SEEK_HOLE` (holes are never read)
//!   and read in large chunks; all-zero clusters are skipped with a word-wise test;
//! * non-zero clusters take consecutive slots, so their data is written with one `pwritev`
//!   per chunk and segment; each meta cluster is built in memory and written once, when its
//!   segment is complete;
//! * the header (both slots) is written last, then **one** `fdatasync`, then the temporary
//!   file is renamed to the destination (`RENAME_NOREPLACE`: an existing destination is never
//!   replaced) and the directory is synced.
//!
//! A crash before the rename leaves only the temporary file (its name says what it is; it
//! may lack its header, and `densevm image check` then rejects it); a crash after it leaves
//! the complete, durable image. The result is an ordinary version 1 image, identical in
//! layout to one written cluster by cluster through [`crate::Chain::write`].

use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{PcowError, Result};
use crate::format::{Entry, EntryKind, Geometry, HEADER_SLOT_SIZE};
use crate::ops::{new_header, CreateOptions};

/// Source bytes read per `pread` (rounded up to whole clusters).
const CHUNK: u64 = 8 << 20;

/// What [`import_raw`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportStats {
    /// Virtual size of the new image (the source's length).
    pub virtual_size: u64,
    /// Clusters holding data (non-zero clusters of the source).
    pub data_clusters: u64,
    /// Source bytes read (holes reported by `SEEK_HOLE` are not read).
    pub bytes_read: u64,
}

/// True if every byte of `b` is zero. Word-wise, 256 bytes per step with an early exit, so
/// random data is rejected after its first block and zero clusters run at memory speed.
pub fn is_zero(b: &[u8]) -> bool {
    let mut blocks = b.chunks_exact(256);
    for blk in &mut blocks {
        let mut acc = 0u64;
        for w in blk.chunks_exact(8) {
            acc |= u64::from_ne_bytes(w.try_into().expect("8 bytes"));
        }
        if acc != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&x| x == 0)
}

/// Name of the temporary file [`import_raw`] builds `dst` in.
pub fn temp_path(dst: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(dst.file_name().unwrap_or_default());
    name.push(format!(".{}.convert.tmp", std::process::id()));
    dst.with_file_name(name)
}

fn io_err(path: &Path, op: &'static str, offset: u64, source: std::io::Error) -> PcowError {
    PcowError::Io {
        path: path.to_path_buf(),
        op,
        offset,
        source,
    }
}

/// Data ranges of `file` in `[0, size)` per `SEEK_DATA`/`SEEK_HOLE` (the whole file when the
/// file system cannot tell).
fn data_extents(file: &File, size: u64) -> Vec<(u64, u64)> {
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < size {
        // SAFETY: lseek on a descriptor we own, plain integer arguments.
        let start = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if start < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            return vec![(0, size)];
        }
        let start = start as u64;
        // SAFETY: as above.
        let end = unsafe { libc::lseek(fd, start as libc::off_t, libc::SEEK_HOLE) };
        if end < 0 {
            return vec![(0, size)];
        }
        let end = (end as u64).min(size);
        if end > start {
            out.push((start, end));
        }
        at = end.max(start + 1);
    }
    out
}

/// Builds a new image of the current segment's meta cluster and the data runs waiting for
/// one `pwritev`.
struct Builder<'a> {
    file: &'a File,
    path: &'a Path,
    geo: Geometry,
    full: Vec<u64>,
    /// Meta cluster of the segment of `next_slot` (entries of the slots taken so far).
    meta: Vec<u8>,
    next_slot: u64,
}

impl Builder<'_> {
    fn segment_of(&self, slot: u64) -> u64 {
        slot / self.geo.entries_per_meta
    }

    /// Records slot `slot` = logical cluster `logical` (full data) in the meta buffer.
    fn add_entry(&mut self, slot: u64, logical: u64) {
        let e = Entry {
            logical,
            epoch: 1,
            kind: EntryKind::Data,
            seq: 1,
            bitmap: self.full.clone(),
        };
        let at = ((slot % self.geo.entries_per_meta) * self.geo.pair_size()) as usize;
        let copy = e.encode(&self.geo);
        self.meta[at..at + copy.len()].copy_from_slice(&copy);
    }

    fn write_meta(&mut self, segment: u64) -> Result<()> {
        let off = self.geo.meta_offset(segment);
        self.file
            .write_all_at(&self.meta, off)
            .map_err(|e| io_err(self.path, "write", off, e))?;
        self.meta.fill(0);
        Ok(())
    }

    /// Writes `bufs` (the data of consecutive slots starting at `first`, all in one segment).
    fn write_run(&self, first: u64, bufs: &[&[u8]]) -> Result<()> {
        let mut off = self.geo.data_offset(first);
        let max_iov = 1024;
        for group in bufs.chunks(max_iov) {
            let mut iov: Vec<libc::iovec> = group
                .iter()
                .map(|b| libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                })
                .collect();
            let mut total: usize = group.iter().map(|b| b.len()).sum();
            let mut iov_at = 0usize;
            while total > 0 {
                // SAFETY: every iovec points into a live, immutably borrowed buffer of
                // `bufs` (`iov_len` bytes); pwritev only reads them.
                let n = unsafe {
                    libc::pwritev(
                        self.file.as_raw_fd(),
                        iov[iov_at..].as_ptr(),
                        (iov.len() - iov_at) as libc::c_int,
                        off as libc::off_t,
                    )
                };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(io_err(self.path, "write", off, e));
                }
                let mut n = n as usize;
                off += n as u64;
                total -= n;
                // Skip what was written (a short write may end inside an iovec).
                while n > 0 {
                    let v = &mut iov[iov_at];
                    if n >= v.iov_len {
                        n -= v.iov_len;
                        iov_at += 1;
                    } else {
                        // SAFETY: advancing inside the same buffer by fewer than its length.
                        v.iov_base = unsafe { (v.iov_base as *mut u8).add(n) }.cast();
                        v.iov_len -= n;
                        n = 0;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Imports the raw file `src` into a new pcow image at `dst` (which must not exist) with
/// clusters of `cluster_size` bytes; see the module documentation for the write order.
/// `progress(done, total)` is called with source bytes.
pub fn import_raw(
    src: &Path,
    dst: &Path,
    cluster_size: u64,
    mut progress: impl FnMut(u64, u64),
) -> Result<ImportStats> {
    let input = File::open(src).map_err(|e| io_err(src, "open", 0, e))?;
    let size = input
        .metadata()
        .map_err(|e| io_err(src, "stat", 0, e))?
        .len();
    let header = new_header(
        &CreateOptions {
            virtual_size: size.max(1),
            cluster_size,
            backing: None,
        },
        [0; 16],
    )?;
    let geo = Geometry::new(header.cluster_bits)?;
    if dst.symlink_metadata().is_ok() {
        return Err(io_err(
            dst,
            "create",
            0,
            std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        ));
    }
    let tmp = temp_path(dst);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| io_err(&tmp, "create", 0, e))?;
    let result = build(&input, src, size, &file, &tmp, geo, &header, &mut progress)
        .and_then(|stats| publish(&tmp, dst).map(|_| stats));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn build(
    input: &File,
    src: &Path,
    size: u64,
    file: &File,
    path: &Path,
    geo: Geometry,
    header: &crate::format::Header,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportStats> {
    let cs = geo.cluster_size();
    // SAFETY: posix_fadvise on a descriptor we own; advisory only.
    unsafe { libc::posix_fadvise(input.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    let mut b = Builder {
        file,
        path,
        geo,
        full: geo.full_bitmap(),
        meta: vec![0u8; cs as usize],
        next_slot: 0,
    };
    let chunk = CHUNK.div_ceil(cs) * cs;
    let mut buf = vec![0u8; chunk as usize];
    let mut stats = ImportStats {
        virtual_size: size,
        ..Default::default()
    };
    // Next logical cluster not yet looked at (extents are widened to whole clusters).
    let mut next_cluster = 0u64;
    for (start, end) in data_extents(input, size) {
        let mut at = (start / cs).max(next_cluster) * cs;
        let end = end.div_ceil(cs) * cs;
        while at < end && at < size {
            let n = (end - at).min(chunk).min(size - at) as usize;
            let want = n.div_ceil(cs as usize) * cs as usize;
            read_full(input, src, &mut buf[..n], at)?;
            buf[n..want].fill(0);
            stats.bytes_read += n as u64;
            // Data clusters of this chunk, as runs of consecutive slots within one segment.
            let mut run: Vec<&[u8]> = Vec::new();
            let mut run_first = b.next_slot;
            for (i, cl) in buf[..want].chunks_exact(cs as usize).enumerate() {
                if is_zero(cl) {
                    continue;
                }
                let logical = at / cs + i as u64;
                let slot = b.next_slot;
                if slot > 0 && slot % geo.entries_per_meta == 0 {
                    // A new segment starts: its data is not contiguous with the previous one.
                    b.write_run(run_first, &run)?;
                    run.clear();
                    run_first = slot;
                    b.write_meta(b.segment_of(slot - 1))?;
                }
                b.add_entry(slot, logical);
                run.push(cl);
                b.next_slot += 1;
            }
            b.write_run(run_first, &run)?;
            at += n as u64;
            next_cluster = at.div_ceil(cs);
            progress(at, size);
        }
    }
    stats.data_clusters = b.next_slot;
    if b.next_slot > 0 {
        b.write_meta(b.segment_of(b.next_slot - 1))?;
    } else {
        file.set_len(cs)
            .map_err(|e| io_err(path, "truncate", cs, e))?;
    }
    // The header last (both slots, as at create), then the one flush.
    let h = header.encode();
    for slot in 0..2u64 {
        file.write_all_at(&h, slot * HEADER_SLOT_SIZE as u64)
            .map_err(|e| io_err(path, "write", 0, e))?;
    }
    file.sync_data()
        .map_err(|e| io_err(path, "fdatasync", 0, e))?;
    progress(size, size);
    Ok(stats)
}

fn read_full(f: &File, path: &Path, buf: &mut [u8], offset: u64) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(path, "read", offset + done as u64, e)),
        }
    }
    Ok(())
}

/// Renames the finished temporary file to `dst` without replacing an existing file, then
/// syncs the directory so the name is durable.
fn publish(tmp: &Path, dst: &Path) -> Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| PcowError::InvalidParameter(format!("path {} has a NUL", p.display())))
    };
    let (from, to) = (c(tmp)?, c(dst)?);
    // SAFETY: two NUL-terminated paths that outlive the call; AT_FDCWD for relative ones.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(io_err(dst, "rename", 0, e));
        }
        // No RENAME_NOREPLACE here: link (fails if dst exists), then drop the temporary name.
        std::fs::hard_link(tmp, dst).map_err(|e| io_err(dst, "link", 0, e))?;
        std::fs::remove_file(tmp).map_err(|e| io_err(tmp, "unlink", 0, e))?;
    }
    let dir = match dst.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, "fsync", 0, e))
}
