//! Host threads touching a tiered region: data survives eviction under 8 threads, zero
//! pages cost nothing, the budget holds, discards and snapshots see the right bytes.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::{
    check, check_file, eight_threads, fill, sampler, slack, snapshot_copy, wait_within, Region, MIB,
};
use densevm_tier::PAGE;

#[test]
fn eight_threads_keep_their_data_with_a_quarter_budget() {
    let (size, budget) = (64 * MIB, 16 * MIB);
    let region = Arc::new(Region::new(size, budget));
    let run = eight_threads(&region);
    run.check_within(budget);
    let s = run.stats;
    assert!(s.evicted_compressed > 0 && s.evicted_swap > 0, "{s:?}");
    assert!(s.missing_faults > 0, "{s:?}");
    // Every page is read back after leaving: from both stores, never from a base.
    assert!(s.faults_compressed > 0 && s.faults_swap > 0, "{s:?}");
    assert_eq!(s.faults_base, 0, "{s:?}");
    assert!(
        s.faults_compressed + s.faults_swap <= s.missing_faults,
        "{s:?}"
    );
}

#[test]
fn zero_pages_cost_nothing() {
    let (size, budget) = (64 * MIB, 8 * MIB);
    let region = Region::new(size, budget);
    let mut nonzero = 0;
    for pg in 0..region.pages() {
        let p = region.page(pg);
        if pg % 3 == 0 {
            p[7] = 0; // a write of zeros
        }
        nonzero += p.iter().filter(|&&w| w != 0).count();
    }
    // Read everything again after eviction.
    for pg in 0..region.pages() {
        nonzero += region.page(pg).iter().filter(|&&w| w != 0).count();
    }
    let s = region.tier().stats();
    eprintln!("stats: {s:?}");
    assert_eq!(nonzero, 0);
    assert!(s.evicted_zero > 0, "{s:?}");
    assert_eq!((s.compressed_bytes, s.swap_pages), (0, 0), "{s:?}");
    assert!(s.resident <= budget + slack(budget), "{s:?}");
}

#[test]
fn a_lower_budget_moves_pages_out_and_discard_reads_zeros() {
    let (size, budget) = (32 * MIB, 32 * MIB);
    let region = Region::new(size, budget);
    for pg in 0..region.pages() {
        fill(region.page(pg), pg, 1);
    }
    let before = region.tier().stats().resident;
    assert!(before >= 30 * MIB, "resident {before}");
    region.tier().set_budget(4 * MIB);
    wait_within(&region, 4 * MIB, "resident stayed over the lower budget");
    // Give the first half back: tiered data there must not come back.
    region.tier().discard(0, size / 2).unwrap();
    for pg in 0..region.pages() {
        let p = region.page(pg);
        if pg < region.pages() / 2 {
            assert!(
                p.iter().all(|&w| w == 0),
                "page {pg} not zero after discard"
            );
        } else {
            assert!(check(p, pg, 1), "page {pg} lost its data");
        }
    }
    assert!(region.tier().discard(1, PAGE).is_err());
}

#[test]
fn a_frozen_tier_copies_all_data_and_dissolve_puts_it_back() {
    let (size, budget) = (16 * MIB, 4 * MIB);
    let mut region = Region::new(size, budget);
    for pg in 0..region.pages() {
        fill(region.page(pg), pg, 5);
    }
    let (out, tiered) = snapshot_copy(&region);
    assert!(
        tiered >= size - budget - slack(budget),
        "only {tiered} bytes tiered"
    );
    check_file(&out, region.pages(), 5, "snapshot");
    let moved = region.tier.take().unwrap().dissolve().unwrap();
    assert!(moved > 0);
    check_file(&region.file, region.pages(), 5, "the file after dissolve");
    for pg in 0..region.pages() {
        assert!(
            check(region.page(pg), pg, 5),
            "mapped page {pg} wrong after dissolve"
        );
    }
}

/// The tier tracks which pages the file holds by the faults it serves; pages written into
/// the file some other way (here `pwrite`, behind its back) are found again when its count
/// drifts from the file's, and leave like any other under a lower budget, data intact.
#[test]
fn pages_written_behind_the_tiers_back_are_found_and_can_leave() {
    use std::os::unix::fs::FileExt;
    let (size, budget) = (32 * MIB, 32 * MIB);
    let region = Region::new(size, budget);
    let mut words = vec![0u64; 512];
    let mut buf = vec![0u8; PAGE as usize];
    for pg in 0..region.pages() {
        fill(&mut words, pg, 3);
        for (b, w) in buf.chunks_exact_mut(8).zip(&words) {
            b.copy_from_slice(&w.to_ne_bytes());
        }
        region.file.write_all_at(&buf, pg * PAGE).unwrap();
    }
    region.tier().set_budget(4 * MIB);
    wait_within(
        &region,
        4 * MIB,
        "pages written behind the tier's back never left",
    );
    for pg in 0..region.pages() {
        assert!(check(region.page(pg), pg, 3), "page {pg} lost its data");
    }
}

/// A budget cut's excess leaves a step at a time while threads keep faulting: a fault then
/// waits only for as many pages to leave as it may bring in, not for the whole excess, so
/// the threads keep running while it leaves; resident RAM never rises above where the cut
/// found it, the data stays right and the tier ends within the budget.
#[test]
fn threads_keep_running_while_a_budget_cut_takes_effect() {
    let (size, budget) = (128 * MIB, 4 * MIB);
    let region = Arc::new(Region::new(size, size));
    // Three pages in four hold data; the rest are holes, which a touch fills (zeros).
    // Filled in a scattered order: faults walking forward would bring the holes in too.
    let filled = |pg: u64| pg % 4 != 3;
    let pages = region.pages();
    for pg in (0..pages)
        .map(|i| i * 7919 % pages)
        .filter(|&pg| filled(pg))
    {
        fill(region.page(pg), pg, 1);
    }
    let at_cut = region.tier().stats().resident;
    let done = Arc::new(AtomicBool::new(false));
    let peak = sampler(region.clone(), done.clone());
    let bad = Arc::new(AtomicU64::new(0));
    // The cut first (the readers fill holes: started before it, they would add pages
    // under the old budget), then the readers, long before the excess has left.
    let before = region.tier().stats();
    region.tier().set_budget(budget);
    let readers: Vec<_> = (0..4u64)
        .map(|t| {
            let (region, bad, done) = (region.clone(), bad.clone(), done.clone());
            std::thread::spawn(move || {
                // Each thread its own scattered order (no two neighbours: no prefetch).
                let mut pg = t * 977;
                while !done.load(Ordering::Relaxed) {
                    pg = (pg + 7919) % region.pages();
                    let p = region.page(pg);
                    let ok = if filled(pg) {
                        check(p, pg, 1)
                    } else {
                        p.iter().all(|&w| w == 0)
                    };
                    if !ok {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // The missing faults served while the excess was still leaving.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (mut during, mut samples) = (0, 0);
    loop {
        let s = region.tier().stats();
        if s.resident <= budget + slack(budget) {
            break;
        }
        samples += 1;
        during = s.missing_faults - before.missing_faults;
        assert!(std::time::Instant::now() < deadline, "the cut: {s:?}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    done.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let peak = peak.join().unwrap();
    let s = region.tier().stats();
    eprintln!(
        "stats: {s:?}; resident {} KiB at the cut, peak {} KiB; {during} missing faults \
         served while the excess left, {samples} samples of the counters meanwhile",
        at_cut >> 10,
        peak >> 10
    );
    assert_eq!(bad.load(Ordering::Relaxed), 0, "pages read back wrong");
    // Measured: 0 when the first missing fault waited for the whole excess to leave (the
    // others queued behind it); 1,000-2,000 since (also 0 in a third of runs while the
    // counters could not be read during the cut: see `samples`).
    assert!(
        during >= 10,
        "only {during} missing faults were served while the cut's excess left: the \
         faulting threads waited for all of it"
    );
    // The counters answer while the excess leaves (the loop samples them about every
    // millisecond): measured 237-537 samples; 1-9 when the service thread kept the lock
    // for as long as faults kept coming.
    assert!(
        samples >= 50,
        "only {samples} samples of the counters while the cut's excess left: callers wait \
         for the tier's lock until it has all left"
    );
    // The window a fault may bring in (16 pages) is the only give.
    assert!(
        peak <= at_cut + 16 * PAGE,
        "resident rose from {} KiB at the cut to {} KiB while its excess left",
        at_cut >> 10,
        peak >> 10
    );
    assert!(s.resident <= budget + slack(budget), "{s:?}");
}

/// Writes race with evictions: four threads keep incrementing a counter in pages of their
/// own picked at random, 15 of 16 picks in an eighth of their pages (so pages are armed,
/// written again while armed, chosen to leave and brought back, all the time), under a
/// budget of a quarter of the region. Every increment must be there at the end: a write to
/// an armed page is a minor fault the service thread serves, so none can land between an
/// evicted page's read and its punch.
#[test]
fn writes_racing_with_evictions_are_never_lost() {
    use std::time::{Duration, Instant};
    let (size, budget) = (32 * MIB, 8 * MIB);
    let started = Instant::now();
    let region = Arc::new(Region::new(size, budget));
    let pages = region.pages();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let region = region.clone();
            std::thread::spawn(move || {
                let mine: Vec<u64> = (0..pages).filter(|p| p % 4 == t).collect();
                let mut counts = vec![0u64; mine.len()];
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                let until = Instant::now() + Duration::from_secs(3);
                while Instant::now() < until {
                    for _ in 0..1000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let r = (x >> 8) as usize;
                        let i = if x % 16 != 0 {
                            r % (mine.len() / 8)
                        } else {
                            r % mine.len()
                        };
                        let word = region.page(mine[i]).as_mut_ptr();
                        // SAFETY: the page is this thread's alone, mapped for the test's
                        // life; volatile so that every increment is a store to the page.
                        unsafe { word.write_volatile(word.read_volatile() + 1) };
                        counts[i] += 1;
                    }
                }
                let lost = mine
                    .iter()
                    .zip(&counts)
                    .filter(|&(&pg, &n)| region.page(pg)[0] != n)
                    .count();
                (lost, counts.iter().sum::<u64>())
            })
        })
        .collect();
    let (mut lost, mut writes) = (0, 0);
    for t in threads {
        let (l, w) = t.join().unwrap();
        lost += l;
        writes += w;
    }
    let s = region.tier().stats();
    eprintln!("stats: {s:?}; {writes} increments, {lost} pages wrong");
    assert_eq!(
        lost, 0,
        "pages lost increments that raced with their eviction"
    );
    let evicted = s.evicted_zero + s.evicted_compressed + s.evicted_swap;
    assert!(evicted > 10_000, "too few evictions to race with: {s:?}");
    assert!(s.minor_faults > 0, "no armed page was written again: {s:?}");
    // The service thread's CPU, read from its clock while it runs: it served and evicted
    // all along, and one thread cannot have used more CPU than the test's time.
    let cpu = Duration::from_nanos(s.service_cpu_ns);
    assert!(
        cpu > Duration::from_millis(10) && cpu < started.elapsed(),
        "service thread CPU {cpu:?} over {:?}: {s:?}",
        started.elapsed()
    );
}
