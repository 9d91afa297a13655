//! The byte-storage layer under an image: a real file, a sparse in-memory buffer, and a
//! recording wrapper for crash-injection tests.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{PcowError, Result};

/// Byte storage for one image file. Reads beyond the end return zeros.
pub trait Storage: Send + Sync {
    /// Reads `buf.len()` bytes at `offset`; bytes beyond the end read as zero.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Writes `buf` at `offset`, extending the file if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Writes `bufs` back to back starting at `offset` (one `pwritev` for a real file).
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let mut at = offset;
        for b in bufs {
            self.write_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// Starts writing back `[offset, offset+len)` without waiting (a hint so that a later
    /// flush has less to wait for; not a durability point). No-op by default.
    fn start_writeback(&self, _offset: u64, _len: u64) {}
    /// Makes every completed write durable (fdatasync).
    fn flush(&self) -> Result<()>;
    /// Current length in bytes.
    fn len(&self) -> Result<u64>;
    /// True if the length is zero.
    fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Sets the length (truncates or extends with zeros).
    fn set_len(&self, len: u64) -> Result<()>;
    /// Ensures `[offset, offset+len)` is allocated and the file is at least that long.
    fn preallocate(&self, offset: u64, len: u64) -> Result<()> {
        if self.len()? < offset + len {
            self.set_len(offset + len)?;
        }
        Ok(())
    }
    /// Deallocates `[offset, offset+len)`; it reads as zeros afterwards. Does not change the length.
    fn punch_hole(&self, offset: u64, len: u64) -> Result<()>;
    /// The file descriptor, for storage backed by a real file.
    fn raw_fd(&self) -> Option<RawFd>;
    /// Path (or a descriptive name) used in error messages.
    fn path(&self) -> &Path;
}

/// A real file accessed with pread/pwrite/fdatasync.
#[derive(Debug)]
pub struct FileStorage {
    file: File,
    path: PathBuf,
}

impl FileStorage {
    /// Opens an existing file.
    pub fn open(path: &Path, writable: bool) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| io_err(path, "open", 0, e))?;
        Ok(FileStorage {
            file,
            path: path.to_path_buf(),
        })
    }
    /// Creates a new file; fails if it exists.
    pub fn create(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| io_err(path, "create", 0, e))?;
        Ok(FileStorage {
            file,
            path: path.to_path_buf(),
        })
    }
    fn err(&self, op: &'static str, offset: u64, e: std::io::Error) -> PcowError {
        io_err(&self.path, op, offset, e)
    }
}

fn io_err(path: &Path, op: &'static str, offset: u64, source: std::io::Error) -> PcowError {
    PcowError::Io {
        path: path.to_path_buf(),
        op,
        offset,
        source,
    }
}

impl Storage for FileStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0);
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.err("read", offset, e)),
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.err("write", offset, e))
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        pwritev_all(&self.file, bufs, offset).map_err(|e| self.err("write", offset, e))
    }
    fn start_writeback(&self, offset: u64, len: u64) {
        // SAFETY: sync_file_range on a descriptor we own, plain integer arguments; the result
        // is ignored (a hint).
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
    }
    fn flush(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| self.err("fdatasync", 0, e))
    }
    fn len(&self) -> Result<u64> {
        Ok(self
            .file
            .metadata()
            .map_err(|e| self.err("stat", 0, e))?
            .len())
    }
    fn set_len(&self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .map_err(|e| self.err("truncate", len, e))
    }
    fn preallocate(&self, offset: u64, len: u64) -> Result<()> {
        // SAFETY: fallocate on a descriptor we own, with plain integer arguments.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                0,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            // Filesystems without fallocate: extend sparsely instead.
            if self.len()? < offset + len {
                self.set_len(offset + len)?;
            }
        }
        Ok(())
    }
    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        // SAFETY: fallocate on a descriptor we own, with plain integer arguments.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc != 0 {
            // No hole punching here: write zeros instead (same observable content).
            let end = (offset + len).min(self.len()?);
            let zeros = vec![0u8; 1 << 16];
            let mut at = offset;
            while at < end {
                let n = (end - at).min(zeros.len() as u64) as usize;
                self.write_at(&zeros[..n], at)?;
                at += n as u64;
            }
        }
        Ok(())
    }
    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }
    fn path(&self) -> &Path {
        &self.path
    }
}

/// `pwritev` of all of `bufs` at `offset` (groups of `IOV_MAX`, short writes resumed).
fn pwritev_all(file: &File, bufs: &[&[u8]], mut offset: u64) -> std::io::Result<()> {
    const IOV_MAX: usize = 1024;
    for group in bufs.chunks(IOV_MAX) {
        let mut iov: Vec<libc::iovec> = group
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let mut left: usize = group.iter().map(|b| b.len()).sum();
        let mut at = 0usize;
        while left > 0 {
            // SAFETY: every iovec points into a live buffer of `bufs` (borrowed for the whole
            // call) with at most its length; pwritev only reads them.
            let n = unsafe {
                libc::pwritev(
                    file.as_raw_fd(),
                    iov[at..].as_ptr(),
                    (iov.len() - at) as libc::c_int,
                    offset as libc::off_t,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let mut n = n as usize;
            offset += n as u64;
            left -= n;
            // Skip what was written (a short write may end inside an iovec).
            while n > 0 {
                let v = &mut iov[at];
                if n >= v.iov_len {
                    n -= v.iov_len;
                    at += 1;
                } else {
                    // SAFETY: advances inside the same buffer by fewer bytes than it has left.
                    v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n) }.cast();
                    v.iov_len -= n;
                    n = 0;
                }
            }
        }
    }
    Ok(())
}

const PAGE: u64 = 4096;

#[derive(Clone, Default, Debug)]
struct MemInner {
    pages: HashMap<u64, Box<[u8]>>,
    len: u64,
}

impl MemInner {
    fn read(&self, buf: &mut [u8], offset: u64) {
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let in_page = (at % PAGE) as usize;
            let n = (PAGE as usize - in_page).min(buf.len() - done);
            let dst = &mut buf[done..done + n];
            match self.pages.get(&(at / PAGE)) {
                Some(p) => dst.copy_from_slice(&p[in_page..in_page + n]),
                None => dst.fill(0),
            }
            // Bytes at or beyond the length read as zero.
            if at + n as u64 > self.len {
                let keep = self.len.saturating_sub(at) as usize;
                dst[keep.min(n)..].fill(0);
            }
            done += n;
        }
    }
    fn write(&mut self, buf: &[u8], offset: u64) {
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let in_page = (at % PAGE) as usize;
            let n = (PAGE as usize - in_page).min(buf.len() - done);
            let page = self
                .pages
                .entry(at / PAGE)
                .or_insert_with(|| vec![0u8; PAGE as usize].into_boxed_slice());
            page[in_page..in_page + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        self.len = self.len.max(offset + buf.len() as u64);
    }
    fn set_len(&mut self, len: u64) {
        if len < self.len {
            self.zero(len, self.len - len);
        }
        self.len = len;
    }
    fn zero(&mut self, offset: u64, len: u64) {
        let end = offset + len;
        let keys: Vec<u64> = self
            .pages
            .keys()
            .copied()
            .filter(|p| p * PAGE < end && (p + 1) * PAGE > offset)
            .collect();
        for p in keys {
            let start = (p * PAGE).max(offset);
            let stop = ((p + 1) * PAGE).min(end);
            if start == p * PAGE && stop == (p + 1) * PAGE {
                self.pages.remove(&p);
            } else if let Some(page) = self.pages.get_mut(&p) {
                page[(start - p * PAGE) as usize..(stop - p * PAGE) as usize].fill(0);
            }
        }
    }
}

/// A sparse in-memory file, for tests, fuzzing and benchmarks. Clones share the same bytes.
#[derive(Clone, Debug)]
pub struct MemStorage {
    inner: Arc<Mutex<MemInner>>,
    name: PathBuf,
}

impl MemStorage {
    /// An empty in-memory file named `name` (used in error messages).
    pub fn new(name: &str) -> Self {
        MemStorage {
            inner: Arc::default(),
            name: PathBuf::from(name),
        }
    }
    /// An in-memory file holding a copy of `bytes`.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Self {
        let s = Self::new(name);
        s.lock().write(bytes, 0);
        s
    }
    /// An independent copy of the current contents.
    pub fn deep_clone(&self) -> Self {
        MemStorage {
            inner: Arc::new(Mutex::new(self.lock().clone())),
            name: self.name.clone(),
        }
    }
    /// Returns the whole contents (for small files).
    pub fn to_bytes(&self) -> Vec<u8> {
        let g = self.lock();
        let mut v = vec![0u8; g.len as usize];
        g.read(&mut v, 0);
        v
    }
    fn lock(&self) -> MutexGuard<'_, MemInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Storage for MemStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.lock().read(buf, offset);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.lock().write(buf, offset);
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn len(&self) -> Result<u64> {
        Ok(self.lock().len)
    }
    fn set_len(&self, len: u64) -> Result<()> {
        self.lock().set_len(len);
        Ok(())
    }
    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.lock().zero(offset, len);
        Ok(())
    }
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
    fn path(&self) -> &Path {
        &self.name
    }
}

/// One recorded storage operation.
#[derive(Clone, Debug)]
pub enum Op {
    /// A write of `data` at `offset`.
    Write {
        /// File offset.
        offset: u64,
        /// Bytes written.
        data: Vec<u8>,
    },
    /// A flush (durability barrier).
    Flush,
    /// A length change.
    SetLen(u64),
    /// A hole punch.
    Punch(u64, u64),
}

/// A shared, ordered log of storage operations on several files, for crash injection.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    log: Arc<Mutex<Vec<(usize, Op)>>>,
}

impl Recorder {
    /// A new, empty log.
    pub fn new() -> Self {
        Self::default()
    }
    /// Starts recording operations on `mem` (as file `id`) from its current contents.
    pub fn wrap(&self, id: usize, mem: MemStorage) -> RecordingStorage {
        RecordingStorage {
            initial: mem.deep_clone(),
            mem,
            id,
            log: self.log.clone(),
        }
    }
    /// Number of operations recorded so far (over all files).
    pub fn op_count(&self) -> usize {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
    /// A copy of the log.
    pub fn ops(&self) -> Vec<(usize, Op)> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Wraps a [`MemStorage`] and records every operation in a [`Recorder`], so that tests can
/// rebuild the file as it would be after a crash at any point.
#[derive(Clone, Debug)]
pub struct RecordingStorage {
    mem: MemStorage,
    initial: MemStorage,
    id: usize,
    log: Arc<Mutex<Vec<(usize, Op)>>>,
}

impl RecordingStorage {
    /// This file as it is after the first `n` operations of the log (over all files), plus
    /// the first `torn` bytes of operation `n` when it is a write to this file.
    pub fn replay(&self, n: usize, torn: Option<usize>) -> MemStorage {
        let out = self.initial.deep_clone();
        let ops = self.log.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (id, op) in &ops[..n.min(ops.len())] {
            if *id == self.id {
                apply(&out, op, None);
            }
        }
        if let (Some(t), Some((id, op))) = (torn, ops.get(n)) {
            if *id == self.id {
                apply(&out, op, Some(t));
            }
        }
        out
    }
    fn push(&self, op: Op) {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((self.id, op));
    }
}

fn apply(m: &MemStorage, op: &Op, torn: Option<usize>) {
    let mut g = m.lock();
    match op {
        Op::Write { offset, data } => {
            let n = torn.unwrap_or(data.len()).min(data.len());
            g.write(&data[..n], *offset);
        }
        Op::Flush => {}
        Op::SetLen(l) => g.set_len(*l),
        Op::Punch(o, l) => g.zero(*o, *l),
    }
}

impl Storage for RecordingStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.push(Op::Write {
            offset,
            data: buf.to_vec(),
        });
        self.mem.write_at(buf, offset)
    }
    fn flush(&self) -> Result<()> {
        self.push(Op::Flush);
        Ok(())
    }
    fn len(&self) -> Result<u64> {
        self.mem.len()
    }
    fn set_len(&self, len: u64) -> Result<()> {
        self.push(Op::SetLen(len));
        self.mem.set_len(len)
    }
    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.push(Op::Punch(offset, len));
        self.mem.punch_hole(offset, len)
    }
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
    fn path(&self) -> &Path {
        self.mem.path()
    }
}
