//! Times the phases of opening a large image (development aid, also used under callgrind):
//! `open_phases FILE [ROUNDS]`. If FILE does not exist, an image with 1,048,576 allocated
//! 64 KiB clusters (real metadata, sparse data) is written there first, as in the benchmark.
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;
use support::{build_big_image, process_cpu, status_kib};

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
        let (t, c0) = (Instant::now(), process_cpu());
        let st: Arc<dyn pcow::Storage> =
            Arc::new(pcow::FileStorage::open(path.as_ref(), false).unwrap());
        let img = pcow::Image::open(st, false).unwrap();
        scan.push(t.elapsed());
        let c = pcow::Chain::from_images(vec![img], false).unwrap();
        wall.push(t.elapsed());
        cpu.push(process_cpu() - c0);
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
