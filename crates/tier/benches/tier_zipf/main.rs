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
//!   --poll on|off     whether the tier's service thread polls for the next fault before it
//!                     sleeps (on)
//!   --op-us US        CPU work per request besides the store access (0: full speed; a
//!                     server's parsing and network stack cost some µs per request)
//!   --out FILE        the raw result lines, appended
//!
//! Each mode runs in a fresh child process (the kernel's modes join the cgroup first);
//! the parent prints a Markdown table and `TIERZIPF key=value ...` lines.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use densevm_tier::{Area, Tier, TierConfig, TierStats};

mod report;
mod store;
mod zipf;

use report::parent;
use store::{lz4_ratio, value, worker, Store};
use zipf::{scramble, Zipf};

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
    /// Swap-file reader threads beside the service thread (`TierConfig::swap_readers`).
    readers: usize,
    /// Whether the tier's service thread polls for faults (`TierConfig::poll_faults`).
    poll: bool,
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
        readers: 0,
        poll: true,
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
            "--readers" => o.readers = num(&val()),
            "--poll" => {
                o.poll = match val().as_str() {
                    "on" => true,
                    "off" => false,
                    v => die(&format!("--poll is on or off, not {v}")),
                }
            }
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
                swap_readers: o.readers,
                poll_faults: o.poll,
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
             swap_reads_behind={} minor_faults={} prefetched={} armed={} faults_polled={} \
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
            d(|s| s.swap_reads_behind),
            d(|s| s.minor_faults),
            d(|s| s.prefetched),
            d(|s| s.armed),
            d(|s| s.faults_polled),
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
