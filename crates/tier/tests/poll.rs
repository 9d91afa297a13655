//! The service thread's poll for the next fault (`TierConfig::poll_faults`, src/poll.rs):
//! a thread that keeps faulting is served without wake-ups where polling can pay, never
//! with the poll off or where the tier's thread has one CPU, and a tier whose faults
//! stopped stops polling.

mod common;

use std::time::Duration;

use common::{check, fill, Region, MIB};
use densevm_tier::TierStats;

const SIZE: u64 = 32 * MIB;
const BUDGET: u64 = 8 * MIB;

/// Fills the region, then reads pages in a scattered order (most of them out of RAM, half
/// compressed) from this thread for `rounds` passes, checking each; the tier's counters
/// over the reads.
fn fault_a_while(r: &Region, rounds: u64) -> TierStats {
    for pg in 0..r.pages() {
        fill(r.page(pg), pg, 0);
    }
    let before = r.tier().stats();
    let n = r.pages();
    for round in 0..rounds {
        for i in 0..n {
            // A stride coprime with the page count: every page once per pass, no runs
            // for the prefetch to find.
            let pg = (i * 1031 + round * 7) % n;
            assert!(check(r.page(pg), pg, 0), "page {pg} lost its data");
        }
    }
    let after = r.tier().stats();
    TierStats {
        missing_faults: after.missing_faults - before.missing_faults,
        minor_faults: after.minor_faults - before.minor_faults,
        faults_polled: after.faults_polled - before.faults_polled,
        ..after
    }
}

/// Pins the calling thread (and the threads it starts from now on) to its first allowed
/// CPU.
fn pin_to_one_cpu() {
    // SAFETY: a cpu_set_t is a bitmask, for which all zeros is a valid value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of_val(&set);
    // SAFETY: sched_getaffinity fills the set we own, of the size we pass.
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
    // SAFETY: CPU_ISSET only reads the set.
    let first = (0..libc::CPU_SETSIZE as usize)
        .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .expect("a CPU this thread may run on");
    // SAFETY: as above; CPU_ZERO and CPU_SET write the set we own.
    unsafe {
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(first, &mut set);
    }
    // SAFETY: sched_setaffinity reads the set we pass, for this thread only.
    assert_eq!(unsafe { libc::sched_setaffinity(0, size, &set) }, 0);
}

#[test]
fn a_thread_that_keeps_faulting_is_served_while_the_tier_polls_and_the_poll_stops_after() {
    let r = Region::with_poll(SIZE, BUDGET, true);
    let s = fault_a_while(&r, 3);
    assert!(s.missing_faults > 10_000, "too few faults to tell: {s:?}");
    if densevm_tier::polling_possible() {
        // Here a tenth to a half are (the tests of this file run at once, on two CPUs);
        // a host whose faults come further apart than the longest poll (the nested lab's
        // L1 under TCG: none of 24,000) is not one this test may run on.
        assert!(
            s.faults_polled > s.missing_faults / 100,
            "a thread faulting back to back was served without polling: {s:?}"
        );
    } else {
        assert_eq!(s.faults_polled, 0, "polled where it cannot pay: {s:?}");
    }
    assert!(
        s.faults_polled <= s.missing_faults + s.minor_faults,
        "more faults polled than served: {s:?}"
    );
    // With the faults over, the thread sleeps (after at most one window's poll): 300 ms
    // of quiet costs it almost no CPU. A poll that did not stop would cost all 300.
    std::thread::sleep(Duration::from_millis(50));
    let cpu0 = r.tier().stats().service_cpu_ns;
    std::thread::sleep(Duration::from_millis(300));
    let idle_ms = (r.tier().stats().service_cpu_ns - cpu0) as f64 / 1e6;
    assert!(
        idle_ms < 30.0,
        "the tier's thread used {idle_ms:.1} ms of CPU in 300 ms without a fault"
    );
}

#[test]
fn with_the_poll_off_every_fault_wakes_the_tier() {
    let r = Region::with_poll(SIZE, BUDGET, false);
    let s = fault_a_while(&r, 2);
    assert!(s.missing_faults > 10_000, "too few faults to tell: {s:?}");
    assert_eq!(s.faults_polled, 0, "polled with poll_faults off: {s:?}");
}

#[test]
fn a_tier_started_on_one_cpu_does_not_poll() {
    // This test's thread only: the tier's thread inherits its mask.
    pin_to_one_cpu();
    assert!(!densevm_tier::polling_possible());
    let r = Region::with_poll(SIZE, BUDGET, true);
    let s = fault_a_while(&r, 2);
    assert!(s.missing_faults > 10_000, "too few faults to tell: {s:?}");
    assert_eq!(s.faults_polled, 0, "polled on one CPU: {s:?}");
}
