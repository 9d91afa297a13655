//! Saving a [`Session`] and building it again (VM snapshots, restore and clones).
//!
//! A session is saved as what the guest negotiated (msize, version) and its fid table; each
//! fid as the path of names from the export root to its node (the node's parent chain), its
//! guest uid, its qid and how it is open:
//! - walked only ([`FidOpen::Path`]);
//! - an open file with its open flags (`fcntl(F_GETFL)` minus `O_CREAT|O_EXCL|O_TRUNC`, so
//!   reopening never creates or truncates);
//! - an open directory with its descriptor's position (`lseek(fd, 0, SEEK_CUR)`; every
//!   Treaddir seeks to the offset the client asks for anyway, so this is only a courtesy).
//!
//! Xattr fids (between Txattrwalk/Txattrcreate and their Tclunk: the middle of one guest
//! getxattr/setxattr call) are not saved: [`Session::snapshot`] refuses with
//! [`SnapshotError::XattrFid`], and the snapshot can be retried a moment later, when the
//! guest's call has finished. Dropping them instead would make that guest call fail, or
//! silently lose an attribute write.
//!
//! [`Server::restore_session`] walks each saved path again from the export root with the
//! server's own lookup (one component at a time, `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)`, symlinks never followed; `.`, `..`, empty names and names with
//! `/` are refused as a damaged state). A fid whose path no longer leads to the file it
//! named (deleted or replaced on the host since: the qid differs) is restored as a *stale*
//! fid ([`FidKind::Stale`]): every operation on it fails with ESTALE (or the error that
//! reopening it gave, e.g. EACCES, or EROFS for a writable open on a read-only export) and
//! Tclunk releases it. The restore as a whole fails only for a state that cannot be right
//! (bad msize or version, bad names, a fid number twice, more fids than the export allows).
//!
//! Known limits: a fid's path is the path it was reached by; a rename done through another
//! fid (Trenameat, or on the host) leaves it pointing at the old name, and on restore it
//! is stale (its qid no longer matches). Qid paths of inodes on other filesystems mounted
//! inside the export are numbered in lookup order and are not saved: such fids are matched
//! by qid type only. Qids carry no generation: a file deleted on the host and replaced by a
//! new one that reuses its inode number is taken for the same file.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;

use crate::fid::{Fid, FidKind, FidTable, InsertError, Node, FOREIGN_BASE};
use crate::message::Qid;
use crate::server::{Server, Session, MIN_MSIZE, VERSION_L, VERSION_NONE, VERSION_UNKNOWN};
use crate::sys::{self, Errno};

/// Open flags kept from `F_GETFL` when a file is reopened on restore (the state is
/// untrusted: nothing that creates, truncates or changes how the path resolves).
const KEPT_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_NONBLOCK
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_NOATIME
    | libc::O_DIRECT
    | libc::O_LARGEFILE;

/// A saved session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSnapshot {
    /// Negotiated msize.
    pub msize: u32,
    /// What Rversion answered (`9P2000.L` or `unknown`); `None` before any Tversion.
    pub version: Option<String>,
    /// Every fid, in ascending fid order.
    pub fids: Vec<FidSnapshot>,
}

/// A saved fid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FidSnapshot {
    /// The client's fid number.
    pub fid: u32,
    /// Entry names from the export root to the node (empty: the root).
    pub path: Vec<Vec<u8>>,
    /// Guest uid (from Tattach, inherited by walks).
    pub uid: u32,
    /// The node's qid when it was reached.
    pub qid: Qid,
    /// How the fid is open.
    pub open: FidOpen,
}

/// How a saved fid is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FidOpen {
    /// Walked, not opened.
    Path,
    /// An open regular file: host open flags (`F_GETFL` minus `O_CREAT|O_EXCL|O_TRUNC`).
    File {
        /// Host open flags.
        flags: i32,
    },
    /// An open directory and its descriptor's position.
    Dir {
        /// `lseek(fd, 0, SEEK_CUR)`.
        offset: u64,
    },
    /// A fid that was already stale (restored from an earlier snapshot): fails with `errno`.
    Stale {
        /// The error its operations answer.
        errno: i32,
    },
}

/// Why a session cannot be saved or restored.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SnapshotError {
    /// An xattr operation is in progress on `fid`.
    #[error(
        "fid {fid} is in the middle of an extended-attribute call (Txattrwalk/Txattrcreate not \
         clunked yet), which a snapshot does not save: retry the snapshot in a moment"
    )]
    XattrFid {
        /// The fid.
        fid: u32,
    },
    /// A host call failed while saving.
    #[error("cannot read the state of fid {fid}: {errno}")]
    Host {
        /// The fid.
        fid: u32,
        /// What failed.
        errno: Errno,
    },
    /// msize out of range for this export.
    #[error("msize {msize} is out of range ({MIN_MSIZE}..={max}) for this export")]
    Msize {
        /// The saved msize.
        msize: u32,
        /// This export's largest msize.
        max: u32,
    },
    /// A version this server never answers.
    #[error("protocol version {0:?} is not one this server negotiates")]
    Version(String),
    /// A path component that a walk cannot have produced.
    #[error("fid {fid} has an invalid path component {name:?}")]
    BadName {
        /// The fid.
        fid: u32,
        /// The component (lossy).
        name: String,
    },
    /// The same fid number twice.
    #[error("fid {0} appears twice")]
    DuplicateFid(u32),
    /// More fids than this export allows a session.
    #[error("more fids than this export's limit of {0}")]
    TooManyFids(usize),
}

/// What a restore could not bring back as it was.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// Fids restored stale, with the error they answer.
    pub stale: Vec<(u32, i32)>,
}

/// The names from the export root to `node`.
fn path_of(node: &Node) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    let mut n = node;
    while let Some(parent) = &n.parent {
        names.push(n.name.as_bytes().to_vec());
        n = parent;
    }
    names.reverse();
    names
}

impl Session {
    /// Saves the session: msize, version and every fid. Call only while no request is being
    /// handled (the device is quiesced). Refuses while an xattr fid is open.
    pub fn snapshot(&self) -> Result<SessionSnapshot, SnapshotError> {
        let version = match self.version.load(Ordering::Relaxed) {
            VERSION_L => Some("9P2000.L".to_string()),
            VERSION_UNKNOWN => Some("unknown".to_string()),
            _ => None,
        };
        let mut fids = Vec::with_capacity(self.fids.len());
        for (fid, f) in self.fids.entries() {
            let host = |errno| SnapshotError::Host { fid, errno };
            let open = match &f.kind {
                FidKind::Path => FidOpen::Path,
                FidKind::File { fd } => {
                    let flags = sys::getfl(fd.as_fd()).map_err(host)?;
                    FidOpen::File {
                        flags: flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC),
                    }
                }
                FidKind::Dir { fd } => {
                    let fd = fd.lock().unwrap_or_else(|p| p.into_inner());
                    FidOpen::Dir {
                        offset: sys::tell(fd.as_fd()).map_err(host)?,
                    }
                }
                FidKind::XattrRead { .. } | FidKind::XattrWrite(_) => {
                    return Err(SnapshotError::XattrFid { fid })
                }
                FidKind::Stale { errno } => FidOpen::Stale { errno: *errno },
            };
            let path = match open {
                FidOpen::Stale { .. } => Vec::new(),
                _ => path_of(&f.node),
            };
            fids.push(FidSnapshot {
                fid,
                path,
                uid: f.uid,
                qid: f.node.qid,
                open,
            });
        }
        Ok(SessionSnapshot {
            msize: self.msize(),
            version,
            fids,
        })
    }
}

/// Whether `node` is the file a fid with qid `saved` named.
fn same_file(node: &Node, saved: &Qid) -> bool {
    node.qid.kind == saved.kind && (saved.path >= FOREIGN_BASE || node.qid.path == saved.path)
}

impl Server {
    /// A session rebuilt from `snap` (see the module documentation): the session as the guest
    /// left it, with the fids whose files are gone restored stale (listed in the report).
    pub fn restore_session(
        self: &Arc<Self>,
        snap: &SessionSnapshot,
    ) -> Result<(Session, RestoreReport), SnapshotError> {
        let max = self.cfg.max_msize;
        if snap.msize < MIN_MSIZE || snap.msize > max {
            return Err(SnapshotError::Msize {
                msize: snap.msize,
                max,
            });
        }
        let version = match snap.version.as_deref() {
            None => VERSION_NONE,
            Some("9P2000.L") => VERSION_L,
            Some("unknown") => VERSION_UNKNOWN,
            Some(v) => return Err(SnapshotError::Version(v.to_string())),
        };
        if snap.fids.len() > self.cfg.max_fids {
            return Err(SnapshotError::TooManyFids(self.cfg.max_fids));
        }
        // Names are checked before anything is opened.
        for f in &snap.fids {
            for name in &f.path {
                if crate::ops::entry_name(name).is_err() {
                    return Err(SnapshotError::BadName {
                        fid: f.fid,
                        name: String::from_utf8_lossy(name).into_owned(),
                    });
                }
            }
        }
        let session = Session {
            server: self.clone(),
            fids: FidTable::new(self.cfg.max_fids),
            msize: AtomicU32::new(snap.msize),
            version: AtomicU8::new(version),
        };
        let mut report = RestoreReport::default();
        // Nodes already looked up, by (parent node, name): fids share their prefixes.
        let mut seen: HashMap<(usize, Vec<u8>), Arc<Node>> = HashMap::new();
        for f in &snap.fids {
            let (node, kind) = match self.restore_fid(&session, f, &mut seen) {
                Ok(restored) => restored,
                Err(Errno(errno)) => {
                    tracing::warn!(
                        fid = f.fid,
                        path = %String::from_utf8_lossy(&f.path.join(&b'/')),
                        error = %Errno(errno),
                        "9p fid restored stale"
                    );
                    report.stale.push((f.fid, errno));
                    let placeholder = Arc::new(Node {
                        fd: self.root.fd.clone(),
                        parent: None,
                        name: CString::default(),
                        qid: f.qid,
                        ftype: 0,
                    });
                    (placeholder, FidKind::Stale { errno })
                }
            };
            let fid = Fid {
                node,
                kind,
                uid: f.uid,
            };
            session.fids.insert_new(f.fid, fid).map_err(|e| match e {
                InsertError::InUse => SnapshotError::DuplicateFid(f.fid),
                InsertError::Full => SnapshotError::TooManyFids(self.cfg.max_fids),
            })?;
        }
        Ok((session, report))
    }

    /// Walks and reopens one saved fid; `Err` makes it stale with that error.
    fn restore_fid(
        &self,
        session: &Session,
        f: &FidSnapshot,
        seen: &mut HashMap<(usize, Vec<u8>), Arc<Node>>,
    ) -> Result<(Arc<Node>, FidKind), Errno> {
        if let FidOpen::Stale { errno } = f.open {
            return Err(Errno(errno));
        }
        let stale = |e: Errno| match e.0 {
            libc::ENOENT | libc::ENOTDIR => Errno(libc::ESTALE),
            _ => e,
        };
        let mut node = self.root.clone();
        for name in &f.path {
            let key = (Arc::as_ptr(&node) as usize, name.clone());
            let next = match seen.get(&key) {
                Some(n) => n.clone(),
                None => {
                    let n = session.lookup(&node, name).map_err(stale)?;
                    seen.insert(key, n.clone());
                    n
                }
            };
            node = next;
        }
        if !same_file(&node, &f.qid) {
            return Err(Errno(libc::ESTALE));
        }
        let kind = match f.open {
            FidOpen::Path => FidKind::Path,
            FidOpen::File { flags } => {
                if node.ftype != libc::S_IFREG {
                    return Err(Errno(libc::ESTALE));
                }
                let flags = flags & KEPT_FLAGS;
                if self.cfg.readonly && flags & libc::O_ACCMODE != libc::O_RDONLY {
                    return Err(Errno(libc::EROFS));
                }
                FidKind::File {
                    fd: Arc::new(self.reopen(node.fd.as_fd(), flags)?),
                }
            }
            FidOpen::Dir { offset } => {
                if node.ftype != libc::S_IFDIR {
                    return Err(Errno(libc::ESTALE));
                }
                let fd = self.reopen(node.fd.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
                if let Err(e) = sys::seek(fd.as_fd(), offset) {
                    tracing::debug!(fid = f.fid, offset, error = %e, "9p directory seek on restore");
                }
                FidKind::Dir { fd: Mutex::new(fd) }
            }
            FidOpen::Stale { errno } => return Err(Errno(errno)),
        };
        Ok((node, kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{kind, Request};
    use crate::server::Config;
    use std::os::unix::ffi::OsStrExt;

    fn call(s: &Session, req: &Request<'_>) -> Vec<u8> {
        let mut frame = Vec::new();
        req.encode(1, &mut frame);
        let mut out = Vec::new();
        s.handle(&frame, &mut out);
        out
    }

    fn errno(reply: &[u8]) -> Option<i32> {
        (reply[4] == kind::RLERROR).then(|| i32::from_le_bytes(reply[7..11].try_into().unwrap()))
    }

    #[test]
    fn session_round_trip_with_odd_names_and_a_vanished_file() {
        let root = std::env::temp_dir().join(format!("ninep-snapshot-{}", std::process::id()));
        let odd = std::ffi::OsStr::from_bytes(b"sub\xffdir");
        std::fs::create_dir_all(root.join(odd)).unwrap();
        std::fs::write(root.join(odd).join("f"), b"0123456789").unwrap();
        std::fs::write(root.join("gone"), b"x").unwrap();
        let server = Server::new(&root, Config::default()).unwrap();
        let s = server.session();
        let version = Request::Version {
            msize: 8192,
            version: b"9P2000.L",
        };
        call(&s, &version);
        let attach = Request::Attach {
            fid: 0,
            afid: u32::MAX,
            uname: b"",
            aname: b"",
            n_uname: 1000,
        };
        assert_eq!(errno(&call(&s, &attach)), None);
        let walk = Request::Walk {
            fid: 0,
            newfid: 1,
            names: vec![b"sub\xffdir", b"f"],
        };
        assert_eq!(errno(&call(&s, &walk)), None);
        let open = Request::Lopen { fid: 1, flags: 2 };
        assert_eq!(errno(&call(&s, &open)), None);
        let walk = Request::Walk {
            fid: 0,
            newfid: 2,
            names: vec![b"gone"],
        };
        assert_eq!(errno(&call(&s, &walk)), None);

        let snap = s.snapshot().unwrap();
        assert_eq!(snap.msize, 8192);
        assert_eq!(snap.version.as_deref(), Some("9P2000.L"));
        assert_eq!(
            snap.fids[1].path,
            vec![b"sub\xffdir".to_vec(), b"f".to_vec()]
        );
        assert_eq!(snap.fids[1].uid, 1000);
        let FidOpen::File { flags } = snap.fids[1].open else {
            panic!("{:?}", snap.fids[1].open)
        };
        assert_eq!(flags & libc::O_ACCMODE, libc::O_RDWR);

        std::fs::remove_file(root.join("gone")).unwrap();
        let (r, report) = server.restore_session(&snap).unwrap();
        assert_eq!(report.stale, vec![(2, libc::ESTALE)]);
        assert_eq!(r.msize(), 8192);
        let read = Request::Read {
            fid: 1,
            offset: 4,
            count: 3,
        };
        let reply = call(&r, &read);
        assert_eq!(&reply[11..], b"456");
        let write = Request::Write {
            fid: 1,
            offset: 0,
            data: b"ab",
        };
        assert_eq!(errno(&call(&r, &write)), None, "opened read-write again");
        assert_eq!(
            errno(&call(
                &r,
                &Request::Getattr {
                    fid: 2,
                    mask: 0x7ff
                }
            )),
            Some(libc::ESTALE)
        );
        assert_eq!(
            errno(&call(&r, &Request::Remove { fid: 2 })),
            Some(libc::ESTALE)
        );
        assert_eq!(r.fid_count(), 2, "Tremove clunked the stale fid");
        assert_eq!(
            std::fs::read(root.join(odd).join("f")).unwrap(),
            b"ab23456789"
        );

        // An xattr fid in progress is refused; duplicates and bad names too.
        let xw = Request::XattrWalk {
            fid: 0,
            newfid: 9,
            name: b"",
        };
        assert_eq!(errno(&call(&s, &xw)), None);
        assert_eq!(s.snapshot(), Err(SnapshotError::XattrFid { fid: 9 }));
        let mut bad = snap.clone();
        bad.fids[1].path = vec![b".".to_vec()];
        assert!(matches!(
            server.restore_session(&bad),
            Err(SnapshotError::BadName { fid: 1, .. })
        ));
        let mut dup = snap.clone();
        dup.fids[2].fid = 1;
        assert!(matches!(
            server.restore_session(&dup),
            Err(SnapshotError::DuplicateFid(1))
        ));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
