//! `densevm fleet` for real on /dev/kvm: the daemon starts a probe VM as a `densevm run`
//! process, lists it, reports its RSS in the metrics, and deletes it (issue #12); a probe VM
//! with a DRAM budget shows its tier and obeys a new budget sent through the fleet
//! (issue #13). Fails, never skips, without /dev/kvm.

mod common;

use common::{densevm, require_kvm, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    dir: PathBuf,
    sock: PathBuf,
}

impl Daemon {
    /// `densevm fleet serve` in a fresh directory named after `tag`, ticking every 200 ms.
    fn start(tag: &str) -> Self {
        Self::start_with(tag, |_| Vec::new())
    }

    /// [`Daemon::start`] with more daemon arguments, made from the daemon's directory.
    fn start_with(tag: &str, extra: impl FnOnce(&Path) -> Vec<String>) -> Self {
        // Short: socket paths are limited to 107 bytes.
        let dir = std::env::temp_dir().join(format!("dv{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("fleet.sock");
        let child = densevm()
            .args(["fleet", "serve", "--state-dir"])
            .arg(dir.join("state"))
            .arg("--sock")
            .arg(&sock)
            .args(["--tick-ms", "200", "--grace-secs", "2"])
            .args(extra(&dir))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let daemon = Daemon { child, dir, sock };
        let t0 = Instant::now();
        while !daemon.sock.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the daemon did not serve"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fleet(sock: &Path, args: &[&str]) -> String {
    let out = densevm()
        .arg("fleet")
        .args(args)
        .arg("--sock")
        .arg(sock)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "densevm fleet {args:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

fn json(sock: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&fleet(sock, &a)).unwrap()
}

#[test]
fn the_daemon_runs_a_probe_vm_reports_its_rss_and_deletes_it() {
    require_kvm();
    let daemon = Daemon::start("f");
    let sock = daemon.sock.clone();
    let info = json(&sock, &["list"]);
    assert_eq!(info, serde_json::json!([]));

    let vm = json(
        &sock,
        &[
            "create",
            "--id",
            "p0",
            "--memory",
            "64M",
            "--priority",
            "low",
            "--probe",
            "touch 16M; sleep 60000; exit 0",
        ],
    );
    assert_eq!(vm["id"], "p0");
    assert_eq!(vm["status"], "running");
    let pid = vm["pid"].as_u64().unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    let list = json(&sock, &["list"]);
    assert_eq!(list.as_array().unwrap().len(), 1);

    // Within a few ticks the metrics show the VMM's RSS with the 16 MiB it touched.
    let t0 = Instant::now();
    let rss = loop {
        let text = fleet(&sock, &["metrics"]);
        let rss = text
            .lines()
            .find(|l| l.starts_with("densevm_fleet_vm_rss_bytes{vm=\"p0\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if rss >= 16.0 * 1048576.0 {
            assert!(
                text.contains("densevm_fleet_host_memory_available_bytes"),
                "{text}"
            );
            break rss;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no RSS >= 16 MiB for p0 in the metrics:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // The VM has no balloon device yet: the policy leaves it alone and says why.
    let shown = json(&sock, &["show", "p0"]);
    assert!(
        shown["balloon_error"]
            .as_str()
            .unwrap()
            .contains("no balloon device"),
        "{shown}"
    );
    assert!(shown["rss_kib"].as_u64().unwrap() * 1024 >= rss as u64 / 2);

    let gone = json(&sock, &["delete", "p0"]);
    assert_eq!(gone["status"], "exited", "{gone}");
    assert!(
        !Path::new(&format!("/proc/{pid}/cmdline")).exists() || {
            // A zombie until the daemon's next wait: its command line is empty.
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .is_empty()
        }
    );
    assert_eq!(json(&sock, &["list"]), serde_json::json!([]));
    drop(daemon);
}

/// A sample of the metrics text for VM `id`, if the family has one.
fn metric(text: &str, name: &str, id: &str) -> Option<f64> {
    let prefix = format!("{name}{{vm=\"{id}\"");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls `GET /vms/ID` every 200 ms until `done` holds, failing after `limit` with what
/// the VM showed last and the end of its console.
fn wait_vm(
    sock: &Path,
    id: &str,
    limit: Duration,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let vm = json(sock, &["show", id]);
        if done(&vm) {
            return vm;
        }
        if t0.elapsed() > limit {
            let console = vm["console"]
                .as_str()
                .and_then(|c| std::fs::read_to_string(c).ok())
                .unwrap_or_default();
            let tail = &console[console.len().saturating_sub(1500)..];
            panic!("{what}: not within {limit:?}; VM {id}: {vm:#}\nconsole:\n{tail}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_fleet_probe_vm_with_a_budget_shows_its_tier_and_obeys_a_new_budget() {
    require_kvm();
    let daemon = Daemon::start("b");
    let sock = daemon.sock.clone();
    // 32 MiB of incompressible words (each its own address times a constant) under a
    // 16 MiB budget: at least 16 MiB must leave DRAM, mostly for the swap file.
    let vm = json(
        &sock,
        &[
            "create",
            "--id",
            "t0",
            "--memory",
            "64M",
            "--memory-budget",
            "16M",
            "--priority",
            "low",
            "--probe",
            "fill-addr ram 8M 32M; sleep 60000; sleep 60000; sleep 60000; exit 0",
        ],
    );
    assert_eq!(vm["memory_budget_mib"], 16, "{vm}");
    assert_eq!(vm["memory_budget_user_mib"], 16, "{vm}");
    assert_eq!(vm["spec"]["memory_budget_mib"], 16, "{vm}");
    let pid = vm["pid"].as_u64().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let at = args
        .iter()
        .position(|a| *a == b"--memory-budget")
        .expect("--memory-budget on densevm run's command line");
    assert_eq!(args[at + 1], b"16M");

    // The daemon's tick reads the tier: pages leave as the probe fills (about 1 s per
    // 2 MiB first touched on this host's software KVM, so minutes at most).
    const MIB: u64 = 1 << 20;
    let vm = wait_vm(
        &sock,
        "t0",
        Duration::from_secs(300),
        "12 MiB evicted under the 16 MiB budget",
        |v| v["tier"]["evicted"].as_u64().unwrap_or(0) * 4096 >= 12 * MIB,
    );
    let tier = &vm["tier"];
    assert_eq!(tier["budget_mib"], 16, "{vm}");
    assert!(vm["tier_error"].is_null(), "{vm}");
    // Within the budget plus the tier's slack (1/32 of it, at least 1 MiB).
    let held_kib =
        tier["resident_kib"].as_u64().unwrap() + tier["compressed_kib"].as_u64().unwrap();
    assert!(held_kib <= 17 << 10, "{vm}");
    // ...and over what the new budget below will allow, so that the change is seen.
    assert!(tier["resident_kib"].as_u64().unwrap() > 9 << 10, "{vm}");
    assert!(tier["swap_pages"].as_u64().unwrap() > 0, "{vm}");

    let text = fleet(&sock, &["metrics"]);
    assert_eq!(
        metric(&text, "densevm_fleet_vm_memory_budget_bytes", "t0"),
        Some((16 * MIB) as f64),
        "{text}"
    );
    let resident = metric(&text, "densevm_fleet_vm_tier_resident_bytes", "t0")
        .unwrap_or_else(|| panic!("no tier resident bytes for t0:\n{text}"));
    assert!(resident > 0.0 && resident <= (17 * MIB) as f64, "{text}");
    assert!(
        metric(&text, "densevm_fleet_vm_tier_evictions_total", "t0").unwrap_or(0.0)
            >= (12 * MIB / 4096) as f64,
        "{text}"
    );
    for name in [
        "densevm_fleet_vm_tier_missing_faults_total",
        "densevm_fleet_vm_tier_service_cpu_seconds_total",
    ] {
        assert!(metric(&text, name, "t0").is_some(), "no {name}:\n{text}");
    }

    // PATCH /vms/t0 {"memory_budget_mib": 8}: the VM's resident RAM follows.
    let set = json(&sock, &["set", "t0", "--memory-budget", "8M"]);
    assert_eq!(set["memory_budget_mib"], 8, "{set}");
    assert_eq!(set["memory_budget_user_mib"], 8, "{set}");
    let vm = wait_vm(
        &sock,
        "t0",
        Duration::from_secs(60),
        "resident RAM at most 9 MiB after the budget went to 8 MiB",
        |v| {
            v["tier"]["budget_mib"] == 8
                && v["tier"]["resident_kib"]
                    .as_u64()
                    .is_some_and(|k| k <= 9 << 10)
        },
    );
    assert_eq!(vm["status"], "running", "{vm}");
    eprintln!("t0 under an 8 MiB budget: {}", vm["tier"]);
    let text = fleet(&sock, &["metrics"]);
    assert_eq!(
        metric(&text, "densevm_fleet_vm_memory_budget_bytes", "t0"),
        Some((8 * MIB) as f64),
        "{text}"
    );

    // A budget the tier cannot take is refused by the fleet before it reaches the VM.
    let out = densevm()
        .args(["fleet", "set", "t0", "--memory-budget", "2M", "--sock"])
        .arg(&sock)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("out of range"), "{}", stderr(&out));

    json(&sock, &["delete", "t0"]);
    drop(daemon);
}

#[test]
fn a_jailed_fleet_vm_runs_unprivileged_is_measured_and_deleted() {
    require_kvm();
    // SAFETY: geteuid has no arguments.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "jailed VMs need a root daemon"
    );
    let daemon = Daemon::start_with("j", |dir| {
        let jail = dir.join("jail");
        std::fs::create_dir_all(&jail).unwrap();
        [
            "--jail-root",
            jail.to_str().unwrap(),
            "--jail-uid",
            "64125",
            "--jail-gid",
            "64125",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    });
    let sock = daemon.sock.clone();
    let vm = json(
        &sock,
        &[
            "create",
            "--id",
            "j0",
            "--memory",
            "64M",
            "--probe",
            "touch 16M; sleep 60000; exit 0",
        ],
    );
    assert_eq!(vm["status"], "running", "{vm}");
    let outer = vm["pid"].as_u64().unwrap();
    let children = std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children")).unwrap();
    let vmm: u64 = children.split_whitespace().next().unwrap().parse().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{vmm}/status")).unwrap();
    assert!(
        status.contains("Uid:\t64125\t64125\t64125\t64125"),
        "{status}"
    );
    let root = std::fs::read_link(format!("/proc/{vmm}/root")).unwrap();
    assert_eq!(root, Path::new("/"));
    let vm_dir = daemon.dir.join("state/vms/j0");
    assert!(
        Path::new(&format!(
            "/proc/{vmm}/root{}",
            vm_dir.join("api.sock").display()
        ))
        .exists(),
        "the API socket is not in the jail"
    );
    let cgroups = std::fs::read_to_string(format!("/proc/{vmm}/cgroup")).unwrap();
    assert!(cgroups.contains("/densevm/j0"), "{cgroups}");

    // The daemon measures the jailed VMM, not the outer process.
    let t0 = Instant::now();
    loop {
        let text = fleet(&sock, &["metrics"]);
        if metric(&text, "densevm_fleet_vm_rss_bytes", "j0").unwrap_or(0.0) >= 16.0 * 1048576.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no RSS >= 16 MiB for j0:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let gone = json(&sock, &["delete", "j0"]);
    assert_eq!(gone["status"], "exited", "{gone}");
    assert!(
        !Path::new(&format!("/proc/{vmm}/cmdline")).exists()
            || std::fs::read(format!("/proc/{vmm}/cmdline"))
                .unwrap_or_default()
                .is_empty()
    );
    drop(daemon);
}
