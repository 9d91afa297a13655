//! Operations on open fids: open/create, read/write, readdir, fsync, locks
//! and extended attributes.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use crate::fid::{Fid, FidKind, Node, XattrWrite};
use crate::message::{kind, LockArgs};
use crate::ops::entry_name;
use crate::server::{OpResult, Session};
use crate::sys::{self, Errno};
use crate::wire::Writer;

/// Largest xattr value or name list (Linux XATTR_SIZE_MAX).
pub const XATTR_MAX: usize = 65536;

/// 9P2000.L open flags (Linux generic values) → host open flags.
pub fn open_flags(p9: u32) -> i32 {
    const TABLE: &[(u32, i32)] = &[
        (0o100, libc::O_CREAT),
        (0o200, libc::O_EXCL),
        (0o1000, libc::O_TRUNC),
        (0o2000, libc::O_APPEND),
        (0o4000, libc::O_NONBLOCK),
        (0o10000, libc::O_DSYNC),
        (0o200000, libc::O_DIRECTORY),
        (0o1000000, libc::O_NOATIME),
        (0o4000000, libc::O_SYNC),
    ];
    let acc = match p9 & 3 {
        1 => libc::O_WRONLY,
        2 => libc::O_RDWR,
        _ => libc::O_RDONLY,
    };
    TABLE
        .iter()
        .filter(|(p, _)| p9 & p != 0)
        .fold(acc, |f, (_, h)| f | h)
}

fn writes(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_TRUNC | libc::O_CREAT) != 0
}

impl Session {
    pub(crate) fn lopen(
        &self,
        tag: u16,
        fid: u32,
        flags: u32,
        out: &mut Vec<u8>,
        nowait: bool,
    ) -> OpResult {
        let f = self.fid(fid)?;
        if !matches!(f.kind, FidKind::Path) {
            return Err(Errno(libc::EINVAL));
        }
        let flags = open_flags(flags) & !(libc::O_CREAT | libc::O_EXCL);
        if self.server.cfg.readonly && writes(flags) {
            return Err(Errno(libc::EROFS));
        }
        // Opening for writing may touch the disk (quota, truncation): a worker does it.
        if nowait && writes(flags) {
            return Err(sys::WOULD_BLOCK);
        }
        let node = &f.node;
        let kind = match node.ftype {
            libc::S_IFDIR => {
                let fd = self
                    .server
                    .reopen(node.fd.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
                FidKind::Dir { fd: Mutex::new(fd) }
            }
            libc::S_IFREG => FidKind::File {
                fd: Arc::new(self.server.reopen(node.fd.as_fd(), flags)?),
            },
            // Symlinks are resolved by the client; device nodes, FIFOs and
            // sockets are never opened on the host.
            libc::S_IFLNK => return Err(Errno(libc::ELOOP)),
            _ => return Err(Errno(libc::EPERM)),
        };
        let qid = node.qid;
        self.fids.replace(
            fid,
            Fid {
                node: node.clone(),
                kind,
                uid: f.uid,
            },
        );
        open_reply(out, kind::TLOPEN + 1, tag, qid);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lcreate(
        &self,
        tag: u16,
        fid: u32,
        name: &[u8],
        flags: u32,
        mode: u32,
        gid: u32,
        out: &mut Vec<u8>,
    ) -> OpResult {
        let d = self.fid(fid)?;
        if d.node.ftype != libc::S_IFDIR || !matches!(d.kind, FidKind::Path) {
            return Err(Errno(libc::ENOTDIR));
        }
        let cname = entry_name(name)?;
        let flags = (open_flags(flags) & !libc::O_DIRECTORY) | libc::O_CREAT | libc::O_NOFOLLOW;
        let fd = sys::open_beneath(d.node.fd.as_fd(), &cname, flags, mode)?;
        self.chown_new(fd.as_fd(), d.uid, gid);
        let st = sys::fstat(fd.as_fd())?;
        let fd = Arc::new(fd);
        let qid = self.server.qids.qid(&st);
        let node = Arc::new(Node {
            fd: fd.clone(),
            parent: Some(d.node.clone()),
            name: cname,
            qid,
            ftype: st.st_mode & libc::S_IFMT,
        });
        self.fids.replace(
            fid,
            Fid {
                node,
                kind: FidKind::File { fd },
                uid: d.uid,
            },
        );
        open_reply(out, kind::TLCREATE + 1, tag, qid);
        Ok(())
    }

    pub(crate) fn read(
        &self,
        tag: u16,
        fid: u32,
        offset: u64,
        count: u32,
        out: &mut Vec<u8>,
        nowait: bool,
    ) -> OpResult {
        let f = self.fid(fid)?;
        let count = count.min(self.max_io()) as usize;
        let start = out.len();
        let mut w = Writer::begin(out, kind::TREAD + 1, tag);
        w.u32(0);
        let n = match &f.kind {
            FidKind::File { fd } if nowait => {
                sys::pread_into_nowait(fd.as_fd(), w.buffer(), count, offset)?
            }
            FidKind::File { fd } => sys::pread_into(fd.as_fd(), w.buffer(), count, offset)?,
            FidKind::XattrRead { data } => {
                let from = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                let chunk = &data[from..(from + count).min(data.len())];
                w.raw(chunk);
                chunk.len()
            }
            FidKind::Dir { .. } => return Err(Errno(libc::EISDIR)),
            _ => return Err(Errno(libc::EBADF)),
        };
        w.finish();
        out[start + 7..start + 11].copy_from_slice(&(n as u32).to_le_bytes());
        Ok(())
    }

    pub(crate) fn write(
        &self,
        tag: u16,
        fid: u32,
        offset: u64,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> OpResult {
        let f = self.fid(fid)?;
        let n = match &f.kind {
            FidKind::File { fd } => sys::pwrite(fd.as_fd(), data, offset)?,
            FidKind::XattrWrite(x) => {
                let at = usize::try_from(offset).map_err(|_| Errno(libc::ENOSPC))?;
                let end = at
                    .checked_add(data.len())
                    .filter(|&e| e <= x.size)
                    .ok_or(Errno(libc::ENOSPC))?;
                let mut v = x.value.lock().unwrap_or_else(|p| p.into_inner());
                if v.len() < end {
                    v.resize(end, 0);
                }
                v[at..end].copy_from_slice(data);
                data.len()
            }
            _ => return Err(Errno(libc::EBADF)),
        };
        Writer::begin(out, kind::TWRITE + 1, tag)
            .u32(n as u32)
            .finish();
        Ok(())
    }

    pub(crate) fn readdir(
        &self,
        tag: u16,
        fid: u32,
        offset: u64,
        count: u32,
        out: &mut Vec<u8>,
    ) -> OpResult {
        let f = self.fid(fid)?;
        let FidKind::Dir { fd } = &f.kind else {
            return Err(Errno(libc::ENOTDIR));
        };
        let count = count.min(self.max_io()) as usize;
        let dev = f.node.fd.as_fd();
        let dir_dev = sys::fstat(dev)?.st_dev;
        let mut raw = vec![0u8; count.clamp(512, 64 * 1024)];
        let start = out.len();
        let mut w = Writer::begin(out, kind::TREADDIR + 1, tag);
        w.u32(0);
        let body_start = w.len();
        {
            let fd = fd.lock().unwrap_or_else(|p| p.into_inner());
            sys::seek(fd.as_fd(), offset)?;
            'fill: loop {
                let n = sys::getdents(fd.as_fd(), &mut raw)?;
                if n == 0 {
                    break;
                }
                let mut pos = 0;
                while pos + 19 <= n {
                    let rec = &raw[pos..n];
                    let ino = u64::from_ne_bytes(rec[0..8].try_into().unwrap_or_default());
                    let off = u64::from_ne_bytes(rec[8..16].try_into().unwrap_or_default());
                    let reclen = u16::from_ne_bytes([rec[16], rec[17]]) as usize;
                    let dtype = rec[18];
                    if reclen < 19 || reclen > rec.len() {
                        return Err(Errno(libc::EIO));
                    }
                    let name = &rec[19..reclen];
                    let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                    let entry_len = 13 + 8 + 1 + 2 + name.len();
                    if w.len() - body_start + entry_len > count {
                        // Leave the rest for the next Treaddir (it seeks to `off`).
                        break 'fill;
                    }
                    let qkind = match dtype {
                        libc::DT_DIR => crate::fid::QT_DIR,
                        libc::DT_LNK => crate::fid::QT_SYMLINK,
                        _ => crate::fid::QT_FILE,
                    };
                    let qid = crate::message::Qid {
                        kind: qkind,
                        version: 0,
                        path: self.server.qids.path(dir_dev, ino),
                    };
                    qid.encode(&mut w);
                    w.u64(off).u8(dtype).string(name);
                    pos += reclen;
                }
            }
        }
        let used = (w.len() - body_start) as u32;
        w.finish();
        out[start + 7..start + 11].copy_from_slice(&used.to_le_bytes());
        Ok(())
    }

    pub(crate) fn fsync(&self, tag: u16, fid: u32, datasync: bool, out: &mut Vec<u8>) -> OpResult {
        let f = self.fid(fid)?;
        match &f.kind {
            FidKind::File { fd } => sys::fsync(fd.as_fd(), datasync)?,
            FidKind::Dir { fd } => {
                let fd = fd.lock().unwrap_or_else(|p| p.into_inner());
                sys::fsync(fd.as_fd(), datasync)?
            }
            _ => return Err(Errno(libc::EBADF)),
        }
        Self::reply_empty(out, kind::TFSYNC + 1, tag);
        Ok(())
    }

    fn flock(args: &LockArgs<'_>) -> Result<libc::flock64, Errno> {
        // SAFETY: flock64 is plain data; zero is a valid value.
        let mut fl: libc::flock64 = unsafe { std::mem::zeroed() };
        fl.l_type = match args.lock_type {
            0 => libc::F_RDLCK,
            1 => libc::F_WRLCK,
            2 => libc::F_UNLCK,
            _ => return Err(Errno(libc::EINVAL)),
        } as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = i64::try_from(args.start).map_err(|_| Errno(libc::EINVAL))?;
        fl.l_len = i64::try_from(args.length).unwrap_or(0);
        Ok(fl)
    }

    /// The open file of `fid` and the `struct flock` for a lock request on it.
    fn lock_target(
        &self,
        fid: u32,
        args: &LockArgs<'_>,
    ) -> Result<(Arc<std::os::fd::OwnedFd>, libc::flock64), Errno> {
        let f = self.fid(fid)?;
        let fd = match &f.kind {
            FidKind::File { fd } => fd.clone(),
            _ => return Err(Errno(libc::EBADF)),
        };
        Ok((fd, Self::flock(args)?))
    }

    pub(crate) fn lock(
        &self,
        tag: u16,
        fid: u32,
        args: &LockArgs<'_>,
        out: &mut Vec<u8>,
    ) -> OpResult {
        let (fd, mut fl) = self.lock_target(fid, args)?;
        // OFD locks belong to the open file description, i.e. to this fid.
        let status: u8 = match sys::ofd_lock(fd.as_fd(), libc::F_OFD_SETLK, &mut fl) {
            Ok(()) => 0,
            Err(Errno(libc::EAGAIN)) | Err(Errno(libc::EACCES)) => 1,
            Err(_) => 2,
        };
        Writer::begin(out, kind::TLOCK + 1, tag).u8(status).finish();
        Ok(())
    }

    pub(crate) fn getlock(
        &self,
        tag: u16,
        fid: u32,
        args: &LockArgs<'_>,
        out: &mut Vec<u8>,
    ) -> OpResult {
        let (fd, mut fl) = self.lock_target(fid, args)?;
        sys::ofd_lock(fd.as_fd(), libc::F_OFD_GETLK, &mut fl)?;
        let (ltype, start, len) = if fl.l_type == libc::F_UNLCK as i16 {
            (2u8, args.start, args.length)
        } else {
            (
                if fl.l_type == libc::F_RDLCK as i16 {
                    0
                } else {
                    1
                },
                fl.l_start as u64,
                fl.l_len as u64,
            )
        };
        let mut w = Writer::begin(out, kind::TGETLOCK + 1, tag);
        w.u8(ltype)
            .u64(start)
            .u64(len)
            .u32(args.proc_id)
            .string(args.client_id);
        w.finish();
        Ok(())
    }

    pub(crate) fn xattrwalk(
        &self,
        tag: u16,
        fid: u32,
        newfid: u32,
        name: &[u8],
        out: &mut Vec<u8>,
    ) -> OpResult {
        let f = self.fid(fid)?;
        if self.fids.contains(newfid) && newfid != fid {
            return Err(Errno(libc::EBADF));
        }
        let path = self.server.proc_path(f.node.fd.as_fd());
        let cname = sys::cstr(name)?;
        let fetch = |buf: &mut [u8]| {
            if name.is_empty() {
                sys::listxattr(&path, buf)
            } else {
                sys::getxattr(&path, &cname, buf)
            }
        };
        let mut data = Vec::new();
        for _ in 0..4 {
            let size = fetch(&mut [])?.min(XATTR_MAX);
            data.resize(size, 0);
            match fetch(&mut data) {
                Ok(n) => {
                    data.truncate(n);
                    break;
                }
                Err(Errno(libc::ERANGE)) => continue,
                Err(e) => return Err(e),
            }
        }
        let size = data.len() as u64;
        let newf = Fid {
            node: f.node.clone(),
            kind: FidKind::XattrRead { data },
            uid: f.uid,
        };
        if newfid == fid {
            self.fids.replace(fid, newf);
        } else {
            self.insert_fid(newfid, newf)?;
        }
        Writer::begin(out, kind::TXATTRWALK + 1, tag)
            .u64(size)
            .finish();
        Ok(())
    }

    pub(crate) fn xattrcreate(
        &self,
        tag: u16,
        fid: u32,
        name: &[u8],
        size: u64,
        flags: u32,
        out: &mut Vec<u8>,
    ) -> OpResult {
        let f = self.fid(fid)?;
        if name.is_empty() || flags & !3 != 0 {
            return Err(Errno(libc::EINVAL));
        }
        let size = usize::try_from(size)
            .ok()
            .filter(|&s| s <= XATTR_MAX)
            .ok_or(Errno(libc::E2BIG))?;
        let x = XattrWrite {
            name: sys::cstr(name)?,
            flags: flags as i32,
            size,
            value: Mutex::new(Vec::with_capacity(size)),
        };
        self.fids.replace(
            fid,
            Fid {
                node: f.node.clone(),
                kind: FidKind::XattrWrite(x),
                uid: f.uid,
            },
        );
        Self::reply_empty(out, kind::TXATTRCREATE + 1, tag);
        Ok(())
    }

    /// Work done when a fid goes away: a pending xattr write is applied.
    pub(crate) fn finish_fid(&self, f: &Fid) -> OpResult {
        let FidKind::XattrWrite(x) = &f.kind else {
            return Ok(());
        };
        let value = x.value.lock().unwrap_or_else(|p| p.into_inner());
        if value.len() != x.size {
            return Err(Errno(libc::EINVAL));
        }
        let path: CString = self.server.proc_path(f.node.fd.as_fd());
        if x.size == 0 {
            sys::removexattr(&path, &x.name)
        } else {
            sys::setxattr(&path, &x.name, &value, x.flags)
        }
    }
}

/// Rlopen / Rlcreate: the opened file's qid and an iounit of 0 (the client uses msize).
fn open_reply(out: &mut Vec<u8>, reply: u8, tag: u16, qid: crate::message::Qid) {
    let mut w = Writer::begin(out, reply, tag);
    qid.encode(&mut w);
    w.u32(0);
    w.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_flags_translate() {
        assert_eq!(open_flags(0), libc::O_RDONLY);
        assert_eq!(open_flags(2 | 0o1000), libc::O_RDWR | libc::O_TRUNC);
        assert_eq!(
            open_flags(1 | 0o2000 | 0o100),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT
        );
        assert!(writes(open_flags(1)) && !writes(open_flags(0)));
    }
}
