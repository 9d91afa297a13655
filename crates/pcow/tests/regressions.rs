//! The prototype's data-loss bugs, each as a test, plus a corrupted-image corpus
//! (open/check must return errors, never panic or hang) and concurrent allocation.

mod common;

use std::sync::Arc;

use common::*;
use pcow::{AllocInit, Chain, CreateOptions, Image, MemStorage, OpenOptions, SharedChain, Storage};

const CS: u64 = 65536;

#[test]
fn partially_copied_cluster_reads_lower_units_after_reopen() {
    let base = mem("base");
    create_in(base.clone(), CS, 4 * CS, None);
    let base_data = pattern(3, (4 * CS) as usize);
    let mut b = open_chain(std::slice::from_ref(&base)).unwrap();
    b.write(0, &base_data).unwrap();
    b.flush().unwrap();
    drop(b);
    let top = mem("top");
    create_in(top.clone(), CS, 4 * CS, Some(&base));
    let files = vec![top, base];
    let mut c = open_chain(&files).unwrap();
    // Copy-on-write of one 4 KiB unit of cluster 1 only.
    c.write(CS + 8192, &[0xEE; 4096]).unwrap();
    c.flush().unwrap();
    drop(c);
    let c = open_chain(&files).unwrap();
    let mut want = base_data.clone();
    want[(CS + 8192) as usize..(CS + 12288) as usize].fill(0xEE);
    assert_same(&read_all(&c), &want, "after reopen");
    let loc = c.lookup(1).unwrap();
    assert_eq!(loc.bitmap[0], 0b100, "only unit 2 is held by the top");
}

#[test]
fn metadata_beyond_511_mib_and_4_gib() {
    // 2 MiB clusters: one segment spans 16 GiB, so the second meta cluster is far beyond
    // 4 GiB (the prototype overflowed a 32-bit offset at ~511 MiB).
    let cs = 2 << 20;
    let s = mem("big");
    create_in(s.clone(), cs, 1 << 45, None);
    let mut c = open_chain(std::slice::from_ref(&s)).unwrap();
    let per_meta = c.geometry().entries_per_meta;
    let n = per_meta + 3;
    for i in 0..n {
        c.write(i * cs * 7, &i.to_le_bytes()).unwrap();
    }
    c.flush().unwrap();
    assert!(s.len().unwrap() > 16 << 30, "file reaches past 16 GiB");
    drop(c);
    let c = open_chain(std::slice::from_ref(&s)).unwrap();
    for i in [0, 1, per_meta - 1, per_meta, per_meta + 2] {
        let mut b = [0u8; 8];
        c.read(i * cs * 7, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i, "cluster {i}");
    }
    assert!(c.check().corruptions.is_empty());
}

#[test]
fn base_chain_of_depth_four_on_files() {
    let dir = std::env::temp_dir().join(format!("pcow-chain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut want = vec![0u8; (8 * CS) as usize];
    let mut prev: Option<String> = None;
    for level in 0..4u64 {
        let name = format!("l{level}.pcow");
        let opts = CreateOptions {
            virtual_size: 8 * CS,
            cluster_size: CS,
            backing: prev.clone(),
        };
        pcow::create_file(&dir.join(&name), &opts).unwrap();
        let mut c = Chain::open(
            &dir.join(&name),
            OpenOptions {
                writable: true,
                ..Default::default()
            },
        )
        .unwrap();
        let data = pattern(level as u8 + 1, 5000);
        let off = level * CS + level * 100;
        c.write(off, &data).unwrap();
        c.flush().unwrap();
        want[off as usize..off as usize + 5000].copy_from_slice(&data);
        prev = Some(name);
    }
    let c = Chain::open(&dir.join("l3.pcow"), OpenOptions::default()).unwrap();
    assert_eq!(c.images().len(), 4);
    assert_same(&read_all(&c), &want, "depth-4 chain");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reads_of_unallocated_ranges_do_not_allocate() {
    let s = mem("t");
    create_in(s.clone(), CS, 16 * CS, None);
    let c = open_chain(std::slice::from_ref(&s)).unwrap();
    let len_before = s.len().unwrap();
    let mut buf = vec![1u8; (16 * CS) as usize];
    c.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    assert_eq!(s.len().unwrap(), len_before);
    assert!(c.lookup(3).is_none());
    drop(c);
    let c = open_chain(std::slice::from_ref(&s)).unwrap();
    assert_eq!(c.check().allocated_clusters, 0);
}

#[test]
fn clean_close_keeps_metadata_intact() {
    // The prototype corrupted metadata on clean shutdown (`|=` for `&=`).
    let s = mem("t");
    create_in(s.clone(), 16384, 64 * 16384, None);
    let mut c = open_chain(std::slice::from_ref(&s)).unwrap();
    for i in 0..64u64 {
        c.write(i * 16384 + i, &[i as u8 + 1; 300]).unwrap();
    }
    c.flush().unwrap();
    let before = read_all(&c);
    drop(c);
    for _ in 0..3 {
        let c = open_chain(std::slice::from_ref(&s)).unwrap();
        let r = c.check();
        assert_eq!(r.exit_code(), 0, "{:?} {:?}", r.corruptions, r.leaks);
        assert_same(&read_all(&c), &before, "reopen");
    }
}

#[test]
fn concurrent_allocation_happens_exactly_once_and_is_adjacent() {
    let s = mem("t");
    create_in(s.clone(), CS, 256 * CS, None);
    let shared = SharedChain::new(open_chain(std::slice::from_ref(&s)).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let sh = shared.clone();
            std::thread::spawn(move || {
                let mut newly = 0;
                for l in 0..256 {
                    if sh.allocate(l, AllocInit::Zeroed).unwrap().newly_allocated {
                        newly += 1;
                    }
                }
                newly
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, 256, "each cluster allocated exactly once");
    shared.sync().unwrap();
    let c = shared.read();
    let mut offsets: Vec<u64> = (0..256).map(|l| c.lookup(l).unwrap().file_offset).collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), 256, "distinct clusters");
    let adjacent = offsets.windows(2).filter(|w| w[1] - w[0] == CS).count();
    assert!(
        adjacent >= 250,
        "allocations are mostly adjacent: {adjacent}/255"
    );
}

/// Builds a small valid image with snapshots and returns its bytes.
fn sample_image() -> Vec<u8> {
    let s = MemStorage::new("sample");
    create_in(Arc::new(s.clone()), 4096, 64 * 4096, None);
    let st: Arc<dyn Storage> = Arc::new(s.clone());
    let mut c = open_chain(&[st]).unwrap();
    c.write(1000, &pattern(1, 20000)).unwrap();
    c.snapshot_create("a").unwrap();
    c.write(50000, &pattern(2, 9000)).unwrap();
    c.discard(0, 4096).unwrap();
    c.flush().unwrap();
    s.to_bytes()
}

fn try_open_and_check(bytes: &[u8]) {
    let st: Arc<dyn Storage> = Arc::new(MemStorage::from_bytes("corrupt", bytes));
    if let Ok(img) = Image::open(st.clone(), false) {
        let _ = pcow::check::check_image(&img);
        if let Ok(c) = Chain::from_images(vec![img], true) {
            let _ = c.check();
            let mut buf = vec![0u8; 4096];
            for l in 0..c.virtual_clusters().min(64) {
                let _ = c.read(
                    l * c.cluster_size(),
                    &mut buf[..c.cluster_size().min(4096) as usize],
                );
            }
        }
    }
    if let Ok(img) = Image::open(st, true) {
        if let Ok(mut c) = Chain::from_images(vec![img], true) {
            let _ = c.repair();
        }
    }
}

#[test]
fn corrupted_image_corpus_never_panics() {
    let good = sample_image();
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Truncations.
    for cut in [
        0,
        7,
        100,
        2047,
        2048,
        4095,
        4096,
        4097,
        8191,
        8192,
        good.len() / 2,
    ] {
        try_open_and_check(&good[..cut.min(good.len())]);
    }
    // Single-byte and multi-byte corruption of headers, entries and records.
    for _ in 0..3000 {
        let mut b = good.clone();
        let hot = next() % 3;
        let pos = match hot {
            0 => (next() % 4096) as usize,
            1 => 8192 + (next() % 4096) as usize,
            _ => (next() % b.len() as u64) as usize,
        };
        let n = 1 + (next() % 8) as usize;
        for i in 0..n {
            if pos + i < b.len() {
                b[pos + i] = next() as u8;
            }
        }
        try_open_and_check(&b);
    }
    // Both headers valid but with absurd fields (huge virtual size / bad epochs).
    let mut h = Image::open(Arc::new(MemStorage::from_bytes("x", &good)), false)
        .unwrap()
        .header()
        .clone();
    h.virtual_size = 1 << 50;
    h.current_parent = h.next_epoch - 1;
    let mut b = good.clone();
    b[..2048].copy_from_slice(&h.encode());
    b[2048..4096].copy_from_slice(&h.encode());
    try_open_and_check(&b);
    // A corrupted entry is reported as corruption and makes a normal open fail.
    let mut b = good.clone();
    for x in &mut b[4096..4096 + 64] {
        *x ^= 0x5a;
    }
    let st: Arc<dyn Storage> = Arc::new(MemStorage::from_bytes("c", &b));
    let err = open_chain(std::slice::from_ref(&st))
        .err()
        .expect("open must fail");
    assert!(err.to_string().contains("no valid copy"), "{err}");
    let img = Image::open(st.clone(), true).unwrap();
    assert_eq!(pcow::check::check_image(&img).exit_code(), 2);
    let mut c = Chain::from_images(vec![img], true).unwrap();
    c.repair().unwrap();
    drop(c);
    let c = open_chain(std::slice::from_ref(&st)).unwrap();
    assert!(c.check().corruptions.is_empty());
    // Garbage that is not a pcow image at all.
    let err = Image::open(Arc::new(MemStorage::from_bytes("g", &[0xAB; 10000])), false)
        .err()
        .expect("not an image");
    assert!(err.to_string().contains("not a pcow image"), "{err}");
}

#[test]
fn parallel_scan_of_many_segments_matches_writes() {
    // 4 KiB clusters: 64 entries per meta cluster, so 5000 clusters span 79 segments
    // (the scan is split over threads above 64 segments).
    let s = mem("many");
    let n = 5000u64;
    create_in(s.clone(), 4096, n * 4096, None);
    let mut c = open_chain(std::slice::from_ref(&s)).unwrap();
    for l in 0..n {
        c.write(((l * 37) % n) * 4096 + 5, &(l as u32).to_le_bytes())
            .unwrap();
    }
    c.flush().unwrap();
    drop(c);
    let c = open_chain(std::slice::from_ref(&s)).unwrap();
    for l in 0..n {
        let mut b = [0u8; 4];
        c.read(((l * 37) % n) * 4096 + 5, &mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), l as u32);
    }
    assert_eq!(c.check().exit_code(), 0);
}

#[test]
fn vectored_write_with_two_parts_in_one_cluster_keeps_both() {
    let base = mem("base");
    create_in(base.clone(), CS, 2 * CS, None);
    let mut b = open_chain(std::slice::from_ref(&base)).unwrap();
    b.write(0, &pattern(9, (2 * CS) as usize)).unwrap();
    b.flush().unwrap();
    drop(b);
    let top = mem("top");
    create_in(top.clone(), CS, 2 * CS, Some(&base));
    let files = vec![top, base];
    let mut c = open_chain(&files).unwrap();
    let mut want = read_all(&c);
    let (p1, p2) = (pattern(1, 100), pattern(2, 5000));
    c.write_vectored(&[(10, &p1), (4000, &p2)]).unwrap();
    c.flush().unwrap();
    want[10..110].copy_from_slice(&p1);
    want[4000..9000].copy_from_slice(&p2);
    assert_same(&read_all(&c), &want, "vectored write");
    drop(c);
    assert_same(
        &read_all(&open_chain(&files).unwrap()),
        &want,
        "after reopen",
    );
}

#[test]
fn safe_rebase_onto_another_base_keeps_the_view() {
    let a = mem("a");
    let b = mem("b");
    for (s, seed) in [(&a, 1u8), (&b, 2u8)] {
        create_in(s.clone(), 16384, 8 * 16384, None);
        let mut c = open_chain(std::slice::from_ref(s)).unwrap();
        c.write(0, &pattern(seed, 6 * 16384)).unwrap();
        c.discard(16384, 16384).unwrap();
        c.flush().unwrap();
    }
    let top = mem("top");
    create_in(top.clone(), 16384, 8 * 16384, Some(&a));
    let mut c = open_chain(&[top.clone(), a.clone()]).unwrap();
    c.write(5000, &pattern(7, 3000)).unwrap();
    c.discard(3 * 16384, 16384).unwrap();
    c.flush().unwrap();
    let want = read_all(&c);
    let nb = open_chain(std::slice::from_ref(&b)).unwrap();
    c.rebase(Some(("b", nb)), false, |_, _| {}).unwrap();
    assert_same(&read_all(&c), &want, "after rebase");
    drop(c);
    let c = open_chain(&[top.clone(), b.clone()]).unwrap();
    assert_same(&read_all(&c), &want, "reopened on the new base");
    assert_eq!(c.images()[0].header().backing_name, "b");
    // The old base no longer matches the recorded identity.
    assert!(open_chain(&[top, a]).is_err());
}

/// Allocations keep the file long enough to map every allocated cluster, also after a
/// compaction shrinks the file under the same open chain (the chain remembers how long the
/// file is known to be, and must not trust that after a truncation).
#[test]
fn allocations_after_compaction_extend_the_file_again() {
    let top = mem("top");
    create_in(top.clone(), CS, 256 * CS, None);
    let mut c = open_chain(std::slice::from_ref(&top)).unwrap();
    let covered = |c: &Chain, top: &Arc<dyn Storage>, slot: u64| {
        let end = c.images()[0].geometry().data_offset(slot) + CS;
        assert!(top.len().unwrap() >= end, "slot {slot} ends past the file");
    };
    for logical in 0..8 {
        let a = c.allocate(logical, AllocInit::Zeroed).unwrap();
        covered(&c, &top, a.slot);
    }
    c.flush().unwrap();
    for logical in 0..8 {
        c.discard(logical * CS, CS).unwrap();
    }
    c.flush().unwrap();
    c.compact(|_, _| {}).unwrap();
    for logical in 100..140 {
        let a = c.allocate(logical, AllocInit::Zeroed).unwrap();
        covered(&c, &top, a.slot);
    }
}
