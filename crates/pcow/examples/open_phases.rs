//! Times the phases of opening a large image (development aid, also used under callgrind):
//! `open_phases FILE [ROUNDS]`. If FILE does not exist, an image with 1,048,576 allocated
//! 64 KiB clusters (real metadata, sparse data) is written there first, as in the benchmark.
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pcow::format::{Entry, EntryKind, Geometry};
use pcow::{CreateOptions, FileStorage, Storage};

/// Writes an image with `n` allocated 64 KiB clusters directly (sparse data, real metadata).
fn build_big_image(path: &Path, n: u64) {
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
    for s in 0..n.div_ceil(e) {
        meta.fill(0);
        for j in 0..e.min(n - s * e) {
            let entry = Entry {
                logical: s * e + j,
                epoch: 1,
                kind: EntryKind::Data,
                seq: 1,
                bitmap: geo.full_bitmap(),
            };
            let at = (j * geo.pair_size()) as usize;
            meta[at..at + geo.slot_size as usize].copy_from_slice(&entry.encode(&geo));
        }
        st.write_at(&meta, geo.meta_offset(s)).unwrap();
    }
    st.set_len(geo.data_offset(n - 1) + cs).unwrap();
    st.flush().unwrap();
}

fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|x| x.parse().ok()))
        })
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: open_phases FILE [ROUNDS]");
    let rounds: usize = std::env::args()
        .nth(2)
        .map_or(7, |r| r.parse().expect("ROUNDS is a number"));
    if !Path::new(&path).exists() {
        build_big_image(path.as_ref(), 1 << 20);
    }
    let (mut scan, mut wall, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    let hwm = status_kib("VmHWM:");
    let mut first_rss = 0;
    for round in 0..rounds {
        let rss = status_kib("VmRSS:");
        let (t, c0) = (Instant::now(), cpu_now());
        let st: Arc<dyn pcow::Storage> =
            Arc::new(pcow::FileStorage::open(path.as_ref(), false).unwrap());
        let img = pcow::Image::open(st, false).unwrap();
        scan.push(t.elapsed());
        let c = pcow::Chain::from_images(vec![img], false).unwrap();
        wall.push(t.elapsed());
        cpu.push(cpu_now() - c0);
        assert!(c.lookup(0).is_some());
        if round == 0 {
            first_rss = status_kib("VmRSS:") - rss;
        }
    }
    println!(
        "median of {rounds}: scan {:.1} ms, open + map build {:.1} ms wall, {:.1} ms CPU; \
         VmHWM growth {} MiB; RSS of the first open chain {:.1} MiB",
        median(scan),
        median(wall),
        median(cpu),
        (status_kib("VmHWM:") - hwm) / 1024,
        first_rss as f64 / 1024.0
    );
}
