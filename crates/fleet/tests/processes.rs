//! Real processes without /dev/kvm: the process launcher's cgroup join and its error when
//! a VM never serves its API, and a restarted daemon adopting the VMs an earlier one left.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use densevm_fleet::cgroup::Cgroups;
use densevm_fleet::host::ProcFs;
use densevm_fleet::launcher::{LaunchPlan, Launcher, ProcessLauncher};
use densevm_fleet::registry::{Registry, RegistryConfig};
use densevm_fleet::types::VmStatus;

#[test]
fn the_launcher_joins_the_cgroup_before_exec_and_reports_a_vm_that_never_serves() {
    let dir = tempfile::tempdir().unwrap();
    // A "densevm" that prints and exits at once.
    let fake = dir.path().join("densevm");
    std::fs::write(&fake, "#!/bin/sh\necho \"fake densevm: $*\"\nexit 3\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cg = Cgroups::at(dir.path().join("cg"));
    std::fs::create_dir_all(cg.parent()).unwrap();
    let vm_cg = cg.create_vm("a", 1 << 30).unwrap();
    let plan = LaunchPlan {
        id: "a".into(),
        run_args: vec!["--probe".into(), "exit 0".into()],
        api_sock: dir.path().join("api.sock"),
        console: dir.path().join("console.log"),
        cgroup: Some(vm_cg.clone()),
    };
    let mut launcher = ProcessLauncher::new(&fake).with_ready_timeout(Duration::from_secs(10));
    let err = launcher.launch(&plan).err().expect("must fail");
    assert!(
        err.contains("ended before serving its API (exit code 3)"),
        "{err}"
    );
    assert!(err.contains("fake densevm: run --probe exit 0"), "{err}");
    // The child wrote "0" (itself) into cgroup.procs before exec.
    assert_eq!(
        std::fs::read_to_string(vm_cg.dir().join("cgroup.procs")).unwrap(),
        "0"
    );
}

#[test]
fn a_restarted_daemon_adopts_running_vms_and_reports_gone_ones() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cfg = RegistryConfig {
        state_dir: state.clone(),
        overhead_mib: 64,
        grace: Duration::from_secs(2),
    };
    let record = |id: &str, pid: u32| {
        let vm_dir = state.join("vms").join(id);
        std::fs::create_dir_all(&vm_dir).unwrap();
        let rec = serde_json::json!({
            "spec": {"probe": "exit 0", "memory_mib": 128},
            "pid": pid, "priority": "high", "min_mib": 32, "max_mib": 128, "balloon_mib": 0
        });
        std::fs::write(vm_dir.join("vm.json"), rec.to_string()).unwrap();
        vm_dir.join("api.sock")
    };
    // A stand-in VMM whose command line names its API socket, in its own process group.
    let sock = record("alive", 0);
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("sleep 60; true")
        .arg("sh")
        .arg("--api-sock")
        .arg(&sock)
        .process_group(0)
        .spawn()
        .unwrap();
    record("alive", child.id());
    // Until the child has exec'd, its command line is this test's: wait for the shell's.
    let cmdline = format!("/proc/{}/cmdline", child.id());
    let t0 = std::time::Instant::now();
    while !std::fs::read(&cmdline)
        .map(|c| String::from_utf8_lossy(&c).contains("--api-sock"))
        .unwrap_or(false)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the stand-in VMM did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A record whose process is gone (pid 2^30 is above any pid_max).
    record("gone", 1 << 30);
    let launcher = common::FakeLauncher::default();
    let mut reg = Registry::new(cfg, Box::new(launcher), None);
    assert_eq!(reg.adopt(&ProcFs::default()), 2);
    let alive = reg.get("alive").unwrap();
    assert_eq!((alive.status, alive.pid), (VmStatus::Running, child.id()));
    assert_eq!(alive.priority, densevm_fleet::policy::Priority::High);
    let gone = reg.get("gone").unwrap();
    assert_eq!(gone.status, VmStatus::Exited);
    assert!(gone.exit.unwrap().contains("no fleet daemon"));
    // Deleting the adopted VM signals its process group.
    let deleted = reg.delete("alive");
    let status = child.wait().unwrap();
    assert!(deleted.is_ok(), "{deleted:?}");
    assert!(!status.success());
    assert!(reg.list().iter().all(|v| v.id != "alive"));
}
