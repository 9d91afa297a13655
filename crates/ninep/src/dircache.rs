//! Directory nodes reused across walks.
//!
//! Walking `d/f` for every file of a tree would open (and later close) a new
//! `O_PATH` descriptor of `d` each time. The cache keeps the node of each
//! recently walked directory, keyed by (parent node, name); a hit is checked
//! with one `fstatat(parent, name, AT_SYMLINK_NOFOLLOW)` that must find the
//! very inode the cached descriptor holds (same device and inode number; the
//! held descriptor keeps that inode alive, so its number cannot have been
//! reused). A hit is therefore what a fresh lookup would have returned: the
//! name is one validated component, resolved from the same parent descriptor,
//! symlinks are not followed, and the node's descriptor was itself opened
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
//!
//! Only directories on the export root's own mount are kept (same mount id,
//! so neither they nor their ancestors are on another mount: a cached node
//! never keeps a submount or bind mount busy after its fids are clunked), at
//! most [`CAPACITY`] of them; a full cache is emptied. Without mount ids
//! (kernels before 5.8) nothing is cached.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::CStr;
use std::hash::{Hash, Hasher};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use crate::fid::{Node, FOREIGN_BASE};
use crate::sys;

/// Directory nodes kept at most.
pub const CAPACITY: usize = 1024;

/// The directory-node cache of one export.
#[derive(Debug)]
pub struct DirCache {
    /// Device of the export root.
    dev: u64,
    /// Mount id of the export root (`None`: the cache is off).
    mnt_id: Option<u64>,
    /// Hash of (parent node address, name) → node; a hit is compared in full.
    map: Mutex<HashMap<u64, Arc<Node>>>,
}

impl DirCache {
    /// An empty cache for an export whose root is `root` (an `O_PATH` descriptor).
    pub fn new(root: BorrowedFd<'_>) -> Self {
        let id = sys::ident_at(root, c"").ok();
        DirCache {
            dev: id.map_or(0, |i| i.dev),
            mnt_id: id.and_then(|i| i.mnt_id),
            map: Mutex::new(HashMap::new()),
        }
    }

    /// True if `id` is a directory on the export root's mount.
    fn keeps(&self, id: &sys::Ident) -> bool {
        self.mnt_id.is_some()
            && id.mnt_id == self.mnt_id
            && id.dev == self.dev
            && id.ftype == libc::S_IFDIR
    }

    fn key(parent: &Arc<Node>, name: &[u8]) -> u64 {
        let mut h = DefaultHasher::new();
        (Arc::as_ptr(parent) as usize).hash(&mut h);
        name.hash(&mut h);
        h.finish()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Node>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached node of directory `name` in `parent`, if the name still
    /// leads to the inode it holds. Costs one `fstatat` on a hit.
    pub fn get(&self, parent: &Arc<Node>, name: &CStr) -> Option<Arc<Node>> {
        let key = Self::key(parent, name.to_bytes());
        let node = {
            let m = self.lock();
            let n = m.get(&key)?;
            // The cached node holds its parent, so the address in the key
            // cannot belong to another node while the entry exists.
            let same = n.parent.as_ref().is_some_and(|p| Arc::ptr_eq(p, parent))
                && n.name.as_c_str() == name;
            if !same {
                return None;
            }
            n.clone()
        };
        match sys::ident_at(parent.fd.as_fd(), name) {
            Ok(id) if self.keeps(&id) && id.ino == node.qid.path => Some(node),
            _ => {
                // Renamed, removed or replaced on the host: forget it.
                let mut m = self.lock();
                if m.get(&key).is_some_and(|n| Arc::ptr_eq(n, &node)) {
                    m.remove(&key);
                }
                None
            }
        }
    }

    /// Remembers a freshly looked-up node if it is a directory on the export
    /// root's mount (one `statx` of the new node for directories of the root's device).
    pub fn insert(&self, node: &Arc<Node>) {
        // Qid paths below FOREIGN_BASE are inode numbers of the root's device.
        if self.mnt_id.is_none() || node.ftype != libc::S_IFDIR || node.qid.path >= FOREIGN_BASE {
            return;
        }
        let Some(parent) = node.parent.as_ref() else {
            return;
        };
        match sys::ident_at(node.fd.as_fd(), c"") {
            Ok(id) if self.keeps(&id) && id.ino == node.qid.path => {}
            _ => return,
        }
        let key = Self::key(parent, node.name.as_bytes());
        let mut m = self.lock();
        if m.len() >= CAPACITY {
            m.clear();
        }
        m.insert(key, node.clone());
    }

    /// Number of cached nodes.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Server};

    #[test]
    fn a_hit_needs_the_same_inode_under_the_same_name() {
        let dir = std::env::temp_dir().join(format!("ninep-dircache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("d")).unwrap();
        std::fs::write(dir.join("f"), b"").unwrap();
        let server = Server::new(&dir, Config::default()).unwrap();
        let s = server.session();
        let root = server.root.clone();
        let d = s.lookup(&root, b"d").unwrap();
        assert_eq!(server.dirs.len(), 1, "a directory is cached");
        assert!(Arc::ptr_eq(&s.lookup(&root, b"d").unwrap(), &d), "hit");
        s.lookup(&root, b"f").unwrap();
        assert_eq!(server.dirs.len(), 1, "files are not cached");

        // Replaced on the host: the old node no longer answers for the name.
        std::fs::rename(dir.join("d"), dir.join("old")).unwrap();
        std::fs::create_dir(dir.join("d")).unwrap();
        let d2 = s.lookup(&root, b"d").unwrap();
        assert!(!Arc::ptr_eq(&d2, &d));
        assert_ne!(d2.qid.path, d.qid.path);
        // A symlink in its place is never followed.
        std::fs::remove_dir(dir.join("d")).unwrap();
        std::os::unix::fs::symlink("old", dir.join("d")).unwrap();
        let l = s.lookup(&root, b"d").unwrap();
        assert_eq!(l.ftype, libc::S_IFLNK);
        std::fs::remove_file(dir.join("d")).unwrap();
        assert_eq!(s.lookup(&root, b"d").err(), Some(sys::Errno(libc::ENOENT)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Run as root in a private mount namespace:
    /// `unshare -m --propagation private cargo test -p densevm-9p --lib dircache -- --ignored`
    #[test]
    #[ignore = "needs root and a private mount namespace (see the comment)"]
    fn directories_on_another_mount_are_not_kept() {
        use std::ffi::CString;
        let dir = std::env::temp_dir().join(format!("ninep-dircache-mnt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["plain", "sub", "other"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let c = |p: &std::path::Path| CString::new(p.to_str().unwrap()).unwrap();
        let (src, dst) = (c(&dir.join("other")), c(&dir.join("sub")));
        // SAFETY: NUL-terminated paths; a bind mount in the test's own namespace.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "bind mount: {}", std::io::Error::last_os_error());
        let server = Server::new(&dir, Config::default()).unwrap();
        let s = server.session();
        let root = server.root.clone();
        let sub = s.lookup(&root, b"sub").unwrap();
        assert_eq!(
            server.dirs.len(),
            0,
            "a bind mount (same device) is not kept"
        );
        s.lookup(&root, b"plain").unwrap();
        assert_eq!(server.dirs.len(), 1, "a directory of the root's mount is");
        drop(sub);
        // SAFETY: NUL-terminated path.
        let r = unsafe { libc::umount2(dst.as_ptr(), 0) };
        assert_eq!(
            r,
            0,
            "nothing keeps the mount busy: {}",
            std::io::Error::last_os_error()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
