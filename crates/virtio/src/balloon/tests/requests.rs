//! The page queues: inflate, deflate and free page reports, normal and hostile.

use super::*;
use crate::balloon::request::{ram_ranges, runs, MAX_PFNS_PER_CHAIN};
use std::time::{Duration, Instant};

const P: u64 = PAGE_SIZE;

fn rig() -> Rig {
    Rig::new(feature::REPORTING, memory(&[(0, 64 * MIB)]))
}

#[test]
fn runs_of_sorted_pfns() {
    let r: Vec<_> = runs(&[1, 2, 3, 7, 9, 10, u32::MAX]).collect();
    assert_eq!(r, [(1, 3), (7, 1), (9, 2), (u32::MAX, 1)]);
    assert_eq!(runs(&[]).count(), 0);
}

#[test]
fn inflate_coalesces_adjacent_pfns_into_ranges() {
    let mut r = rig();
    let head = r.pfns(0, &[10, 11, 12, 20, 13, 5, 5]);
    r.serve(0);
    assert_eq!(
        r.used(0),
        [(u32::from(head), 0)],
        "returned, nothing written"
    );
    assert_eq!(
        r.memory.take(),
        [
            Call::Release(5 * P, P),
            Call::Release(10 * P, 4 * P),
            Call::Release(20 * P, P)
        ],
        "sorted, duplicates once, adjacent pages in one range"
    );
    let c = r.counters();
    assert_eq!((c.pages_inflated, c.inflated_pages), (6, 6));
    assert_eq!(c.bytes_released, 6 * P);
    assert_eq!((c.invalid_pages, c.malformed), (0, 0));
    assert_eq!(
        *r.irq.queues.lock().unwrap(),
        [0],
        "inflate queue interrupt"
    );
}

#[test]
fn deflate_reclaims_and_the_count_never_goes_below_zero() {
    let mut r = rig();
    r.pfns(0, &[1, 2, 3, 4]);
    r.serve(0);
    r.memory.take();
    r.pfns(1, &[3, 2]);
    r.serve(1);
    assert_eq!(r.memory.take(), [Call::Reclaim(2 * P, 2 * P)]);
    assert_eq!(r.used(1).len(), 1);
    let c = r.counters();
    assert_eq!((c.pages_deflated, c.inflated_pages), (2, 2));
    assert_eq!(c.bytes_released, 4 * P, "a reclaim releases nothing");
    // A guest deflating pages it never inflated: counted, the balloon stays at 0.
    r.pfns(1, &[100, 101, 102]);
    r.serve(1);
    assert_eq!(r.counters().inflated_pages, 0);
    assert_eq!(r.counters().pages_deflated, 5);
}

#[test]
fn pfns_outside_ram_or_over_a_hole_are_skipped_and_counted() {
    // RAM: [0, 16 MiB) and [32 MiB, 48 MiB); a hole between, nothing past 48 MiB.
    let mut r = Rig::new(0, memory(&[(0, 16 * MIB), (32 * MIB, 16 * MIB)]));
    let last = (16 * MIB / P) as u32 - 1;
    let hole = (20 * MIB / P) as u32;
    let second = (32 * MIB / P) as u32;
    r.pfns(
        0,
        &[last, last + 1, last + 2, hole, second, u32::MAX, 0x100_0000],
    );
    r.serve(0);
    assert_eq!(
        r.memory.take(),
        [
            Call::Release(u64::from(last) * P, P),
            Call::Release(32 * MIB, P)
        ]
    );
    let c = r.counters();
    assert_eq!(
        c.invalid_pages, 5,
        "two past the first region, the hole, two past the end"
    );
    assert_eq!(c.inflated_pages, 2);
    assert_eq!(r.used(0).len(), 1, "the chain still comes back");
}

#[test]
fn a_run_across_two_regions_is_split_at_the_boundary() {
    let mut r = Rig::new(0, memory(&[(0, 16 * MIB), (16 * MIB, 16 * MIB)]));
    let b = (16 * MIB / P) as u32;
    r.pfns(0, &[b - 2, b - 1, b, b + 1]);
    r.serve(0);
    assert_eq!(
        r.memory.take(),
        [
            Call::Release(16 * MIB - 2 * P, 2 * P),
            Call::Release(16 * MIB, 2 * P)
        ],
        "each range inside one region"
    );
}

#[test]
fn ram_ranges_trims_partial_pages_and_wrapping_ranges() {
    let mem = memory(&[(0, 16 * MIB)]);
    let mut got = Vec::new();
    let skipped = ram_ranges(&mem, 0x1800, 0x3000, |a, l| got.push((a, l)));
    assert_eq!(got, [(0x2000, 0x2000)], "the two whole pages inside");
    assert_eq!(skipped, 0x1000, "half a page at each end");
    got.clear();
    let skipped = ram_ranges(&mem, u64::MAX - 0xfff, 0x10000, |a, l| got.push((a, l)));
    assert!(got.is_empty());
    assert_eq!(
        skipped, 0x10000,
        "past the end of the address space: all skipped"
    );
}

#[test]
fn hostile_page_chains_are_bounded_and_counted() {
    let mut r = rig();
    let q = 0;
    // One 1 MiB buffer of PFNs (262,144): only the first MAX_PFNS_PER_CHAIN are read.
    let big: Vec<u32> = (0..(MIB / 4) as u32).collect();
    r.pfns(q, &big);
    r.serve(q);
    let c = r.counters();
    assert_eq!(c.pages_inflated, MAX_PFNS_PER_CHAIN as u64);
    assert_eq!(c.malformed, 1);
    assert_eq!(
        r.memory.take(),
        [Call::Release(0, MAX_PFNS_PER_CHAIN as u64 * P)],
        "one range"
    );
    // A writable buffer (skipped), a 6-byte buffer (one PFN, the rest ignored), a buffer
    // outside guest memory (skipped), in one chain.
    let mq = &mut r.queues[q];
    let a = mq.alloc(16);
    mq.write(a, &[7, 0, 0, 0, 0xff, 0xff]);
    let w = mq.alloc(16);
    mq.write(w, &8u32.to_le_bytes());
    let head = mq.add_chain(&[(w, 4, true), (a, 6, false), (1 << 40, 8, false)]);
    r.serve(q);
    assert_eq!(r.memory.take(), [Call::Release(7 * P, P)]);
    assert_eq!(r.counters().malformed, 4);
    assert_eq!(r.used(q).last(), Some(&(u32::from(head), 0)));
    // An empty chain and a zero-length buffer: nothing happens, the chain comes back.
    let z = r.queues[q].alloc(4);
    r.queues[q].add_chain(&[(z, 0, false)]);
    r.serve(q);
    assert!(r.memory.take().is_empty());
    assert_eq!(r.used(q).len(), 3);
}

#[test]
fn release_errors_are_counted_and_the_guest_goes_on() {
    let mut r = rig();
    r.memory.fail.store(true, Ordering::SeqCst);
    r.pfns(0, &[1, 3]);
    r.serve(0);
    let c = r.counters();
    assert_eq!(c.release_errors, 2);
    assert_eq!(c.bytes_released, 0);
    assert_eq!(c.inflated_pages, 2, "the guest's balloon holds them anyway");
    assert_eq!(r.used(0).len(), 1);
}

/// Publishes a report chain of `(addr, len, writable)` buffers on the reporting queue.
fn report(r: &mut Rig, bufs: &[(u64, u32, bool)]) -> u16 {
    let q = r.layout.reporting.unwrap();
    r.queues[q].add_chain(bufs)
}

#[test]
fn reporting_releases_each_block_and_returns_the_chain_empty() {
    let mut r = rig();
    let q = r.layout.reporting.unwrap();
    assert_eq!(q, 2, "reporting without statistics is queue 2");
    let head = report(
        &mut r,
        &[
            (16 * MIB, 4 << 20, true),
            (24 * MIB, 2 << 20, true),
            (40 * MIB, 4096, true),
        ],
    );
    r.serve(q);
    assert_eq!(
        r.memory.take(),
        [
            Call::Release(16 * MIB, 4 * MIB),
            Call::Release(24 * MIB, 2 * MIB),
            Call::Release(40 * MIB, P)
        ]
    );
    assert_eq!(r.used(q), [(u32::from(head), 0)]);
    let c = r.counters();
    assert_eq!(c.pages_reported, (6 * MIB + P) / P);
    assert_eq!(c.bytes_released, 6 * MIB + P);
    assert_eq!(c.inflated_pages, 0, "reports are not the balloon");
    assert_eq!(*r.irq.queues.lock().unwrap(), [2]);
}

#[test]
fn readable_empty_misaligned_and_outside_reports_are_refused_or_trimmed() {
    let mut r = rig();
    let q = r.layout.reporting.unwrap();
    report(
        &mut r,
        &[
            (16 * MIB, 4096, false),   // readable: not a report
            (17 * MIB, 0, true),       // empty
            (0x1800, 0x3000, true),    // misaligned: only the pages inside
            (63 * MIB, 2 << 20, true), // half beyond the end of RAM
            (1 << 40, 4 << 20, true),  // nowhere
        ],
    );
    r.serve(q);
    assert_eq!(
        r.memory.take(),
        [Call::Release(0x2000, 2 * P), Call::Release(63 * MIB, MIB)]
    );
    let c = r.counters();
    assert_eq!(c.malformed, 3);
    assert_eq!(c.invalid_pages, (MIB + 4 * MIB) / P);
    assert_eq!(r.used(q).len(), 1);
}

#[test]
fn a_full_batch_of_32_order_10_reports_is_served_quickly() {
    let mut r = Rig::new(feature::REPORTING, memory(&[(0, 160 * MIB)]));
    let q = r.layout.reporting.unwrap();
    let bufs: Vec<(u64, u32, bool)> = (0..32)
        .map(|i| (16 * MIB + i * 4 * MIB, 4 << 20, true))
        .collect();
    report(&mut r, &bufs);
    let t = Instant::now();
    r.serve(q);
    let took = t.elapsed();
    assert_eq!(r.memory.take().len(), 32);
    assert_eq!(r.counters().bytes_released, 128 * MIB);
    assert!(took < Duration::from_millis(50), "32 reports took {took:?}");
}

#[test]
fn a_corrupt_ring_stops_the_device_and_asks_for_a_reset() {
    let mut r = rig();
    r.queues[0].set_avail_idx(1000);
    r.serve(0);
    assert!(r.handler.is_broken());
    assert_eq!(r.irq.resets.load(Ordering::SeqCst), 1);
    r.pfns(1, &[1]);
    r.serve(1);
    assert!(r.memory.take().is_empty(), "a broken device serves nothing");
}
