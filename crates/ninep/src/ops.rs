//! Namespace operations: walk, create, link, rename, remove, attributes.
//!
//! All of them are relative to descriptors held by nodes; client names are
//! single path components resolved with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)`, so neither `..`, absolute symlinks nor renames
//! racing with a lookup can leave the export.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::fid::{Fid, FidKind, Node};
use crate::message::{kind, Qid, SetAttr};
use crate::server::{OpResult, Session};
use crate::sys::{self, Errno, SysResult};
use crate::wire::Writer;

/// Getattr mask bit set we always fill (P9_GETATTR_BASIC).
const GETATTR_BASIC: u64 = 0x7ff;

/// Setattr `valid` bits.
mod setattr {
    pub const MODE: u32 = 0x1;
    pub const UID: u32 = 0x2;
    pub const GID: u32 = 0x4;
    pub const SIZE: u32 = 0x8;
    pub const ATIME: u32 = 0x10;
    pub const MTIME: u32 = 0x20;
    pub const ATIME_SET: u32 = 0x80;
    pub const MTIME_SET: u32 = 0x100;
}

/// Unlinkat flag asking to remove a directory.
const P9_AT_REMOVEDIR: u32 = 0x200;

/// Validates a name for a new directory entry: one component, not `.`/`..`.
pub(crate) fn entry_name(name: &[u8]) -> SysResult<CString> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(Errno(libc::EINVAL));
    }
    sys::cstr(name)
}

impl Session {
    /// Looks one component up beneath `dir`.
    pub(crate) fn lookup(&self, dir: &Arc<Node>, name: &[u8]) -> SysResult<Arc<Node>> {
        self.lookup_mode(dir, name, false)
    }

    /// [`Session::lookup`]; with `nowait`, only from the dentry cache (else
    /// [`sys::WOULD_BLOCK`]).
    fn lookup_mode(&self, dir: &Arc<Node>, name: &[u8], nowait: bool) -> SysResult<Arc<Node>> {
        match name {
            b"." => return Ok(dir.clone()),
            b".." => {
                let up = dir.parent.clone().unwrap_or_else(|| dir.clone());
                return Ok(up);
            }
            _ => {}
        }
        let cname = entry_name(name)?;
        // A cached directory node is checked with one fstatat (the held
        // descriptor pins its dentry, so that lookup finds it in memory).
        if let Some(node) = self.server.dirs.get(dir, &cname) {
            return Ok(node);
        }
        let flags = libc::O_PATH | libc::O_NOFOLLOW;
        let fd = if nowait {
            sys::open_beneath_cached(dir.fd.as_fd(), &cname, flags)?
        } else {
            sys::open_beneath(dir.fd.as_fd(), &cname, flags, 0)?
        };
        let node = self.node_from_fd(dir, cname, fd)?;
        self.server.dirs.insert(&node);
        Ok(node)
    }

    /// Builds a node from a descriptor of an entry of `dir`.
    fn node_from_fd(&self, dir: &Arc<Node>, name: CString, fd: OwnedFd) -> SysResult<Arc<Node>> {
        let st = sys::fstat(fd.as_fd())?;
        Ok(Arc::new(Node {
            fd: Arc::new(fd),
            parent: Some(dir.clone()),
            name,
            qid: self.server.qids.qid(&st),
            ftype: st.st_mode & libc::S_IFMT,
        }))
    }

    /// Opens a just-created entry by name (O_PATH) and gives it to its owner.
    fn created(&self, dir: &Arc<Node>, name: CString, uid: u32, gid: u32) -> SysResult<Arc<Node>> {
        let fd = sys::open_beneath(dir.fd.as_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        self.chown_new(fd.as_fd(), uid, gid);
        self.node_from_fd(dir, name, fd)
    }

    /// Sets the owner of a new file to the mapped guest ids (when root).
    pub(crate) fn chown_new(&self, fd: BorrowedFd<'_>, uid: u32, gid: u32) {
        if !self.server.chown_new {
            return;
        }
        let cfg = &self.server.cfg;
        let (huid, hgid) = (cfg.uid_map.to_host(uid), cfg.gid_map.to_host(gid));
        if let Err(e) = sys::fchown(fd, huid, hgid) {
            tracing::debug!(error = %e, huid, hgid, "chown of a new file failed");
        }
    }

    /// A fid that must be a directory node.
    fn dir_fid(&self, fid: u32) -> Result<Arc<Fid>, Errno> {
        let f = self.fid(fid)?;
        if f.node.qid.kind & crate::fid::QT_DIR == 0 {
            return Err(Errno(libc::ENOTDIR));
        }
        Ok(f)
    }

    pub(crate) fn walk(
        &self,
        tag: u16,
        fid: u32,
        newfid: u32,
        names: &[&[u8]],
        out: &mut Vec<u8>,
        nowait: bool,
    ) -> OpResult {
        let start = self.fid(fid)?;
        if newfid != fid && self.fids.contains(newfid) {
            return Err(Errno(libc::EBADF));
        }
        let mut node = start.node.clone();
        let mut qids: Vec<Qid> = Vec::with_capacity(names.len());
        for name in names {
            match self.lookup_mode(&node, name, nowait) {
                // Nothing has changed yet: the blocking path redoes the walk.
                Err(e) if nowait && e == sys::WOULD_BLOCK => return Err(e),
                Ok(next) => {
                    qids.push(next.qid);
                    node = next;
                }
                // The first element failing is an error; later ones give a
                // partial Rwalk and leave newfid unused.
                Err(e) if qids.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        if qids.len() == names.len() {
            let f = Fid {
                node,
                kind: FidKind::Path,
                uid: start.uid,
            };
            if newfid == fid {
                self.fids.replace(fid, f);
            } else {
                self.insert_fid(newfid, f)?;
            }
        }
        let mut w = Writer::begin(out, kind::TWALK + 1, tag);
        w.u16(qids.len() as u16);
        for q in &qids {
            q.encode(&mut w);
        }
        w.finish();
        Ok(())
    }

    pub(crate) fn remove(&self, tag: u16, fid: u32, out: &mut Vec<u8>) -> OpResult {
        // Tremove clunks the fid whatever the outcome.
        let f = self.fids.remove(fid).ok_or(Errno(libc::EBADF))?;
        let _ = self.finish_fid(&f);
        if let FidKind::Stale { errno } = f.kind {
            return Err(Errno(errno));
        }
        let parent = f.node.parent.as_ref().ok_or(Errno(libc::EBUSY))?;
        let flags = if f.node.qid.kind & crate::fid::QT_DIR != 0 {
            libc::AT_REMOVEDIR
        } else {
            0
        };
        sys::unlinkat(parent.fd.as_fd(), &f.node.name, flags)?;
        Self::reply_empty(out, kind::TREMOVE + 1, tag);
        Ok(())
    }

    pub(crate) fn statfs(&self, tag: u16, fid: u32, out: &mut Vec<u8>) -> OpResult {
        let f = self.fid(fid)?;
        let s = sys::fstatfs(f.node.fd.as_fd())?;
        // SAFETY: fsid_t is two i32s; reading it as bytes is sound.
        let fsid: [i32; 2] = unsafe { std::mem::transmute(s.f_fsid) };
        let fsid = (fsid[0] as u32 as u64) | ((fsid[1] as u32 as u64) << 32);
        let mut w = Writer::begin(out, kind::TSTATFS + 1, tag);
        w.u32(s.f_type as u32)
            .u32(s.f_bsize as u32)
            .u64(s.f_blocks)
            .u64(s.f_bfree)
            .u64(s.f_bavail);
        w.u64(s.f_files)
            .u64(s.f_ffree)
            .u64(fsid)
            .u32(s.f_namelen as u32);
        w.finish();
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn symlink(
        &self,
        tag: u16,
        fid: u32,
        name: &[u8],
        target: &[u8],
        gid: u32,
        out: &mut Vec<u8>,
    ) -> OpResult {
        let d = self.dir_fid(fid)?;
        let cname = entry_name(name)?;
        if target.is_empty() {
            return Err(Errno(libc::ENOENT));
        }
        sys::symlinkat(&sys::cstr(target)?, d.node.fd.as_fd(), &cname)?;
        let n = self.created(&d.node, cname, d.uid, gid)?;
        Self::reply_qid(out, kind::TSYMLINK + 1, tag, n.qid);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mknod(
        &self,
        tag: u16,
        dfid: u32,
        name: &[u8],
        mode: u32,
        dev: u64,
        gid: u32,
        out: &mut Vec<u8>,
    ) -> OpResult {
        let d = self.dir_fid(dfid)?;
        let cname = entry_name(name)?;
        // Device nodes would let a guest reach host devices through the export.
        match mode & libc::S_IFMT {
            libc::S_IFREG | libc::S_IFIFO | libc::S_IFSOCK => {}
            _ => return Err(Errno(libc::EPERM)),
        }
        sys::mknodat(
            d.node.fd.as_fd(),
            &cname,
            mode & (libc::S_IFMT | 0o7777),
            dev,
        )?;
        let n = self.created(&d.node, cname, d.uid, gid)?;
        Self::reply_qid(out, kind::TMKNOD + 1, tag, n.qid);
        Ok(())
    }

    pub(crate) fn mkdir(
        &self,
        tag: u16,
        dfid: u32,
        name: &[u8],
        mode: u32,
        gid: u32,
        out: &mut Vec<u8>,
    ) -> OpResult {
        let d = self.dir_fid(dfid)?;
        let cname = entry_name(name)?;
        sys::mkdirat(d.node.fd.as_fd(), &cname, mode)?;
        let n = self.created(&d.node, cname, d.uid, gid)?;
        Self::reply_qid(out, kind::TMKDIR + 1, tag, n.qid);
        Ok(())
    }

    pub(crate) fn link(
        &self,
        tag: u16,
        dfid: u32,
        fid: u32,
        name: &[u8],
        out: &mut Vec<u8>,
    ) -> OpResult {
        let d = self.dir_fid(dfid)?;
        let f = self.fid(fid)?;
        let cname = entry_name(name)?;
        let (proc_dir, entry) = self.server.proc_entry(f.node.fd.as_fd());
        sys::linkat(
            proc_dir,
            &entry,
            d.node.fd.as_fd(),
            &cname,
            libc::AT_SYMLINK_FOLLOW,
        )?;
        Self::reply_empty(out, kind::TLINK + 1, tag);
        Ok(())
    }

    pub(crate) fn rename(
        &self,
        tag: u16,
        fid: u32,
        dfid: u32,
        name: &[u8],
        out: &mut Vec<u8>,
    ) -> OpResult {
        let f = self.fid(fid)?;
        let d = self.dir_fid(dfid)?;
        let cname = entry_name(name)?;
        let parent = f.node.parent.as_ref().ok_or(Errno(libc::EBUSY))?;
        sys::renameat(parent.fd.as_fd(), &f.node.name, d.node.fd.as_fd(), &cname)?;
        // The fid now names the entry at its new place.
        let node = Arc::new(Node {
            fd: f.node.fd.clone(),
            parent: Some(d.node.clone()),
            name: cname,
            qid: f.node.qid,
            ftype: f.node.ftype,
        });
        let kind = match &f.kind {
            FidKind::File { fd } => FidKind::File { fd: fd.clone() },
            _ => FidKind::Path,
        };
        if matches!(f.kind, FidKind::Path | FidKind::File { .. }) {
            self.fids.replace(
                fid,
                Fid {
                    node,
                    kind,
                    uid: f.uid,
                },
            );
        }
        Self::reply_empty(out, kind::TRENAME + 1, tag);
        Ok(())
    }

    pub(crate) fn renameat(
        &self,
        tag: u16,
        olddirfid: u32,
        oldname: &[u8],
        newdirfid: u32,
        newname: &[u8],
        out: &mut Vec<u8>,
    ) -> OpResult {
        let od = self.dir_fid(olddirfid)?;
        let nd = self.dir_fid(newdirfid)?;
        let (on, nn) = (entry_name(oldname)?, entry_name(newname)?);
        sys::renameat(od.node.fd.as_fd(), &on, nd.node.fd.as_fd(), &nn)?;
        Self::reply_empty(out, kind::TRENAMEAT + 1, tag);
        Ok(())
    }

    pub(crate) fn unlinkat(
        &self,
        tag: u16,
        dirfid: u32,
        name: &[u8],
        flags: u32,
        out: &mut Vec<u8>,
    ) -> OpResult {
        let d = self.dir_fid(dirfid)?;
        let cname = entry_name(name)?;
        let at = if flags & P9_AT_REMOVEDIR != 0 {
            libc::AT_REMOVEDIR
        } else {
            0
        };
        sys::unlinkat(d.node.fd.as_fd(), &cname, at)?;
        Self::reply_empty(out, kind::TUNLINKAT + 1, tag);
        Ok(())
    }

    pub(crate) fn getattr(&self, tag: u16, fid: u32, _mask: u64, out: &mut Vec<u8>) -> OpResult {
        let f = self.fid(fid)?;
        let st = sys::fstat(f.node.fd.as_fd())?;
        let cfg = &self.server.cfg;
        let mut w = Writer::begin(out, kind::TGETATTR + 1, tag);
        w.u64(GETATTR_BASIC);
        self.server.qids.qid(&st).encode(&mut w);
        w.u32(st.st_mode)
            .u32(cfg.uid_map.to_guest(st.st_uid))
            .u32(cfg.gid_map.to_guest(st.st_gid));
        w.u64(st.st_nlink)
            .u64(st.st_rdev)
            .u64(st.st_size as u64)
            .u64(st.st_blksize as u64);
        w.u64(st.st_blocks as u64);
        w.u64(st.st_atime as u64).u64(st.st_atime_nsec as u64);
        w.u64(st.st_mtime as u64).u64(st.st_mtime_nsec as u64);
        w.u64(st.st_ctime as u64).u64(st.st_ctime_nsec as u64);
        w.u64(0).u64(0).u64(0).u64(0);
        w.finish();
        Ok(())
    }

    pub(crate) fn setattr(&self, tag: u16, fid: u32, a: &SetAttr, out: &mut Vec<u8>) -> OpResult {
        let f = self.fid(fid)?;
        let fd = f.node.fd.as_fd();
        let cfg = &self.server.cfg;
        if a.valid & setattr::MODE != 0 {
            match &f.kind {
                FidKind::File { fd } => sys::fchmod(fd.as_fd(), a.mode)?,
                _ => {
                    let (dir, entry) = self.server.proc_entry(fd);
                    // SAFETY: NUL-terminated entry name; the proc link leads to
                    // exactly the inode our descriptor holds.
                    let r = unsafe {
                        libc::fchmodat(
                            std::os::fd::AsRawFd::as_raw_fd(&dir),
                            entry.as_ptr(),
                            a.mode & 0o7777,
                            0,
                        )
                    };
                    if r < 0 {
                        return Err(Errno::last());
                    }
                }
            }
        }
        if a.valid & (setattr::UID | setattr::GID) != 0 {
            let uid = if a.valid & setattr::UID != 0 {
                cfg.uid_map.to_host(a.uid)
            } else {
                u32::MAX
            };
            let gid = if a.valid & setattr::GID != 0 {
                cfg.gid_map.to_host(a.gid)
            } else {
                u32::MAX
            };
            sys::fchown(fd, uid, gid)?;
        }
        if a.valid & setattr::SIZE != 0 {
            if f.node.qid.kind != crate::fid::QT_FILE {
                return Err(Errno(libc::EISDIR));
            }
            match &f.kind {
                FidKind::File { fd } => match sys::ftruncate(fd.as_fd(), a.size) {
                    Err(Errno(libc::EBADF)) | Err(Errno(libc::EINVAL)) => {
                        let w = self
                            .server
                            .reopen(fd.as_fd(), libc::O_WRONLY | libc::O_NONBLOCK)?;
                        sys::ftruncate(w.as_fd(), a.size)?
                    }
                    other => other?,
                },
                _ => {
                    let w = self.server.reopen(fd, libc::O_WRONLY | libc::O_NONBLOCK)?;
                    sys::ftruncate(w.as_fd(), a.size)?
                }
            }
        }
        if a.valid & (setattr::ATIME | setattr::MTIME) != 0 {
            let ts = |set: bool, explicit: bool, sec: u64, nsec: u64| match (set, explicit) {
                (false, _) => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                (true, false) => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
                (true, true) => libc::timespec {
                    tv_sec: sec as i64,
                    tv_nsec: (nsec % 1_000_000_000) as i64,
                },
            };
            let times = [
                ts(
                    a.valid & setattr::ATIME != 0,
                    a.valid & setattr::ATIME_SET != 0,
                    a.atime_sec,
                    a.atime_nsec,
                ),
                ts(
                    a.valid & setattr::MTIME != 0,
                    a.valid & setattr::MTIME_SET != 0,
                    a.mtime_sec,
                    a.mtime_nsec,
                ),
            ];
            let (dir, entry) = self.server.proc_entry(fd);
            sys::utimensat(dir, &entry, &times, 0)?;
        }
        Self::reply_empty(out, kind::TSETATTR + 1, tag);
        Ok(())
    }
}
