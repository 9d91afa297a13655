//! A minimal userfaultfd binding (the ioctls this crate needs), written against the stable
//! kernel UAPI (`linux/userfaultfd.h`) with `libc` only.
//!
//! The `userfaultfd` crate's `-sys` part runs bindgen at build time (needs libclang); these few
//! definitions avoid that build dependency. The descriptor is created through
//! `/dev/userfaultfd` (or the syscall) **without** `UFFD_USER_MODE_ONLY`, so faults raised by
//! KVM on behalf of a vCPU are delivered too.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const UFFDIO: u64 = 0xAA;
const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (UFFDIO << 8) | nr
}
const IOC_WRITE_READ: u64 = 3;
const IOC_READ: u64 = 2;

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: u64 = ioc(IOC_WRITE_READ, 0x3F, 24);
const UFFDIO_REGISTER: u64 = ioc(IOC_WRITE_READ, 0x00, 32);
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, 16);
const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, 16);
const UFFDIO_COPY: u64 = ioc(IOC_WRITE_READ, 0x03, 40);
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

/// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`.
const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
/// `UFFD_FEATURE_THREAD_ID`.
const FEATURE_THREAD_ID: u64 = 1 << 8;

/// `UFFDIO_REGISTER_MODE_MISSING`.
pub const REGISTER_MISSING: u64 = 1;
/// `UFFDIO_REGISTER_MODE_WP`.
pub const REGISTER_WP: u64 = 2;
const COPY_MODE_DONTWAKE: u64 = 1;
const COPY_MODE_WP: u64 = 2;

/// `UFFD_EVENT_PAGEFAULT`.
pub const EVENT_PAGEFAULT: u8 = 0x12;
/// `UFFD_PAGEFAULT_FLAG_WRITE`.
pub const FLAG_WRITE: u64 = 1;
/// `UFFD_PAGEFAULT_FLAG_WP`.
pub const FLAG_WP: u64 = 2;

#[repr(C)]
struct ApiArg {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
struct RegisterArg {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct CopyArg {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// One fault message (`struct uffd_msg`, page-fault flavour).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Msg {
    /// Event type (`EVENT_PAGEFAULT`).
    pub event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    /// `UFFD_PAGEFAULT_FLAG_*`.
    pub flags: u64,
    /// Faulting address.
    pub address: u64,
    /// Faulting thread id.
    pub ptid: u32,
    pad: u32,
}

/// An open userfaultfd descriptor.
pub struct Uffd {
    fd: OwnedFd,
}

fn ioctl(fd: RawFd, req: u64, arg: *mut libc::c_void) -> io::Result<()> {
    // SAFETY: `arg` points to a live, correctly sized `#[repr(C)]` argument of `req`.
    let rc = unsafe { libc::ioctl(fd, req as libc::c_ulong, arg) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Uffd {
    /// Opens a non-blocking, close-on-exec userfaultfd that also sees kernel (KVM) faults,
    /// with write-protect fault reporting and thread ids enabled.
    pub fn new() -> io::Result<Uffd> {
        let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
        let fd = match OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/userfaultfd")
        {
            Ok(dev) => {
                // SAFETY: USERFAULTFD_IOC_NEW takes the open flags as its integer argument.
                let fd = unsafe {
                    libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as libc::c_ulong, flags)
                };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                fd
            }
            Err(_) => {
                // SAFETY: plain syscall with an integer flags argument (no UFFD_USER_MODE_ONLY).
                let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                fd as RawFd
            }
        };
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut api = ApiArg {
            api: UFFD_API,
            features: FEATURE_PAGEFAULT_FLAG_WP | FEATURE_THREAD_ID,
            ioctls: 0,
        };
        ioctl(fd.as_raw_fd(), UFFDIO_API, (&mut api as *mut ApiArg).cast())?;
        Ok(Uffd { fd })
    }

    /// Registers `[start, start+len)` with `mode` (`REGISTER_MISSING | REGISTER_WP`).
    pub fn register(&self, start: u64, len: u64, mode: u64) -> io::Result<()> {
        let mut arg = RegisterArg {
            range: Range { start, len },
            mode,
            ioctls: 0,
        };
        ioctl(
            self.fd.as_raw_fd(),
            UFFDIO_REGISTER,
            (&mut arg as *mut RegisterArg).cast(),
        )
    }

    /// Unregisters a range.
    pub fn unregister(&self, start: u64, len: u64) -> io::Result<()> {
        let mut arg = Range { start, len };
        ioctl(
            self.fd.as_raw_fd(),
            UFFDIO_UNREGISTER,
            (&mut arg as *mut Range).cast(),
        )
    }

    /// Wakes threads blocked on faults in `[start, start+len)`.
    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        let mut arg = Range { start, len };
        ioctl(
            self.fd.as_raw_fd(),
            UFFDIO_WAKE,
            (&mut arg as *mut Range).cast(),
        )
    }

    /// Atomically installs a copy of `src` at `dst` (`len` bytes), write-protected so that a
    /// later write still faults, and wakes the waiters.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes.
    pub unsafe fn copy_wp(&self, src: *const u8, dst: u64, len: u64) -> io::Result<()> {
        let mut arg = CopyArg {
            dst,
            src: src as u64,
            len,
            mode: COPY_MODE_WP & !COPY_MODE_DONTWAKE,
            copy: 0,
        };
        ioctl(
            self.fd.as_raw_fd(),
            UFFDIO_COPY,
            (&mut arg as *mut CopyArg).cast(),
        )
    }

    /// Reads one pending message, or `None` if none is queued.
    pub fn read_msg(&self) -> io::Result<Option<Msg>> {
        let mut msg = Msg::default();
        // SAFETY: reading at most size_of::<Msg>() bytes into a plain-data struct we own.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut msg as *mut Msg).cast(),
                std::mem::size_of::<Msg>(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(msg))
    }

    /// The raw descriptor (for poll).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<Msg>(), 32);
        assert_eq!(std::mem::size_of::<CopyArg>(), 40);
        assert_eq!(std::mem::size_of::<RegisterArg>(), 32);
        // Values from linux/userfaultfd.h (x86-64).
        assert_eq!(UFFDIO_API, 0xc018_aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020_aa00);
        assert_eq!(UFFDIO_COPY, 0xc028_aa03);
        assert_eq!(UFFDIO_WAKE, 0x8010_aa02);
    }
}
