//! Fids and the nodes they name: an O(1) sharded fid table and the
//! inode-to-qid map.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::message::Qid;

/// A file or directory reached by walking from the root.
///
/// `fd` is an `O_PATH` descriptor (or an open descriptor for files made by
/// Tlcreate): every operation is relative to it, so a node keeps pointing at
/// the same inode after renames and after unlink. `parent` + `name` are used
/// only by operations that need a directory entry (remove, rename) and for `..`.
#[derive(Debug)]
pub struct Node {
    /// Descriptor of the inode.
    pub fd: Arc<OwnedFd>,
    /// Directory this node was reached from; `None` for the export root.
    pub parent: Option<Arc<Node>>,
    /// Entry name inside `parent` (empty for the root).
    pub name: CString,
    /// Qid computed when the node was reached.
    pub qid: Qid,
    /// File type bits (`st_mode & S_IFMT`) when the node was reached.
    pub ftype: u32,
}

impl Node {
    /// True for the export root.
    pub fn is_root(&self) -> bool {
        self.parent.is_none()
    }
}

/// A pending xattr write (Txattrcreate): applied when the fid is clunked.
#[derive(Debug)]
pub struct XattrWrite {
    /// Attribute name.
    pub name: CString,
    /// XATTR_CREATE / XATTR_REPLACE flags.
    pub flags: i32,
    /// Size announced by Txattrcreate; the value must be exactly this long.
    pub size: usize,
    /// Bytes received so far.
    pub value: Mutex<Vec<u8>>,
}

/// What a fid currently stands for.
#[derive(Debug)]
pub enum FidKind {
    /// Walked but not opened.
    Path,
    /// Opened regular file.
    File {
        /// Open descriptor.
        fd: Arc<OwnedFd>,
    },
    /// Opened directory; the mutex serialises seek + getdents.
    Dir {
        /// Open descriptor, guarded for readdir.
        fd: Mutex<OwnedFd>,
    },
    /// Result of Txattrwalk: the value (or name list) to be read.
    XattrRead {
        /// Attribute bytes.
        data: Vec<u8>,
    },
    /// Result of Txattrcreate.
    XattrWrite(XattrWrite),
    /// Restored from a snapshot whose path no longer leads to the same file (deleted or
    /// replaced on the host since, or no longer openable): every operation but Tclunk fails
    /// with `errno` (ESTALE when the file is gone).
    Stale {
        /// The error every operation answers.
        errno: i32,
    },
}

/// One fid: a node, its state and the user it acts for.
#[derive(Debug)]
pub struct Fid {
    /// The node.
    pub node: Arc<Node>,
    /// The state.
    pub kind: FidKind,
    /// Guest uid from Tattach (n_uname), inherited by walks.
    pub uid: u32,
}

const SHARDS: usize = 16;

/// The fid table: client-chosen 32-bit fids → [`Fid`], a hash map per shard
/// (O(1) expected per lookup, independent of how many fids are open).
#[derive(Debug)]
pub struct FidTable {
    shards: Vec<Mutex<HashMap<u32, Arc<Fid>>>>,
    count: AtomicUsize,
    limit: usize,
}

/// Why a fid could not be inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertError {
    /// The fid number is already in use.
    InUse,
    /// The session's fid limit is reached.
    Full,
}

impl FidTable {
    /// Creates an empty table holding at most `limit` fids.
    pub fn new(limit: usize) -> Self {
        FidTable {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            count: AtomicUsize::new(0),
            limit,
        }
    }

    fn shard(&self, fid: u32) -> MutexGuard<'_, HashMap<u32, Arc<Fid>>> {
        let i = (fid as usize ^ (fid as usize >> 8)) % SHARDS;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks a fid up.
    pub fn get(&self, fid: u32) -> Option<Arc<Fid>> {
        self.shard(fid).get(&fid).cloned()
    }

    /// True if `fid` is in use.
    pub fn contains(&self, fid: u32) -> bool {
        self.shard(fid).contains_key(&fid)
    }

    /// Inserts a new fid; fails if it is in use or the table is full.
    pub fn insert_new(&self, fid: u32, value: Fid) -> Result<(), InsertError> {
        let mut shard = self.shard(fid);
        if shard.contains_key(&fid) {
            return Err(InsertError::InUse);
        }
        if self.count.load(Ordering::Relaxed) >= self.limit {
            return Err(InsertError::Full);
        }
        shard.insert(fid, Arc::new(value));
        self.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Inserts or replaces `fid`.
    pub fn replace(&self, fid: u32, value: Fid) {
        if self.shard(fid).insert(fid, Arc::new(value)).is_none() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Removes a fid, returning it.
    pub fn remove(&self, fid: u32) -> Option<Arc<Fid>> {
        let out = self.shard(fid).remove(&fid);
        if out.is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        out
    }

    /// Number of fids in use.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// True when no fid is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every fid with its number, in ascending fid order (for snapshots).
    pub fn entries(&self) -> Vec<(u32, Arc<Fid>)> {
        let mut out = Vec::with_capacity(self.len());
        for s in &self.shards {
            let s = s.lock().unwrap_or_else(|p| p.into_inner());
            out.extend(s.iter().map(|(&n, f)| (n, f.clone())));
        }
        out.sort_unstable_by_key(|&(n, _)| n);
        out
    }

    /// Drops every fid (Tversion resets the session).
    pub fn clear(&self) -> Vec<Arc<Fid>> {
        let mut out = Vec::new();
        for s in &self.shards {
            let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
            out.extend(s.drain().map(|(_, f)| f));
        }
        self.count.store(0, Ordering::Relaxed);
        out
    }
}

/// QTDIR.
pub const QT_DIR: u8 = 0x80;
/// QTSYMLINK.
pub const QT_SYMLINK: u8 = 0x02;
/// QTFILE.
pub const QT_FILE: u8 = 0;

/// Maps (device, inode) to qid paths: inodes of the export's own device map to
/// themselves; inodes of other (sub-mounted) devices get fresh unique numbers
/// from an O(1) hash map, so qid paths never collide across devices.
#[derive(Debug)]
pub struct QidMap {
    root_dev: u64,
    other: Mutex<HashMap<(u64, u64), u64>>,
}

pub(crate) const FOREIGN_BASE: u64 = 1 << 63;

impl QidMap {
    /// A map for an export whose root lives on `root_dev`.
    pub fn new(root_dev: u64) -> Self {
        QidMap {
            root_dev,
            other: Mutex::new(HashMap::new()),
        }
    }

    /// The qid path for (dev, ino).
    pub fn path(&self, dev: u64, ino: u64) -> u64 {
        if dev == self.root_dev && ino < FOREIGN_BASE {
            return ino;
        }
        let mut m = self.other.lock().unwrap_or_else(|p| p.into_inner());
        let next = FOREIGN_BASE + m.len() as u64;
        *m.entry((dev, ino)).or_insert(next)
    }

    /// The qid type for a stat mode.
    pub fn kind_of_mode(mode: u32) -> u8 {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => QT_DIR,
            libc::S_IFLNK => QT_SYMLINK,
            _ => QT_FILE,
        }
    }

    /// The qid of a stat result.
    pub fn qid(&self, st: &libc::stat) -> Qid {
        Qid {
            kind: Self::kind_of_mode(st.st_mode),
            version: 0,
            path: self.path(st.st_dev, st.st_ino),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn node() -> Arc<Node> {
        let fd = std::fs::File::open("/")
            .unwrap()
            .as_fd()
            .try_clone_to_owned()
            .unwrap();
        Arc::new(Node {
            fd: Arc::new(fd),
            parent: None,
            name: CString::default(),
            qid: Qid::default(),
            ftype: libc::S_IFDIR,
        })
    }

    #[test]
    fn fid_table_insert_get_remove_and_limit() {
        let n = node();
        let t = FidTable::new(2);
        let f = |n: &Arc<Node>| Fid {
            node: n.clone(),
            kind: FidKind::Path,
            uid: 0,
        };
        t.insert_new(1, f(&n)).unwrap();
        assert_eq!(t.insert_new(1, f(&n)), Err(InsertError::InUse));
        t.insert_new(u32::MAX - 1, f(&n)).unwrap();
        assert_eq!(t.insert_new(3, f(&n)), Err(InsertError::Full));
        assert!(t.get(1).is_some() && t.get(3).is_none());
        assert!(t.remove(1).is_some());
        assert!(t.remove(1).is_none());
        assert_eq!(t.len(), 1);
        t.replace(5, f(&n));
        t.replace(5, f(&n));
        assert_eq!(t.len(), 2);
        assert_eq!(t.clear().len(), 2);
        assert!(t.is_empty());
    }

    #[test]
    fn qid_paths_are_unique_across_devices() {
        let m = QidMap::new(7);
        assert_eq!(m.path(7, 42), 42);
        let a = m.path(8, 42);
        let b = m.path(9, 42);
        assert_ne!(a, 42);
        assert_ne!(a, b);
        assert_eq!(m.path(8, 42), a);
    }
}
