//! The parent process: one child per mode, then the Markdown table and the raw lines.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use super::{die, num, Opts, MIB};

pub(crate) fn parent(o: &Opts) {
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
        cmd.args(["--readers", &o.readers.to_string()]);
        cmd.args(["--poll", if o.poll { "on" } else { "off" }]);
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

pub(crate) fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The all-DRAM throughput mode `i` is compared with: the mean of the nearest all-DRAM
/// runs before and after it (the one there is at either end).
pub(crate) fn baseline(rs: &[BTreeMap<String, String>], i: usize) -> f64 {
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
pub(crate) fn dram_used(r: &BTreeMap<String, String>) -> u64 {
    let f = |k: &str| r.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    match r["mode"].as_str() {
        m if m.starts_with("tier") => f("tier_resident") + f("tier_compressed_bytes"),
        "kernel" => (f("rss_shmem_kib") + f("zswap_pool_kib")) * 1024,
        "kernel-anon" => (f("rss_kib") + f("zswap_pool_kib")) * 1024,
        _ => f("rss_shmem_kib") * 1024,
    }
}

pub(crate) fn table(o: &Opts, rs: &[BTreeMap<String, String>]) {
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
