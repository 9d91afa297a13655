//! The mapped-file flush path (`pcow::dax`): a chain whose top file is accessed through a
//! shared mapping (MAP_SYNC + cache-line write-back on DAX, msync elsewhere) behaves like the
//! pwrite path: every operation's result reads back the same after reopening with `pread`,
//! and the image checks clean. On a non-DAX file system this exercises the msync mode; on
//! DAX (`PCOW_DAX_DIR=/mnt/dax cargo test -p pcow --test mapped`) the MAP_SYNC mode.

mod common;

use std::path::PathBuf;

use common::*;
use pcow::{create_file, dax, Chain, CreateOptions, OpenOptions};

fn dir() -> PathBuf {
    let base = std::env::var_os("PCOW_DAX_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let d = base.join(format!("pcow-mapped-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn line_flush_and_fence_run_on_mapped_memory() {
    let v = vec![7u8; 4096 + 100];
    // SAFETY: the range is a live allocation.
    unsafe { dax::write_back(dax::line_flush(), v.as_ptr().wrapping_add(3), 4096) };
    dax::fence();
    assert!(v.iter().all(|&b| b == 7));
}

#[test]
fn mapped_top_file_matches_the_pwrite_path() {
    let d = dir();
    let cs = 16384u64;
    let size = 32 * cs;
    let base = d.join("base.pcow");
    let top = d.join("top.pcow");
    let opts = |backing: Option<&str>| CreateOptions {
        virtual_size: size,
        cluster_size: cs,
        backing: backing.map(str::to_string),
    };
    create_file(&base, &opts(None)).unwrap();
    let rw = OpenOptions {
        writable: true,
        ..Default::default()
    };
    let mut want = vec![0u8; size as usize];
    {
        let mut b = Chain::open(&base, rw).unwrap();
        let data = pattern(3, (size / 2) as usize);
        b.write(cs / 2, &data).unwrap();
        b.flush().unwrap();
        want[(cs / 2) as usize..(cs / 2 + size / 2) as usize].copy_from_slice(&data);
    }
    create_file(&top, &opts(Some("base.pcow"))).unwrap();
    let dax_mode;
    {
        let mut c = Chain::open_with(&top, rw, &dax::open_mapped).unwrap();
        dax_mode = std::env::var_os("PCOW_DAX_DIR").is_some();
        for (i, (off, len)) in [(100u64, 9000u64), (5 * cs - 7, cs + 20), (20 * cs, 3 * cs)]
            .into_iter()
            .enumerate()
        {
            let data = pattern(10 + i as u8, len as usize);
            c.write(off, &data).unwrap();
            want[off as usize..(off + len) as usize].copy_from_slice(&data);
        }
        c.snapshot_create("s").unwrap();
        c.discard(2 * cs, cs).unwrap();
        want[(2 * cs) as usize..(3 * cs) as usize].fill(0);
        let a = c.allocate(30, pcow::AllocInit::Zeroed).unwrap();
        assert!(a.newly_allocated);
        c.flush().unwrap();
        c.compact(|_, _| {}).unwrap();
        c.flush().unwrap();
        assert_same(&read_all(&c), &want, "mapped view");
    }
    let c = Chain::open(&top, OpenOptions::default()).unwrap();
    assert_same(&read_all(&c), &want, "reopened with pread");
    assert_eq!(
        c.check().exit_code(),
        0,
        "{:?} (dax: {dax_mode})",
        c.check()
    );
    std::fs::remove_dir_all(&d).unwrap();
}
