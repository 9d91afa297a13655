//! Shared by the pcow benchmark and the `open_phases` example (`mod support;` here,
//! `#[path]` from benches/): the 1M-cluster test image and process measurements.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use pcow::format::{Entry, EntryKind, Geometry};
use pcow::{CreateOptions, FileStorage, Storage};

/// Writes an image with `n` allocated 64 KiB clusters directly (sparse data, real metadata).
pub fn build_big_image(path: &Path, n: u64) {
    let cs = 64 << 10;
    pcow::create_file(
        path,
        &CreateOptions {
            virtual_size: n * cs,
            cluster_size: cs,
            backing: None,
        },
    )
    .unwrap();
    let st = FileStorage::open(path, true).unwrap();
    let geo = Geometry::new(16).unwrap();
    let e = geo.entries_per_meta;
    let mut meta = vec![0u8; cs as usize];
    let full = geo.full_bitmap();
    let segments = n.div_ceil(e);
    for s in 0..segments {
        meta.fill(0);
        for j in 0..e {
            let slot = s * e + j;
            if slot >= n {
                break;
            }
            let entry = Entry {
                logical: slot,
                epoch: 1,
                kind: EntryKind::Data,
                seq: 1,
                bitmap: full.clone(),
            };
            let at = (j * geo.pair_size()) as usize;
            meta[at..at + geo.slot_size as usize].copy_from_slice(&entry.encode(&geo));
        }
        st.write_at(&meta, geo.meta_offset(s)).unwrap();
    }
    st.set_len(geo.data_offset(n - 1) + cs).unwrap();
    st.flush().unwrap();
}

/// CPU time of the whole process so far.
pub fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A `kB` field of /proc/self/status (e.g. `"VmRSS:"`), 0 if unreadable.
pub fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|x| x.parse().ok()))
        })
        .unwrap_or(0)
}

/// Peak resident memory (VmHWM) of the process in KiB.
pub fn rss_hwm_kib() -> u64 {
    status_kib("VmHWM:")
}
