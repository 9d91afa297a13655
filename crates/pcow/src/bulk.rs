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
//! * data and meta clusters are flushed with **one** `fdatasync`, then the header (both
//!   slots) is written and flushed, then the temporary file is renamed to the destination (`RENAME_NOREPLACE`: an existing destination is never
//!   replaced) and the directory is synced.
//!
//! A crash before the rename leaves only the temporary file (its name says what it is; until
//! its header is durable, after everything else, `densevm image check` rejects it as not an
//! image); a crash after it leaves the complete, durable image. The result is an ordinary version 1 image, identical in
//! layout to one written cluster by cluster through [`crate::Chain::write`].

use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use crate::error::{PcowError, Result};
use crate::format::{Entry, EntryKind, Geometry, Header, HEADER_SLOT_SIZE};
use crate::ops::{new_header, CreateOptions};
use crate::storage::{FileStorage, Storage};

/// Source bytes read per `pread` (rounded up to whole clusters): small enough that the
/// chunk is still in cache when it is zero-tested and written out.
const CHUNK: u64 = 1 << 20;

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

/// The meta cluster of the current segment, built in memory and written once.
struct Builder<'a> {
    out: &'a dyn Storage,
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
        self.out
            .write_at(&self.meta, self.geo.meta_offset(segment))?;
        self.meta.fill(0);
        Ok(())
    }

    /// Writes `bufs` (the data of consecutive slots from `first`, all in one segment).
    fn write_run(&self, first: u64, bufs: &[&[u8]]) -> Result<()> {
        if bufs.is_empty() {
            return Ok(());
        }
        let at = self.geo.data_offset(first);
        self.out.write_vectored_at(bufs, at)?;
        // Writeback starts now, overlapping the rest of the copy; the final flush then waits
        // only for the last chunks.
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        self.out.start_writeback(at, len as u64);
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
    if dst.symlink_metadata().is_ok() {
        return Err(io_err(
            dst,
            "create",
            0,
            std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        ));
    }
    let tmp = temp_path(dst);
    let out = FileStorage::create(&tmp)?;
    let result = import_into(&input, src, size, &out, &header, &mut progress)
        .and_then(|stats| publish(&tmp, dst).map(|_| stats));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes the image of the raw file `input` (`size` bytes; `src` names it in errors) with
/// header `header` into the empty storage `out`: data and meta clusters, flush, then the
/// header (both slots), flush. Until the last write the storage holds no valid header, so a
/// crash anywhere leaves a file that does not open as an image or the complete image.
pub fn import_into(
    input: &File,
    src: &Path,
    size: u64,
    out: &dyn Storage,
    header: &Header,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportStats> {
    let geo = Geometry::new(header.cluster_bits)?;
    let cs = geo.cluster_size();
    // SAFETY: posix_fadvise on a descriptor we own; advisory only.
    unsafe { libc::posix_fadvise(input.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    let mut b = Builder {
        out,
        geo,
        full: geo.full_bitmap(),
        meta: vec![0u8; cs as usize],
        next_slot: 0,
    };
    let chunk = CHUNK.div_ceil(cs) * cs;
    let mut stats = ImportStats {
        virtual_size: size,
        ..Default::default()
    };
    // Two stages on two threads: a reader fills chunks and finds their non-zero clusters,
    // this thread writes them (the copies into and out of the page cache overlap).
    let (full_tx, full_rx) = mpsc::sync_channel::<Chunk>(BUFFERS - 1);
    let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
    for _ in 0..BUFFERS {
        free_tx
            .send(vec![0u8; chunk as usize])
            .expect("receiver alive");
    }
    let extents = data_extents(input, size);
    std::thread::scope(|sc| -> Result<()> {
        let reader =
            sc.spawn(move || read_chunks(input, src, size, cs, chunk, &extents, full_tx, free_rx));
        let written = (|| -> Result<()> {
            for c in full_rx {
                // Data clusters of this chunk, as runs of consecutive slots within a segment.
                let mut run: Vec<&[u8]> = Vec::new();
                let mut run_first = b.next_slot;
                for &i in &c.nonzero {
                    let slot = b.next_slot;
                    if slot > 0 && slot % geo.entries_per_meta == 0 {
                        // A new segment: its data is not contiguous with the previous one.
                        b.write_run(run_first, &run)?;
                        run.clear();
                        run_first = slot;
                        b.write_meta(b.segment_of(slot - 1))?;
                    }
                    b.add_entry(slot, c.at / cs + i as u64);
                    let from = i as usize * cs as usize;
                    run.push(&c.buf[from..from + cs as usize]);
                    b.next_slot += 1;
                }
                b.write_run(run_first, &run)?;
                drop(run);
                stats.bytes_read += c.len as u64;
                progress(c.at + c.len as u64, size);
                // The reader may have stopped (error): then the buffer is just dropped.
                let _ = free_tx.send(c.buf);
            }
            Ok(())
        })();
        // `full_rx` is gone here, so a reader blocked on it stops; its error comes first.
        let read = reader
            .join()
            .unwrap_or_else(|_| Err(PcowError::InvalidParameter("reader panicked".into())));
        read.and(written)
    })?;
    stats.data_clusters = b.next_slot;
    if b.next_slot > 0 {
        b.write_meta(b.segment_of(b.next_slot - 1))?;
    } else {
        out.set_len(cs)?;
    }
    // Everything else durable first, then the header (both slots, as at create), durable.
    out.flush()?;
    // Both slots in one 4 KiB write; a crash that tears it leaves one valid slot (the image
    // is complete; check reports the other slot as an interrupted header update).
    let h = header.encode();
    let mut both = vec![0u8; 2 * HEADER_SLOT_SIZE];
    both[..HEADER_SLOT_SIZE].copy_from_slice(&h);
    both[HEADER_SLOT_SIZE..].copy_from_slice(&h);
    out.write_at(&both, 0)?;
    out.flush()?;
    progress(size, size);
    Ok(stats)
}

/// Chunks in flight between the reader and the writer.
const BUFFERS: usize = 4;

/// One chunk of the source: `len` bytes at `at` in `buf` (zero-padded to whole clusters)
/// and the indices of its non-zero clusters.
struct Chunk {
    at: u64,
    len: usize,
    buf: Vec<u8>,
    nonzero: Vec<u32>,
}

/// The reader stage of [`import_into`]: reads the data extents chunk by chunk into buffers
/// from `free` and sends them, with their non-zero clusters, to `full`.
#[allow(clippy::too_many_arguments)]
fn read_chunks(
    input: &File,
    src: &Path,
    size: u64,
    cs: u64,
    chunk: u64,
    extents: &[(u64, u64)],
    full: mpsc::SyncSender<Chunk>,
    free: mpsc::Receiver<Vec<u8>>,
) -> Result<()> {
    // Next logical cluster not yet looked at (extents are widened to whole clusters).
    let mut next_cluster = 0u64;
    for &(start, end) in extents {
        let mut at = (start / cs).max(next_cluster) * cs;
        let end = end.div_ceil(cs) * cs;
        while at < end && at < size {
            let n = (end - at).min(chunk).min(size - at) as usize;
            let want = n.div_ceil(cs as usize) * cs as usize;
            let Ok(mut buf) = free.recv() else {
                return Ok(()); // the writer stopped; it reports why
            };
            read_full(input, src, &mut buf[..n], at)?;
            buf[n..want].fill(0);
            let nonzero = buf[..want]
                .chunks_exact(cs as usize)
                .enumerate()
                .filter(|(_, cl)| !is_zero(cl))
                .map(|(i, _)| i as u32)
                .collect();
            let c = Chunk {
                at,
                len: n,
                buf,
                nonzero,
            };
            if full.send(c).is_err() {
                return Ok(());
            }
            at += n as u64;
            next_cluster = at.div_ceil(cs);
        }
    }
    Ok(())
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
