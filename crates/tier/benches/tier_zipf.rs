//! A zipfian key-value workload over a region of shared memory (issue #13's process-level
//! benchmark): the same store and the same request stream with all of it in DRAM, under a
//! [`Tier`] at a DRAM budget of 1/1, 1/2, 1/3 and 1/4 of the working set, and in a memory
//! cgroup limited to the same shares with the kernel's swap (zswap) as the slower tier.
//!
//! The store: fixed 1 KiB slots in a memfd mapped `MAP_SHARED`, key `k` in slot `k` (four
//! to a page): a 16-byte header (key, version, checksum) and a 1008-byte value that is 3/4
//! text-like (words from a 64-word vocabulary: LZ4 finds the repeats) and 1/4 random bytes
//! (ids, hashes), about 2:1 under LZ4. Requests: YCSB-B (95% reads, 5% updates) from 2
//! threads; keys are drawn zipfian with θ = 0.99 (Gray et al.'s generator, as YCSB's
//! ZipfianGenerator) over the key count and scrambled: the rank-r key is the r-th key in
//! FNV-1a-64 hash order, so hot keys are spread over pages as in a real store. A read
//! checks the slot's key and checksum (under a per-stripe seqlock, as updates rewrite
//! values); at the end every slot is compared byte for byte with what its last update
//! wrote. Any mismatch fails the run.
//!
//! Usage (`cargo bench -p densevm-tier --bench tier_zipf -- [options]`):
//!   --size MIB (256)  --secs S (12)  --warmup S (8)  --threads N (2)
//!   --modes LIST      dram, tier:N, kernel:N (memfd), kernel-anon:N, tier-eq:N (the tier
//!                     with the DRAM kernel:N used); default: for N = 1..4 tier, kernel
//!                     and tier-eq, with all-DRAM runs first, between N = 2 and 3 and last
//!                     (each mode is compared with the mean of the all-DRAM runs just
//!                     before and after it: the host's load drifts)
//!   --cgroup DIR      a cgroup v1 memory directory for the kernel's modes (skipped without)
//!   --swap-dir DIR    the tier's swap file directory (/var/tmp)
//!   --allowance MIB   what a kernel-mode cgroup gets on top of the share, for the process
//!                     itself (page tables, heap, stacks): 8
//!   --compressed-frac F  the tier's compressed store at most F of the budget (default: the
//!                     tier's own default, 1/4)
//!   --op-us US        CPU work per request besides the store access (0: full speed; a
//!                     server's parsing and network stack cost some µs per request)
//!   --out FILE        the raw result lines, appended
//!
//! Each mode runs in a fresh child process (the kernel's modes join the cgroup first);
//! the parent prints a Markdown table and `TIERZIPF key=value ...` lines.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use densevm_tier::{Area, Tier, TierConfig, TierStats, PAGE};

const MIB: u64 = 1 << 20;
const SLOT: usize = 1024;
const HEADER: usize = 16;
const VALUE: usize = SLOT - HEADER;
const THETA: f64 = 0.99;
const STRIPES: usize = 1 << 16;
const DEFAULT_MODES: &str =
    "dram,tier:1,kernel:1,tier:2,kernel:2,tier-eq:2,dram,tier:3,kernel:3,tier-eq:3,tier:4,kernel:4,tier-eq:4,dram";

struct Opts {
    size: u64,
    secs: f64,
    warmup: f64,
    threads: usize,
    modes: String,
    cgroup: Option<String>,
    swap_dir: String,
    allowance: u64,
    compressed_frac: Option<f64>,
    budget: Option<u64>,
    op_us: f64,
    out: Option<String>,
    child: Option<String>,
}

fn parse() -> Opts {
    let mut o = Opts {
        size: 256,
        secs: 12.0,
        warmup: 8.0,
        threads: 2,
        modes: DEFAULT_MODES.into(),
        cgroup: None,
        swap_dir: "/var/tmp".into(),
        allowance: 8,
        compressed_frac: None,
        budget: None,
        op_us: 0.0,
        out: None,
        child: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--bench" => {}
            "--size" => o.size = num(&val()),
            "--secs" => o.secs = num(&val()),
            "--warmup" => o.warmup = num(&val()),
            "--threads" => o.threads = num(&val()),
            "--modes" => o.modes = val(),
            "--cgroup" => o.cgroup = Some(val()),
            "--swap-dir" => o.swap_dir = val(),
            "--allowance" => o.allowance = num(&val()),
            "--compressed-frac" => o.compressed_frac = Some(num(&val())),
            "--budget" => o.budget = Some(num(&val())),
            "--op-us" => o.op_us = num(&val()),
            "--out" => o.out = Some(val()),
            "--child" => o.child = Some(val()),
            _ => die(&format!("unknown argument {a}")),
        }
    }
    o
}

fn num<T: std::str::FromStr>(s: &str) -> T {
    s.parse()
        .unwrap_or_else(|_| die(&format!("not a number: {s}")))
}

fn die(msg: &str) -> ! {
    eprintln!("tier_zipf: {msg}");
    std::process::exit(2)
}

fn main() {
    let o = parse();
    match o.child.clone() {
        Some(mode) => child(&o, &mode),
        None => parent(&o),
    }
}

// ---------------------------------------------------------------------------------------
// The parent: one child per mode, then the table.

fn parent(o: &Opts) {
    let exe = std::env::current_exe().unwrap_or_else(|e| die(&format!("current_exe: {e}")));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let zswap = |p: &str| {
        std::fs::read_to_string(format!("/sys/module/zswap/parameters/{p}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    println!(
        "# tier_zipf: {} MiB working set, {} threads, warm-up {} s, measure {} s, \
         loadavg at start {}; zswap enabled={} compressor={}",
        o.size,
        o.threads,
        o.warmup,
        o.secs,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        zswap("enabled"),
        zswap("compressor"),
    );
    let mut results: Vec<BTreeMap<String, String>> = Vec::new();
    let mut failed = false;
    for mode in o.modes.split(',') {
        if mode.starts_with("kernel") && o.cgroup.is_none() {
            eprintln!("tier_zipf: {mode} skipped (no --cgroup)");
            continue;
        }
        let kshare = mode
            .split_once(':')
            .filter(|(k, _)| k.starts_with("kernel"));
        if let (Some(cg), Some((_, share))) = (&o.cgroup, kshare) {
            let share: u64 = num(share);
            let limit = o.size * MIB / share + o.allowance * MIB;
            // A fresh start: nothing left charged from the previous mode.
            let _ = std::fs::write(format!("{cg}/memory.force_empty"), "0");
            std::fs::write(format!("{cg}/memory.limit_in_bytes"), limit.to_string())
                .unwrap_or_else(|e| die(&format!("setting {cg}/memory.limit_in_bytes: {e}")));
            let _ = std::fs::write(format!("{cg}/memory.max_usage_in_bytes"), "0");
        }
        // tier-eq:N: the tier with the DRAM the kernel's N mode actually used (its cgroup's
        // peak plus the zswap pool, which cgroup v1 does not charge).
        let mut budget = None;
        if let Some(share) = mode.strip_prefix("tier-eq:") {
            let k = results.iter().rev().find(|r| {
                r["mode"] == "kernel" && r["share"] == share && !r.contains_key("failed")
            });
            let Some(k) = k else {
                eprintln!("tier_zipf: {mode} skipped (no kernel:{share} result before it)");
                continue;
            };
            let get = |f: &str| k.get(f).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let used = (get("rss_shmem_kib") + get("zswap_pool_kib")) * 1024;
            budget = Some(used.min(o.size * MIB));
        }
        eprintln!("tier_zipf: running {mode} ...");
        let mut cmd = Command::new(&exe);
        cmd.args(["--child", mode])
            .args(["--size", &o.size.to_string()])
            .args(["--secs", &o.secs.to_string()])
            .args(["--warmup", &o.warmup.to_string()])
            .args(["--threads", &o.threads.to_string()])
            .args(["--swap-dir", &o.swap_dir])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(cg) = &o.cgroup {
            cmd.args(["--cgroup", cg]);
        }
        cmd.args(["--op-us", &o.op_us.to_string()]);
        if let Some(b) = budget {
            cmd.args(["--budget", &b.to_string()]);
        }
        if let Some(f) = o.compressed_frac {
            cmd.args(["--compressed-frac", &f.to_string()]);
        }
        // The kernel's modes may be OOM-killed in their cgroup (its reclaim gives up under
        // the fault rate): up to two more tries, counted.
        let mut tries = 0;
        let out = loop {
            tries += 1;
            let out = cmd
                .output()
                .unwrap_or_else(|e| die(&format!("running a child: {e}")));
            if out.status.success() || !mode.starts_with("kernel") || tries == 3 {
                break out;
            }
            eprintln!("tier_zipf: {mode} ended with {}, trying again", out.status);
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with("TIERZIPF "));
        let line = match (out.status.success(), line) {
            (true, Some(line)) => format!("{line} tries={tries}"),
            _ => {
                // Recorded, not fatal: the kernel's modes may be OOM-killed in their cgroup.
                print!("{text}");
                let (kind, share) = mode.split_once(':').unwrap_or((mode, "1"));
                let why = out
                    .status
                    .to_string()
                    .replace(' ', "_")
                    .replace(['(', ')', ':'], "");
                eprintln!("tier_zipf: mode {mode} failed: {}", out.status);
                failed |= !mode.starts_with("kernel");
                format!(
                    "TIERZIPF mode={kind} share={share} size_mib={} ops_s=0 failed={why} \
                     tries={tries}",
                    o.size
                )
            }
        };
        println!("{line}");
        if let Some(path) = &o.out {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap_or_else(|e| die(&format!("{path}: {e}")));
            let _ = writeln!(f, "{line}");
        }
        results.push(fields(&line));
    }
    table(o, &results);
    if failed {
        std::process::exit(1);
    }
}

fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The all-DRAM throughput mode `i` is compared with: the mean of the nearest all-DRAM
/// runs before and after it (the one there is at either end).
fn baseline(rs: &[BTreeMap<String, String>], i: usize) -> f64 {
    let ops = |r: &BTreeMap<String, String>| r["ops_s"].parse::<f64>().unwrap_or(0.0);
    let is_dram = |r: &&BTreeMap<String, String>| r["mode"] == "dram";
    let before = rs[..=i].iter().rev().find(is_dram).map(ops);
    let after = rs[i..].iter().find(is_dram).map(ops);
    match (before, after) {
        (Some(a), Some(b)) => (a + b) / 2.0,
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => f64::NAN,
    }
}

/// DRAM the region used at the end of a mode's window, bytes: the tier's resident pages
/// plus its compressed store; the kernel's resident region plus the zswap pool (only this
/// process swaps); all-DRAM: the resident region.
fn dram_used(r: &BTreeMap<String, String>) -> u64 {
    let f = |k: &str| r.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    match r["mode"].as_str() {
        m if m.starts_with("tier") => f("tier_resident") + f("tier_compressed_bytes"),
        "kernel" => (f("rss_shmem_kib") + f("zswap_pool_kib")) * 1024,
        "kernel-anon" => (f("rss_kib") + f("zswap_pool_kib")) * 1024,
        _ => f("rss_shmem_kib") * 1024,
    }
}

fn table(o: &Opts, rs: &[BTreeMap<String, String>]) {
    let f = |r: &BTreeMap<String, String>, k: &str| -> f64 {
        r.get(k).and_then(|v| v.parse().ok()).unwrap_or(0.0)
    };
    let drams: Vec<String> = rs
        .iter()
        .filter(|r| r["mode"] == "dram")
        .map(|r| format!("{:.0}", f(r, "ops_s")))
        .collect();
    if drams.is_empty() {
        return;
    }
    let ws = (o.size * MIB) as f64;
    println!();
    println!(
        "All-DRAM runs: {} ops/s; each mode is compared with the mean of the all-DRAM runs \
         just before and after it.",
        drams.join(", ")
    );
    println!();
    println!(
        "| mode | DRAM share (budget or limit) | ops/s | vs all-DRAM | DRAM used at the end \
         (MiB, share) | missing / minor faults per s (tier); swap-ins per s (kernel) | \
         evicted per s: zero, lz4, file; demoted | tier service CPU µs/op | process CPU µs/op |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (i, r) in rs.iter().enumerate() {
        let base = baseline(rs, i);
        let mode = &r["mode"];
        let secs = f(r, "secs");
        let per_s = |k: &str| f(r, k) / secs;
        let share = if mode == "tier-eq" {
            format!("{:.2} (= kernel 1/{})", f(r, "budget") / ws, r["share"])
        } else {
            format!("1/{}", r["share"])
        };
        if let Some(why) = r.get("failed") {
            println!(
                "| {mode} | {share} | failed: {why} ({} tries) | | | | | | |",
                r["tries"]
            );
            continue;
        }
        let tiered = mode.starts_with("tier");
        let used = dram_used(r) as f64;
        println!(
            "| {} | {} | {:.0} | {:.1}% | {:.0} ({:.2}) | {} | {} | {} | {:.2} |",
            mode,
            share,
            f(r, "ops_s"),
            100.0 * f(r, "ops_s") / base,
            used / MIB as f64,
            used / ws,
            if tiered {
                format!(
                    "{:.0} / {:.0}",
                    per_s("missing_faults"),
                    per_s("minor_faults")
                )
            } else if mode.starts_with("kernel") {
                format!("{:.0}", per_s("zswpin").max(per_s("pswpin")))
            } else {
                String::new()
            },
            if tiered {
                format!(
                    "{:.0}, {:.0}, {:.0}; {:.0}",
                    per_s("evicted_zero"),
                    per_s("evicted_compressed"),
                    per_s("evicted_swap"),
                    per_s("demoted")
                )
            } else {
                String::new()
            },
            if tiered {
                format!("{:.2}", f(r, "service_ns_per_op") / 1e3)
            } else {
                String::new()
            },
            f(r, "cpu_us_per_op"),
        );
    }
}

// ---------------------------------------------------------------------------------------
// The child: one mode.

fn child(o: &Opts, mode: &str) {
    let (kind, share) = match mode.split_once(':') {
        Some((k, s)) => (k, num::<u64>(s)),
        None => (mode, 1),
    };
    let cgrouped = kind.starts_with("kernel");
    if cgrouped {
        let cg = o
            .cgroup
            .as_deref()
            .unwrap_or_else(|| die("kernel mode needs --cgroup"));
        // Join the cgroup before anything is allocated.
        std::fs::write(format!("{cg}/cgroup.procs"), std::process::id().to_string())
            .unwrap_or_else(|e| die(&format!("joining {cg}: {e}")));
    }
    let size = o.size * MIB;
    let keys = (size / SLOT as u64) as usize;
    let store = Arc::new(Store::new(size, kind == "kernel-anon"));
    let budget = o.budget.unwrap_or(size / share);
    let tier = kind.starts_with("tier").then(|| {
        Tier::start(
            store.file.clone(),
            vec![Area {
                offset: 0,
                host_addr: store.base as u64,
                len: size,
            }],
            TierConfig {
                budget,
                compressed_max: o.compressed_frac.map(|f| (budget as f64 * f) as u64),
                swap_dir: o.swap_dir.clone().into(),
                base: None,
            },
        )
        .unwrap_or_else(|e| die(&format!("cannot start the tier: {e}")))
    });
    let zipf = Arc::new(Zipf::new(keys as u64, THETA));
    let perm = Arc::new(scramble(keys));

    // Load: every key at version 0.
    let t0 = Instant::now();
    let mut v = vec![0u8; VALUE];
    for k in 0..keys {
        store.write(k, 0, &mut v);
    }
    let load_s = t0.elapsed().as_secs_f64();
    let ratio = lz4_ratio(&store, keys);

    // Workers run from here to the end; warm-up, then the measured window.
    let stop = Arc::new(AtomicBool::new(false));
    let ops: Arc<Vec<AtomicU64>> = Arc::new((0..o.threads).map(|_| AtomicU64::new(0)).collect());
    let bad = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..o.threads)
        .map(|t| {
            let (store, zipf, perm, stop, ops, bad) = (
                store.clone(),
                zipf.clone(),
                perm.clone(),
                stop.clone(),
                ops.clone(),
                bad.clone(),
            );
            let work = Duration::from_secs_f64(o.op_us / 1e6);
            std::thread::spawn(move || worker(t, &store, &zipf, &perm, work, &stop, &ops[t], &bad))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(o.warmup));
    let count = || ops.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>();
    let s0 = Sample::take(tier.as_ref(), count());
    std::thread::sleep(Duration::from_secs_f64(o.secs));
    let s1 = Sample::take(tier.as_ref(), count());
    let rss = status_kib();
    let cg = o.cgroup.as_deref().filter(|_| cgrouped).map(cgroup_figures);
    let zswap_pool = meminfo_kib("Zswap:");
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }

    // Every slot must hold what its last update wrote.
    let t1 = Instant::now();
    let mut wrong = 0u64;
    let mut want = vec![0u8; VALUE];
    for k in 0..keys {
        let ver = store.version(k);
        value(k as u64, ver, &mut want);
        if !store.equals(k, ver, &want) {
            wrong += 1;
        }
    }
    let verify_s = t1.elapsed().as_secs_f64();
    let bad = bad.load(Ordering::Relaxed);
    if bad + wrong > 0 {
        die(&format!(
            "{mode}: {bad} reads failed their checksum, {wrong} slots differ at the end"
        ));
    }

    let secs = (s1.at - s0.at).as_secs_f64();
    let n = s1.ops - s0.ops;
    let mut line = format!(
        "TIERZIPF mode={kind} share={} size_mib={} threads={} op_us={} secs={secs:.3} ops={n} \
         ops_s={:.0} cpu_us_per_op={:.3} load_s={load_s:.2} verify_s={verify_s:.2} \
         lz4_ratio={ratio:.2} bad=0 rss_kib={} rss_shmem_kib={}",
        if kind == "dram" { 1 } else { share },
        o.size,
        o.threads,
        o.op_us,
        n as f64 / secs,
        (s1.cpu_ns - s0.cpu_ns) as f64 / 1e3 / n.max(1) as f64,
        rss.0,
        rss.1,
    );
    for (k, a, b) in [
        ("pswpin", s0.vm.0, s1.vm.0),
        ("pswpout", s0.vm.1, s1.vm.1),
        ("zswpin", s0.vm.2, s1.vm.2),
        ("zswpout", s0.vm.3, s1.vm.3),
    ] {
        line += &format!(" {k}={}", b.saturating_sub(a));
    }
    if let (Some(a), Some(b)) = (s0.tier, s1.tier) {
        let d = |f: fn(&TierStats) -> u64| f(&b).saturating_sub(f(&a));
        line += &format!(
            " budget={} tier_resident={} tier_compressed_bytes={} tier_compressed_data={} \
             tier_compressed_pages={} \
             tier_swap_pages={} missing_faults={} faults_compressed={} faults_swap={} \
             minor_faults={} prefetched={} armed={} \
             evicted_zero={} evicted_compressed={} evicted_swap={} demoted={} \
             service_ns_per_op={:.1}",
            b.budget,
            b.resident,
            b.compressed_bytes,
            b.compressed_data_bytes,
            b.compressed_pages,
            b.swap_pages,
            d(|s| s.missing_faults),
            d(|s| s.faults_compressed),
            d(|s| s.faults_swap),
            d(|s| s.minor_faults),
            d(|s| s.prefetched),
            d(|s| s.armed),
            d(|s| s.evicted_zero),
            d(|s| s.evicted_compressed),
            d(|s| s.evicted_swap),
            d(|s| s.demoted),
            d(|s| s.service_cpu_ns) as f64 / n.max(1) as f64,
        );
    }
    if let Some((usage, max, limit, swap)) = cg {
        line += &format!(
            " cg_usage={usage} cg_max_usage={max} cg_limit={limit} cg_swap={swap} \
             zswap_pool_kib={zswap_pool}"
        );
    }
    println!("{line}");
    drop(tier);
}

/// Figures taken at both ends of the measured window.
struct Sample {
    at: Instant,
    ops: u64,
    cpu_ns: u64,
    tier: Option<TierStats>,
    /// pswpin, pswpout, zswpin, zswpout (host-wide).
    vm: (u64, u64, u64, u64),
}

impl Sample {
    fn take(tier: Option<&Tier>, ops: u64) -> Sample {
        let vm = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        let get = |k: &str| {
            vm.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|r| r.trim().parse().ok()))
                .unwrap_or(0)
        };
        Sample {
            at: Instant::now(),
            ops,
            cpu_ns: process_cpu_ns(),
            tier: tier.map(Tier::stats),
            vm: (
                get("pswpin "),
                get("pswpout "),
                get("zswpin "),
                get("zswpout "),
            ),
        }
    }
}

fn process_cpu_ns() -> u64 {
    // SAFETY: clock_gettime fills a timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// VmRSS and RssShmem of this process, KiB.
fn status_kib() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (get("VmRSS:"), get("RssShmem:"))
}

fn meminfo_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// usage, max usage, limit, swap (bytes) of a cgroup v1 memory directory.
fn cgroup_figures(cg: &str) -> (u64, u64, u64, u64) {
    let read = |f: &str| -> u64 {
        std::fs::read_to_string(format!("{cg}/{f}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("{cg}/memory.stat")).unwrap_or_default();
    let swap = stat
        .lines()
        .find_map(|l| l.strip_prefix("swap "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (
        read("memory.usage_in_bytes"),
        read("memory.max_usage_in_bytes"),
        read("memory.limit_in_bytes"),
        swap,
    )
}

// ---------------------------------------------------------------------------------------
// The store.

struct Store {
    file: Arc<File>,
    base: *mut u8,
    size: u64,
    /// Seqlocks, one per stripe of keys: odd while an update writes.
    seq: Vec<AtomicU32>,
}

// SAFETY: the mapping is shared memory every thread may touch; slot contents are guarded
// by the seqlocks (readers validate, writers exclude each other).
unsafe impl Send for Store {}
// SAFETY: as above.
unsafe impl Sync for Store {}

impl Store {
    /// A memfd mapped `MAP_SHARED`, or (`anon`) private anonymous memory with the memfd
    /// only as a placeholder.
    fn new(size: u64, anon: bool) -> Store {
        // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned below.
        let fd = unsafe { libc::memfd_create(c"tier-zipf".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            die(&format!(
                "memfd_create: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let file = Arc::new(unsafe { File::from_raw_fd(fd) });
        if !anon {
            file.set_len(size)
                .unwrap_or_else(|e| die(&format!("sizing the memfd: {e}")));
        }
        let (flags, fd) = if anon {
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
        } else {
            (libc::MAP_SHARED, fd)
        };
        // SAFETY: a new mapping (of the whole file, or anonymous), unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            die(&format!("mmap: {}", std::io::Error::last_os_error()));
        }
        Store {
            file,
            base: p.cast(),
            size,
            seq: (0..STRIPES).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn slot(&self, k: usize) -> *mut u64 {
        debug_assert!(((k + 1) * SLOT) as u64 <= self.size);
        // SAFETY: k is a key of the store, so its slot lies inside the mapping.
        unsafe { self.base.add(k * SLOT).cast() }
    }

    fn lock(&self, k: usize) -> &AtomicU32 {
        &self.seq[k % STRIPES]
    }

    /// Writes key `k` at `version` (an update: under its stripe's seqlock). `buf` is
    /// scratch of [`VALUE`] bytes.
    fn write(&self, k: usize, version: u32, buf: &mut [u8]) {
        value(k as u64, version, buf);
        let sum = checksum(k as u64, version, buf);
        let l = self.lock(k);
        let mut s = l.load(Ordering::Relaxed);
        loop {
            if s & 1 == 0 {
                match l.compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(now) => s = now,
                }
            } else {
                std::hint::spin_loop();
                s = l.load(Ordering::Relaxed);
            }
        }
        fence(Ordering::Release);
        let p = self.slot(k);
        // SAFETY: the slot lies inside the mapping (see `slot`) and we hold its stripe:
        // no other writer; readers retry what they saw meanwhile.
        unsafe {
            p.write_volatile(k as u64);
            p.add(1)
                .write_volatile(u64::from(version) | u64::from(sum) << 32);
            for (i, w) in buf.chunks_exact(8).enumerate() {
                p.add(2 + i)
                    .write_volatile(u64::from_ne_bytes(w.try_into().unwrap()));
            }
        }
        l.store(s + 2, Ordering::Release);
    }

    /// Reads key `k` into `out` (header words then value words), consistently; returns
    /// whether its key and checksum match.
    fn read(&self, k: usize, out: &mut [u64; SLOT / 8]) -> bool {
        let l = self.lock(k);
        let p = self.slot(k);
        loop {
            let s = l.load(Ordering::Acquire);
            if s & 1 != 0 {
                std::hint::spin_loop();
                continue;
            }
            for (i, w) in out.iter_mut().enumerate() {
                // SAFETY: inside the mapping; a torn read is detected by the sequence
                // number below and retried.
                *w = unsafe { p.add(i).read_volatile() };
            }
            fence(Ordering::Acquire);
            if l.load(Ordering::Relaxed) == s {
                break;
            }
        }
        let version = out[1] as u32;
        let sum = (out[1] >> 32) as u32;
        // SAFETY: viewing 126 initialized u64 words as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(out[2..].as_ptr().cast::<u8>(), VALUE) };
        out[0] == k as u64 && checksum(k as u64, version, bytes) == sum
    }

    /// The version key `k` holds (after the workers stopped).
    fn version(&self, k: usize) -> u32 {
        // SAFETY: inside the mapping; nothing writes any more.
        unsafe { self.slot(k).add(1).read_volatile() as u32 }
    }

    /// Whether slot `k` holds exactly `want` at `version`.
    fn equals(&self, k: usize, version: u32, want: &[u8]) -> bool {
        let mut out = [0u64; SLOT / 8];
        let ok = self.read(k, &mut out);
        // SAFETY: viewing initialized u64 words as bytes.
        let got = unsafe { std::slice::from_raw_parts(out[2..].as_ptr().cast::<u8>(), VALUE) };
        ok && out[1] as u32 == version && got == want
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used (the tier was dropped first).
        unsafe { libc::munmap(self.base.cast(), self.size as usize) };
    }
}

/// The bytes of key `k` at `version`: 3/4 words of a small vocabulary, 1/4 random.
fn value(k: u64, version: u32, out: &mut [u8]) {
    const WORDS: [&str; 64] = [
        "the",
        "user",
        "session",
        "token",
        "price",
        "amount",
        "status",
        "active",
        "pending",
        "order",
        "item",
        "quantity",
        "country",
        "city",
        "name",
        "email",
        "created",
        "updated",
        "true",
        "false",
        "null",
        "value",
        "count",
        "total",
        "region",
        "device",
        "mobile",
        "desktop",
        "browser",
        "version",
        "score",
        "level",
        "group",
        "admin",
        "guest",
        "cart",
        "product",
        "category",
        "review",
        "rating",
        "comment",
        "shipping",
        "address",
        "street",
        "payment",
        "method",
        "card",
        "invoice",
        "balance",
        "currency",
        "euro",
        "dollar",
        "event",
        "click",
        "view",
        "search",
        "query",
        "result",
        "page",
        "index",
        "cache",
        "hit",
        "miss",
        "timestamp",
    ];
    let mut x = Rng::new(k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(version) << 40);
    let text = out.len() * 3 / 4;
    let mut i = 0;
    while i < text {
        let w = WORDS[(x.next() % 64) as usize].as_bytes();
        for &b in w.iter().chain(b" ") {
            if i < text {
                out[i] = b;
                i += 1;
            }
        }
    }
    for c in out[text..].chunks_mut(8) {
        let r = x.next().to_ne_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
}

/// A 32-bit checksum of a slot's key, version and value (word-wise multiply-xor).
fn checksum(k: u64, version: u32, v: &[u8]) -> u32 {
    let mut h = k ^ u64::from(version).rotate_left(32) ^ 0x51_7cc1_b727_220a;
    for w in v.chunks_exact(8) {
        let w = u64::from_ne_bytes(w.try_into().unwrap());
        h = (h ^ w).wrapping_mul(0x2127_599b_f432_5c37).rotate_left(29);
    }
    (h ^ h >> 32) as u32
}

/// The LZ4 ratio of a sample of the store's pages (what the tier's compressed store sees).
fn lz4_ratio(store: &Store, keys: usize) -> f64 {
    let pages = keys * SLOT / PAGE as usize;
    let (mut raw, mut packed) = (0usize, 0usize);
    let mut page = vec![0u8; PAGE as usize];
    for pg in (0..pages).step_by((pages / 256).max(1)) {
        // SAFETY: a page inside the mapping, read while no worker runs.
        let src = unsafe {
            std::slice::from_raw_parts(store.base.add(pg * PAGE as usize), PAGE as usize)
        };
        page.copy_from_slice(src);
        raw += page.len();
        packed += lz4_flex::block::compress(&page).len();
    }
    raw as f64 / packed.max(1) as f64
}

#[allow(clippy::too_many_arguments)]
fn worker(
    t: usize,
    store: &Store,
    zipf: &Zipf,
    perm: &[u32],
    work: Duration,
    stop: &AtomicBool,
    ops: &AtomicU64,
    bad: &AtomicU64,
) {
    let mut rng = Rng::new(0x1234_5678 + t as u64 * 0x9e37_79b9);
    let mut slot = [0u64; SLOT / 8];
    let mut buf = vec![0u8; VALUE];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..256 {
            let k = perm[zipf.next(&mut rng) as usize] as usize;
            if rng.next() % 100 < 5 {
                // An update: the next version (read under the lock's protection is not
                // needed: two updates of one key may pick the same version, both valid).
                let ver = store.version(k).wrapping_add(1);
                store.write(k, ver, &mut buf);
            } else if !store.read(k, &mut slot) {
                bad.fetch_add(1, Ordering::Relaxed);
            }
            if !work.is_zero() {
                let t0 = Instant::now();
                while t0.elapsed() < work {
                    std::hint::spin_loop();
                }
            }
        }
        n += 256;
        ops.store(n, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------
// Zipf and friends.

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipfian ranks in [0, n) with exponent θ, by Gray et al.'s method ("Quickly generating
/// billion-record synthetic databases", 1994), the one YCSB's ZipfianGenerator uses.
struct Zipf {
    n: f64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        let zeta = |n: u64| (1..=n).map(|i| (i as f64).powf(-theta)).sum::<f64>();
        let (zetan, zeta2) = (zeta(n), zeta(2));
        Zipf {
            n: n as f64,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        }
    }

    fn next(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let r = (self.n * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n as u64 - 1)
    }
}

/// FNV-1a, 64 bits, of a word's little-endian bytes.
fn fnv1a64(v: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in v.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The key of each rank: keys in FNV-1a-64 order of their number (a fixed permutation, so
/// every key keeps exactly one rank and hot keys land on unrelated pages).
fn scramble(keys: usize) -> Vec<u32> {
    let mut v: Vec<u32> = (0..keys as u32).collect();
    v.sort_by_key(|&k| fnv1a64(u64::from(k)));
    v
}
