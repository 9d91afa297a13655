//! The route table: every route, 404, 405, bad JSON, unknown fields, refused Firecracker
//! options and range checks.

use densevm_api::{
    parse_route, ApiRequest, CloneRequest, InstanceInfo, InstanceState, SnapshotCreate,
    SnapshotType, VmState, VmStateChange,
};

fn err(method: &str, path: &str, body: &str) -> (u16, String) {
    let e = parse_route(method, path, body.as_bytes()).expect_err("must fail");
    (e.status, e.message)
}

#[test]
fn every_route_parses() {
    assert_eq!(parse_route("GET", "/", b""), Ok(ApiRequest::GetInfo));
    assert_eq!(
        parse_route("GET", "/?verbose=1", b"ignored"),
        Ok(ApiRequest::GetInfo)
    );
    for (word, state) in [("Paused", VmState::Paused), ("Resumed", VmState::Resumed)] {
        let body = format!(r#"{{"state": "{word}"}}"#);
        assert_eq!(
            parse_route("PATCH", "/vm", body.as_bytes()),
            Ok(ApiRequest::PatchVm(VmStateChange { state }))
        );
    }
    assert_eq!(
        parse_route("PUT", "/snapshot/create", br#"{"snapshot_path": "/s/a"}"#),
        Ok(ApiRequest::CreateSnapshot(SnapshotCreate {
            snapshot_type: SnapshotType::Full,
            snapshot_path: "/s/a".into(),
            mem_file_path: None,
        }))
    );
    assert_eq!(
        parse_route(
            "PUT",
            "/snapshot/create/",
            br#"{"snapshot_type": "Template", "snapshot_path": "/t"}"#
        ),
        Ok(ApiRequest::CreateSnapshot(SnapshotCreate {
            snapshot_type: SnapshotType::Template,
            snapshot_path: "/t".into(),
            mem_file_path: None,
        }))
    );
    assert_eq!(
        parse_route("POST", "/clones", br#"{"count": 3, "snapshot_path": "/t"}"#),
        Ok(ApiRequest::CreateClones(CloneRequest {
            count: 3,
            snapshot_path: "/t".into(),
            network_overrides: Vec::new(),
            memory_budget_mib: None,
        }))
    );
    assert_eq!(
        parse_route(
            "POST",
            "/clones",
            br#"{"count": 1, "snapshot_path": "/t", "memory_budget_mib": 64}"#
        ),
        Ok(ApiRequest::CreateClones(CloneRequest {
            count: 1,
            snapshot_path: "/t".into(),
            network_overrides: Vec::new(),
            memory_budget_mib: Some(64),
        }))
    );
}

#[test]
fn clone_network_overrides_are_checked() {
    use densevm_api::NetworkOverride;
    let ok = br#"{"count": 2, "snapshot_path": "/t",
        "network_overrides": [{"iface_id": "net0", "host_dev_name": "tap-c{index}"}]}"#;
    match parse_route("POST", "/clones", ok) {
        Ok(ApiRequest::CreateClones(c)) => {
            assert_eq!(
                c.network_overrides,
                [NetworkOverride {
                    iface_id: "net0".into(),
                    host_dev_name: "tap-c{index}".into()
                }]
            );
            assert_eq!(c.network_overrides[0].for_clone(7), "tap-c7");
        }
        other => panic!("{other:?}"),
    }
    for (body, what) in [
        (
            r#"{"count": 2, "snapshot_path": "/t", "network_overrides": [{"iface_id": "net0", "host_dev_name": "tap1"}]}"#,
            "{index}",
        ),
        (
            r#"{"count": 1, "snapshot_path": "/t", "network_overrides": [{"iface_id": "net0", "host_dev_name": "a-very-long-tap-name"}]}"#,
            "15 bytes",
        ),
        (
            r#"{"count": 1, "snapshot_path": "/t", "network_overrides": [{"iface_id": "net0", "host_dev_name": "a"}, {"iface_id": "net0", "host_dev_name": "b"}]}"#,
            "twice",
        ),
        (
            r#"{"count": 1, "snapshot_path": "/t", "network_overrides": [{"iface_id": "net0"}]}"#,
            "host_dev_name",
        ),
    ] {
        let (status, msg) = err("POST", "/clones", body);
        assert_eq!(status, 400, "{body}");
        assert!(msg.contains(what), "{body}: {msg}");
    }
}

#[test]
fn vsock_route() {
    assert_eq!(parse_route("GET", "/vsock", b""), Ok(ApiRequest::GetVsock));
    assert_eq!(err("PUT", "/vsock", "{}").0, 405);
}

#[test]
fn memory_tier_routes_parse_and_check_the_budget() {
    assert_eq!(
        parse_route("GET", "/memory-tier", b""),
        Ok(ApiRequest::GetMemoryTier)
    );
    assert_eq!(
        parse_route("PATCH", "/memory-tier", br#"{"budget_mib": 256}"#),
        Ok(ApiRequest::PatchMemoryTier(densevm_api::MemoryTierUpdate {
            budget_mib: 256
        }))
    );
    let (status, msg) = err("PATCH", "/memory-tier", r#"{"budget_mib": 2}"#);
    assert_eq!(status, 400);
    assert!(msg.contains("minimum"), "{msg}");
    let (status, msg) = err("PATCH", "/memory-tier", r#"{"budget": 64}"#);
    assert_eq!(status, 400);
    assert!(msg.contains("budget_mib"), "{msg}");
    assert_eq!(err("PUT", "/memory-tier", "{}").0, 405);
}

#[test]
fn unknown_path_is_404_listing_the_routes() {
    let (status, msg) = err("GET", "/machine-config", "");
    assert_eq!(status, 404);
    for route in ["GET /", "PATCH /vm", "PUT /snapshot/create", "POST /clones"] {
        assert!(msg.contains(route), "{msg}");
    }
    assert!(msg.contains("/machine-config"), "{msg}");
    assert_eq!(err("GET", "", "").0, 404);
    assert_eq!(err("GET", "*", "").0, 404);
    // A long path is quoted cut short.
    let long = format!("/{}", "x".repeat(5000));
    assert!(err("GET", &long, "").1.len() < 600);
}

#[test]
fn wrong_method_is_405_naming_the_right_one() {
    let (status, msg) = err("GET", "/vm", "");
    assert_eq!(status, 405);
    assert!(msg.contains("PATCH"), "{msg}");
    assert_eq!(err("POST", "/", "").0, 405);
    assert!(err("POST", "/snapshot/create", "{}").1.contains("PUT"));
    assert!(err("PUT", "/clones", "{}").1.contains("POST"));
    assert_eq!(err("get", "/", "").0, 405, "methods are case-sensitive");
}

#[test]
fn bad_json_is_400_with_serdes_message() {
    let (status, msg) = err("PATCH", "/vm", "{\"state\": ");
    assert_eq!(status, 400);
    assert!(msg.contains("EOF"), "{msg}");
    let (status, msg) = err("PATCH", "/vm", "");
    assert_eq!(status, 400);
    assert!(msg.contains("needs a JSON body"), "{msg}");
    let (status, msg) = err("PATCH", "/vm", r#"{"state": "Stopped"}"#);
    assert_eq!(status, 400);
    assert!(msg.contains("Stopped") && msg.contains("Resumed"), "{msg}");
    assert_eq!(err("PATCH", "/vm", "\u{0}\u{1}").0, 400);
    assert_eq!(
        err("POST", "/clones", r#"{"count": -1, "snapshot_path": "/t"}"#).0,
        400
    );
    assert_eq!(err("PUT", "/snapshot/create", r#"{}"#).0, 400);
}

#[test]
fn unknown_field_is_400_naming_it() {
    let (status, msg) = err("PATCH", "/vm", r#"{"state": "Paused", "stat": 1}"#);
    assert_eq!(status, 400);
    assert!(msg.contains("stat"), "{msg}");
    let (_, msg) = err("PUT", "/snapshot/create", r#"{"snapshot_pth": "/s"}"#);
    assert!(msg.contains("snapshot_pth"), "{msg}");
    let (_, msg) = err(
        "POST",
        "/clones",
        r#"{"count": 1, "snapshot_path": "/t", "n": 2}"#,
    );
    assert!(msg.contains("`n`"), "{msg}");
}

#[test]
fn firecracker_options_densevm_lacks_are_refused_with_advice() {
    let (status, msg) = err(
        "PUT",
        "/snapshot/create",
        r#"{"snapshot_type": "Diff", "snapshot_path": "/s"}"#,
    );
    assert_eq!(status, 400);
    assert!(msg.contains("no diff snapshots"), "{msg}");
    let (status, msg) = err(
        "PUT",
        "/snapshot/create",
        r#"{"snapshot_type": "Full", "snapshot_path": "/s", "mem_file_path": "/m"}"#,
    );
    assert_eq!(status, 400);
    assert!(msg.contains("inside snapshot_path") && msg.contains("only snapshot_path"));
    assert_eq!(
        err("PUT", "/snapshot/create", r#"{"snapshot_path": ""}"#).0,
        400
    );
}

#[test]
fn clone_count_is_bounded() {
    let body = |n: i64| format!(r#"{{"count": {n}, "snapshot_path": "/t"}}"#);
    for n in [1, 256] {
        assert!(
            parse_route("POST", "/clones", body(n).as_bytes()).is_ok(),
            "{n}"
        );
    }
    for n in [0, 257, 1 << 40] {
        let (status, msg) = err("POST", "/clones", &body(n));
        assert_eq!(status, 400, "{n}: {msg}");
    }
    assert!(err("POST", "/clones", &body(0)).1.contains("1 to 256"));
    assert_eq!(
        err("POST", "/clones", r#"{"count": 1, "snapshot_path": ""}"#).0,
        400
    );
}

#[test]
fn response_types_use_firecrackers_strings() {
    let info = InstanceInfo {
        id: "vm0".into(),
        state: InstanceState::NotStarted,
        vmm_version: "0.1.0".into(),
        app_name: "densevm".into(),
    };
    let json = serde_json::to_string(&info).unwrap();
    assert_eq!(
        json,
        r#"{"id":"vm0","state":"Not started","vmm_version":"0.1.0","app_name":"densevm"}"#
    );
    assert_eq!(
        serde_json::to_string(&InstanceState::Paused).unwrap(),
        r#""Paused""#
    );
    let snap = SnapshotCreate {
        snapshot_type: SnapshotType::Template,
        snapshot_path: "/t".into(),
        mem_file_path: None,
    };
    assert_eq!(
        serde_json::to_string(&snap).unwrap(),
        r#"{"snapshot_type":"Template","snapshot_path":"/t"}"#
    );
}

#[test]
fn balloon_routes_parse_with_firecrackers_shapes() {
    use densevm_api::{Balloon, BalloonStats, BalloonStatsUpdate, BalloonUpdate};
    assert_eq!(
        parse_route(
            "PUT",
            "/balloon",
            br#"{"amount_mib": 0, "deflate_on_oom": true, "stats_polling_interval_s": 1}"#
        ),
        Ok(ApiRequest::PutBalloon(Balloon {
            amount_mib: 0,
            deflate_on_oom: true,
            stats_polling_interval_s: 1
        }))
    );
    // The polling interval may be left out (0: no statistics).
    assert_eq!(
        parse_route(
            "PUT",
            "/balloon",
            br#"{"amount_mib": 8, "deflate_on_oom": false}"#
        ),
        Ok(ApiRequest::PutBalloon(Balloon {
            amount_mib: 8,
            deflate_on_oom: false,
            stats_polling_interval_s: 0
        }))
    );
    assert_eq!(
        parse_route("PATCH", "/balloon", br#"{"amount_mib": 64}"#),
        Ok(ApiRequest::PatchBalloon(BalloonUpdate { amount_mib: 64 }))
    );
    assert_eq!(
        parse_route("GET", "/balloon/", b""),
        Ok(ApiRequest::GetBalloon)
    );
    assert_eq!(
        parse_route("GET", "/balloon/statistics", b""),
        Ok(ApiRequest::GetBalloonStats)
    );
    assert_eq!(
        parse_route(
            "PATCH",
            "/balloon/statistics",
            br#"{"stats_polling_interval_s": 5}"#
        ),
        Ok(ApiRequest::PatchBalloonStats(BalloonStatsUpdate {
            stats_polling_interval_s: 5
        }))
    );
    let (status, msg) = err("POST", "/balloon", "{}");
    assert_eq!(status, 405);
    assert!(msg.contains("PUT, PATCH, GET"), "{msg}");
    assert_eq!(err("PUT", "/balloon/statistics", "{}").0, 405);
    assert_eq!(err("PATCH", "/balloon", r#"{"amount_mib": -1}"#).0, 400);
    assert_eq!(err("PATCH", "/balloon", r#"{"amount": 1}"#).0, 400);
    assert_eq!(err("PUT", "/balloon", r#"{"amount_mib": 1}"#).0, 400);
    assert_eq!(err("PATCH", "/balloon/statistics", "").0, 400);
    // Statistics: the first four fields always, the guest's only once it reported them.
    let s: BalloonStats = serde_json::from_str(
        r#"{"target_pages": 256, "actual_pages": 0, "target_mib": 1, "actual_mib": 0,
            "free_memory": 1048576, "available_memory": 2097152, "disk_caches": 4096}"#,
    )
    .unwrap();
    assert_eq!(s.free_memory, Some(1 << 20));
    assert_eq!(s.swap_in, None);
    assert_eq!(
        serde_json::to_string(&BalloonStats::default()).unwrap(),
        r#"{"target_pages":0,"actual_pages":0,"target_mib":0,"actual_mib":0}"#
    );
}
