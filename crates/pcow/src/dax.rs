//! The mapped-file flush paths of docs/pcow.md ("Flush"): a file accessed through a shared
//! mapping instead of `pwrite`. On a DAX file system the mapping is `MAP_SYNC` (the file
//! system makes the block metadata of every written page durable when the page is first
//! written), every written cache line is written back with `clwb` (or `clflushopt`,
//! `clflush`) as it is written and a flush is one `sfence`, plus an `fdatasync` only when the
//! file's length or allocation changed since the last flush. On any other file system the
//! mapping is plain `MAP_SHARED` and a flush is `msync(MS_SYNC)` of the written ranges.
//!
//! [`MappedStorage`] implements [`Storage`] this way, so every operation of the crate keeps
//! its write order; [`Chain::open_with`](crate::Chain::open_with) opens a chain on it
//! ([`open_mapped`]).
//!
//! Not for a chain under the pmem mapping service as it stands: guest stores go through the
//! service's own `MAP_SHARED` (not `MAP_SYNC`) mappings of clusters, which an `sfence` does
//! not make durable; there the file's `fdatasync` (a [`FileStorage`] chain) stays the flush.

use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::error::{PcowError, Result};
use crate::storage::{FileStorage, Storage};

/// `MAP_SHARED_VALIDATE` and `MAP_SYNC` (Linux UAPI, the same on every architecture that
/// has them).
const MAP_SHARED_VALIDATE: libc::c_int = 0x03;
const MAP_SYNC: libc::c_int = 0x80000;
const LINE: usize = 64;

/// How the cache lines of a DAX mapping are written back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineFlush {
    /// `clwb` (keeps the line cached).
    Clwb,
    /// `clflushopt` (weakly ordered, evicts).
    Clflushopt,
    /// `clflush` (strongly ordered, evicts).
    Clflush,
    /// Not x86-64: no user-space write-back instruction is used (the DAX mode is not offered).
    None,
}

/// The best write-back instruction of this CPU.
pub fn line_flush() -> LineFlush {
    #[cfg(target_arch = "x86_64")]
    {
        // cpuid leaf 7 subleaf 0 (structured extended features) exists when the maximum
        // leaf is >= 7 (checked first).
        let max = std::arch::x86_64::__cpuid(0).eax;
        if max >= 7 {
            let ebx = std::arch::x86_64::__cpuid_count(7, 0).ebx;
            if ebx & (1 << 24) != 0 {
                return LineFlush::Clwb;
            }
            if ebx & (1 << 23) != 0 {
                return LineFlush::Clflushopt;
            }
        }
        LineFlush::Clflush
    }
    #[cfg(not(target_arch = "x86_64"))]
    LineFlush::None
}

/// Writes back every cache line of `[ptr, ptr+len)` (no fence: call [`fence`] to order it
/// before later stores).
///
/// # Safety
/// The range must be mapped (readable) memory.
pub unsafe fn write_back(how: LineFlush, ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let start = ptr as usize & !(LINE - 1);
    let end = ptr as usize + len;
    #[cfg(target_arch = "x86_64")]
    {
        let mut p = start;
        while p < end {
            match how {
                // SAFETY: the caller guarantees the line is mapped; clwb only writes it back
                // (the CPU supports it: `line_flush` checked cpuid).
                LineFlush::Clwb => unsafe {
                    std::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags))
                },
                // SAFETY: as above; clflushopt writes back and evicts, contents unchanged.
                LineFlush::Clflushopt => unsafe {
                    std::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
                },
                // SAFETY: as above; clflush (SSE2, every x86-64 CPU).
                LineFlush::Clflush => unsafe { std::arch::x86_64::_mm_clflush(p as *const u8) },
                LineFlush::None => {}
            }
            p += LINE;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (how, start, end);
}

/// Orders every earlier write-back before later stores (`sfence`).
pub fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no operands and no effect other than ordering.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

struct Map {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is a process-wide shared mapping owned by the storage; access to it is
// synchronised by the RwLock that holds this value.
unsafe impl Send for Map {}
// SAFETY: as above.
unsafe impl Sync for Map {}

/// A pcow file accessed through a shared mapping (see the module documentation).
pub struct MappedStorage {
    file: FileStorage,
    path: PathBuf,
    dax: bool,
    flush_how: LineFlush,
    map: RwLock<Map>,
    /// Written ranges not yet msync'ed (non-DAX mode).
    dirty: Mutex<Vec<(u64, u64)>>,
    /// Length or allocation changed since the last flush (needs an fdatasync).
    meta_dirty: AtomicBool,
}

impl MappedStorage {
    /// Opens `path` mapped: `MAP_SYNC` if the file is on DAX (and `allow_dax`), else a plain
    /// shared mapping.
    pub fn open(path: &Path, writable: bool, allow_dax: bool) -> Result<MappedStorage> {
        let file = FileStorage::open(path, writable)?;
        let len = file.len()? as usize;
        let fd = file.raw_fd().expect("a file has a descriptor");
        let how = line_flush();
        let mut dax = false;
        let mut ptr = std::ptr::null_mut();
        if allow_dax && writable && how != LineFlush::None && len > 0 {
            match map(fd, len, writable, MAP_SHARED_VALIDATE | MAP_SYNC) {
                Ok(p) => {
                    ptr = p;
                    dax = true;
                }
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
                Err(e) => return Err(io_err(path, "mmap(MAP_SYNC)", e)),
            }
        }
        if !dax && len > 0 {
            ptr = map(fd, len, writable, libc::MAP_SHARED).map_err(|e| io_err(path, "mmap", e))?;
        }
        Ok(MappedStorage {
            file,
            path: path.to_path_buf(),
            dax,
            flush_how: how,
            map: RwLock::new(Map { ptr, len }),
            dirty: Mutex::new(Vec::new()),
            meta_dirty: AtomicBool::new(false),
        })
    }

    /// True if the file is mapped `MAP_SYNC` (DAX): flushes are cache-line write-backs.
    pub fn is_dax(&self) -> bool {
        self.dax
    }

    fn flags(&self) -> libc::c_int {
        if self.dax {
            MAP_SHARED_VALIDATE | MAP_SYNC
        } else {
            libc::MAP_SHARED
        }
    }

    /// Maps the file's current length again after it changed.
    fn remap(&self) -> Result<()> {
        let len = self.file.len()? as usize;
        let mut m = self.map.write().unwrap_or_else(|p| p.into_inner());
        if m.len == len {
            return Ok(());
        }
        if m.len > 0 {
            // SAFETY: unmaps the mapping this storage created; no reader holds it (write lock).
            unsafe { libc::munmap(m.ptr.cast(), m.len) };
        }
        *m = Map {
            ptr: std::ptr::null_mut(),
            len: 0,
        };
        if len > 0 {
            let fd = self.file.raw_fd().expect("a file has a descriptor");
            let ptr =
                map(fd, len, true, self.flags()).map_err(|e| io_err(&self.path, "mmap", e))?;
            *m = Map { ptr, len };
        }
        Ok(())
    }
}

fn map(fd: RawFd, len: usize, writable: bool, flags: libc::c_int) -> std::io::Result<*mut u8> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a new mapping at a kernel-chosen address of a descriptor the caller owns; the
    // result is checked.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p.cast())
}

fn io_err(path: &Path, op: &'static str, source: std::io::Error) -> PcowError {
    PcowError::Io {
        path: path.to_path_buf(),
        op,
        offset: 0,
        source,
    }
}

impl Drop for MappedStorage {
    fn drop(&mut self) {
        let m = self.map.get_mut().unwrap_or_else(|p| p.into_inner());
        if m.len > 0 {
            // SAFETY: unmaps the mapping this storage created; nothing borrows it any more.
            unsafe { libc::munmap(m.ptr.cast(), m.len) };
        }
    }
}

impl Storage for MappedStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let m = self.map.read().unwrap_or_else(|p| p.into_inner());
        let have = (m.len as u64).saturating_sub(offset).min(buf.len() as u64) as usize;
        if have > 0 {
            // SAFETY: `offset + have <= m.len`, inside the live mapping (read lock held).
            let src = unsafe { std::slice::from_raw_parts(m.ptr.add(offset as usize), have) };
            buf[..have].copy_from_slice(src);
        }
        buf[have..].fill(0);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let end = offset + buf.len() as u64;
        if end > self.map.read().unwrap_or_else(|p| p.into_inner()).len as u64 {
            self.file.set_len(end)?;
            self.meta_dirty.store(true, Ordering::Release);
            self.remap()?;
        }
        let m = self.map.read().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `end <= m.len` (extended above), inside the live writable mapping; other
        // writers of the same bytes are excluded by the image's own locking.
        let dst = unsafe { std::slice::from_raw_parts_mut(m.ptr.add(offset as usize), buf.len()) };
        dst.copy_from_slice(buf);
        if self.dax {
            // SAFETY: the range was just written, so it is mapped.
            unsafe { write_back(self.flush_how, dst.as_ptr(), dst.len()) };
        } else {
            self.dirty
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((offset, buf.len() as u64));
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        if self.dax {
            fence();
        } else {
            let ranges = std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|p| p.into_inner()));
            let m = self.map.read().unwrap_or_else(|p| p.into_inner());
            for (off, len) in ranges {
                let start = off & !4095;
                let end = (off + len).min(m.len as u64);
                if start >= end {
                    continue;
                }
                // SAFETY: a page-aligned range inside the live mapping.
                let rc = unsafe {
                    libc::msync(
                        m.ptr.add(start as usize).cast(),
                        (end - start) as usize,
                        libc::MS_SYNC,
                    )
                };
                if rc != 0 {
                    return Err(io_err(&self.path, "msync", std::io::Error::last_os_error()));
                }
            }
        }
        if self.meta_dirty.swap(false, Ordering::AcqRel) {
            self.file.flush()?;
        }
        Ok(())
    }
    fn len(&self) -> Result<u64> {
        self.file.len()
    }
    fn set_len(&self, len: u64) -> Result<()> {
        self.file.set_len(len)?;
        self.meta_dirty.store(true, Ordering::Release);
        self.remap()
    }
    fn preallocate(&self, offset: u64, len: u64) -> Result<()> {
        self.file.preallocate(offset, len)?;
        self.meta_dirty.store(true, Ordering::Release);
        self.remap()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        self.file.punch_hole(offset, len)?;
        self.meta_dirty.store(true, Ordering::Release);
        Ok(())
    }
    fn raw_fd(&self) -> Option<RawFd> {
        self.file.raw_fd()
    }
    fn path(&self) -> &Path {
        &self.path
    }
}

/// Opener for [`Chain::open_with`](crate::Chain::open_with): the writable top file mapped
/// (DAX when the file system offers it), read-only files through `pread`.
pub fn open_mapped(path: &Path, writable: bool) -> Result<Arc<dyn Storage>> {
    if writable {
        Ok(Arc::new(MappedStorage::open(path, true, true)?))
    } else {
        Ok(Arc::new(FileStorage::open(path, false)?))
    }
}
