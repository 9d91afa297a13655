//! The pre-mapped (staged) expansion pool (`MapOptions::staging`): expansions served by
//! moving staged clusters keep
//! their data across drop and reopen, keep the mapping coalesced, and leave no staging
//! mapping behind (needs userfaultfd: run as root or with access to /dev/userfaultfd).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{assert_clean, create, map_with, open, tmpdir, CLUSTER, MIB};
use densevm_pmem::{MapOptions, PmemRegion};

/// Maps the chain whose top image is `path` with the staged expansion pool on.
fn map_staged(path: &Path) -> PmemRegion {
    map_with(
        path,
        MapOptions {
            staging: true,
            ..MapOptions::default()
        },
    )
}

/// Waits (bounded) until the pool thread has staged clusters, failing if it never does.
fn wait_staged(r: &PmemRegion) {
    let t = Instant::now();
    while r.stats().staged_clusters == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the pool thread staged no cluster within 10 s: {:?}",
            r.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Writes one distinct byte pattern at the start and end of clusters `range`, one cluster
/// after the other (sequential expansion).
fn write_clusters(r: &PmemRegion, range: std::ops::Range<u64>) {
    for l in range {
        let at = r.host_addr() + l * CLUSTER;
        // SAFETY: inside the mapped region, which lives while `r` does.
        unsafe {
            std::ptr::write_volatile(at as *mut u8, l as u8 ^ 0x5a);
            std::ptr::write_volatile((at + CLUSTER - 1) as *mut u8, l as u8 ^ 0xa5);
        }
    }
}

fn check_clusters(path: &Path, range: std::ops::Range<u64>) {
    let c = open(path, false);
    let mut buf = vec![0u8; CLUSTER as usize];
    for l in range {
        c.read(l * CLUSTER, &mut buf).unwrap();
        assert_eq!(buf[0], l as u8 ^ 0x5a, "cluster {l} first byte");
        assert_eq!(
            buf[CLUSTER as usize - 1],
            l as u8 ^ 0xa5,
            "cluster {l} last byte"
        );
        assert!(
            buf[1..CLUSTER as usize - 1].iter().all(|&b| b == 0),
            "cluster {l} not zero between the written bytes"
        );
    }
}

/// Lines of /proc/self/maps that map `path`.
fn mappings_of(path: &Path) -> usize {
    let name = path.to_str().unwrap();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(name))
        .count()
}

#[test]
fn staged_expansions_keep_data_across_drop_and_reopen() {
    let dir = tmpdir("reopen");
    let img = dir.join("a.pcow");
    create(&img, 64 * MIB, None);
    let first = 0..200;
    let second = 300..500;
    for (round, range) in [first.clone(), second.clone()].into_iter().enumerate() {
        let r = map_staged(&img);
        wait_staged(&r);
        write_clusters(&r, range.clone());
        let s = r.stats();
        assert_eq!(
            s.expansions,
            range.end - range.start,
            "round {round}: {s:?}"
        );
        assert!(
            s.staged_hits > 0,
            "round {round}: no expansion used a staged cluster: {s:?}"
        );
        // One file run per contiguous range of slots (plus its neighbouring placeholders):
        // moving staged clusters in must not leave one VMA per cluster.
        let vmas = r.vma_count().unwrap();
        assert!(
            vmas <= 2 * (round + 1) + 1,
            "round {round}: {vmas} VMAs after sequential expansion: {s:?}"
        );
        r.flush().unwrap();
        drop(r);
        assert_eq!(
            mappings_of(&img),
            0,
            "round {round}: staging mappings of the image left after drop"
        );
        check_clusters(&img, first.clone());
        if round == 1 {
            check_clusters(&img, second.clone());
        }
        assert_clean(&img);
    }
}

#[test]
fn staged_and_direct_expansions_mix_under_concurrency() {
    let dir = tmpdir("mix");
    let img = dir.join("a.pcow");
    create(&img, 128 * MIB, None);
    const THREADS: u64 = 4;
    let per = 256;
    {
        let r = map_staged(&img);
        wait_staged(&r);
        // Four threads expand interleaved clusters back to back: more than the staging pool
        // holds, so staged and directly mapped expansions mix.
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let r = &r;
                s.spawn(move || {
                    for i in 0..per {
                        let l = i * THREADS + t;
                        write_clusters(r, l..l + 1);
                    }
                });
            }
        });
        let s = r.stats();
        assert_eq!(s.expansions, THREADS * per, "{s:?}");
        assert!(s.staged_hits > 0, "no staged cluster used: {s:?}");
        r.flush().unwrap();
        let c = r.chain().read();
        assert_eq!(
            c.images()[0].slot_count(),
            THREADS * per,
            "one slot per cluster"
        );
    }
    check_clusters(&img, 0..THREADS * per);
    assert_clean(&img);
}
