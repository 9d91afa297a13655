//! A small userfaultfd binding written against the stable kernel UAPI
//! (`linux/userfaultfd.h`, x86-64) with `libc` only.
//!
//! The `userfaultfd` crate's `-sys` part runs bindgen at build time (needs libclang); these
//! few definitions avoid that build dependency. The descriptor is created through
//! `/dev/userfaultfd` (or the syscall) **without** `UFFD_USER_MODE_ONLY`, so faults KVM
//! raises on behalf of a vCPU are delivered too (see the project's memory notes).
//!
//! Every resolving call (`copy`, `zeropage`, `continue_minor`) reports a page another
//! thread already resolved as [`Resolved::Exists`] rather than an error: the caller then
//! only has to wake the waiters.

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
const UFFDIO_ZEROPAGE: u64 = ioc(IOC_WRITE_READ, 0x04, 32);
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_WRITE_READ, 0x06, 24);
const UFFDIO_CONTINUE: u64 = ioc(IOC_WRITE_READ, 0x07, 32);
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

/// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`: write-protect faults are reported.
pub const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
/// `UFFD_FEATURE_MISSING_SHMEM`: missing faults on shmem (reported, never requested).
pub const FEATURE_MISSING_SHMEM: u64 = 1 << 5;
/// `UFFD_FEATURE_THREAD_ID`: messages carry the faulting thread's id.
pub const FEATURE_THREAD_ID: u64 = 1 << 8;
/// `UFFD_FEATURE_MINOR_SHMEM`: minor faults on shmem.
pub const FEATURE_MINOR_SHMEM: u64 = 1 << 10;

/// `UFFDIO_REGISTER_MODE_MISSING`.
pub const REGISTER_MISSING: u64 = 1;
/// `UFFDIO_REGISTER_MODE_WP`.
pub const REGISTER_WP: u64 = 2;
/// `UFFDIO_REGISTER_MODE_MINOR`.
pub const REGISTER_MINOR: u64 = 4;

const MODE_DONTWAKE: u64 = 1;
const COPY_MODE_WP: u64 = 2;

/// `UFFD_EVENT_PAGEFAULT`.
pub const EVENT_PAGEFAULT: u8 = 0x12;
/// `UFFD_PAGEFAULT_FLAG_WRITE`.
pub const FLAG_WRITE: u64 = 1;
/// `UFFD_PAGEFAULT_FLAG_WP`.
pub const FLAG_WP: u64 = 2;
/// `UFFD_PAGEFAULT_FLAG_MINOR`.
pub const FLAG_MINOR: u64 = 4;

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

/// `struct uffdio_zeropage` and `struct uffdio_continue` share this layout.
#[repr(C)]
struct RangeModeArg {
    range: Range,
    mode: u64,
    result: i64,
}

#[repr(C)]
struct WriteProtectArg {
    range: Range,
    mode: u64,
}

/// One fault message (`struct uffd_msg`, page-fault flavour).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
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

/// What a resolving call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// This many bytes were filled from the start of the range.
    Filled(u64),
    /// The first page of the range was already present (another thread or path resolved
    /// it): nothing was filled; wake the waiters.
    Exists,
}

/// An open userfaultfd descriptor.
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
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

/// Turns a resolving ioctl's outcome (`rc`, the count it wrote back) into a [`Resolved`].
fn resolved(rc: io::Result<()>, count: i64, len: u64) -> io::Result<Resolved> {
    match rc {
        Ok(()) => Ok(Resolved::Filled(if count > 0 { count as u64 } else { len })),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            if count > 0 {
                Ok(Resolved::Filled(count as u64))
            } else {
                Ok(Resolved::Exists)
            }
        }
        // A partial fill interrupted by something else reports the bytes done.
        Err(_) if count > 0 => Ok(Resolved::Filled(count as u64)),
        Err(e) => Err(e),
    }
}

impl Uffd {
    /// Opens a non-blocking, close-on-exec userfaultfd that also sees kernel (KVM) faults
    /// and asks for `features` (`FEATURE_*`). Features the kernel lacks make this fail
    /// with the kernel's error (`EINVAL`).
    pub fn new(features: u64) -> io::Result<Uffd> {
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
            features,
            ioctls: 0,
        };
        ioctl(fd.as_raw_fd(), UFFDIO_API, (&mut api as *mut ApiArg).cast())?;
        Ok(Uffd {
            fd,
            features: api.features,
        })
    }

    /// The features the kernel reported as available.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Registers `[start, start+len)` with `mode` (`REGISTER_*` bits).
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

    /// Atomically installs a copy of `src` at `dst` (`len` bytes, page multiples),
    /// write-protected if `wp` (a later write still faults), waking the waiters if `wake`.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes.
    pub unsafe fn copy(
        &self,
        src: *const u8,
        dst: u64,
        len: u64,
        wp: bool,
        wake: bool,
    ) -> io::Result<Resolved> {
        let mut arg = CopyArg {
            dst,
            src: src as u64,
            len,
            mode: if wp { COPY_MODE_WP } else { 0 } | if wake { 0 } else { MODE_DONTWAKE },
            copy: 0,
        };
        let rc = ioctl(
            self.fd.as_raw_fd(),
            UFFDIO_COPY,
            (&mut arg as *mut CopyArg).cast(),
        );
        resolved(rc, arg.copy, len)
    }

    /// Installs a copy of `src` write-protected and wakes the waiters (pmem's read
    /// faults).
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes.
    pub unsafe fn copy_wp(&self, src: *const u8, dst: u64, len: u64) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.copy(src, dst, len, true, true) }.map(|_| ())
    }

    /// Fills `[dst, dst+len)` with zero pages (shmem: allocated, zeroed pages).
    pub fn zeropage(&self, dst: u64, len: u64, wake: bool) -> io::Result<Resolved> {
        let mut arg = RangeModeArg {
            range: Range { start: dst, len },
            mode: if wake { 0 } else { MODE_DONTWAKE },
            result: 0,
        };
        let rc = ioctl(
            self.fd.as_raw_fd(),
            UFFDIO_ZEROPAGE,
            (&mut arg as *mut RangeModeArg).cast(),
        );
        resolved(rc, arg.result, len)
    }

    /// Resolves minor faults in `[start, start+len)` by mapping the pages the file
    /// already holds (`UFFDIO_CONTINUE`). A page the file does not hold fails with
    /// `EFAULT`.
    pub fn continue_minor(&self, start: u64, len: u64, wake: bool) -> io::Result<Resolved> {
        let mut arg = RangeModeArg {
            range: Range { start, len },
            mode: if wake { 0 } else { MODE_DONTWAKE },
            result: 0,
        };
        let rc = ioctl(
            self.fd.as_raw_fd(),
            UFFDIO_CONTINUE,
            (&mut arg as *mut RangeModeArg).cast(),
        );
        resolved(rc, arg.result, len)
    }

    /// Sets (`protect`) or clears write protection on `[start, start+len)`; clearing
    /// wakes the waiters.
    pub fn write_protect(&self, start: u64, len: u64, protect: bool) -> io::Result<()> {
        let mut arg = WriteProtectArg {
            range: Range { start, len },
            mode: u64::from(protect),
        };
        ioctl(
            self.fd.as_raw_fd(),
            UFFDIO_WRITEPROTECT,
            (&mut arg as *mut WriteProtectArg).cast(),
        )
    }

    /// Reads one pending message, or `None` if none is queued.
    pub fn read_msg(&self) -> io::Result<Option<Msg>> {
        let mut msg = [Msg::default()];
        Ok((self.read_msgs(&mut msg)? == 1).then_some(msg[0]))
    }

    /// Reads the pending messages into `msgs`, as many as fit, in one system call; how
    /// many (0 if none is queued). The kernel hands over what is queued at the time, so
    /// fewer than `msgs.len()` means the queue was empty then: no second call is needed
    /// to find that out.
    pub fn read_msgs(&self, msgs: &mut [Msg]) -> io::Result<usize> {
        // SAFETY: reading at most size_of_val(msgs) bytes into plain-data structs we own.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr().cast(),
                std::mem::size_of_val(msgs),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        Ok(n as usize / std::mem::size_of::<Msg>())
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
    fn layouts_and_request_numbers_match_the_kernel() {
        assert_eq!(std::mem::size_of::<Msg>(), 32);
        assert_eq!(std::mem::size_of::<CopyArg>(), 40);
        assert_eq!(std::mem::size_of::<RegisterArg>(), 32);
        assert_eq!(std::mem::size_of::<RangeModeArg>(), 32);
        // Values from linux/userfaultfd.h (x86-64).
        assert_eq!(UFFDIO_API, 0xc018_aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020_aa00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_aa01);
        assert_eq!(UFFDIO_COPY, 0xc028_aa03);
        assert_eq!(UFFDIO_ZEROPAGE, 0xc020_aa04);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xc018_aa06);
        assert_eq!(UFFDIO_CONTINUE, 0xc020_aa07);
        assert_eq!(UFFDIO_WAKE, 0x8010_aa02);
    }

    /// The scheduler state of thread `tid` of this process (`/proc/self/task/TID/stat`).
    fn thread_state(tid: i32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    #[test]
    fn read_msgs_takes_every_queued_fault_in_one_call() {
        use std::sync::atomic::{AtomicI32, Ordering};
        use std::sync::Arc;
        const N: usize = 3;
        let uffd = Uffd::new(0).expect("userfaultfd (root or vm.unprivileged_userfaultfd=1)");
        let len = N * 4096;
        // SAFETY: a fresh anonymous private mapping, unmapped at the end of the test.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let start = base as u64;
        uffd.register(start, len as u64, REGISTER_MISSING).unwrap();
        assert_eq!(uffd.read_msgs(&mut [Msg::default(); 8]).unwrap(), 0);
        let tids: Arc<Vec<AtomicI32>> = Arc::new((0..N).map(|_| AtomicI32::new(0)).collect());
        let threads: Vec<_> = (0..N)
            .map(|i| {
                let tids = tids.clone();
                std::thread::spawn(move || {
                    // SAFETY: gettid has no arguments.
                    tids[i].store(unsafe { libc::gettid() }, Ordering::SeqCst);
                    let p = (start + i as u64 * 4096) as *const u8;
                    // SAFETY: inside the mapping; blocks until the test resolves the fault.
                    unsafe { std::ptr::read_volatile(p) }
                })
            })
            .collect();
        // Every thread is asleep in its fault: all three messages are queued.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !tids.iter().all(|t| {
            let tid = t.load(Ordering::SeqCst);
            tid != 0 && thread_state(tid) == Some('S')
        }) {
            assert!(
                std::time::Instant::now() < deadline,
                "threads never faulted"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut msgs = [Msg::default(); 8];
        let n = uffd.read_msgs(&mut msgs).unwrap();
        assert_eq!(n, N, "one read took {n} of the {N} queued messages");
        let mut pages: Vec<u64> = msgs[..n]
            .iter()
            .map(|m| (m.address - start) / 4096)
            .collect();
        pages.sort_unstable();
        assert_eq!(pages, (0..N as u64).collect::<Vec<_>>());
        assert!(msgs[..n].iter().all(|m| m.event == EVENT_PAGEFAULT));
        // None is left after.
        assert_eq!(uffd.read_msgs(&mut [Msg::default(); 8]).unwrap(), 0);
        assert_eq!(
            uffd.zeropage(start, len as u64, true).unwrap(),
            Resolved::Filled(len as u64)
        );
        for t in threads {
            assert_eq!(t.join().unwrap(), 0);
        }
        // SAFETY: the mapping made above; no thread uses it any more.
        unsafe { libc::munmap(base, len) };
    }

    #[test]
    fn resolved_maps_eexist_and_partial_fills() {
        assert_eq!(resolved(Ok(()), 0, 4096).unwrap(), Resolved::Filled(4096));
        let eexist = || Err(io::Error::from_raw_os_error(libc::EEXIST));
        assert_eq!(resolved(eexist(), -17, 8192).unwrap(), Resolved::Exists);
        assert_eq!(
            resolved(eexist(), 4096, 8192).unwrap(),
            Resolved::Filled(4096)
        );
        assert!(resolved(Err(io::Error::from_raw_os_error(libc::EFAULT)), -14, 4096).is_err());
    }
}
