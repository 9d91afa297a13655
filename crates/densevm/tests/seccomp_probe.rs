//! seccomp filters (docs/security.md, "seccomp filters"): a thread of each kind that makes
//! a forbidden call (the hidden `--seccomp-test-violation KIND` hook) ends the VMM with
//! exit code 159 and a line naming the kind and the call; `--seccomp off` warns and runs
//! unfiltered. The probe tests of the other files run with the filters on (the default).

mod common;
use common::*;

/// Runs a probe VM with `--seccomp-test-violation KIND` plus `extra` arguments and checks
/// the process died of it.
fn assert_violation_kills(kind: &str, extra: &[&str]) {
    let mut args = vec![
        "--probe",
        "sleep 2000; exit 0",
        "--seccomp-test-violation",
        kind,
    ];
    args.extend_from_slice(extra);
    let out = run_probe(&args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(159), "{kind}: {err}");
    let want =
        format!("densevm: seccomp: thread kind {kind} made a forbidden system call: socket (41); exiting with code 159");
    assert!(err.contains(&want), "{kind}: no `{want}` in:\n{err}");
}

#[test]
fn a_forbidden_call_on_a_vcpu_thread_kills_the_vmm_naming_vcpu_and_socket() {
    assert_violation_kills("vcpu", &[]);
}

#[test]
fn a_forbidden_call_on_the_control_thread_kills_the_vmm_naming_it() {
    assert_violation_kills("vmm", &[]);
}

#[test]
fn a_forbidden_call_on_the_api_thread_kills_the_vmm_naming_it() {
    let dir = TempDir::new("seccomp-api");
    let sock = dir.join("api.sock");
    assert_violation_kills("api", &["--api-sock", sock.to_str().unwrap()]);
}

#[test]
fn a_forbidden_call_on_the_console_thread_kills_the_vmm_naming_it() {
    let dir = TempDir::new("seccomp-console");
    let sock = dir.join("console.sock");
    assert_violation_kills("console", &["--console-sock", sock.to_str().unwrap()]);
}

#[test]
fn a_forbidden_call_on_the_tier_thread_kills_the_vmm_naming_it() {
    assert_violation_kills("tier", &["--memory", "64M", "--memory-budget", "32M"]);
}

#[test]
fn a_forbidden_call_on_a_pmem_fault_thread_kills_the_vmm_naming_it() {
    let dir = TempDir::new("seccomp-pmem");
    let img = dir.join("p.pcow");
    let out = densevm()
        .args(["image", "create", img.to_str().unwrap(), "4M"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    for kind in ["pmem-faults", "pmem-pool"] {
        assert_violation_kills(kind, &["--pmem", img.to_str().unwrap()]);
    }
}

#[test]
fn the_hook_is_hidden_and_unknown_kinds_are_refused() {
    let help = densevm().args(["run", "--help"]).output().unwrap();
    let text = stdout(&help);
    assert!(text.contains("--seccomp <SECCOMP>"), "{text}");
    assert!(!text.contains("seccomp-test-violation"), "{text}");
    let out = densevm()
        .args(["run", "--probe", "--seccomp-test-violation", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown thread kind; one of vmm, vcpu"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn seccomp_off_warns_loudly_and_lets_the_forbidden_call_through() {
    let out = run_probe(&[
        "--probe",
        "exit 7",
        "--seccomp",
        "off",
        "--seccomp-test-violation",
        "vcpu",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(
        err.contains("WARNING: --seccomp off: this VMM runs WITHOUT seccomp filters"),
        "{err}"
    );
    assert!(!err.contains("forbidden system call"), "{err}");
}

#[test]
fn seccomp_log_warns_and_lets_the_forbidden_call_through_under_logging_filters() {
    let out = run_probe(&[
        "--probe",
        "exit 7",
        "--seccomp",
        "log",
        "--seccomp-test-violation",
        "vcpu",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(
        err.contains("WARNING: --seccomp log: the seccomp filters deny nothing"),
        "{err}"
    );
    // The hook ran (filters were entered) and its call went through.
    assert!(err.contains("making a forbidden call"), "{err}");
    assert!(!err.contains("forbidden system call"), "{err}");
}

/// With the filters on, a probe VM that touches memory over two vCPUs, serves its API and
/// console sockets and keeps RAM under a budget runs to its own exit code.
#[test]
fn a_filtered_vm_with_api_console_and_tier_runs_to_its_exit_code() {
    let dir = TempDir::new("seccomp-ok");
    let api = dir.join("api.sock");
    let console = dir.join("console.sock");
    let out = run_probe(&[
        "--cpus",
        "2",
        "--memory",
        "96M",
        "--memory-budget",
        "48M",
        "--probe",
        "touch 64M; sum ram 0 1M; exit 5",
        "--api-sock",
        api.to_str().unwrap(),
        "--console-sock",
        console.to_str().unwrap(),
        "--report",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(!err.contains("seccomp"), "{err}");
}
