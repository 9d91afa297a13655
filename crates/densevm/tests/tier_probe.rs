//! `--memory-budget` on /dev/kvm with the probe guest (issue #13): the guest's writes
//! survive eviction to the compressed store and the swap file, RSS stays within the budget
//! plus the tier's slack, and snapshots, restores (with and without a budget), clones and
//! budget changes of a tiered VM see all of its data.

mod common;

use common::{densevm, require_kvm, stderr, stdout, vm, wait_for, TempDir};
use densevm_probe::abi::FILL_ADDR_MUL;
use densevm_probe::probe_checksum;
use std::process::Stdio;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// The probe's `sum` line for `fill-addr ram OFF LEN` (each word = its guest address *
/// MUL; region `ram` starts at the probe's workload base).
fn fill_addr_sum(off: u64, len: u64) -> String {
    let base = densevm_vmm::boot::probe::WORKLOAD_BASE;
    let bytes: Vec<u8> = (base + off..base + off + len)
        .step_by(8)
        .flat_map(|a| a.wrapping_mul(FILL_ADDR_MUL).to_le_bytes())
        .collect();
    format!(
        "sum ram {}M {}M = {:016x}",
        off / MIB,
        len / MIB,
        probe_checksum(&bytes)
    )
}

fn byte_sum(off: u64, len: u64, byte: u8) -> String {
    format!(
        "sum ram {}M {}M = {:016x}",
        off / MIB,
        len / MIB,
        probe_checksum(&vec![byte; len as usize])
    )
}

/// VmRSS of `pid` in KiB, or None once it is gone.
fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Samples `pid`'s VmRSS every 20 ms until it is gone; the thread returns the largest, in
/// KiB.
fn peak_rss(pid: u32) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while let Some(kib) = rss_kib(pid) {
            peak = peak.max(kib);
            std::thread::sleep(Duration::from_millis(20));
        }
        peak
    })
}

#[test]
fn a_probe_writes_64_mib_under_a_16_mib_budget_and_sums_it_back() {
    require_kvm();
    let budget = 16 * MIB;
    // 32 MiB that do not compress (each word differs) and 32 MiB that do.
    let script = "fill-addr ram 8M 32M; write ram 40M 32M 0x5a; \
                  sum ram 8M 32M; sum ram 40M 32M; exit 0";
    let child = densevm()
        // Two vCPUs and a swap-file reader beside the tier's service thread (by default a
        // VM gets readers from 4 vCPUs on).
        .args(["run", "--memory", "96M", "--memory-budget", "16M,readers=1"])
        .args([
            "--cpus",
            "2",
            "--json",
            "--timeout",
            "900",
            "--probe",
            script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sampler = peak_rss(child.id());
    let out = child.wait_with_output().unwrap();
    let peak = sampler.join().unwrap();
    let (console, json) = (stderr(&out), stdout(&out));
    assert_eq!(out.status.code(), Some(0), "{console}{json}");
    for want in [
        fill_addr_sum(8 * MIB, 32 * MIB),
        byte_sum(40 * MIB, 32 * MIB, 0x5a),
    ] {
        assert!(console.contains(&want), "expected `{want}`:\n{console}");
    }
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let tier = &doc["memory_tier"];
    let n = |k: &str| tier[k].as_u64().unwrap_or_else(|| panic!("no {k}: {json}"));
    assert!(
        n("evicted_swap") > 0,
        "nothing went to the swap file: {tier}"
    );
    assert!(
        n("evicted_compressed") > 0,
        "nothing was compressed: {tier}"
    );
    assert!(n("missing_faults") > 0, "no page came back: {tier}");
    assert!(
        n("swap_reads_behind") > 0,
        "no swap-file read went to the reader: {tier}"
    );
    assert!(n("resident_kib") <= (budget + MIB) >> 10, "{tier}");
    // The VMM's own memory (binary, heap, stacks) comes on top of guest RAM: measured at
    // the end of the same run. The tier's slack is 1/32 of the budget, at least 1 MiB.
    let own = doc["vmm_overhead"]["rss_kib"].as_u64().unwrap();
    let limit = ((budget + MIB) >> 10) + own + 512;
    assert!(
        peak <= limit,
        "peak RSS {peak} KiB over budget + slack + the VMM's own {own} KiB = {limit} KiB: {tier}"
    );
}

/// A tiered VM (most of its data out of RAM) is snapshotted, restored and cloned: each
/// copy sums the whole pattern right. A new budget over the API takes effect; a VM that
/// became a clone template leaves its tier and says so.
#[test]
fn snapshots_restores_clones_and_budget_changes_of_a_tiered_vm() {
    require_kvm();
    let tmp = TempDir::new("tier-probe");
    let console = tmp.join("parent.console");
    let sock = tmp.join("api.sock");
    // The parent is paused as soon as it sleeps (a paused VM's sleep stands still) and
    // resumed after the clone, so its 10 s only have to outlast the `vm pause` call.
    let script = "fill-addr ram 8M 24M; sleep 10000; sum ram 8M 24M; exit 4";
    let mut parent = densevm()
        .args(["run", "--memory", "48M", "--memory-budget", "12M"])
        .args(["--timeout", "900", "--probe", script, "--api-sock"])
        .arg(&sock)
        .stdout(std::fs::File::create(&console).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&console, "sleep 10000 ms");
    vm(&["pause"], &sock);
    let want = fill_addr_sum(8 * MIB, 24 * MIB);

    // A lower budget: pages leave until RAM is within it (plus the 1 MiB slack), also while
    // the VM is paused.
    let out = vm(&["memory-tier", "--budget", "6M", "--json"], &sock);
    let t: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["budget_mib"], 6, "{out}");
    let t0 = std::time::Instant::now();
    loop {
        let out = vm(&["memory-tier", "--json"], &sock);
        let t: serde_json::Value = serde_json::from_str(&out).unwrap();
        if t["resident_kib"].as_u64().unwrap() <= 7 << 10 {
            assert!(t["evicted_swap"].as_u64().unwrap() > 0, "{out}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "RAM stays over 6M: {out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A snapshot holds the tiered pages too (its restore, run below, sums them right).
    let snap = tmp.join("snap");
    vm(&["snapshot", "--dir", snap.to_str().unwrap()], &sock);

    // A clone with a budget, while the parent is paused in its sleep: the template gets
    // every page back first; the clone reads its RAM from the template under its own 8M
    // budget and sums right, and the parent (resumed below) runs on without a tier.
    let tpl = tmp.join("tpl");
    let out = vm(
        &[
            "clone",
            "--count",
            "1",
            "--memory-budget",
            "8M",
            "--json",
            "--dir",
            tpl.to_str().unwrap(),
        ],
        &sock,
    );
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let clone_console = doc["clones"][0]["console"].as_str().unwrap().to_string();
    let clone_sock = std::path::PathBuf::from(doc["clones"][0]["api_sock"].as_str().unwrap());
    let out = vm(&["memory-tier", "--json"], &clone_sock);
    let t: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["budget_mib"], 8, "the clone's tier: {out}");
    assert!(
        t["base_pages"].as_u64().unwrap() > 0,
        "the clone's tier: {out}"
    );
    assert!(
        t["resident_kib"].as_u64().unwrap() <= 9 << 10,
        "the clone's tier: {out}"
    );
    let bad = densevm()
        .args(["vm", "memory-tier", "--api-sock"])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("no memory tier"), "{}", stderr(&bad));
    vm(&["resume"], &sock);

    // A restore under a budget (RAM filled from the snapshot on first access, 8M of it at
    // most in DRAM), alongside a plain one (RAM private over the snapshot's file); slow on
    // a loaded PVM host: each reads 24 MiB from the snapshot.
    let budgeted = densevm()
        .args([
            "run",
            "--timeout",
            "600",
            "--memory-budget",
            "8M",
            "--json",
            "--restore",
        ])
        .arg(&snap)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sampler = peak_rss(budgeted.id());
    let restored = densevm()
        .args(["run", "--timeout", "600", "--restore"])
        .arg(&snap)
        .output()
        .unwrap();
    let out = budgeted.wait_with_output().unwrap();
    let peak = sampler.join().unwrap();
    let (text, json) = (stderr(&out), stdout(&out));
    assert_eq!(out.status.code(), Some(4), "{text}{json}");
    assert!(
        text.contains(&want),
        "budgeted restore: expected `{want}`:\n{text}"
    );
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let tier = &doc["memory_tier"];
    let n = |k: &str| tier[k].as_u64().unwrap_or_else(|| panic!("no {k}: {json}"));
    // The restored guest only reads: its pages leave RAM for nothing (the snapshot has them).
    assert!(n("missing_faults") > 0 && n("evicted_clean") > 0, "{tier}");
    assert!(n("resident_kib") <= 9 << 10, "{tier}");
    let own = doc["vmm_overhead"]["rss_kib"].as_u64().unwrap();
    let limit = (9 << 10) + own + 512;
    assert!(
        peak <= limit,
        "budgeted restore: peak RSS {peak} KiB over budget + slack + the VMM's own {own} KiB = {limit} KiB: {tier}"
    );
    let text = stdout(&restored);
    assert_eq!(
        restored.status.code(),
        Some(4),
        "{text}{}",
        stderr(&restored)
    );
    assert!(text.contains(&want), "restore: expected `{want}`:\n{text}");
    assert_eq!(parent.wait().unwrap().code(), Some(4));
    let text = std::fs::read_to_string(&console).unwrap();
    assert!(text.contains(&want), "parent: expected `{want}`:\n{text}");
    let t0 = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(&clone_console).unwrap_or_default();
        if text.contains("sum ram 8M 24M = ") {
            assert!(text.contains(&want), "clone: expected `{want}`:\n{text}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "clone: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn bad_budgets_are_refused_clearly() {
    for (args, says) in [
        (vec!["--memory-budget", "1M"], "minimum"),
        (vec!["--memory-budget", "64M,foo=1"], "unknown option"),
        (
            vec!["--memory-budget", "64M", "--merge", "all"],
            "--merge all",
        ),
    ] {
        let out = densevm()
            .args(["run", "--memory", "64M", "--probe", "exit 0"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}
