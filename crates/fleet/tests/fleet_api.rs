//! The registry and the REST API over a real unix socket, with a fake launcher (no
//! /dev/kvm): create, list, inspect, change, delete, exits, metrics, policy ticks, cgroups
//! on a fake cgroupfs, and malformed requests.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use common::TestFleet;
use densevm_api::{BalloonStats, ClientError};
use densevm_fleet::api::{parse_request, FleetRequest};
use densevm_fleet::metrics::parse::parse;
use densevm_fleet::policy::Priority;
use densevm_fleet::types::{VmCreate, VmPatch, VmStatus};

fn probe(id: Option<&str>, memory_mib: u64) -> VmCreate {
    VmCreate {
        id: id.map(Into::into),
        probe: Some("sleep 100000; exit 0".into()),
        memory_mib,
        ..Default::default()
    }
}

fn api_err<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, String) {
    match r {
        Err(ClientError::Api { status, message }) => (status, message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A guest with `free`, `avail`, `caches` MiB of its `total`.
fn stats(total: u64, free: u64, avail: u64, caches: u64) -> BalloonStats {
    BalloonStats {
        total_memory: Some(total << 20),
        free_memory: Some(free << 20),
        available_memory: Some(avail << 20),
        disk_caches: Some(caches << 20),
        major_faults: Some(0),
        swap_in: Some(0),
        ..Default::default()
    }
}

#[test]
fn create_list_show_change_delete() {
    let t = TestFleet::new(false);
    let info = t.client.info().unwrap();
    assert_eq!(info.app_name, "densevm-fleet");
    assert!(!info.cgroup.enabled);
    assert!(
        info.warnings
            .iter()
            .any(|w| w.contains("no hard memory stop")),
        "{info:?}"
    );

    let a = t.client.create(&probe(None, 256)).unwrap();
    assert_eq!(a.id, "vm-0");
    assert_eq!((a.min_mib, a.max_mib, a.balloon_mib), (64, 256, 0));
    assert_eq!(a.status, VmStatus::Running);
    assert!(
        a.api_sock.ends_with("state/vms/vm-0/api.sock"),
        "{}",
        a.api_sock
    );
    // The process gets densevm run's flags.
    let args = t.fake("vm-0").plan_args;
    let joined = args.join(" ");
    assert!(
        joined.starts_with("--memory 256M --cpus 1 --probe"),
        "{joined}"
    );
    assert!(
        joined.contains("--api-sock") && joined.contains("--console-sock"),
        "{joined}"
    );
    assert!(args.ends_with(&["--id".into(), "vm-0".into()]), "{args:?}");

    let mut spec = probe(Some("big"), 1024);
    spec.priority = Priority::High;
    spec.max_mib = Some(768);
    spec.min_mib = Some(512);
    let b = t.client.create(&spec).unwrap();
    // A max under the RAM starts with the balloon holding the rest (sent once it can be).
    assert_eq!((b.balloon_mib, b.priority), (256, Priority::High));
    assert_eq!(api_err(t.client.create(&spec)).0, 409);

    let list = t.client.list().unwrap();
    let ids: Vec<&str> = list.iter().map(|v| v.id.as_str()).collect();
    assert_eq!(ids, ["big", "vm-0"]);
    assert_eq!(t.client.get("big").unwrap().spec, spec);
    assert_eq!(api_err(t.client.get("nope")).0, 404);

    // Changes: class, bounds (the balloon moves into them), impossible targets refused.
    let p = VmPatch {
        priority: Some(Priority::Low),
        ..Default::default()
    };
    assert_eq!(t.client.patch("vm-0", &p).unwrap().priority, Priority::Low);
    let (status, msg) = api_err(t.client.patch(
        "big",
        &VmPatch {
            balloon_mib: Some(600),
            ..Default::default()
        },
    ));
    assert_eq!(status, 400);
    assert!(
        msg.contains("impossible balloon target") && msg.contains("256 to 512"),
        "{msg}"
    );
    let (status, msg) = api_err(t.client.patch(
        "big",
        &VmPatch {
            max_mib: Some(2048),
            ..Default::default()
        },
    ));
    assert_eq!(status, 400);
    assert!(msg.contains("above the VM's memory"), "{msg}");
    assert_eq!(
        api_err(t.client.patch(
            "big",
            &VmPatch {
                min_mib: Some(800),
                ..Default::default()
            }
        ))
        .0,
        400,
        "min above max"
    );
    let moved = t
        .client
        .patch(
            "big",
            &VmPatch {
                max_mib: Some(600),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((moved.max_mib, moved.balloon_mib), (600, 424));
    // A target for a VM without a balloon device: the VM's refusal is the answer.
    let (status, msg) = api_err(t.client.patch(
        "vm-0",
        &VmPatch {
            balloon_mib: Some(64),
            ..Default::default()
        },
    ));
    assert_eq!(status, 409);
    assert!(msg.contains("no balloon device"), "{msg}");
    // With one, it is sent at once.
    t.with_fake("vm-0", |v| v.stats = Some(stats(256, 10, 100, 50)));
    let set = t
        .client
        .patch(
            "vm-0",
            &VmPatch {
                balloon_mib: Some(64),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(set.balloon_mib, 64);
    assert_eq!(t.fake("vm-0").balloon, Some(64));

    // Delete: SIGTERM, gone, its directory removed.
    let gone = t.client.delete("vm-0").unwrap();
    assert_eq!(gone.status, VmStatus::Exited);
    assert_eq!(t.fake("vm-0").signals, [libc::SIGTERM]);
    assert!(!t.dir.path().join("state/vms/vm-0").exists());
    assert_eq!(api_err(t.client.delete("vm-0")).0, 404);
    // One that ignores SIGTERM gets SIGKILL after the grace period.
    t.with_fake("big", |v| v.ignores_sigterm = true);
    let gone = t.client.delete("big").unwrap();
    assert_eq!(t.fake("big").signals, [libc::SIGTERM, libc::SIGKILL]);
    assert!(gone.exit.unwrap().contains(&libc::SIGKILL.to_string()));
    assert!(t.client.list().unwrap().is_empty());
}

#[test]
fn bad_create_requests_are_refused_with_a_reason() {
    let t = TestFleet::new(false);
    let cases: Vec<(VmCreate, &str)> = vec![
        (
            VmCreate {
                memory_mib: 128,
                ..Default::default()
            },
            "exactly one of",
        ),
        (
            VmCreate {
                kernel: Some("/k".into()),
                probe: Some("exit 0".into()),
                memory_mib: 128,
                ..Default::default()
            },
            "exactly one of",
        ),
        (
            VmCreate {
                disks: vec!["/d.pcow".into()],
                ..probe(None, 128)
            },
            "devices of a Linux guest",
        ),
        (probe(None, 0), "memory_mib 0"),
        (probe(Some(".hidden"), 128), "not valid"),
        (probe(Some("a/b"), 128), "not valid"),
        (
            VmCreate {
                max_mib: Some(256),
                ..probe(None, 128)
            },
            "above the VM's memory",
        ),
        (
            VmCreate {
                vcpus: Some(0),
                ..probe(None, 128)
            },
            "vcpus",
        ),
    ];
    for (spec, want) in cases {
        let (status, msg) = api_err(t.client.create(&spec));
        assert_eq!(status, 400, "{spec:?}: {msg}");
        assert!(msg.contains(want), "{spec:?}: {msg}");
    }
    *t.launcher.fail.lock().unwrap() = Some("VM x ended before serving its API".into());
    let (status, msg) = api_err(t.client.create(&probe(None, 128)));
    assert_eq!(status, 500);
    assert!(msg.contains("ended before"), "{msg}");
    assert!(t.client.list().unwrap().is_empty());
}

#[test]
fn a_vm_that_dies_is_reported_and_counted() {
    let t = TestFleet::new(false);
    t.client.create(&probe(Some("a"), 128)).unwrap();
    t.with_fake("a", |v| {
        v.exit = Some("killed by signal 9 (SIGKILL)".into())
    });
    t.fleet.tick();
    let a = t.client.get("a").unwrap();
    assert_eq!(a.status, VmStatus::Exited);
    assert!(a.exit.unwrap().contains("SIGKILL"));
    let m = parse(&t.client.metrics().unwrap());
    let get = |name: &str, labels: &[(&str, &str)]| {
        let mut l: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.sort();
        m.get(&(name.to_string(), l)).copied()
    };
    assert_eq!(get("densevm_fleet_vm_exits_total", &[]), Some(1.0));
    assert_eq!(get("densevm_fleet_vms", &[("status", "exited")]), Some(1.0));
    // An exited VM cannot be changed, only deleted (no signals then).
    assert_eq!(api_err(t.client.patch("a", &VmPatch::default())).0, 409);
    t.client.delete("a").unwrap();
    assert!(t.fake("a").signals.is_empty());
}

#[test]
fn ticks_run_the_policy_through_each_vms_balloon_and_count_it() {
    let t = TestFleet::new(false);
    t.client.create(&probe(Some("lo"), 1024)).unwrap();
    t.client.create(&probe(Some("nostats"), 1024)).unwrap();
    t.with_fake("lo", |v| v.stats = Some(stats(1024, 24, 900, 800)));
    // Host under the low watermark (400 MiB).
    t.set_host(4096, 300);
    t.fleet.tick();
    let lo = t.fake("lo");
    assert_eq!(
        lo.balloon_sets,
        [24 + 64],
        "one bounded step over what the guest had free"
    );
    assert!(
        t.fake("nostats").balloon_sets.is_empty(),
        "no stats: left alone"
    );
    let info = t.client.get("lo").unwrap();
    assert_eq!(info.balloon_mib, 88);
    assert_eq!(info.guest.unwrap().available_mib, 900);
    assert!(t
        .client
        .get("nostats")
        .unwrap()
        .balloon_error
        .unwrap()
        .contains("no balloon"));

    let text = t.client.metrics().unwrap();
    let m = parse(&text);
    let key = |name: &str, labels: &[(&str, &str)]| {
        let mut l: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.sort();
        (name.to_string(), l)
    };
    assert_eq!(
        m[&key(
            "densevm_fleet_policy_actions_total",
            &[("direction", "inflate"), ("reason", "host_low_memory")]
        )],
        1.0
    );
    assert_eq!(
        m[&key(
            "densevm_fleet_policy_actions_total",
            &[("direction", "deflate"), ("reason", "guest_short")]
        )],
        0.0
    );
    assert_eq!(
        m[&key("densevm_fleet_host_memory_available_bytes", &[])],
        (300u64 << 20) as f64
    );
    assert_eq!(
        m[&key("densevm_fleet_policy_mode", &[("mode", "reclaim")])],
        1.0
    );
    assert_eq!(
        m[&key(
            "densevm_fleet_vm_balloon_target_bytes",
            &[("vm", "lo"), ("priority", "normal")]
        )],
        (88u64 << 20) as f64
    );
    assert_eq!(
        m[&key(
            "densevm_fleet_vm_guest_available_bytes",
            &[("vm", "lo"), ("priority", "normal")]
        )],
        (900u64 << 20) as f64
    );
    assert!(
        text.contains("densevm_fleet_vm_rss_bytes{vm=\"nostats\""),
        "{text}"
    );
    assert_eq!(m[&key("densevm_fleet_ticks_total", &[])], 1.0);
    assert_eq!(m[&key("densevm_fleet_cgroup_enabled", &[])], 0.0);
}

#[test]
fn vms_get_a_cgroup_with_their_limit_on_a_fake_cgroupfs() {
    let t = TestFleet::new(true);
    let info = t.client.info().unwrap();
    assert!(info.cgroup.enabled && info.cgroup.missing.is_none());
    let mut spec = probe(Some("c"), 512);
    spec.max_mib = Some(384);
    let c = t.client.create(&spec).unwrap();
    let dir = t.dir.path().join("cgroup/vm-c");
    assert_eq!(c.cgroup.as_deref(), Some(dir.to_str().unwrap()));
    assert_eq!(t.fake("c").cgroup.as_deref(), Some(dir.as_path()));
    let max = || std::fs::read_to_string(dir.join("memory.max")).unwrap();
    assert_eq!(max(), ((384u64 + 64) << 20).to_string());
    t.client
        .patch(
            "c",
            &VmPatch {
                max_mib: Some(448),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(max(), ((448u64 + 64) << 20).to_string());
    t.client.delete("c").unwrap();
    assert!(!dir.exists());
}

#[test]
fn malformed_requests_get_4xx_json_and_never_kill_the_api() {
    let t = TestFleet::new(false);
    let raw = |req: &[u8]| -> (u16, String) {
        let mut s = UnixStream::connect(&t.sock).unwrap();
        let _ = s.write_all(req);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status: u16 = out.get(9..12).and_then(|x| x.parse().ok()).unwrap_or(0);
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        (status, body)
    };
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (
            b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
            404,
        ),
        (
            b"PUT /vms HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".to_vec(),
            405,
        ),
        (
            b"POST /metrics HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".to_vec(),
            405,
        ),
        (
            b"GET /vms/../../etc HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
            404,
        ),
        (
            b"GET /vms/a/b HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
            404,
        ),
        (
            b"DELETE /vms/ghost HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
            404,
        ),
        (post("/vms", "").into_bytes(), 400),
        (post("/vms", "{").into_bytes(), 400),
        (post("/vms", "[1,2]").into_bytes(), 400),
        (
            post("/vms", r#"{"memory_mib": -5, "probe": "x"}"#).into_bytes(),
            400,
        ),
        (
            post("/vms", r#"{"memory_mib": 64, "probe": "x", "prio": 1}"#).into_bytes(),
            400,
        ),
        (
            post(
                "/vms",
                r#"{"memory_mib": 64, "probe": "x", "priority": "urgent"}"#,
            )
            .into_bytes(),
            400,
        ),
        (post("/vms", &"[".repeat(60_000)).into_bytes(), 400),
        (
            b"PATCH /vms/x HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}".to_vec(),
            404,
        ),
        (b"GARBAGE\r\n\r\n".to_vec(), 400),
        (
            b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
            501,
        ),
        (
            b"GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n".to_vec(),
            413,
        ),
    ];
    for (req, want) in cases {
        let (status, body) = raw(&req);
        assert_eq!(
            status,
            want,
            "{}: {body}",
            String::from_utf8_lossy(&req[..req.len().min(80)])
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["fault_message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }
    // A PATCH with unknown fields on an existing VM.
    t.client.create(&probe(Some("x"), 64)).unwrap();
    let (status, body) = raw(
        b"PATCH /vms/x HTTP/1.1\r\nContent-Length: 12\r\nConnection: close\r\n\r\n{\"maxx\": 1 }",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("maxx"), "{body}");
    // Still serving.
    assert_eq!(t.client.list().unwrap().len(), 1);
}

#[test]
fn routes_parse_without_io() {
    assert_eq!(parse_request("GET", "/", b""), Ok(FleetRequest::Info));
    assert_eq!(
        parse_request("GET", "/vms/?x=1", b""),
        Ok(FleetRequest::List)
    );
    assert_eq!(
        parse_request("GET", "/metrics", b""),
        Ok(FleetRequest::Metrics)
    );
    assert_eq!(
        parse_request("DELETE", "/vms/a-1.b_c", b""),
        Ok(FleetRequest::Delete("a-1.b_c".into()))
    );
    assert_eq!(
        parse_request(
            "PATCH",
            "/vms/a",
            br#"{"priority": "high", "balloon_mib": 64}"#
        ),
        Ok(FleetRequest::Patch(
            "a".into(),
            VmPatch {
                priority: Some(Priority::High),
                balloon_mib: Some(64),
                ..Default::default()
            }
        ))
    );
    let e = parse_request("GET", "/x", b"").unwrap_err();
    assert_eq!(e.status, 404);
    assert!(e.message.contains("PATCH /vms/{id}"), "{}", e.message);
    let e = parse_request("POST", "/vms/a", b"").unwrap_err();
    assert_eq!(e.status, 405);
    assert!(e.message.contains("GET, PATCH, DELETE"), "{}", e.message);
    // Arbitrary bytes never panic.
    let mut seed = 1u64;
    for _ in 0..5000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = (seed >> 58) as usize;
        let bytes: Vec<u8> = (0..len).map(|i| (seed >> (i % 56)) as u8).collect();
        let path = format!("/vms/{}", String::from_utf8_lossy(&bytes));
        for m in ["GET", "PATCH", "POST", "DELETE", "PUT"] {
            let _ = parse_request(m, &path, &bytes);
            let _ = parse_request(m, "/vms", &bytes);
        }
    }
}
