//! Process-level tests: host threads fault a mapped pcow chain (needs userfaultfd: run as
//! root or with access to /dev/userfaultfd).

mod common;

use std::sync::Arc;

use common::{
    assert_clean, base_and_top, create, fill, map, open, read_chain, slice, tmpdir, CLUSTER, MIB,
    PAGE,
};
use densevm_pmem::GuestWrite;

#[test]
fn reads_allocate_nothing_and_writes_expand_thinly() {
    let dir = tmpdir("thin");
    let img = dir.join("a.pcow");
    create(&img, 64 * MIB, None);
    let len_before = std::fs::metadata(&img).unwrap().len();
    {
        let r = map(&img);
        let m = slice(&r);
        let sum: u64 = m[..8 * MIB as usize].iter().map(|&b| b as u64).sum();
        assert_eq!(sum, 0, "unallocated space reads as zeros");
        assert!(r.stats().read_faults >= 1);
        for l in 0..128 {
            assert!(r.chain().lookup(l).is_none(), "read allocated cluster {l}");
        }
        m[..MIB as usize].fill(0xab);
        let s = r.stats();
        assert_eq!(
            s.expansions,
            MIB / CLUSTER,
            "one expansion per cluster: {s:?}"
        );
        assert_eq!(s.cow_units, 0);
        // Sequential expansion is adjacent in the file: one VMA for the run (+ placeholders).
        let vmas = r.vma_count().unwrap();
        assert!(vmas <= 3, "{vmas} VMAs for one contiguous run");
        r.flush().unwrap();
    }
    assert_eq!(read_chain(&img, 0, MIB as usize), vec![0xab; MIB as usize]);
    assert_eq!(read_chain(&img, MIB, 4096), vec![0; 4096]);
    assert!(std::fs::metadata(&img).unwrap().len() > len_before);
    assert_clean(&img);
    // Persistence: map again and see the data through the mapping.
    let r = map(&img);
    assert!(slice(&r)[..MIB as usize].iter().all(|&b| b == 0xab));
    assert_eq!(r.stats().expansions, 0);
}

#[test]
fn writes_to_a_snapshot_copy_4k_and_rollback_restores() {
    let dir = tmpdir("snap");
    let img = dir.join("a.pcow");
    create(&img, 16 * MIB, None);
    fill(&img, 2 * MIB, 0x11).snapshot_create("before").unwrap();
    {
        let r = map(&img);
        let m = slice(&r);
        assert!(m[..2 * MIB as usize].iter().all(|&b| b == 0x11));
        m[4096 + 7] = 0x22;
        let s = r.stats();
        assert_eq!((s.cow_faults, s.cow_units), (1, 1), "{s:?}");
        assert_eq!(m[4096 + 7], 0x22);
        assert_eq!(m[4096 + 8], 0x11, "rest of the copied unit kept");
        assert_eq!(m[8192], 0x11);
        m[4096 + 9] = 0x33; // same unit again: no new copy
        assert_eq!(r.stats().cow_units, 1);
        r.flush().unwrap();
    }
    let after = read_chain(&img, 0, 3 * 4096);
    assert_eq!(after[4096 + 7], 0x22);
    assert_eq!(after[4096 + 9], 0x33);
    assert_eq!(after[4096 + 8], 0x11);
    assert_eq!(after[0], 0x11);
    assert_clean(&img);
    // Rollback.
    {
        let mut c = open(&img, true);
        c.snapshot_apply("before").unwrap();
    }
    assert_eq!(read_chain(&img, 0, 3 * 4096), vec![0x11; 3 * 4096]);
    assert_clean(&img);
}

#[test]
fn writes_over_a_base_image_leave_the_base_untouched() {
    let scratch = tmpdir("base");
    let (base, top) = base_and_top(&scratch, 16 * MIB, MIB, 0x44);
    let base_bytes = std::fs::read(&base).unwrap();
    {
        let r = map(&top);
        let m = slice(&r);
        assert_eq!(m[12345], 0x44);
        for page in (0..MIB).step_by(4096 * 3) {
            m[page as usize] = 0x55;
        }
        m[2 * MIB as usize] = 0x66; // unallocated everywhere: expansion
        let s = r.stats();
        assert_eq!(s.cow_units, MIB.div_ceil(3 * 4096), "{s:?}");
        assert_eq!(s.expansions, 1);
        r.flush().unwrap();
    }
    assert_eq!(
        std::fs::read(&base).unwrap(),
        base_bytes,
        "base file changed"
    );
    let data = read_chain(&top, 0, MIB as usize);
    for (i, page) in data.chunks(4096).enumerate() {
        let expect_first = if i % 3 == 0 { 0x55 } else { 0x44 };
        assert_eq!(page[0], expect_first, "page {i}");
        assert!(page[1..].iter().all(|&b| b == 0x44), "page {i}");
    }
    assert_eq!(read_chain(&top, 2 * MIB, 2), vec![0x66, 0]);
    assert_clean(&top);
    assert_clean(&base);
}

#[test]
fn copied_up_pages_leave_the_readonly_ranges() {
    let scratch = tmpdir("readonly-ranges");
    let (base, top) = base_and_top(&scratch, 16 * MIB, MIB, 0x44);
    {
        let r = map(&top);
        assert_eq!(r.lower_layer_ranges(), &[(0, MIB)]);
        let h = r.write_fault_handle();
        assert_eq!(h.readonly_ranges(), vec![(0, MIB)]);
        // A vCPU write (the VMM's exit path) copies page 2 up.
        assert_eq!(
            h.guest_write(2 * PAGE + 8, Some(&[1, 2, 3, 4])).unwrap(),
            GuestWrite::Served
        );
        assert_eq!(
            h.readonly_ranges(),
            vec![(0, 2 * PAGE), (3 * PAGE, MIB - 3 * PAGE)]
        );
        // A second exit on that page finds it writable: the VMM's view is stale.
        assert_eq!(
            h.guest_write(2 * PAGE + 100, Some(&[9])).unwrap(),
            GuestWrite::AlreadyWritable
        );
        assert_eq!(r.stats().guest_writes_already_writable, 1);
        // A host thread's write (SIGSEGV path) copies page 5 up.
        slice(&r)[5 * PAGE as usize] = 0x55;
        assert_eq!(
            h.readonly_ranges(),
            vec![
                (0, 2 * PAGE),
                (3 * PAGE, 2 * PAGE),
                (6 * PAGE, MIB - 6 * PAGE)
            ]
        );
        // The lower-layer ranges of the initial mapping are what the VMM started from.
        assert_eq!(r.lower_layer_ranges(), &[(0, MIB)]);
        for page in (0..MIB).step_by(PAGE as usize) {
            h.guest_write(page, None).unwrap();
        }
        assert_eq!(h.readonly_ranges(), Vec::<(u64, u64)>::new());
        r.flush().unwrap();
    }
    let data = read_chain(&top, 0, MIB as usize);
    let mut expect = vec![0x44u8; MIB as usize];
    expect[2 * PAGE as usize + 8..2 * PAGE as usize + 12].copy_from_slice(&[1, 2, 3, 4]);
    expect[2 * PAGE as usize + 100] = 9;
    expect[5 * PAGE as usize] = 0x55;
    assert!(data == expect, "image content");
    assert_clean(&top);
    assert_clean(&base);
}

#[test]
fn concurrent_faults_allocate_and_copy_exactly_once() {
    let scratch = tmpdir("conc");
    let (_, top) = base_and_top(&scratch, 32 * MIB, 4 * MIB, 0x77);
    const THREADS: u64 = 8;
    let clusters = 8 * MIB / CLUSTER; // half over the base (CoW), half unallocated
    {
        let r = Arc::new(map(&top));
        let addr = r.host_addr();
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                std::thread::spawn(move || {
                    for l in 0..clusters {
                        // Every thread writes its own byte of page 0 (shared page) and its
                        // own page of each cluster.
                        let shared = addr + l * CLUSTER + t;
                        let own = addr + l * CLUSTER + (1 + t) * 4096 + 100;
                        // SAFETY: inside the mapped region.
                        unsafe {
                            std::ptr::write_volatile(shared as *mut u8, 0x80 + t as u8);
                            std::ptr::write_volatile(own as *mut u8, 0x90 + t as u8);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let s = r.stats();
        let lower = 4 * MIB / CLUSTER;
        assert_eq!(s.expansions, clusters - lower, "{s:?}");
        assert_eq!(
            s.cow_units,
            lower * (THREADS + 1),
            "each unit copied once: {s:?}"
        );
        r.flush().unwrap();
        let c = r.chain().read();
        assert_eq!(c.images()[0].slot_count(), clusters, "one slot per cluster");
    }
    let data = read_chain(&top, 0, 8 * MIB as usize);
    for l in 0..clusters as usize {
        let c = &data[l * CLUSTER as usize..(l + 1) * CLUSTER as usize];
        let fill = if (l as u64) < 4 * MIB / CLUSTER {
            0x77
        } else {
            0
        };
        for t in 0..THREADS as usize {
            assert_eq!(c[t], 0x80 + t as u8, "cluster {l} shared page byte {t}");
            let own = (1 + t) * 4096;
            assert_eq!(
                c[own + 100],
                0x90 + t as u8,
                "cluster {l} page of thread {t}"
            );
            assert_eq!(c[own], fill, "cluster {l} page {t} rest");
        }
        assert_eq!(c[THREADS as usize], fill);
    }
    assert_clean(&top);
}
