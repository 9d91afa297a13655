//! A region moved onto another chain at the same host address: what a clone template does to
//! its parent's `--pmem` regions (the top image is frozen as the base of an overlay the
//! parent goes on in). Needs userfaultfd, like the other process-level tests.

mod common;

use common::{assert_clean, create, map, read_chain, slice, tmpdir, MIB};
use densevm_pmem::{MapOptions, PmemRegion};
use pcow::SharedChain;

#[test]
fn a_region_remapped_onto_an_overlay_keeps_its_address_and_data_and_writes_only_the_overlay() {
    let dir = tmpdir("remap");
    let top = dir.join("top.pcow");
    create(&top, 16 * MIB, None);
    let r = map(&top);
    let addr = r.host_addr();
    slice(&r)[..2 * MIB as usize].fill(0x5a);
    slice(&r)[3 * MIB as usize] = 0x77;
    r.flush().unwrap();
    drop(r);

    let overlay = dir.join("overlay.pcow");
    create(&overlay, 16 * MIB, Some(top.to_str().unwrap()));
    let chain = pcow::Chain::open(
        &overlay,
        pcow::OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap();
    let r = PmemRegion::map(
        SharedChain::new(chain),
        MapOptions {
            at: Some(addr),
            ..MapOptions::default()
        },
    )
    .unwrap();
    assert_eq!(r.host_addr(), addr);
    let m = slice(&r);
    assert!(m[..2 * MIB as usize].iter().all(|&b| b == 0x5a));
    assert_eq!(m[3 * MIB as usize], 0x77);
    assert_eq!(m[4 * MIB as usize], 0);
    m[4096] = 0x11; // copy-up from the frozen base
    m[5 * MIB as usize] = 0x22; // expansion into a hole
    assert!(r.stats().cow_units >= 1, "{:?}", r.stats());
    r.flush().unwrap();

    // A second mapping at the same, now taken, address is refused, not placed over it.
    let again = PmemRegion::map(
        SharedChain::new(pcow::Chain::open(&top, pcow::OpenOptions::default()).unwrap()),
        MapOptions {
            at: Some(addr),
            ..MapOptions::default()
        },
    );
    assert!(again.is_err(), "mapping over a live region must fail");
    drop(r);

    assert_eq!(
        read_chain(&top, 4096, 1),
        vec![0x5a],
        "the frozen base is unchanged"
    );
    assert_eq!(read_chain(&top, 5 * MIB, 1), vec![0]);
    assert_eq!(read_chain(&overlay, 4096, 2), vec![0x11, 0x5a]);
    assert_eq!(read_chain(&overlay, 5 * MIB, 1), vec![0x22]);
    assert_clean(&top);
    assert_clean(&overlay);
}

#[test]
fn an_unaligned_address_is_refused() {
    let dir = tmpdir("remap-unaligned");
    let img = dir.join("a.pcow");
    create(&img, 4 * MIB, None);
    let r = PmemRegion::map(
        SharedChain::new(pcow::Chain::open(&img, pcow::OpenOptions::default()).unwrap()),
        MapOptions {
            at: Some(0x7000_0000_1000),
            ..MapOptions::default()
        },
    );
    assert!(r.is_err());
}
