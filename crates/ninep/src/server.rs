//! The transport-agnostic core: a [`Server`] (the export) and its
//! [`Session`]s (one per client connection). A session turns one request
//! frame into exactly one response frame.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::dircache::DirCache;
use crate::fid::{Fid, FidKind, FidTable, InsertError, Node, QidMap};
use crate::idmap::IdMap;
use crate::message::{decode_request, kind, parse_header, Request, NOTAG};
use crate::sys::{self, Errno, SysResult};
use crate::wire::{DecodeError, Writer, HEADER_LEN};

/// Smallest msize a client may negotiate.
pub const MIN_MSIZE: u32 = 4096;
/// Default (and recommended) maximum msize: 1 MiB.
pub const DEFAULT_MAX_MSIZE: u32 = 1 << 20;
/// Rread/Rreaddir header: size[4] type[1] tag[2] count[4].
pub const IOHDRSZ: u32 = 11;

/// Export options.
#[derive(Debug, Clone)]
pub struct Config {
    /// Refuse every modifying operation with EROFS.
    pub readonly: bool,
    /// Guest → host uid mapping.
    pub uid_map: IdMap,
    /// Guest → host gid mapping.
    pub gid_map: IdMap,
    /// Largest msize offered in Rversion (≥ 512 KiB recommended).
    pub max_msize: u32,
    /// Largest number of fids one session may hold.
    pub max_fids: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            readonly: false,
            uid_map: IdMap::identity(),
            gid_map: IdMap::identity(),
            max_msize: DEFAULT_MAX_MSIZE,
            max_fids: 1 << 22,
        }
    }
}

/// Failure to set up an export.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The export directory cannot be opened.
    #[error("cannot open export directory {path}: {source}")]
    OpenRoot {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `/proc/self/fd` is needed to reopen O_PATH descriptors.
    #[error("cannot open /proc/self/fd (is /proc mounted?): {0}")]
    Proc(std::io::Error),
    /// The configured msize is out of range.
    #[error("max msize {0} is out of range ({MIN_MSIZE}..=16 MiB)")]
    Msize(u32),
}

/// One exported directory tree, shared by all sessions.
#[derive(Debug)]
pub struct Server {
    pub(crate) cfg: Config,
    pub(crate) root: Arc<Node>,
    proc_fd: OwnedFd,
    pub(crate) qids: QidMap,
    pub(crate) dirs: DirCache,
    pub(crate) chown_new: bool,
}

impl Server {
    /// Opens `root` as the jail of a new export.
    pub fn new(root: &Path, cfg: Config) -> Result<Arc<Server>, ServerError> {
        if cfg.max_msize < MIN_MSIZE || cfg.max_msize > 16 << 20 {
            return Err(ServerError::Msize(cfg.max_msize));
        }
        let open_err = |source| ServerError::OpenRoot {
            path: root.to_path_buf(),
            source,
        };
        let c = CString::new(root.as_os_str().as_encoded_bytes())
            .map_err(|_| open_err(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
        let cwd = std::fs::File::open(".").map_err(open_err)?;
        let fd = sys::openat(cwd.as_fd(), &c, libc::O_PATH | libc::O_DIRECTORY)
            .map_err(|e| open_err(std::io::Error::from_raw_os_error(e.0)))?;
        let st =
            sys::fstat(fd.as_fd()).map_err(|e| open_err(std::io::Error::from_raw_os_error(e.0)))?;
        let proc_fd = sys::openat(
            cwd.as_fd(),
            c"/proc/self/fd",
            libc::O_PATH | libc::O_DIRECTORY,
        )
        .map_err(|e| ServerError::Proc(std::io::Error::from_raw_os_error(e.0)))?;
        let qids = QidMap::new(st.st_dev);
        let dirs = DirCache::new(fd.as_fd());
        let root = Arc::new(Node {
            fd: Arc::new(fd),
            parent: None,
            name: CString::default(),
            qid: qids.qid(&st),
            ftype: st.st_mode & libc::S_IFMT,
        });
        // SAFETY: geteuid has no preconditions.
        let chown_new = unsafe { libc::geteuid() } == 0;
        Ok(Arc::new(Server {
            cfg,
            root,
            proc_fd,
            qids,
            dirs,
            chown_new,
        }))
    }

    /// The export options.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Starts a session (one per client connection).
    pub fn session(self: &Arc<Self>) -> Session {
        Session {
            server: self.clone(),
            fids: FidTable::new(self.cfg.max_fids),
            msize: AtomicU32::new(self.cfg.max_msize),
            version: AtomicU8::new(VERSION_NONE),
        }
    }

    /// `/proc/self/fd/N` name of a descriptor, relative to the proc fd.
    fn proc_name(fd: BorrowedFd<'_>) -> CString {
        CString::new(fd.as_raw_fd().to_string()).unwrap_or_default()
    }

    /// Opens the inode behind `fd` (an O_PATH descriptor) with `flags`.
    pub(crate) fn reopen(&self, fd: BorrowedFd<'_>, flags: i32) -> SysResult<OwnedFd> {
        sys::openat(
            self.proc_fd.as_fd(),
            &Self::proc_name(fd),
            flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW),
        )
    }

    /// Absolute `/proc/self/fd/N` path for path-only calls (xattrs).
    pub(crate) fn proc_path(&self, fd: BorrowedFd<'_>) -> CString {
        CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
    }

    /// The proc fd directory and the entry naming `fd` in it.
    pub(crate) fn proc_entry(&self, fd: BorrowedFd<'_>) -> (BorrowedFd<'_>, CString) {
        (self.proc_fd.as_fd(), Self::proc_name(fd))
    }
}

/// Outcome of handling one frame, for the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    /// Tag of the request (NOTAG when even the header was unreadable).
    pub tag: u16,
    /// Response type written.
    pub kind: u8,
}

/// One client connection's state: negotiated msize and its fids.
#[derive(Debug)]
pub struct Session {
    pub(crate) server: Arc<Server>,
    pub(crate) fids: FidTable,
    pub(crate) msize: AtomicU32,
    /// The version Rversion answered: [`VERSION_NONE`] before any Tversion.
    pub(crate) version: AtomicU8,
}

/// No Tversion yet.
pub(crate) const VERSION_NONE: u8 = 0;
/// Rversion answered `9P2000.L`.
pub(crate) const VERSION_L: u8 = 1;
/// Rversion answered `unknown`.
pub(crate) const VERSION_UNKNOWN: u8 = 2;

pub(crate) type OpResult = Result<(), Errno>;

impl Session {
    /// Negotiated message size.
    pub fn msize(&self) -> u32 {
        self.msize.load(Ordering::Relaxed)
    }

    /// Number of fids held.
    pub fn fid_count(&self) -> usize {
        self.fids.len()
    }

    /// The export.
    pub fn server(&self) -> &Arc<Server> {
        &self.server
    }

    /// Handles one complete request frame, appending exactly one response
    /// frame to `out`. Malformed frames get Rlerror; this never panics on input.
    pub fn handle(&self, frame: &[u8], out: &mut Vec<u8>) -> Handled {
        match self.serve(frame, out, false) {
            Some(h) => h,
            // Unreachable: only the non-blocking mode declines a request.
            None => {
                let tag = parse_header(frame).map(|h| h.tag).unwrap_or(NOTAG);
                Self::rlerror(out, tag, libc::EAGAIN as u32);
                Handled {
                    tag,
                    kind: kind::RLERROR,
                }
            }
        }
    }

    /// Like [`Session::handle`], but only if the request can be served without
    /// waiting for I/O: lookups served from the dentry cache, reads from the
    /// page cache, opens for reading, getattr, clunk and the session
    /// messages. Otherwise (or when a cached attempt finds it would have to
    /// wait) nothing is changed, nothing is appended, and `None` asks the
    /// caller to call [`Session::handle`] where blocking is fine (a worker).
    ///
    /// A transport can so serve the common, cached requests on the thread
    /// that read them, with no hand-off to another thread.
    pub fn handle_nowait(&self, frame: &[u8], out: &mut Vec<u8>) -> Option<Handled> {
        self.serve(frame, out, true)
    }

    fn serve(&self, frame: &[u8], out: &mut Vec<u8>, nowait: bool) -> Option<Handled> {
        let start = out.len();
        let tag = parse_header(frame).map(|h| h.tag).unwrap_or(NOTAG);
        let limit = self.msize().max(MIN_MSIZE) as usize;
        let result = match decode_request(frame, limit) {
            Ok((tag, req)) => {
                if nowait && !may_serve_nowait(&req) {
                    return None;
                }
                tracing::trace!(tag, req = req.name(), "9p request");
                self.dispatch(tag, req, out, nowait)
            }
            Err(e) => {
                tracing::debug!(tag, error = %e, "malformed 9p message");
                Err(match e {
                    DecodeError::UnknownType(_) => Errno(libc::EOPNOTSUPP),
                    DecodeError::BadSize { .. } => Errno(libc::EMSGSIZE),
                    _ => Errno(libc::EPROTO),
                })
            }
        };
        Some(match result {
            Ok(()) => Handled {
                tag,
                kind: out.get(start + 4).copied().unwrap_or(0),
            },
            Err(e) if nowait && e == sys::WOULD_BLOCK => {
                out.truncate(start);
                return None;
            }
            Err(Errno(code)) => {
                out.truncate(start);
                Self::rlerror(out, tag, code as u32);
                Handled {
                    tag,
                    kind: kind::RLERROR,
                }
            }
        })
    }

    /// Appends an Rlerror frame.
    pub fn rlerror(out: &mut Vec<u8>, tag: u16, code: u32) {
        let mut w = Writer::begin(out, kind::RLERROR, tag);
        w.u32(code);
        w.finish();
    }

    /// Serves a decoded request. With `nowait`, an operation that would have
    /// to wait for I/O fails with [`sys::WOULD_BLOCK`] before changing anything.
    fn dispatch(&self, tag: u16, req: Request<'_>, out: &mut Vec<u8>, nowait: bool) -> OpResult {
        let rkind = req.kind() + 1;
        if self.server.cfg.readonly && is_modifying(&req) {
            return Err(Errno(libc::EROFS));
        }
        match req {
            Request::Version { msize, version } => self.version(tag, msize, version, out),
            Request::Auth { .. } => Err(Errno(libc::EOPNOTSUPP)),
            Request::Attach { fid, n_uname, .. } => self.attach(tag, fid, n_uname, out),
            Request::Flush { .. } => {
                // The transport handles in-flight bookkeeping; the core replies.
                Writer::begin(out, rkind, tag).finish();
                Ok(())
            }
            Request::Walk { fid, newfid, names } => {
                self.walk(tag, fid, newfid, &names, out, nowait)
            }
            Request::Read { fid, offset, count } => self.read(tag, fid, offset, count, out, nowait),
            Request::Write { fid, offset, data } => self.write(tag, fid, offset, data, out),
            Request::Clunk { fid } => {
                // A pending xattr write is applied at clunk: a worker does it.
                if nowait
                    && self
                        .fids
                        .get(fid)
                        .is_some_and(|f| matches!(f.kind, FidKind::XattrWrite(_)))
                {
                    return Err(sys::WOULD_BLOCK);
                }
                let f = self.fids.remove(fid).ok_or(Errno(libc::EBADF))?;
                self.finish_fid(&f)?;
                Writer::begin(out, rkind, tag).finish();
                Ok(())
            }
            Request::Remove { fid } => self.remove(tag, fid, out),
            Request::Statfs { fid } => self.statfs(tag, fid, out),
            Request::Lopen { fid, flags } => self.lopen(tag, fid, flags, out, nowait),
            Request::Lcreate {
                fid,
                name,
                flags,
                mode,
                gid,
            } => self.lcreate(tag, fid, name, flags, mode, gid, out),
            Request::Symlink {
                fid,
                name,
                target,
                gid,
            } => self.symlink(tag, fid, name, target, gid, out),
            Request::Mknod {
                dfid,
                name,
                mode,
                major,
                minor,
                gid,
            } => self.mknod(tag, dfid, name, mode, libc::makedev(major, minor), gid, out),
            Request::Rename { fid, dfid, name } => self.rename(tag, fid, dfid, name, out),
            Request::Readlink { fid } => {
                let f = self.fid(fid)?;
                let target = sys::readlink(f.node.fd.as_fd())?;
                Writer::begin(out, rkind, tag).string(&target).finish();
                Ok(())
            }
            Request::Getattr { fid, mask } => self.getattr(tag, fid, mask, out),
            Request::Setattr { fid, attr } => self.setattr(tag, fid, &attr, out),
            Request::XattrWalk { fid, newfid, name } => self.xattrwalk(tag, fid, newfid, name, out),
            Request::XattrCreate {
                fid,
                name,
                size,
                flags,
            } => self.xattrcreate(tag, fid, name, size, flags, out),
            Request::Readdir { fid, offset, count } => self.readdir(tag, fid, offset, count, out),
            Request::Fsync { fid, datasync } => self.fsync(tag, fid, datasync != 0, out),
            Request::Lock { fid, args } => self.lock(tag, fid, &args, out),
            Request::GetLock { fid, args } => self.getlock(tag, fid, &args, out),
            Request::Link { dfid, fid, name } => self.link(tag, dfid, fid, name, out),
            Request::Mkdir {
                dfid,
                name,
                mode,
                gid,
            } => self.mkdir(tag, dfid, name, mode, gid, out),
            Request::RenameAt {
                olddirfid,
                oldname,
                newdirfid,
                newname,
            } => self.renameat(tag, olddirfid, oldname, newdirfid, newname, out),
            Request::UnlinkAt {
                dirfid,
                name,
                flags,
            } => self.unlinkat(tag, dirfid, name, flags, out),
        }
    }

    fn version(&self, tag: u16, msize: u32, version: &[u8], out: &mut Vec<u8>) -> OpResult {
        if msize < MIN_MSIZE {
            return Err(Errno(libc::EINVAL));
        }
        // A new version resets the session: all fids are clunked.
        for f in self.fids.clear() {
            let _ = self.finish_fid(&f);
        }
        let negotiated = msize.min(self.server.cfg.max_msize);
        self.msize.store(negotiated, Ordering::Relaxed);
        let (reply, code): (&[u8], u8) = if version.starts_with(b"9P2000.L") {
            (b"9P2000.L", VERSION_L)
        } else {
            (b"unknown", VERSION_UNKNOWN)
        };
        self.version.store(code, Ordering::Relaxed);
        Writer::begin(out, kind::TVERSION + 1, tag)
            .u32(negotiated)
            .string(reply)
            .finish();
        Ok(())
    }

    fn attach(&self, tag: u16, fid: u32, n_uname: u32, out: &mut Vec<u8>) -> OpResult {
        let root = self.server.root.clone();
        let st = sys::fstat(root.fd.as_fd())?;
        let qid = self.server.qids.qid(&st);
        let uid = if n_uname == u32::MAX { 0 } else { n_uname };
        self.insert_fid(
            fid,
            Fid {
                node: root,
                kind: FidKind::Path,
                uid,
            },
        )?;
        let mut w = Writer::begin(out, kind::TATTACH + 1, tag);
        qid.encode(&mut w);
        w.finish();
        Ok(())
    }

    /// Looks a fid up (EBADF when unknown; a stale restored fid answers its error).
    pub(crate) fn fid(&self, fid: u32) -> Result<Arc<Fid>, Errno> {
        let f = self.fids.get(fid).ok_or(Errno(libc::EBADF))?;
        if let FidKind::Stale { errno } = f.kind {
            return Err(Errno(errno));
        }
        Ok(f)
    }

    /// Inserts a new fid (EBADF if in use, EMFILE when the table is full).
    pub(crate) fn insert_fid(&self, fid: u32, value: Fid) -> OpResult {
        self.fids.insert_new(fid, value).map_err(|e| match e {
            InsertError::InUse => Errno(libc::EBADF),
            InsertError::Full => Errno(libc::EMFILE),
        })
    }

    /// Largest payload of an Rread/Rreaddir.
    pub(crate) fn max_io(&self) -> u32 {
        self.msize() - IOHDRSZ
    }

    /// Appends a response carrying only a qid.
    pub(crate) fn reply_qid(out: &mut Vec<u8>, rkind: u8, tag: u16, qid: crate::message::Qid) {
        let mut w = Writer::begin(out, rkind, tag);
        qid.encode(&mut w);
        w.finish();
    }

    /// Appends an empty response.
    pub(crate) fn reply_empty(out: &mut Vec<u8>, rkind: u8, tag: u16) {
        Writer::begin(out, rkind, tag).finish();
    }
}

/// Requests [`Session::handle_nowait`] may serve: the session messages and
/// the operations whose system calls do not wait for the disk when their data
/// is cached (walk, read and open for reading check that; getattr and clunk
/// work on inodes already in memory).
fn may_serve_nowait(req: &Request<'_>) -> bool {
    matches!(
        req,
        Request::Version { .. }
            | Request::Auth { .. }
            | Request::Attach { .. }
            | Request::Flush { .. }
            | Request::Walk { .. }
            | Request::Read { .. }
            | Request::Lopen { .. }
            | Request::Getattr { .. }
            | Request::Clunk { .. }
    )
}

/// Requests that change the export (refused on read-only exports).
fn is_modifying(req: &Request<'_>) -> bool {
    matches!(
        req,
        Request::Write { .. }
            | Request::Remove { .. }
            | Request::Lcreate { .. }
            | Request::Symlink { .. }
            | Request::Mknod { .. }
            | Request::Rename { .. }
            | Request::Setattr { .. }
            | Request::XattrCreate { .. }
            | Request::Link { .. }
            | Request::Mkdir { .. }
            | Request::RenameAt { .. }
            | Request::UnlinkAt { .. }
    )
}

/// Sanity bound used by the transport: a frame must at least hold a header.
pub const MIN_FRAME: usize = HEADER_LEN;
