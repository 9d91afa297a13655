//! A tier over a base file (how a VM restored with a budget gets its RAM): the RAM file
//! starts empty, each page comes from the base on first access, under the budget, with 8
//! threads at once; the base is never written; discards, snapshots and dissolving see the
//! right bytes; a RAM file that already holds data is refused.

mod common;

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{check, fill, sampled, slack, Region, MIB};
use densevm_tier::PAGE;

/// Pages of the base with data: two in three (every third page is a hole).
fn in_base(pg: u64) -> bool {
    pg % 3 != 0
}

/// A base file of `size` bytes in the temporary directory (unlinked): `fill(pg, 0)` on
/// the pages `in_base` picks, holes elsewhere.
fn base_file(size: u64) -> Arc<File> {
    let file = tempfile();
    file.set_len(size).unwrap();
    let mut page = vec![0u64; 512];
    for pg in (0..size / PAGE).filter(|&p| in_base(p)) {
        fill(&mut page, pg, 0);
        let bytes: Vec<u8> = page.iter().flat_map(|w| w.to_ne_bytes()).collect();
        file.write_all_at(&bytes, pg * PAGE).unwrap();
    }
    (&file).flush().unwrap();
    Arc::new(file)
}

/// A checksum of the whole file.
fn file_sum(file: &File, size: u64) -> u64 {
    let mut buf = vec![0u8; PAGE as usize];
    let mut sum = 0u64;
    for pg in 0..size / PAGE {
        file.read_exact_at(&mut buf, pg * PAGE).unwrap();
        for (i, b) in buf.iter().enumerate() {
            sum = sum.wrapping_mul(31).wrapping_add(*b as u64 ^ i as u64);
        }
    }
    sum
}

fn is_zero(page: &[u64]) -> bool {
    page.iter().all(|&w| w == 0)
}

#[test]
fn eight_threads_read_a_base_under_a_quarter_budget_and_the_base_stays_intact() {
    let (size, budget) = (48 * MIB, 12 * MIB);
    let base = base_file(size);
    let before = file_sum(&base, size);
    let region = Arc::new(Region::with_base(size, budget, base.clone()));
    let s = region.tier().stats();
    assert_eq!(
        s.base_pages,
        (0..size / PAGE).filter(|&p| in_base(p)).count() as u64
    );
    assert_eq!(s.resident, 0, "the RAM file starts empty: {s:?}");
    let bad = Arc::new(AtomicU64::new(0));
    let (s, peak) = sampled(&region, || {
        (0..8u64)
            .map(|t| {
                let (region, bad) = (region.clone(), bad.clone());
                std::thread::spawn(move || {
                    let mine: Vec<u64> = (0..region.pages()).filter(|p| p % 8 == t).collect();
                    let base_ok = |pg: u64, page: &[u64]| {
                        if in_base(pg) {
                            check(page, pg, 0)
                        } else {
                            is_zero(page)
                        }
                    };
                    // Every page reads as the base; then half of them get new data.
                    for &pg in &mine {
                        if !base_ok(pg, region.page(pg)) {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                        if pg % 2 == 0 {
                            fill(region.page(pg), pg, 1);
                        }
                    }
                    // Read back after the budget pushed most of them out.
                    for &pg in &mine {
                        let ok = if pg % 2 == 0 {
                            check(region.page(pg), pg, 1)
                        } else {
                            base_ok(pg, region.page(pg))
                        };
                        if !ok {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect()
    });
    assert_eq!(bad.load(Ordering::Relaxed), 0, "pages read back wrong");
    assert!(s.missing_faults > 0 && s.evicted_compressed > 0, "{s:?}");
    // Pages only read (odd ones) left for nothing: they are in the base, unchanged.
    assert!(s.evicted_clean > 0, "{s:?}");
    assert!(s.base_pages > 0 && s.base_pages <= s.evicted_clean, "{s:?}");
    // Every page with data started in the base: its first access read it from there.
    assert!(s.faults_base > 0, "{s:?}");
    assert!(
        s.faults_base + s.faults_compressed + s.faults_swap <= s.missing_faults,
        "{s:?}"
    );
    assert!(
        peak <= budget + slack(budget),
        "resident peaked at {} KiB over a {} KiB budget",
        peak >> 10,
        budget >> 10
    );
    assert_eq!(file_sum(&base, size), before, "the base file changed");
}

#[test]
fn discards_snapshots_and_dissolving_see_the_base_where_nothing_was_written() {
    let size = 8 * MIB;
    let base = base_file(size);
    let mut region = Region::with_base(size, 4 * MIB, base.clone());
    // Page 1 is written, page 2 discarded (it reads zeros from now on, not the base),
    // page 4 never touched.
    fill(region.page(1), 1, 7);
    region.tier().discard(2 * PAGE, PAGE).unwrap();
    assert!(is_zero(region.page(2)), "a discarded page reads zeros");
    let want = |pg: u64, page: &[u64]| match pg {
        1 => check(page, 1, 7),
        2 => is_zero(page),
        _ if in_base(pg) => check(page, pg, 0),
        _ => is_zero(page),
    };
    let words = |bytes: &[u8]| -> Vec<u64> {
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    };
    // A snapshot: the file's own data, then the tier's pages (the base's among them).
    let out = tempfile();
    {
        let frozen = region.tier().freeze();
        let mut buf = vec![0u8; PAGE as usize];
        for pg in 0..region.pages() {
            if region.file.read_at(&mut buf, pg * PAGE).unwrap() == buf.len()
                && buf.iter().any(|&b| b != 0)
            {
                out.write_all_at(&buf, pg * PAGE).unwrap();
            }
        }
        frozen.write_tiered(&out, 0, size).unwrap();
    }
    out.set_len(size).unwrap();
    let mut buf = vec![0u8; PAGE as usize];
    for pg in 0..size / PAGE {
        out.read_exact_at(&mut buf, pg * PAGE).unwrap();
        assert!(want(pg, &words(&buf)), "snapshot page {pg} is wrong");
    }
    // Dissolving (before a clone): every page is in the RAM file itself afterwards.
    let moved = region.tier.take().unwrap().dissolve().unwrap();
    assert!(moved > 0);
    for pg in 0..size / PAGE {
        region.file.read_exact_at(&mut buf, pg * PAGE).unwrap();
        assert!(want(pg, &words(&buf)), "RAM file page {pg} is wrong");
    }
}

#[test]
fn a_ram_file_with_data_is_refused_over_a_base() {
    let size = 4 * MIB;
    let base = base_file(size);
    // A region started over the base and dissolved holds data: a second tier over the
    // same base on it must refuse.
    let mut region = Region::with_base(size, 2 * MIB, base.clone());
    let _ = region.page(1)[0];
    region.tier.take().unwrap().dissolve().unwrap();
    let e = densevm_tier::Tier::start(
        region.file.clone(),
        vec![densevm_tier::Area {
            offset: 0,
            host_addr: region.addr,
            len: size,
        }],
        densevm_tier::TierConfig {
            budget: 2 * MIB,
            compressed_max: None,
            swap_dir: std::env::temp_dir(),
            base: Some(base),
            swap_readers: 0,
            poll_faults: true,
        },
    )
    .err()
    .expect("a tier over a base started on a RAM file with data");
    assert!(e.to_string().contains("already holds data"), "{e}");
}

/// A new unlinked file in the temporary directory.
fn tempfile() -> File {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("tier-base-{}-{n}", std::process::id()));
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}
