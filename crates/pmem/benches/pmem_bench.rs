//! `make bench-pmem`: fault latencies of a mapped pcow region against peers measured in the
//! same run (plain MAP_SHARED file, anonymous memory, the kernel's MAP_PRIVATE CoW, qcow2 CoW
//! through `qemu-io`), start-up of a 64 GiB / 1M-cluster image, VMA counts, and (with
//! `DENSEVM_BIN` set) the same operations from the probe guest on /dev/kvm.
//! Prints a markdown table on stdout.

use std::fs::OpenOptions as FsOpen;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/profile.rs"]
mod profile;

use common::{create, fill, map, map_with, open, tmpdir, CLUSTER, MIB, PAGE};
use densevm_pmem::{MapOptions, PmemRegion};
use pcow::SharedChain;

/// Touches one byte every `stride` bytes of `[addr, addr+len)`; returns µs per touch.
fn touch(addr: u64, len: u64, stride: u64, write: bool) -> f64 {
    let t = Instant::now();
    let mut sum = 0u64;
    let mut off = 0;
    while off < len {
        let p = (addr + off) as *mut u8;
        // SAFETY: callers pass ranges of live mappings.
        unsafe {
            if write {
                std::ptr::write_volatile(p, 1);
            } else {
                sum += std::ptr::read_volatile(p) as u64;
            }
        }
        off += stride;
    }
    std::hint::black_box(sum);
    t.elapsed().as_secs_f64() * 1e6 / (len / stride) as f64
}

/// Writes one byte every `stride` bytes of `[addr, addr+len)`, timing each store; returns
/// the µs of each.
fn stores(addr: u64, len: u64, stride: u64) -> Vec<f64> {
    let mut out = Vec::with_capacity((len / stride) as usize);
    let mut off = 0;
    while off < len {
        let t = Instant::now();
        // SAFETY: callers pass ranges of live mappings.
        unsafe { std::ptr::write_volatile((addr + off) as *mut u8, 1) };
        out.push(t.elapsed().as_secs_f64() * 1e6);
        off += stride;
    }
    out
}

/// Mean and median of per-store µs.
#[derive(Clone, Copy, Default)]
struct Lat {
    mean: f64,
    median: f64,
}

fn lat(mut v: Vec<f64>) -> Lat {
    if v.is_empty() {
        return Lat::default();
    }
    v.sort_by(f64::total_cmp);
    Lat {
        mean: v.iter().sum::<f64>() / v.len() as f64,
        median: v[v.len() / 2],
    }
}

/// "mean X µs / median Y µs".
fn mm(l: Lat) -> String {
    format!("{:.2} / {:.2} µs", l.mean, l.median)
}

fn mmap(len: u64, prot: i32, flags: i32, fd: i32) -> u64 {
    // SAFETY: a fresh mapping (no MAP_FIXED).
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len as usize, prot, flags, fd, 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p as u64
}

fn munmap(addr: u64, len: u64) {
    // SAFETY: unmapping a mapping made by `mmap` above.
    unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
}

fn data_file(path: &Path, len: u64, byte: u8) -> std::fs::File {
    let f = FsOpen::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all_at(&vec![byte; len as usize], 0).unwrap();
    f.sync_all().unwrap();
    f
}

fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct Table(Vec<(String, String, String)>);
impl Table {
    fn row(&mut self, what: &str, value: String, note: &str) {
        self.0.push((what.into(), value, note.into()));
    }
    fn print(&self) {
        println!("| measurement | value | notes |");
        println!("|---|---|---|");
        for (a, b, c) in &self.0 {
            println!("| {a} | {b} | {c} |");
        }
    }
}

fn us(v: f64) -> String {
    format!("{v:.2} µs")
}

/// Seconds a command takes (wall clock), failing loudly if it fails.
fn timed(cmd: &mut Command) -> f64 {
    let t = Instant::now();
    let out = cmd.output().expect("run command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed().as_secs_f64()
}

fn qcow2_cow(d: &Path, n: u64) -> (f64, f64) {
    let base = d.join("base.qcow2");
    let top = d.join("top.qcow2");
    let img = |args: &[&str]| timed(Command::new("qemu-img").args(args));
    img(&["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "64M"]);
    timed(Command::new("qemu-io").args([
        "-f",
        "qcow2",
        "-c",
        "write -q -P 0x11 0 32M",
        base.to_str().unwrap(),
    ]));
    img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        top.to_str().unwrap(),
    ]);
    let writes = |byte: u8| {
        let mut c = Command::new("qemu-io");
        c.args(["-f", "qcow2"]);
        for i in 0..n {
            c.arg("-c")
                .arg(format!("write -q -P {byte} {} 4k", i * CLUSTER));
        }
        c.arg(top.to_str().unwrap());
        c
    };
    let mut empty = Command::new("qemu-io");
    empty.args(["-f", "qcow2", "-c", "read -q 0 4k", top.to_str().unwrap()]);
    let startup = timed(&mut empty);
    let first = timed(&mut writes(0x22)); // each write copies its 64 KiB cluster
    let again = timed(&mut writes(0x33)); // clusters allocated: plain writes
    (
        (first - startup) * 1e6 / n as f64,
        (again - startup) * 1e6 / n as f64,
    )
}

/// Builds a 64 GiB image whose 1M clusters are all allocated (sparse file: entries only).
fn big_image(path: &Path) -> u64 {
    let clusters = 1u64 << 20;
    create(path, clusters * CLUSTER, None);
    let geo = pcow::Geometry::new(16).unwrap();
    let f = FsOpen::new().read(true).write(true).open(path).unwrap();
    let per_meta = CLUSTER as usize / (2 * 32);
    let mut meta = vec![0u8; CLUSTER as usize];
    for seg in 0..clusters / per_meta as u64 {
        meta.fill(0);
        for i in 0..per_meta as u64 {
            let g = seg * per_meta as u64 + i;
            let e = pcow::format::Entry {
                logical: g,
                epoch: 1,
                kind: pcow::EntryKind::Data,
                seq: 1,
                bitmap: geo.full_bitmap(),
            }
            .encode(&geo);
            let at = (geo.entry_offset(g) - geo.meta_offset(seg)) as usize;
            meta[at..at + e.len()].copy_from_slice(&e);
        }
        f.write_all_at(&meta, geo.meta_offset(seg)).unwrap();
    }
    f.set_len(geo.data_offset(clusters - 1) + CLUSTER).unwrap();
    f.sync_all().unwrap();
    clusters
}

fn probe_rows(t: &mut Table, bin: &Path, d: &Path) {
    let run = |img: &Path, script: &str, extra: &[&str]| -> String {
        let out = Command::new(bin)
            .args(["run", "--timeout", "120", "--pmem"])
            .arg(img)
            .args(["--probe", script])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // "write pmem0 OFF LEN 0xBB: N us" -> N
    let write_us = |out: &str, nth: usize| -> f64 {
        out.lines()
            .filter(|l| l.starts_with("write "))
            .nth(nth)
            .and_then(|l| l.rsplit(": ").next())
            .and_then(|v| v.trim_end_matches(" us").parse().ok())
            .unwrap_or(f64::NAN)
    };
    let img = d.join("probe.pcow");
    let status = Command::new(bin)
        .args(["image", "create", img.to_str().unwrap(), "64M"])
        .output()
        .unwrap();
    assert!(status.status.success());
    // 256 KiB = 4 clusters, 64 pages; the same range again is the no-fault peer.
    let out = run(
        &img,
        "write pmem0 0 256K 0x11; write pmem0 0 256K 0x12; write ram 16M 256K 0x13; write ram 16M 256K 0x14; exit 0",
        &[],
    );
    let (fresh, again, ram_first, ram_again) = (
        write_us(&out, 0),
        write_us(&out, 1),
        write_us(&out, 2),
        write_us(&out, 3),
    );
    t.row(
        "probe: write 256K to fresh pmem (4 expansions)",
        format!("{fresh:.0} µs"),
        &format!(
            "same range again: {again:.0} µs; guest RAM first touch {ram_first:.0} µs, again {ram_again:.0} µs"
        ),
    );
    let status = Command::new(bin)
        .args(["image", "snapshot", "create", img.to_str().unwrap(), "s"])
        .output()
        .unwrap();
    assert!(status.status.success());
    let report = d.join("probe-report.json");
    let out = run(
        &img,
        "write pmem0 0 256K 0x21; write pmem0 0 256K 0x22; write pmem0 0 256K 0x23; exit 0",
        &["--report-json", report.to_str().unwrap()],
    );
    let (cow, after, third) = (write_us(&out, 0), write_us(&out, 1), write_us(&out, 2));
    // Exit and refresh counts (densevm run --json fields; absent from older binaries).
    let doc: serde_json::Value = std::fs::read_to_string(&report)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let field = |v: &serde_json::Value| v.as_u64().map_or("n/a".to_string(), |n| n.to_string());
    t.row(
        "probe: write 256K over a snapshot (64 × 4 KiB CoW via MMIO exit), twice more",
        format!("{cow:.0} µs"),
        &format!(
            "same range again: {after:.0} µs, a third time {third:.0} µs → {:.1} µs per CoW; write exits {} for 3 × 32768 stores, read-only slot refreshes {} ({} µs paused)",
            (cow - after) / 64.0,
            field(&doc["pmem"][0]["guest_write_exits"]),
            field(&doc["readonly_slots"]["refreshes"]),
            field(&doc["readonly_slots"]["paused_us"]),
        ),
    );
}

/// Expansion latencies of one mapping configuration.
struct Expansion {
    paced: Lat,
    prep: f64,
    after: f64,
    burst: Lat,
    vmas: usize,
    stats: densevm_pmem::PmemStats,
    /// Process CPU time (user + system, all threads) per expansion over the whole run.
    cpu: f64,
}

/// CPU time (user + system) of the whole process so far, in µs.
fn process_cpu_us() -> f64 {
    // SAFETY: an all-zero rusage is a valid buffer for getrusage to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage into a buffer we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Thin expansion: first write to each of `n` clusters of a fresh image mapped with `opts`.
fn expansion(img: &Path, n: u64, opts: MapOptions) -> Expansion {
    create(img, n * CLUSTER * 2, None);
    let cpu0 = process_cpu_us();
    let r = map_with(img, opts);
    // Paced: batches of 32 first writes with a pause, so the pool thread keeps zero-filled
    // (and staged) clusters ready (the latency a guest sees when it is not expanding at full
    // speed).
    let mut paced = Vec::new();
    let batch = 32;
    for b in 0..n / 2 / batch {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let at = r.host_addr() + b * batch * CLUSTER;
        paced.extend(stores(at, batch * CLUSTER, CLUSTER));
    }
    let paced = lat(paced);
    // The expansion work itself, without the fault round trip: allocate + map (the
    // vCPU-exit/device path), then the first store to the now file-backed page.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let direct_base = n / 2 * CLUSTER;
    let t0 = Instant::now();
    for i in 0..32 {
        r.prepare_write(direct_base + i * CLUSTER).unwrap();
    }
    let prep = t0.elapsed().as_secs_f64() * 1e6 / 32.0;
    let after = touch(r.host_addr() + direct_base, 32 * CLUSTER, CLUSTER, true);
    // Burst: the other half back to back (the pool cannot keep up).
    let burst = lat(stores(
        r.host_addr() + direct_base + 32 * CLUSTER,
        (n / 2 - 32) * CLUSTER,
        CLUSTER,
    ));
    let vmas = r.vma_count().unwrap();
    let stats = r.stats();
    r.flush().unwrap();
    drop(r);
    let cpu = (process_cpu_us() - cpu0) / n as f64;
    Expansion {
        paced,
        prep,
        after,
        burst,
        vmas,
        stats,
        cpu,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `cargo bench -p densevm-pmem --bench pmem_bench -- expansion` runs only that part.
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let want = |part: &str| only.as_deref().is_none_or(|o| part.contains(o));
    let d = tmpdir("bench");
    let mut t = Table(Vec::new());

    if want("expansion") {
        // --- Thin expansion: first write to each of N clusters, with the default options
        // (polling fault round trip), with the written page pre-faulted before the wake (the
        // previous default), with the staged pool, and without polling (the design before).
        let n_exp = 2048u64;
        let e = expansion(&d.join("thin.pcow"), n_exp, MapOptions::default());
        let pre = expansion(
            &d.join("thin-prefault.pcow"),
            n_exp,
            MapOptions {
                prefault: true,
                ..MapOptions::default()
            },
        );
        let staged = expansion(
            &d.join("thin-staged.pcow"),
            n_exp,
            MapOptions {
                staging: true,
                ..MapOptions::default()
            },
        );
        let old = expansion(
            &d.join("thin-plain.pcow"),
            n_exp,
            MapOptions {
                staging: false,
                spin: std::time::Duration::ZERO,
                ..MapOptions::default()
            },
        );
        // Peer: a fresh preallocated file (like the image's pool), first write per 64 KiB.
        let f = FsOpen::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(d.join("plain"))
            .unwrap();
        // SAFETY: fallocate on a file we own.
        unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, (n_exp * CLUSTER) as libc::off_t) };
        let a = mmap(
            n_exp * CLUSTER,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
        );
        let plain = lat(stores(a, n_exp * CLUSTER, CLUSTER));
        munmap(a, n_exp * CLUSTER);
        let a = mmap(
            n_exp * CLUSTER,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
        );
        let anon = lat(stores(a, n_exp * CLUSTER, CLUSTER));
        munmap(a, n_exp * CLUSTER);
        let ratio = |v: Lat, peer: Lat| format!("{:.1}x", v.median / peer.median);
        t.row(
        "expansion: first write to an unallocated 64 KiB cluster, paced (pool ready), mean / median",
        mm(e.paced),
        &format!(
            "{} clusters in batches of 32; peers: fallocated MAP_SHARED file, first write per 64 KiB {}, anonymous page {} (median ratio {}); pre-faulted before the wake (`prefault`, the previous default) {}; with the staged pool {} ({} moved in); without polling (both ends sleep) {}",
            n_exp / 2,
            mm(plain),
            mm(anon),
            ratio(e.paced, anon),
            mm(pre.paced),
            mm(staged.paced),
            staged.stats.staged_hits,
            mm(old.paced),
        ),
    );
        t.row(
        "expansion work without the uffd round trip",
        us(e.prep + e.after),
        &format!(
            "allocate + mmap {} (`prepare_write`), then first store {}; with `prefault` {} + {}; with the staged pool (allocate + mremap) {} + {}",
            us(e.prep),
            us(e.after),
            us(pre.prep),
            us(pre.after),
            us(staged.prep),
            us(staged.after)
        ),
    );
        t.row(
        "expansion, burst (back to back), mean / median",
        mm(e.burst),
        &format!(
            "{} clusters; {} of all {} uffd faults were picked up by the polling service thread; `prefault` {}; staged pool {}; without polling (both ends sleep) {}",
            n_exp / 2 - 32,
            e.stats.spin_hits,
            e.stats.uffd_write_faults,
            mm(pre.burst),
            mm(staged.burst),
            mm(old.burst),
        ),
    );
        t.row(
            "expansion: process CPU time per expansion (all threads, whole run)",
            us(e.cpu),
            &format!(
                "polling costs {} per expansion: without polling {}; `prefault` {}; staged pool {}",
                us(e.cpu - old.cpu),
                us(old.cpu),
                us(pre.cpu),
                us(staged.cpu)
            ),
        );
        t.row(
        "VMAs after sequential expansion",
        format!("{}", e.vmas),
        &format!(
            "{n_exp} clusters in {} segments (a meta cluster every 1024 breaks the file run); with the staged pool {}",
            n_exp.div_ceil(1024),
            staged.vmas
        ),
    );
    }
    if want("read") {
        // --- Read faults of unallocated pages.
        let img = d.join("read.pcow");
        create(&img, 64 * MIB, None);
        let r = map(&img);
        let before = rss_anon_kib();
        let rd = touch(r.host_addr(), 16 * MIB, PAGE, false);
        let grew = rss_anon_kib().saturating_sub(before);
        drop(r);
        let a = mmap(
            16 * MIB,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
        );
        let anon_rd = touch(a, 16 * MIB, PAGE, false);
        munmap(a, 16 * MIB);
        let f = data_file(&d.join("cached"), 16 * MIB, 7);
        let a = mmap(16 * MIB, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd());
        let file_rd = touch(a, 16 * MIB, PAGE, false);
        munmap(a, 16 * MIB);
        t.row(
        "read fault: unallocated page (uffd, write-protected zero page)",
        us(rd),
        &format!(
            "peers: anonymous zero page {}, MAP_SHARED cached file page {}; RssAnon +{grew} KiB for 16 MiB read (a 4 KiB page per read page), image allocation 0",
            us(anon_rd),
            us(file_rd)
        ),
    );
    }
    if want("cow") {
        // --- 4 KiB copy-on-write over a snapshot: served in the SIGSEGV handler (default),
        // handed to the polling service thread with the page pre-faulted (the previous
        // default), and with both ends of that round trip sleeping (the design before).
        let cow_len = 16 * MIB;
        let service = MapOptions {
            cow_on_faulting_thread: false,
            prefault: true,
            ..MapOptions::default()
        };
        let variants = [
            ("cow", MapOptions::default()),
            ("cow-service", service.clone()),
            (
                "cow-sleep",
                MapOptions {
                    spin: std::time::Duration::ZERO,
                    ..service
                },
            ),
        ];
        let mut host = Vec::new();
        for (name, opts) in variants {
            let img = d.join(format!("{name}.pcow"));
            create(&img, 64 * MIB, None);
            fill(&img, cow_len, 0x11).snapshot_create("s").unwrap();
            let r = map_with(&img, opts);
            touch(r.host_addr(), cow_len, PAGE, false); // warm the page cache like the peers
            let v = lat(stores(r.host_addr(), cow_len, PAGE));
            let s = r.stats();
            let t0 = Instant::now();
            r.flush().unwrap();
            host.push((v, s, t0.elapsed().as_secs_f64() * 1e3));
        }
        let (cow_segv, s, flush_ms) = host[0];
        let (cow_service, s_service, _) = host[1];
        let cow_sleep = host[2].0;
        let img2 = d.join("cow-hook.pcow");
        create(&img2, 64 * MIB, None);
        fill(&img2, cow_len, 0x11).snapshot_create("s").unwrap();
        let r = map(&img2);
        touch(r.host_addr(), cow_len, PAGE, false);
        let h = r.write_fault_handle();
        let t0 = Instant::now();
        for off in (0..cow_len).step_by(PAGE as usize) {
            h.guest_write(off, Some(&[1u8])).unwrap();
        }
        let cow_hook = t0.elapsed().as_secs_f64() * 1e6 / (cow_len / PAGE) as f64;
        drop(r);
        let f = data_file(&d.join("private"), cow_len, 0x11);
        let a = mmap(
            cow_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
        );
        touch(a, cow_len, PAGE, false);
        let kcow = lat(stores(a, cow_len, PAGE));
        munmap(a, cow_len);
        t.row(
        "4 KiB CoW, host thread (SIGSEGV, served in the handler), mean / median",
        mm(cow_segv),
        &format!(
            "{} units, {} served on the faulting thread; kernel MAP_PRIVATE CoW {}, median ratio {:.1}x; handed to the polling service thread and pre-faulted (the previous default) {} ({} of {} picked up while polling); both ends sleeping {}; flush of all copies {flush_ms:.1} ms",
            s.cow_units,
            s.segv_in_handler,
            mm(kcow),
            cow_segv.median / kcow.median,
            mm(cow_service),
            s_service.spin_hits,
            s_service.segv_faults,
            mm(cow_sleep),
        ),
    );
        t.row(
            "4 KiB CoW, vCPU exit path (WriteFaultHandle::guest_write)",
            us(cow_hook),
            "the work done per MMIO/EFAULT exit, without the exit itself",
        );
        let have_qemu = Command::new("qemu-io").arg("--version").output().is_ok();
        if have_qemu {
            let n = 256;
            let (cow, plain) = qcow2_cow(&d, n);
            t.row(
            "qcow2 CoW (qemu-io, backing file, 4 KiB write into a 64 KiB cluster)",
            us(cow),
            &format!(
                "{n} writes, qemu-io start-up subtracted; the same writes once allocated {}; pmem 4 KiB CoW is {:.0}x faster",
                us(plain),
                cow / cow_segv.mean
            ),
        );
        } else {
            t.row(
                "qcow2 CoW",
                "not measured".into(),
                "qemu-io missing: run `make deps`",
            );
        }
    }
    if want("startup") {
        // --- Start-up of a 64 GiB image with 1M clusters.
        let img = d.join("big.pcow");
        let clusters = big_image(&img);
        let t0 = Instant::now();
        let chain = SharedChain::new(open(&img, true));
        let open_ms = t0.elapsed().as_secs_f64() * 1e3;
        let r = PmemRegion::map(chain, MapOptions::default()).unwrap();
        t.row(
        "start-up: 64 GiB image, 1M allocated 64 KiB clusters",
        format!("{:.0} ms", open_ms + r.startup_time().as_secs_f64() * 1e3),
        &format!(
            "open (read 1M entries) {open_ms:.0} ms + map {:.0} ms; {} mmap runs, {} VMAs ({} clusters)",
            r.startup_time().as_secs_f64() * 1e3,
            r.initial_runs(),
            r.vma_count().unwrap(),
            clusters
        ),
    );
        drop(r);
    }
    // Only on request: it needs the `fault-trace` feature and prints its own tables.
    if only.as_deref() == Some("profile") {
        profile::run(&d);
    }
    if let Some(bin) = std::env::var_os("DENSEVM_BIN").filter(|_| want("probe")) {
        probe_rows(&mut t, Path::new(&bin), &d);
    }
    t.print();
    drop(d);
}
