//! `POST /vms/{id}/exec` end to end without a VM: a fake VM whose vsock socket is a
//! stand-in for the device's hybrid socket, in front of the real guest agent
//! (lab/guest/agent.c built with the host's cc). The nested lab runs the same verb against
//! a Linux guest (lab/tests/fleet-manager.sh).

mod common;

use std::time::{Duration, Instant};

use common::TestFleet;
use densevm_agent::testing::{agent, HybridSocket};
use densevm_api::ClientError;
use densevm_fleet::types::{VmCreate, VmExec};

fn linux(id: &str) -> VmCreate {
    VmCreate {
        id: Some(id.into()),
        kernel: Some("/boot/vmlinux".into()),
        memory_mib: 256,
        vsock_cid: Some(3),
        ..Default::default()
    }
}

fn cmd(argv: &[&str]) -> VmExec {
    VmExec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn status<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, String) {
    match r {
        Err(ClientError::Api { status, message }) => (status, message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[test]
fn exec_runs_in_the_guest_and_reports_output_and_exit_code() {
    let t = TestFleet::new(false);
    let a = agent("fleet");
    let hybrid = HybridSocket::serve(t.dir.path().join("vsock.sock"), 52, a.sock.clone());
    let vm = t.client.create(&linux("a")).unwrap();
    assert!(
        t.fake("a").plan_args.join(" ").contains(&format!(
            "--vsock cid=3,uds={}",
            t.dir.path().join("state/vms/a/vsock.sock").display()
        )),
        "{:?}",
        t.fake("a").plan_args
    );
    assert_eq!(vm.id, "a");
    t.with_fake("a", |v| v.vsock_uds = Some(hybrid.path.clone()));

    let r = t
        .client
        .exec("a", &cmd(&["sh", "-c", "echo out; echo err >&2; exit 3"]))
        .unwrap();
    assert_eq!((r.exit_code, r.status.as_str()), (3, "exited"));
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out\n", "err\n"));
    assert!(!r.truncated);

    let r = t
        .client
        .exec(
            "a",
            &VmExec {
                stdin: Some("line one\nline two\n".into()),
                env: vec!["X=y z".into()],
                ..cmd(&["sh", "-c", "wc -l; echo \"$X\""])
            },
        )
        .unwrap();
    assert_eq!(r.exit_code, 0);
    assert_eq!(
        r.stdout.split_whitespace().collect::<Vec<_>>(),
        ["2", "y", "z"]
    );

    let r = t
        .client
        .exec(
            "a",
            &VmExec {
                timeout_s: Some(0.3),
                ..cmd(&["sleep", "30"])
            },
        )
        .unwrap();
    assert_eq!((r.exit_code, r.status.as_str()), (124, "timed_out"));

    let r = t.client.exec("a", &cmd(&["/nonexistent/cmd"])).unwrap();
    assert_eq!((r.exit_code, r.status.as_str()), (127, "not_started"));
}

#[test]
fn a_long_command_does_not_hold_up_the_fleet_api() {
    let t = TestFleet::new(false);
    let a = agent("fleet-slow");
    let hybrid = HybridSocket::serve(t.dir.path().join("vsock.sock"), 52, a.sock.clone());
    t.client.create(&linux("slow")).unwrap();
    t.with_fake("slow", |v| v.vsock_uds = Some(hybrid.path.clone()));
    let client = t.client.clone();
    let started = Instant::now();
    let long = std::thread::spawn(move || client.exec("slow", &cmd(&["sleep", "2"])));
    std::thread::sleep(Duration::from_millis(300));
    // The API answers other requests while the command runs.
    let list = t.client.list().unwrap();
    assert_eq!(list.len(), 1);
    assert!(
        started.elapsed() < Duration::from_millis(1800),
        "GET /vms waited for the command: {:?}",
        started.elapsed()
    );
    let r = long.join().unwrap().unwrap();
    assert_eq!(r.exit_code, 0);
    assert!(r.duration_ms >= 2000, "{}", r.duration_ms);
}

#[test]
fn exec_errors_are_clear() {
    let t = TestFleet::new(false);
    let a = agent("fleet-errors");
    let hybrid = HybridSocket::serve(t.dir.path().join("vsock.sock"), 52, a.sock.clone());
    // No such VM.
    assert_eq!(status(t.client.exec("nope", &cmd(&["true"]))).0, 404);
    // A VM without a vsock device.
    t.client
        .create(&VmCreate {
            vsock_cid: None,
            ..linux("novsock")
        })
        .unwrap();
    let (s, m) = status(t.client.exec("novsock", &cmd(&["true"])));
    assert_eq!(s, 400);
    assert!(m.contains("vsock_cid"), "{m}");
    // No agent on that port: 502 naming the VM.
    t.client.create(&linux("b")).unwrap();
    t.with_fake("b", |v| v.vsock_uds = Some(hybrid.path.clone()));
    let (s, m) = status(t.client.exec(
        "b",
        &VmExec {
            port: Some(4444),
            ..cmd(&["true"])
        },
    ));
    assert_eq!(s, 502);
    assert!(m.contains("no agent answered") && m.contains("VM b"), "{m}");
    // Bad requests, before anything runs.
    for bad in [
        cmd(&[]),
        VmExec {
            env: vec!["NOVALUE".into()],
            ..cmd(&["true"])
        },
        VmExec {
            timeout_s: Some(-1.0),
            ..cmd(&["true"])
        },
    ] {
        assert_eq!(status(t.client.exec("b", &bad)).0, 400, "{bad:?}");
    }
    // An exited VM.
    t.with_fake("b", |v| v.exit = Some("exit code 0".into()));
    t.fleet.lock().registry.reap();
    let (s, m) = status(t.client.exec("b", &cmd(&["true"])));
    assert_eq!(s, 409, "{m}");
    // A body with an unknown field names it.
    let (s, body) = densevm_api::ApiClient::new(&t.sock)
        .request(
            "POST",
            "/vms/b/exec",
            Some(r#"{"argv": ["true"], "argz": 1}"#),
        )
        .unwrap();
    assert_eq!(s, 400);
    assert!(String::from_utf8_lossy(&body).contains("argz"));
}
