//! Per-request cost must not grow with the number of open fids: the same
//! request mix is timed with 1k and with 1M fids held by the session.
//!
//! A hash table stays O(1) but its 1M-entry working set no longer fits in the
//! CPU caches, so a ~2x rise from cache misses is expected. The bound (8x) is
//! generous so a noisy 2-core machine does not flake, yet a linear fid lookup
//! (QEMU's old list) would be >1000x slower at 1M fids and fail it.
//! Each measurement is the best of several rounds.

mod common;

use std::time::Instant;

use common::{Client, TempDir};
use densevm_9p::message::Request;
use densevm_9p::Config;

/// Fids used by the measured mix; far from the filler range.
const PROBE_BASE: u32 = 0xF000_0000;

/// walk(clone) + getattr + read + clunk on fids spread over the table; returns ns/op.
fn measure(c: &mut Client, rounds: usize, ops: u32) -> f64 {
    let mut best = f64::INFINITY;
    let mut frame = Vec::new();
    let mut out = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        for i in 0..ops {
            let fid = PROBE_BASE + i;
            for req in [
                Request::Walk {
                    fid: 1,
                    newfid: fid,
                    names: vec![],
                },
                Request::Getattr { fid, mask: 0x7ff },
                Request::Read {
                    fid: 1,
                    offset: 0,
                    count: 64,
                },
                Request::Clunk { fid },
            ] {
                frame.clear();
                out.clear();
                req.encode(1, &mut frame);
                // The stream transport's order: the reader's non-blocking path first.
                if c.session.handle_nowait(&frame, &mut out).is_none() {
                    c.session.handle(&frame, &mut out);
                }
                assert_eq!(out[4] % 2, 1);
                assert_ne!(out[4], 7, "{} failed", req.name());
            }
        }
        best = best.min(start.elapsed().as_nanos() as f64 / (ops as f64 * 4.0));
    }
    best
}

/// Adds clones of the root until the session holds `n` fids.
fn fill(c: &mut Client, n: usize) {
    let mut frame = Vec::new();
    let mut out = Vec::new();
    let mut next = 1_000_000u32 + c.session.fid_count() as u32;
    while c.session.fid_count() < n {
        frame.clear();
        out.clear();
        Request::Walk {
            fid: 0,
            newfid: next,
            names: vec![],
        }
        .encode(1, &mut frame);
        c.session.handle(&frame, &mut out);
        assert_eq!(out[4], 111, "clone walk must succeed");
        next += 1;
    }
}

#[test]
fn per_op_time_is_flat_from_1k_to_1m_fids() {
    let dir = TempDir::new("scaling");
    std::fs::write(dir.path().join("f"), vec![1u8; 4096]).unwrap();
    let mut c = Client::new(dir.path(), Config::default());
    c.walk_n(0, 1, &["f"]).unwrap();
    c.open(1, 0).ok("open");
    // Warm up, then measure at 1k fids.
    fill(&mut c, 1_000);
    measure(&mut c, 1, 2_000);
    let small = measure(&mut c, 5, 10_000);
    fill(&mut c, 1_000_000);
    assert!(c.session.fid_count() >= 1_000_000);
    let large = measure(&mut c, 5, 10_000);
    let ratio = large / small;
    eprintln!("per-op: {small:.0} ns at 1k fids, {large:.0} ns at 1M fids (ratio {ratio:.2})");
    assert!(
        ratio < 8.0,
        "per-op time grew {ratio:.2}x from 1k to 1M fids ({small:.0} → {large:.0} ns)"
    );
}
