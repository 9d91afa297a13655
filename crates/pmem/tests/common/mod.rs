//! Helpers shared by the integration tests of `densevm-pmem` (`mod common;`) and by its
//! bench (`#[path = "../tests/common/mod.rs"] mod common;`): scratch directories, creating,
//! opening and mapping pcow images, and reading and checking them afterwards.
//!
//! Mapping needs userfaultfd: run as root or with access to /dev/userfaultfd.

// Every user compiles this module on its own and none uses every helper.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use densevm_pmem::{MapOptions, PmemRegion};
use pcow::{Chain, CreateOptions, OpenOptions, SharedChain};

/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// Cluster size of every image the helpers create (64 KiB).
pub const CLUSTER: u64 = 64 << 10;
/// Host page size, the copy-on-write unit.
pub const PAGE: u64 = 4096;

/// A scratch directory, removed with everything in it when dropped (images here are tens
/// of MiB; left behind they filled the disk).
pub struct ScratchDir(PathBuf);

impl std::ops::Deref for ScratchDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for ScratchDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh, empty scratch directory `<temp>/pmem-<pid>-<name>` (emptied first if a previous
/// run with the same pid left it behind), removed when the guard drops. `name` tells apart
/// the directories of one process.
pub fn tmpdir(name: &str) -> ScratchDir {
    let d = std::env::temp_dir().join(format!("pmem-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    ScratchDir(d)
}

/// Creates a pcow image of `size` bytes with [`CLUSTER`]-sized clusters at `path`, over the
/// backing file `backing` (a path relative to the image's directory) if given.
pub fn create(path: &Path, size: u64, backing: Option<&str>) {
    pcow::create_file(
        path,
        &CreateOptions {
            virtual_size: size,
            cluster_size: CLUSTER,
            backing: backing.map(str::to_string),
        },
    )
    .unwrap();
}

/// Opens the chain whose top image is `path`, writable or read-only.
pub fn open(path: &Path, writable: bool) -> Chain {
    Chain::open(
        path,
        OpenOptions {
            writable,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Opens the chain whose top image is `path` writable, writes `byte` over its first `len`
/// bytes and flushes. Returns the still-open chain (e.g. to take a snapshot of it).
pub fn fill(path: &Path, len: u64, byte: u8) -> Chain {
    let mut c = open(path, true);
    c.write(0, &vec![byte; len as usize]).unwrap();
    c.flush().unwrap();
    c
}

/// Creates `base.pcow` in `dir` (`size` bytes, its first `filled` bytes set to `byte`) and
/// an empty `top.pcow` over it; returns their paths.
pub fn base_and_top(dir: &Path, size: u64, filled: u64, byte: u8) -> (PathBuf, PathBuf) {
    let base = dir.join("base.pcow");
    create(&base, size, None);
    fill(&base, filled, byte);
    let top = dir.join("top.pcow");
    create(&top, size, Some("base.pcow"));
    (base, top)
}

/// Maps the chain whose top image is `path` (opened writable) with `opts`.
pub fn map_with(path: &Path, opts: MapOptions) -> PmemRegion {
    PmemRegion::map(SharedChain::new(open(path, true)), opts)
        .expect("mapping needs userfaultfd (root or /dev/userfaultfd access)")
}

/// Maps the chain whose top image is `path` (opened writable) with the default options.
pub fn map(path: &Path) -> PmemRegion {
    map_with(path, MapOptions::default())
}

/// The region's bytes. The mapping lives as long as the region; callers use the slice only
/// while the region is alive.
pub fn slice<'a>(r: &PmemRegion) -> &'a mut [u8] {
    // SAFETY: the region is mapped for its whole size while `r` lives (see above).
    unsafe { std::slice::from_raw_parts_mut(r.host_addr() as *mut u8, r.size() as usize) }
}

/// `len` bytes at guest offset `offset` of the chain whose top image is `path`, read through
/// a fresh read-only open (not through any mapping).
pub fn read_chain(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let c = open(path, false);
    let mut buf = vec![0u8; len];
    c.read(offset, &mut buf).unwrap();
    buf
}

/// Fails unless a check of the chain whose top image is `path` finds neither corruption
/// nor leaked clusters.
pub fn assert_clean(path: &Path) {
    let report = pcow::check_path(path).unwrap();
    assert!(
        report.corruptions.is_empty() && report.leaks.is_empty(),
        "check of {} found: {:?} {:?}",
        path.display(),
        report.corruptions,
        report.leaks
    );
}
