//! Swap-file reads by reader threads (`TierConfig::swap_readers`): data survives under
//! 8 threads, and a page whose read is in flight when a discard or a snapshot comes is
//! never installed stale.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{check, check_file, eight_threads, fill, snapshot_copy, wait_within, Region, MIB};
use densevm_tier::PAGE;

/// A xorshift step: the threads' page order.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Threads reading random pages of a region until stopped, counting the pages that
/// `ok(region, page)` says read wrong.
struct Touchers {
    done: Arc<AtomicBool>,
    bad: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Touchers {
    fn start(region: &Arc<Region>, n: u64, ok: fn(&Region, u64) -> bool) -> Touchers {
        let done = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(AtomicU64::new(0));
        let threads = (0..n)
            .map(|t| {
                let (region, done, bad) = (region.clone(), done.clone(), bad.clone());
                std::thread::spawn(move || {
                    let mut x = 0x2545_f491_4f6c_dd1d ^ (t + 1);
                    while !done.load(Ordering::Relaxed) {
                        let pg = next(&mut x) % region.pages();
                        if !ok(&region, pg) {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        Touchers { done, bad, threads }
    }

    /// Stops the threads; how many pages read wrong.
    fn stop(self) -> u64 {
        self.done.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        self.bad.load(Ordering::Relaxed)
    }
}

#[test]
fn eight_threads_keep_their_data_with_readers() {
    let (size, budget) = (64 * MIB, 16 * MIB);
    let region = Arc::new(Region::with_readers(size, budget, 3));
    let run = eight_threads(&region);
    run.check_within(budget);
    let s = run.stats;
    // The readers read most of what came back from the swap file (the rest: pages
    // written since the last write-back, read through the page cache, and prefetches).
    assert!(s.faults_swap > 0, "{s:?}");
    assert!(s.swap_reads_behind > s.faults_swap / 2, "{s:?}");
}

/// Threads read the whole region in random order while the main thread discards its
/// second half, again and again, and fills it anew: reads of pages there are in flight
/// when the discard comes. After each discard the half must read as zeros (a cancelled
/// read installed late would bring the old bytes back), and the first half must always
/// read as written.
#[test]
fn a_discard_cancels_reads_in_flight() {
    let (size, budget) = (32 * MIB, 4 * MIB);
    let region = Arc::new(Region::with_readers(size, budget, 3));
    let pages = region.pages();
    let half = pages / 2;
    for pg in 0..pages {
        fill(region.page(pg), pg, 1);
    }
    wait_within(&region, budget, "resident stayed over the budget");
    // The first half must read as written; the second is only touched (the main thread
    // rewrites it meanwhile).
    let touchers = Touchers::start(&region, 6, |r, pg| {
        if pg < r.pages() / 2 {
            check(r.page(pg), pg, 1)
        } else {
            // SAFETY: a read inside the live mapping.
            unsafe { std::ptr::read_volatile(r.page(pg).as_ptr()) };
            true
        }
    });
    for round in 2..12 {
        std::thread::sleep(Duration::from_millis(100));
        region
            .tier()
            .discard(half * PAGE, (pages - half) * PAGE)
            .unwrap();
        for pg in half..pages {
            let p = region.page(pg);
            assert!(
                p.iter().all(|&w| w == 0),
                "round {round}: page {pg} holds old bytes after the discard: {:?}",
                region.tier().stats()
            );
        }
        for pg in half..pages {
            fill(region.page(pg), pg, round);
        }
    }
    let bad = touchers.stop();
    let s = region.tier().stats();
    eprintln!("stats: {s:?}");
    assert_eq!(bad, 0, "first-half pages read back wrong");
    assert!(s.swap_reads_behind > 0, "{s:?}");
    for pg in half..pages {
        assert!(
            check(region.page(pg), pg, 11),
            "page {pg} lost its last fill"
        );
    }
}

/// A snapshot's copy (`freeze` + `write_tiered`) taken while threads fault pages back
/// through the readers holds every page's data, and the threads read theirs right.
#[test]
fn a_snapshot_during_reads_holds_all_data() {
    let (size, budget) = (16 * MIB, 2 * MIB);
    let region = Arc::new(Region::with_readers(size, budget, 2));
    let pages = region.pages();
    for pg in 0..pages {
        fill(region.page(pg), pg, 5);
    }
    wait_within(&region, budget, "resident stayed over the budget");
    let touchers = Touchers::start(&region, 4, |r, pg| check(r.page(pg), pg, 5));
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        let (out, _) = snapshot_copy(&region);
        check_file(&out, pages, 5, "snapshot");
    }
    let bad = touchers.stop();
    let s = region.tier().stats();
    eprintln!("stats: {s:?}");
    assert_eq!(bad, 0, "pages read back wrong");
    assert!(s.swap_reads_behind > 0, "{s:?}");
}
