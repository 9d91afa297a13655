//! A tier with nothing to do costs (almost) nothing: its thread sleeps longer and longer
//! while nothing happens, and what it wrote to its swap file leaves the host's page cache.
//! One test in its own process, so that its tier's thread is the only one named "tier".

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{fill, Region, MIB};

/// The voluntary context switches (sleeps) of this process's one thread named `name`.
fn sleeps(name: &str) -> u64 {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = entry.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let status = std::fs::read_to_string(dir.join("status")).unwrap();
            let n = status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .expect("voluntary_ctxt_switches in /proc/self/task/*/status");
            found.push(n.trim().parse::<u64>().unwrap());
        }
    }
    assert_eq!(found.len(), 1, "threads named {name:?}: {}", found.len());
    found[0]
}

/// A directory on a disk file system (where dropping a file's page cache drops its pages;
/// on tmpfs the pages are the file): the temporary directory, else the build directory.
fn disk_dir() -> PathBuf {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let exe = std::env::current_exe().unwrap();
    let dirs = [std::env::temp_dir(), exe.parent().unwrap().to_path_buf()];
    dirs.iter()
        .find(|d| {
            let path = std::ffi::CString::new(d.to_str().unwrap()).unwrap();
            // SAFETY: a statfs struct is plain integers; statfs fills the one we own.
            let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: a NUL-terminated path and a statfs we own.
            let r = unsafe { libc::statfs(path.as_ptr(), &mut fs) };
            r == 0 && fs.f_type as i64 != TMPFS_MAGIC
        })
        .unwrap_or_else(|| panic!("{dirs:?} are all tmpfs: run the tests on a disk file system"))
        .clone()
}

/// Pages of the tier's swap file (the one unlinked file this process has open in `dir`)
/// in the page cache.
fn swap_cached_pages(dir: &Path) -> usize {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let link = entry.unwrap().path();
        let Ok(target) = std::fs::read_link(&link) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        if target.starts_with(dir.to_str().unwrap()) && target.ends_with(" (deleted)") {
            found.push(File::open(&link).unwrap());
        }
    }
    assert_eq!(
        found.len(),
        1,
        "unlinked files open in {dir:?}: {}",
        found.len()
    );
    let file = &found[0];
    let len = file.metadata().unwrap().len() as usize;
    assert!(len > 0, "the swap file is empty: nothing left for it");
    // SAFETY: a new read-only shared mapping of a file we hold; unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: `vec` has one byte per page of the mapping, which is live.
    let r = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
    // SAFETY: the mapping made above, not used after this.
    unsafe { libc::munmap(map, len) };
    assert_eq!(r, 0);
    vec.iter().filter(|&&b| b & 1 != 0).count()
}

#[test]
fn an_idle_tier_sleeps_and_leaves_nothing_in_the_page_cache() {
    let dir = disk_dir();
    // 24 MiB of data under an 8 MiB budget: half of it does not compress and goes to
    // the swap file, written back every 4 MiB. What was written since the last
    // write-back (whatever the count, unless a multiple of 4 MiB) is in the page cache.
    let region = Region::with_swap_dir(32 * MIB, 8 * MIB, dir.clone());
    for pg in 0..6_000 {
        fill(region.page(pg), pg, 0);
    }
    let stats = region.tier().stats();
    assert!(
        stats.swap_pages > 0,
        "no page went to the swap file: {stats:?}"
    );
    // Quiet from here on (once the last excess has left and the pool is armed): the
    // thread's wake-ups stretch from 100 ms to 3.2 s, 0.1, 0.3, 0.7, 1.5, 3.1, 6.3 s after
    // the first quiet turn. Even if that came 2 s late (a loaded host), 3 fall in the
    // window below.
    std::thread::sleep(Duration::from_millis(3_000));
    let before = sleeps("tier");
    std::thread::sleep(Duration::from_millis(6_400));
    let woke = sleeps("tier") - before;
    // At 100 ms a tick it woke ~64 times in 6.4 s.
    assert!(
        woke <= 5,
        "the idle tier's thread woke {woke} times in 6.4 s"
    );
    // (A handful may be pinned for a moment elsewhere, as in the store's own tests.)
    let cached = swap_cached_pages(&dir);
    assert!(
        cached <= 8,
        "{cached} pages of the swap file stay in the page cache after the tier went quiet"
    );
    // And the data is all there.
    for pg in 0..6_000 {
        assert!(
            common::check(region.page(pg), pg, 0),
            "page {pg} read back wrong"
        );
    }
}
