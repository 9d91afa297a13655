//! pcow benchmarks (run by `make bench-pcow`):
//! 1. open + map build of an image with 1M allocated clusters (goal <= 50 ms);
//! 2. snapshot create (goal <= 1 ms, O(1));
//! 3. `densevm image convert -f raw -O pcow` vs `qemu-img convert -f raw -O qcow2` of the
//!    same data in the same run (needs DENSEVM_BIN and qemu-img).
//!
//! Prints a markdown fragment for docs/benchmarks.md.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use pcow::format::Geometry;
use pcow::{Chain, CreateOptions, FileStorage, OpenOptions, Storage};

#[path = "../examples/support/mod.rs"]
mod support;
use support::{build_big_image, process_cpu, rss_hwm_kib};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let dir = PathBuf::from(
        std::env::var("PCOW_BENCH_DIR").unwrap_or_else(|_| "build/pcow-bench".into()),
    );
    std::fs::create_dir_all(&dir).unwrap();
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("Date: {date}\n");

    // 1. Open + map build, 1M clusters.
    let n = 1u64 << 20;
    let big = dir.join("big-1M.pcow");
    let _ = std::fs::remove_file(&big);
    build_big_image(&big, n);
    let meta_bytes = n.div_ceil(1024) * 65536;
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    let hwm_before = rss_hwm_kib();
    for _ in 0..7 {
        let t = Instant::now();
        let c0 = process_cpu();
        let c = Chain::open(&big, OpenOptions::default()).unwrap();
        assert!(c.lookup(n - 1).is_some());
        times.push(t.elapsed());
        cpu.push(process_cpu() - c0);
    }
    let open_cpu = median(cpu);
    let hwm_after = rss_hwm_kib();
    let open_med = median(times.clone());
    // Peer in the same run: reading the same metadata bytes without parsing.
    let st = FileStorage::open(&big, false).unwrap();
    let mut buf = vec![0u8; 65536];
    let mut raw = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let geo = Geometry::new(16).unwrap();
        for s in 0..n.div_ceil(1024) {
            st.read_at(&mut buf, geo.meta_offset(s)).unwrap();
        }
        raw.push(t.elapsed());
    }
    let raw_med = median(raw);
    // Lookup cost.
    let c = Chain::open(&big, OpenOptions::default()).unwrap();
    let t = Instant::now();
    let mut acc = 0u64;
    for l in 0..n {
        acc = acc.wrapping_add(c.lookup((l * 7919) % n).map_or(0, |x| x.file_offset));
    }
    let lookup_ns = t.elapsed().as_nanos() as f64 / n as f64;
    assert!(acc > 0);
    drop(c);
    // Snapshot create on the 1M-cluster image: O(1), independent of the image size.
    let mut c = Chain::open(
        &big,
        OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut big_snap = Vec::new();
    for i in 0..20 {
        let t = Instant::now();
        c.snapshot_create(&format!("b{i}")).unwrap();
        big_snap.push(t.elapsed());
    }
    let big_snap_med = median(big_snap);
    drop(c);
    if std::env::var("PCOW_BENCH_KEEP").is_err() {
        let _ = std::fs::remove_file(&big);
    }

    // 2. Snapshot create on an image with data.
    let snap = dir.join("snap.pcow");
    let _ = std::fs::remove_file(&snap);
    pcow::create_file(
        &snap,
        &CreateOptions {
            virtual_size: 1 << 30,
            cluster_size: 65536,
            backing: None,
        },
    )
    .unwrap();
    let mut c = Chain::open(
        &snap,
        OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap();
    c.write(0, &vec![0x5a; 16 << 20]).unwrap();
    c.flush().unwrap();
    let mut st_times = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        c.snapshot_create(&format!("s{i}")).unwrap();
        st_times.push(t.elapsed());
    }
    let snap_med = median(st_times.clone());
    let snap_max = *st_times.iter().max().unwrap();
    // Peer: one 4 KiB pwrite + fdatasync on the same file system.
    let peer = dir.join("fsync-peer");
    let f = std::fs::File::create(&peer).unwrap();
    let mut fs_times = Vec::new();
    for i in 0..50u64 {
        use std::os::unix::fs::FileExt;
        let t = Instant::now();
        f.write_all_at(&[1u8; 4096], i * 4096).unwrap();
        f.sync_data().unwrap();
        fs_times.push(t.elapsed());
    }
    let fsync_med = median(fs_times);
    drop(c);
    let _ = std::fs::remove_file(&snap);
    let _ = std::fs::remove_file(&peer);

    println!("| benchmark | result | peer (same run) | goal |");
    println!("|---|---|---|---|");
    println!(
        "| open + map build, 1,048,576 allocated 64 KiB clusters (64 GiB virtual, {} MiB metadata), median of 7 | {:.1} ms wall, {:.1} ms CPU (all threads) | read of the same metadata without parsing: {:.1} ms | ≤ 50 ms |",
        meta_bytes >> 20,
        open_med.as_secs_f64() * 1e3,
        open_cpu.as_secs_f64() * 1e3,
        raw_med.as_secs_f64() * 1e3
    );
    println!(
        "| map memory (VmHWM growth while opening) | {} MiB | — | — |",
        (hwm_after.saturating_sub(hwm_before)) >> 10
    );
    println!("| lookup (random logical cluster, 1M map) | {lookup_ns:.1} ns | — | O(1) |");
    println!(
        "| snapshot create (image with 256 clusters, 50 in a row), median / max | {:.3} ms / {:.3} ms | one 4 KiB pwrite+fdatasync: {:.3} ms | ≤ 1 ms, O(1) |",
        snap_med.as_secs_f64() * 1e3,
        snap_max.as_secs_f64() * 1e3,
        fsync_med.as_secs_f64() * 1e3
    );
    println!(
        "| snapshot create on the 1M-cluster image, median of 20 | {:.3} ms | (same fdatasync peer) | O(1) |",
        big_snap_med.as_secs_f64() * 1e3
    );

    // 3. Convert throughput.
    let Ok(bin) = std::env::var("DENSEVM_BIN") else {
        println!("\n(convert benchmark skipped: DENSEVM_BIN not set; run `make bench-pcow`)");
        return;
    };
    let size_mib = 512u64;
    let raw_path = dir.join("data.raw");
    if std::fs::metadata(&raw_path).map(|m| m.len()).unwrap_or(0) != size_mib << 20 {
        // Incompressible, non-zero data, with a zero hole every 8th MiB.
        let mut data = vec![0u8; (size_mib << 20) as usize];
        let mut x = 0x2545f4914f6cdd1du64;
        for (i, chunk) in data.chunks_mut(8).enumerate() {
            if ((i * 8) >> 20) % 8 == 7 {
                continue;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        std::fs::write(&raw_path, &data).unwrap();
    }
    let run = |cmd: &mut Command| -> Duration {
        let t = Instant::now();
        let st = cmd.status().unwrap_or_else(|e| {
            panic!("cannot run {cmd:?}: {e} (needs DENSEVM_BIN and qemu-img from qemu-utils)")
        });
        assert!(st.success(), "{cmd:?} failed");
        t.elapsed()
    };
    let mut ours = Vec::new();
    let mut qemu = Vec::new();
    for _ in 0..3 {
        let dst = dir.join("out.pcow");
        let _ = std::fs::remove_file(&dst);
        ours.push(run(Command::new(&bin)
            .args(["image", "convert", "-f", "raw", "-O", "pcow"])
            .arg(&raw_path)
            .arg(&dst)));
        let _ = std::fs::remove_file(&dst);
        let q = dir.join("out.qcow2");
        let _ = std::fs::remove_file(&q);
        qemu.push(run(Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&raw_path)
            .arg(&q)));
        let _ = std::fs::remove_file(&q);
    }
    let o = median(ours).as_secs_f64();
    let q = median(qemu).as_secs_f64();
    println!(
        "| convert raw → pcow, {size_mib} MiB (7/8 random, 1/8 zero), median of 3 | {:.0} MiB/s ({:.2} s) | qemu-img convert raw → qcow2: {:.0} MiB/s ({:.2} s); ratio {:.2}x | — |",
        size_mib as f64 / o,
        o,
        size_mib as f64 / q,
        q,
        q / o
    );
}
