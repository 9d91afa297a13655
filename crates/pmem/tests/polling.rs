//! The fault round trip with both waiting modes (`MapOptions::spin`): polling (the default)
//! and sleeping at once (`spin = 0`, the SIGSEGV handler sleeps on its futex and must be
//! woken by the service thread), with copy-ups handed to the service thread
//! (`cow_on_faulting_thread: false`) and served in the handler (the default). Host threads copy up pages of a snapshot and expand fresh
//! clusters concurrently; a lost wake-up fails the test after a deadline instead of hanging
//! (needs userfaultfd: run as root or with access to /dev/userfaultfd).

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use common::{assert_clean, create, fill, map_with, read_chain, tmpdir, CLUSTER, MIB, PAGE};
use densevm_pmem::MapOptions;

/// Snapshot holding 0x11 over the first 2 MiB; the rest unallocated.
fn image(dir: &Path) -> PathBuf {
    let img = dir.join("a.pcow");
    create(&img, 8 * MIB, None);
    fill(&img, 2 * MIB, 0x11).snapshot_create("s").unwrap();
    img
}

/// Two threads: one writes one byte into every page of the snapshot's 2 MiB (4 KiB CoW via
/// SIGSEGV), one into every cluster of the next 2 MiB (expansion via userfaultfd).
fn fault_from_threads(spin: Duration, in_handler: bool) {
    let dir = tmpdir(&format!("spin{}-{in_handler}", spin.as_micros()));
    let img = image(&dir);
    let r = map_with(
        &img,
        MapOptions {
            spin,
            cow_on_faulting_thread: in_handler,
            ..MapOptions::default()
        },
    );
    let base = r.host_addr();
    let (tx, rx) = mpsc::channel();
    for (start, step) in [(0, PAGE), (2 * MIB, CLUSTER)] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut off = start;
            while off < start + 2 * MIB {
                // SAFETY: inside the mapped region, which lives until both threads reported.
                unsafe { std::ptr::write_volatile((base + off + 5) as *mut u8, 0x22) };
                off += step;
            }
            tx.send(()).unwrap();
        });
    }
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
            panic!(
                "spin {spin:?}: a faulting thread was not resumed within 60 s (lost wake-up?): {:?}",
                r.stats()
            )
        });
    }
    let s = r.stats();
    assert_eq!(s.cow_units, 2 * MIB / PAGE, "spin {spin:?}: {s:?}");
    assert_eq!(s.expansions, 2 * MIB / CLUSTER, "spin {spin:?}: {s:?}");
    if spin.is_zero() {
        assert_eq!(s.spin_hits, 0, "spin 0 must not poll: {s:?}");
    }
    let in_handler_want = if in_handler { s.segv_faults } else { 0 };
    assert_eq!(s.segv_in_handler, in_handler_want, "{s:?}");
    r.flush().unwrap();
    drop(r);
    let buf = read_chain(&img, 0, 4 * MIB as usize);
    for (i, page) in buf.chunks(PAGE as usize).enumerate() {
        let off = i as u64 * PAGE;
        let (fill, written) = if off < 2 * MIB {
            (0x11, true)
        } else {
            (0, off % CLUSTER == 0)
        };
        let want5 = if written { 0x22 } else { fill };
        assert_eq!(page[5], want5, "spin {spin:?}: page {i} byte 5");
        assert!(
            page[..5].iter().chain(&page[6..]).all(|&b| b == fill),
            "spin {spin:?}: page {i} rest"
        );
    }
    assert_clean(&img);
}

#[test]
fn faults_are_served_when_both_ends_sleep() {
    fault_from_threads(Duration::ZERO, false);
    fault_from_threads(Duration::ZERO, true);
}

#[test]
fn faults_are_served_when_both_ends_poll() {
    fault_from_threads(Duration::from_micros(50), false);
    fault_from_threads(Duration::from_micros(50), true);
}
