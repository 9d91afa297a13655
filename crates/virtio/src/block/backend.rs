//! What a virtio-blk disk is stored in: a raw file (or host block device) or a pcow image
//! chain. The request path ([`super::request`]) checks every range against [`Backend::size`]
//! before calling a backend, so backends see only in-range, sector-aligned requests.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use vm_memory::VolatileSlice;

/// Most iovecs one `preadv`/`pwritev` call takes.
const IOV_MAX: usize = 1024;

/// Storage behind a block device. Ranges are in bytes; the caller has checked them against
/// [`size`](Backend::size).
pub trait Backend: Send {
    /// Size of the disk in bytes (the guest sees its whole 512-byte sectors).
    fn size(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`.
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at `offset` (durable only after [`flush`](Backend::flush)).
    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&mut self) -> io::Result<()>;
    /// The guest no longer needs `[offset, offset+len)`: free its storage where possible.
    /// What the range reads afterwards is unspecified (virtio 1.2 §5.2.6.2).
    fn discard(&mut self, offset: u64, len: u64) -> io::Result<()>;
    /// Makes `[offset, offset+len)` read as zeros; with `unmap` its storage may be freed.
    fn write_zeroes(&mut self, offset: u64, len: u64, unmap: bool) -> io::Result<()>;
    /// The unit (bytes, a power of two, at least 512) in which discard frees storage.
    fn discard_granularity(&self) -> u64;
    /// Reads the disk at `offset` straight into guest memory (`bufs`, in order), if this
    /// backend can; `Ok(false)` makes the caller go through [`read`](Backend::read).
    fn read_into(&mut self, _offset: u64, _bufs: &[VolatileSlice<'_>]) -> io::Result<bool> {
        Ok(false)
    }
    /// Writes guest memory (`bufs`, in order) to the disk at `offset`, if this backend can;
    /// `Ok(false)` makes the caller go through [`write`](Backend::write).
    fn write_from(&mut self, _offset: u64, _bufs: &[VolatileSlice<'_>]) -> io::Result<bool> {
        Ok(false)
    }
}

/// Zeros written at most at once when a file system cannot zero a range itself.
const ZERO_CHUNK: u64 = 1 << 20;

/// A raw disk image file or host block device, read and written with pread/pwrite.
pub struct RawFile {
    file: File,
    size: u64,
    granularity: u64,
    /// Cleared once the file system refuses `FALLOC_FL_PUNCH_HOLE`.
    punch_hole: bool,
    /// Cleared once the file system refuses `FALLOC_FL_ZERO_RANGE`.
    zero_range: bool,
}

impl RawFile {
    /// Serves the disk in `file` (a regular file or a block device, opened read-write unless
    /// the disk is read-only).
    pub fn new(file: File) -> io::Result<Self> {
        let meta = file.metadata()?;
        // A block device's metadata says 0 bytes: its size is where its end is.
        let size = if meta.file_type().is_file() {
            meta.len()
        } else {
            use std::io::Seek;
            (&file).seek(io::SeekFrom::End(0))?
        };
        let granularity = meta.blksize().clamp(512, 1 << 20);
        let granularity = if granularity.is_power_of_two() {
            granularity
        } else {
            512
        };
        Ok(Self {
            file,
            size,
            granularity,
            punch_hole: true,
            zero_range: true,
        })
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        // SAFETY: fallocate only reads its integer arguments; the descriptor is owned by
        // `self.file` and stays open for the call.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, n) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Deallocates the range; `Ok(false)` when the file system cannot.
    fn punch(&mut self, offset: u64, len: u64) -> io::Result<bool> {
        if !self.punch_hole {
            return Ok(false);
        }
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        match self.fallocate(mode, offset, len) {
            Ok(()) => Ok(true),
            Err(e) if unsupported(&e) => {
                self.punch_hole = false;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Zeroes the range keeping it allocated; `Ok(false)` when the file system cannot.
    fn zero(&mut self, offset: u64, len: u64) -> io::Result<bool> {
        if !self.zero_range {
            return Ok(false);
        }
        let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        match self.fallocate(mode, offset, len) {
            Ok(()) => Ok(true),
            Err(e) if unsupported(&e) => {
                self.zero_range = false;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn write_zero_bytes(&self, offset: u64, len: u64) -> io::Result<()> {
        let zeros = vec![0u8; len.min(ZERO_CHUNK) as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(ZERO_CHUNK) as usize;
            self.file.write_all_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

/// The file system (or device) does not implement this fallocate mode.
impl RawFile {
    /// `preadv`/`pwritev` between the file at `offset` and guest memory, until every byte
    /// moved (short transfers continue where they stopped).
    fn vectored(&self, offset: u64, bufs: &[VolatileSlice<'_>], write: bool) -> io::Result<()> {
        let mut iovs: Vec<libc::iovec> = bufs
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| libc::iovec {
                iov_base: s.ptr_guard_mut().as_ptr().cast(),
                iov_len: s.len(),
            })
            .collect();
        let mut at = 0usize;
        let mut offset = offset;
        while at < iovs.len() {
            let n = (iovs.len() - at).min(IOV_MAX) as libc::c_int;
            let pos = libc::off_t::try_from(offset)
                .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
            // SAFETY: every iovec points into a `VolatileSlice` of guest memory that
            // vm-memory bounds-checked and that stays mapped for the VM's lifetime (longer
            // than this call); the kernel reads or writes only those ranges. Guest memory
            // is shared with the guest, which is what volatile access allows for.
            let r = unsafe {
                if write {
                    libc::pwritev(self.file.as_raw_fd(), iovs[at..].as_ptr(), n, pos)
                } else {
                    libc::preadv(self.file.as_raw_fd(), iovs[at..].as_ptr(), n, pos)
                }
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                return Err(io::Error::from(if write {
                    io::ErrorKind::WriteZero
                } else {
                    io::ErrorKind::UnexpectedEof
                }));
            }
            let mut moved = r as usize;
            offset += moved as u64;
            while moved > 0 && at < iovs.len() {
                let iov = &mut iovs[at];
                if moved >= iov.iov_len {
                    moved -= iov.iov_len;
                    at += 1;
                } else {
                    // SAFETY: advancing within the same iovec's buffer (moved < its length).
                    iov.iov_base = unsafe { iov.iov_base.cast::<u8>().add(moved) }.cast();
                    iov.iov_len -= moved;
                    moved = 0;
                }
            }
        }
        Ok(())
    }
}

fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL | libc::ENODEV)
    )
}

impl Backend for RawFile {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn discard(&mut self, offset: u64, len: u64) -> io::Result<()> {
        // Discard is a hint: a file system that cannot punch holes keeps the data.
        self.punch(offset, len).map(|_| ())
    }

    fn write_zeroes(&mut self, offset: u64, len: u64, unmap: bool) -> io::Result<()> {
        type Try = fn(&mut RawFile, u64, u64) -> io::Result<bool>;
        // With unmap, free the storage where possible; without, keep it allocated.
        let (first, then): (Try, Try) = if unmap {
            (RawFile::punch, RawFile::zero)
        } else {
            (RawFile::zero, RawFile::punch)
        };
        let done = first(self, offset, len)? || then(self, offset, len)?;
        if done {
            Ok(())
        } else {
            self.write_zero_bytes(offset, len)
        }
    }

    fn discard_granularity(&self) -> u64 {
        self.granularity
    }

    fn read_into(&mut self, offset: u64, bufs: &[VolatileSlice<'_>]) -> io::Result<bool> {
        self.vectored(offset, bufs, false).map(|()| true)
    }

    fn write_from(&mut self, offset: u64, bufs: &[VolatileSlice<'_>]) -> io::Result<bool> {
        self.vectored(offset, bufs, true).map(|()| true)
    }
}

/// A pcow image and its backing chain: thin images, snapshots and bases all work through
/// [`pcow::Chain`].
pub struct PcowDisk {
    chain: pcow::Chain,
}

impl PcowDisk {
    /// Serves the disk `chain` (opened writable unless the disk is read-only).
    pub fn new(chain: pcow::Chain) -> Self {
        Self { chain }
    }
}

fn pcow_err(e: pcow::PcowError) -> io::Error {
    io::Error::other(e)
}

impl Backend for PcowDisk {
    fn size(&self) -> u64 {
        self.chain.virtual_size()
    }

    fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.chain.read(offset, buf).map_err(pcow_err)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.chain.write(offset, data).map_err(pcow_err)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.chain.flush().map_err(pcow_err)
    }

    fn discard(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.chain.discard(offset, len).map_err(pcow_err)
    }

    /// A pcow discard reads back as zeros (whole clusters are freed or become zero
    /// tombstones over a base, partial ones are zeroed), so it serves write-zeroes with or
    /// without `unmap`: allocating zero clusters in a thin image would only waste space.
    fn write_zeroes(&mut self, offset: u64, len: u64, _unmap: bool) -> io::Result<()> {
        self.chain.discard(offset, len).map_err(pcow_err)
    }

    fn discard_granularity(&self) -> u64 {
        self.chain.cluster_size().max(512)
    }
}

/// A disk in host memory, for tests and the fuzz target.
#[cfg(any(test, feature = "test-utils"))]
pub struct MemDisk {
    /// The disk's bytes.
    pub data: Vec<u8>,
    /// Flush requests seen.
    pub flushes: u32,
}

#[cfg(any(test, feature = "test-utils"))]
impl MemDisk {
    /// A zero-filled disk of `size` bytes.
    pub fn new(size: usize) -> Self {
        Self {
            data: vec![0; size],
            flushes: 0,
        }
    }

    fn range(&mut self, offset: u64, len: u64) -> io::Result<&mut [u8]> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        let end = start
            .checked_add(len)
            .ok_or_else(|| io::Error::other("range overflows"))?;
        self.data
            .get_mut(start..end)
            .ok_or_else(|| io::Error::other("range past the end of the disk"))
    }
}

#[cfg(any(test, feature = "test-utils"))]
impl Backend for MemDisk {
    fn size(&self) -> u64 {
        self.data.len() as u64
    }
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        buf.copy_from_slice(self.range(offset, buf.len() as u64)?);
        Ok(())
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.range(offset, data.len() as u64)?.copy_from_slice(data);
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.flushes += 1;
        Ok(())
    }
    fn discard(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.range(offset, len)?.fill(0);
        Ok(())
    }
    fn write_zeroes(&mut self, offset: u64, len: u64, _unmap: bool) -> io::Result<()> {
        self.range(offset, len)?.fill(0);
        Ok(())
    }
    fn discard_granularity(&self) -> u64 {
        4096
    }
}
