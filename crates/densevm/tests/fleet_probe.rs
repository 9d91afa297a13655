//! `densevm fleet` for real on /dev/kvm: the daemon starts a probe VM as a `densevm run`
//! process, lists it, reports its RSS in the metrics, and deletes it (issue #12). Fails,
//! never skips, without /dev/kvm.

mod common;

use common::{densevm, require_kvm, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    dir: PathBuf,
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
    // Short: socket paths are limited to 107 bytes.
    let dir = std::env::temp_dir().join(format!("dvf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("fleet.sock");
    let child = densevm()
        .args(["fleet", "serve", "--state-dir"])
        .arg(dir.join("state"))
        .arg("--sock")
        .arg(&sock)
        .args(["--tick-ms", "200", "--grace-secs", "2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let daemon = Daemon { child, dir };
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the daemon did not serve"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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
