//! Thin safe wrappers over the fd-relative Linux system calls the server uses.
//!
//! Every path argument here is a single name or `""` relative to a directory fd;
//! nothing resolves an absolute path supplied by a client.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A Linux errno value, sent back to clients in Rlerror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's current errno.
    pub fn last() -> Errno {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Self {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

/// Result of a system call wrapper.
pub type SysResult<T> = Result<T, Errno>;

fn check(ret: libc::c_int) -> SysResult<libc::c_int> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

fn check_size(ret: isize) -> SysResult<usize> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret as usize)
    }
}

/// `openat2` resolve flag: stay beneath the directory fd.
pub const RESOLVE_BENEATH: u64 = 0x08;
/// `openat2` resolve flag: refuse /proc magic links.
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// `openat2` resolve flag: fail with EAGAIN unless the lookup is served from
/// the dentry cache (Linux 5.12).
pub const RESOLVE_CACHED: u64 = 0x20;

/// What a non-blocking attempt answers when the call would have to wait for
/// I/O (or cannot tell): the caller retries the operation where blocking is fine.
pub const WOULD_BLOCK: Errno = Errno(libc::EAGAIN);

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Turns a client name into a C string; names with NUL are invalid.
pub fn cstr(name: &[u8]) -> SysResult<CString> {
    CString::new(name).map_err(|_| Errno(libc::EINVAL))
}

/// `openat2(dir, name, flags, mode)` confined beneath `dir`, no magic links.
pub fn open_beneath(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> SysResult<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u32 as u64,
        mode: if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
            (mode & 0o7777) as u64
        } else {
            0
        },
        resolve: RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    loop {
        // SAFETY: `how` is a valid open_how of the size passed; `name` is NUL-terminated.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                name.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if ret >= 0 {
            // SAFETY: the kernel returned a fresh descriptor we now own.
            return Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) });
        }
        let e = Errno::last();
        if e.0 != libc::EAGAIN && e.0 != libc::EINTR {
            return Err(e);
        }
    }
}

/// [`open_beneath`] that never waits for I/O: the lookup must be served from
/// the dentry cache (`RESOLVE_CACHED`), else [`WOULD_BLOCK`]. Kernels without
/// `RESOLVE_CACHED` (EINVAL) also answer [`WOULD_BLOCK`], so the blocking path
/// takes over. Only for opens that create nothing and truncate nothing.
pub fn open_beneath_cached(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> SysResult<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u32 as u64,
        mode: 0,
        resolve: RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_CACHED,
    };
    // SAFETY: `how` is a valid open_how of the size passed; `name` is NUL-terminated.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if ret >= 0 {
        // SAFETY: the kernel returned a fresh descriptor we now own.
        return Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) });
    }
    match Errno::last() {
        Errno(libc::EAGAIN) | Errno(libc::EINVAL) | Errno(libc::EINTR) => Err(WOULD_BLOCK),
        e => Err(e),
    }
}

/// `openat(dir, name, flags)` for server-chosen names (e.g. `/proc/self/fd/N`).
pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> SysResult<OwnedFd> {
    // SAFETY: name is NUL-terminated; the result is checked.
    let fd =
        check(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: fresh descriptor owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(fd, "", AT_EMPTY_PATH)`: the stat of whatever `fd` refers to.
pub fn fstat(fd: BorrowedFd<'_>) -> SysResult<libc::stat> {
    // SAFETY: stat is plain old data; zeroed is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers; empty path with AT_EMPTY_PATH.
    check(unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

/// Identity of an inode as `statx` reports it: enough to tell whether a
/// name still leads to a given inode, and on which mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ident {
    /// Device (`st_dev`).
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// File type bits (`S_IFMT` part of the mode).
    pub ftype: u32,
    /// Mount id (`STATX_MNT_ID`), `None` if the kernel does not report it (< 5.8).
    pub mnt_id: Option<u64>,
}

/// `statx(dir, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT)` reduced to an
/// [`Ident`]; an empty `name` means `dir` itself (`AT_EMPTY_PATH`).
pub fn ident_at(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<Ident> {
    // SAFETY: statx is plain old data; zeroed is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let mut flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT;
    if name.is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    // SAFETY: valid pointers; `name` is NUL-terminated.
    check(unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags,
            libc::STATX_TYPE | libc::STATX_INO | libc::STATX_MNT_ID,
            &mut stx,
        )
    })?;
    Ok(Ident {
        dev: libc::makedev(stx.stx_dev_major, stx.stx_dev_minor),
        ino: stx.stx_ino,
        ftype: stx.stx_mode as u32 & libc::S_IFMT,
        mnt_id: (stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id),
    })
}

/// `fstatfs(fd)`.
pub fn fstatfs(fd: BorrowedFd<'_>) -> SysResult<libc::statfs64> {
    // SAFETY: POD, zeroed is valid.
    let mut st: libc::statfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    check(unsafe { libc::fstatfs64(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `pread(fd, buf, off)`.
pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> SysResult<usize> {
    loop {
        // SAFETY: buf is valid for writes of buf.len() bytes.
        let r = unsafe {
            libc::pread64(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                off as i64,
            )
        };
        match check_size(r) {
            Err(Errno(libc::EINTR)) => continue,
            other => return other,
        }
    }
}

/// Reads at `off` into the spare capacity of `out` (up to `count` bytes),
/// extending its length by the number of bytes read: no intermediate copy.
pub fn pread_into(
    fd: BorrowedFd<'_>,
    out: &mut Vec<u8>,
    count: usize,
    off: u64,
) -> SysResult<usize> {
    out.reserve(count);
    let spare = out.spare_capacity_mut();
    let len = count.min(spare.len());
    loop {
        // SAFETY: the spare capacity is valid for writes of `len` bytes; the
        // kernel initialises the first `n` of them, and only those are exposed.
        let r =
            unsafe { libc::pread64(fd.as_raw_fd(), spare.as_mut_ptr().cast(), len, off as i64) };
        match check_size(r) {
            Err(Errno(libc::EINTR)) => continue,
            Err(e) => return Err(e),
            Ok(n) => {
                // SAFETY: n <= len bytes were initialised by pread.
                unsafe { out.set_len(out.len() + n) };
                return Ok(n);
            }
        }
    }
}

/// [`pread_into`] that never waits for I/O (`RWF_NOWAIT`): the bytes must be
/// in the page cache, else [`WOULD_BLOCK`] and `out` is left as it was.
///
/// A page-cache read stops early only at EOF or at a folio (page-aligned)
/// boundary whose folio is missing, so a short read ending off a page boundary
/// is EOF; one ending on a boundary is checked with a second attempt, and
/// filesystems without `RWF_NOWAIT` (EOPNOTSUPP) answer [`WOULD_BLOCK`]. The
/// result is therefore always what a blocking `pread` would have returned.
pub fn pread_into_nowait(
    fd: BorrowedFd<'_>,
    out: &mut Vec<u8>,
    count: usize,
    off: u64,
) -> SysResult<usize> {
    let base = out.len();
    out.reserve(count);
    let mut done = 0usize;
    while done < count {
        let spare = out.spare_capacity_mut();
        let len = (count - done).min(spare.len());
        let iov = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: len,
        };
        let pos = off.checked_add(done as u64).ok_or(Errno(libc::EINVAL))?;
        // SAFETY: the iovec covers spare capacity valid for writes of `len`
        // bytes; the kernel initialises the first `n` of them, and only those
        // are exposed below.
        let r = unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, pos as i64, libc::RWF_NOWAIT) };
        let n = match check_size(r) {
            Ok(n) => n,
            Err(e) => {
                out.truncate(base);
                return match e.0 {
                    libc::EAGAIN | libc::EOPNOTSUPP | libc::EINVAL | libc::EINTR => {
                        Err(WOULD_BLOCK)
                    }
                    _ => Err(e),
                };
            }
        };
        // SAFETY: n <= len bytes were initialised by preadv2.
        unsafe { out.set_len(out.len() + n) };
        done += n;
        if n == 0 || (pos + n as u64) % page_size() != 0 {
            break; // EOF (or the request is complete)
        }
    }
    Ok(done)
}

/// The system page size (cached).
fn page_size() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PAGE: AtomicU64 = AtomicU64::new(0);
    match PAGE.load(Ordering::Relaxed) {
        0 => {
            // SAFETY: sysconf has no preconditions.
            let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let p = if p > 0 { p as u64 } else { 4096 };
            PAGE.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// `pwrite(fd, buf, off)`.
pub fn pwrite(fd: BorrowedFd<'_>, buf: &[u8], off: u64) -> SysResult<usize> {
    loop {
        // SAFETY: buf is valid for reads of buf.len() bytes.
        let r =
            unsafe { libc::pwrite64(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), off as i64) };
        match check_size(r) {
            Err(Errno(libc::EINTR)) => continue,
            other => return other,
        }
    }
}

/// `lseek(fd, off, SEEK_SET)`.
pub fn seek(fd: BorrowedFd<'_>, off: u64) -> SysResult<()> {
    // SAFETY: plain syscall on a valid fd.
    let r = unsafe { libc::lseek64(fd.as_raw_fd(), off as i64, libc::SEEK_SET) };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `lseek(fd, 0, SEEK_CUR)`: the current offset (a directory's readdir position).
pub fn tell(fd: BorrowedFd<'_>) -> SysResult<u64> {
    // SAFETY: plain syscall on a valid fd.
    let r = unsafe { libc::lseek64(fd.as_raw_fd(), 0, libc::SEEK_CUR) };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r as u64)
    }
}

/// `fcntl(fd, F_GETFL)`: the open file's access mode and status flags.
pub fn getfl(fd: BorrowedFd<'_>) -> SysResult<i32> {
    // SAFETY: plain syscall on a valid fd.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })
}

/// `getdents64(fd, buf)`: raw directory records.
pub fn getdents(fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    check_size(r as isize)
}

/// `readlinkat(fd, "")` of a symlink opened with O_PATH|O_NOFOLLOW.
pub fn readlink(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: buf valid for buf.len() bytes.
    let n = check_size(unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// `mkdirat`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<()> {
    // SAFETY: NUL-terminated name.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode & 0o7777) }).map(drop)
}

/// `mknodat`.
pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, dev: u64) -> SysResult<()> {
    // SAFETY: NUL-terminated name.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) }).map(drop)
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    // SAFETY: NUL-terminated strings.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// `linkat(olddir, oldname, newdir, newname, flags)`.
pub fn linkat(
    olddir: BorrowedFd<'_>,
    old: &CStr,
    newdir: BorrowedFd<'_>,
    new: &CStr,
    flags: i32,
) -> SysResult<()> {
    // SAFETY: NUL-terminated strings.
    check(unsafe {
        libc::linkat(
            olddir.as_raw_fd(),
            old.as_ptr(),
            newdir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `renameat(olddir, oldname, newdir, newname)`.
pub fn renameat(
    olddir: BorrowedFd<'_>,
    old: &CStr,
    newdir: BorrowedFd<'_>,
    new: &CStr,
) -> SysResult<()> {
    // SAFETY: NUL-terminated strings.
    check(unsafe {
        libc::renameat(
            olddir.as_raw_fd(),
            old.as_ptr(),
            newdir.as_raw_fd(),
            new.as_ptr(),
        )
    })
    .map(drop)
}

/// `unlinkat(dir, name, flags)`.
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> SysResult<()> {
    // SAFETY: NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH)`; `u32::MAX` leaves an id alone.
pub fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: empty path with AT_EMPTY_PATH.
    check(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// `fchmod(fd, mode)` on a real (non-O_PATH) fd.
pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
    // SAFETY: plain syscall.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode & 0o7777) }).map(drop)
}

/// `ftruncate(fd, size)`.
pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> SysResult<()> {
    let size = i64::try_from(size).map_err(|_| Errno(libc::EFBIG))?;
    // SAFETY: plain syscall.
    check(unsafe { libc::ftruncate64(fd.as_raw_fd(), size) }).map(drop)
}

/// `utimensat(dir, name, times, flags)`.
pub fn utimensat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    times: &[libc::timespec; 2],
    flags: i32,
) -> SysResult<()> {
    // SAFETY: valid pointers.
    check(unsafe { libc::utimensat(dir.as_raw_fd(), name.as_ptr(), times.as_ptr(), flags) })
        .map(drop)
}

/// `fsync` or `fdatasync`.
pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> SysResult<()> {
    // SAFETY: plain syscalls.
    check(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

/// `fcntl(fd, cmd, &flock)` for OFD locks.
pub fn ofd_lock(fd: BorrowedFd<'_>, cmd: i32, fl: &mut libc::flock64) -> SysResult<()> {
    // SAFETY: fl is a valid flock64.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), cmd, fl as *mut libc::flock64) }).map(drop)
}

/// `getxattr(path, name)`: the value, or its size when `buf` is empty.
pub fn getxattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: valid pointers; size 0 with a dangling-but-unused pointer is allowed.
    check_size(unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })
}

/// `listxattr(path)`: NUL-separated names, or the size when `buf` is empty.
pub fn listxattr(path: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: valid pointers.
    check_size(unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `setxattr(path, name, value, flags)`.
pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: i32) -> SysResult<()> {
    // SAFETY: valid pointers.
    check(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// `removexattr(path, name)`.
pub fn removexattr(path: &CStr, name: &CStr) -> SysResult<()> {
    // SAFETY: valid pointers.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// Raises RLIMIT_NOFILE to its hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> u64 {
    // SAFETY: POD.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 0;
    }
    rl.rlim_cur = rl.rlim_max;
    // SAFETY: valid pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) };
    rl.rlim_cur
}
