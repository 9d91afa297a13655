//! The server and the client over a real unix socket.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use densevm_api::{
    ApiClient, ApiRequest, ApiResponse, ApiServer, ApiServerError, ApiServerHandle, ClientError,
    CloneInfo, CloneList, CloneRequest, InstanceInfo, InstanceState, SnapshotCreate, SnapshotType,
    VmState,
};

type Calls = Arc<Mutex<Vec<ApiRequest>>>;

fn info() -> InstanceInfo {
    InstanceInfo {
        id: "vm0".into(),
        state: InstanceState::Running,
        vmm_version: "0.1.0".into(),
        app_name: "densevm".into(),
    }
}

/// A handler that records every call and answers like a VMM would.
fn recording(calls: Calls) -> Box<dyn FnMut(ApiRequest) -> ApiResponse + Send> {
    Box::new(move |req| {
        calls.lock().unwrap().push(req.clone());
        match req {
            ApiRequest::GetInfo => ApiResponse::ok(&info()),
            ApiRequest::PatchVm(_) => ApiResponse::no_content(),
            ApiRequest::CreateSnapshot(s) if s.snapshot_path == "/busy" => {
                ApiResponse::error(409, "a snapshot is already being written; retry later")
            }
            ApiRequest::CreateSnapshot(_) => ApiResponse::no_content(),
            ApiRequest::GetBalloonStats => ApiResponse::ok(&densevm_api::BalloonStats {
                target_mib: 64,
                actual_mib: 32,
                target_pages: 64 * 256,
                actual_pages: 32 * 256,
                available_memory: Some(100 << 20),
                ..Default::default()
            }),
            ApiRequest::GetBalloon => ApiResponse::ok(&densevm_api::Balloon {
                amount_mib: 64,
                deflate_on_oom: true,
                stats_polling_interval_s: 1,
            }),
            ApiRequest::GetMemoryTier => ApiResponse::ok(&densevm_api::MemoryTierInfo {
                budget_mib: 64,
                resident_kib: 60 << 10,
                evicted_swap: 7,
                ..Default::default()
            }),
            ApiRequest::GetVsock => ApiResponse::ok(&densevm_api::VsockInfo {
                guest_cid: 3,
                uds_path: "/run/v.sock".into(),
            }),
            ApiRequest::PutBalloon(_)
            | ApiRequest::PatchBalloon(_)
            | ApiRequest::PatchBalloonStats(_)
            | ApiRequest::PatchMemoryTier(_) => ApiResponse::no_content(),
            ApiRequest::CreateClones(c) => ApiResponse::ok(&CloneList {
                clones: (0..c.count)
                    .map(|i| CloneInfo {
                        index: i,
                        pid: 1000 + i,
                        api_sock: format!("/run/c{i}.sock"),
                        console: format!("/run/c{i}.log"),
                    })
                    .collect(),
                running_us: Some(4200),
            }),
        }
    })
}

fn serve(dir: &Path, idle: Duration) -> (ApiServerHandle, Calls, PathBuf) {
    let path = dir.join("api.sock");
    let mut server = ApiServer::bind(&path).unwrap();
    server.set_idle_timeout(idle);
    let calls = Calls::default();
    let handle = server.spawn(recording(calls.clone())).unwrap();
    (handle, calls, path)
}

#[test]
fn every_helper_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, calls, path) = serve(dir.path(), Duration::from_secs(5));
    let mode = fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let client = ApiClient::new(&path);

    assert_eq!(client.info().unwrap(), info());
    client.pause().unwrap();
    client.resume().unwrap();
    let snap = SnapshotCreate {
        snapshot_type: SnapshotType::Template,
        snapshot_path: "/snap".into(),
        mem_file_path: None,
    };
    client.create_snapshot(&snap).unwrap();
    let clones = CloneRequest {
        count: 2,
        snapshot_path: "/snap".into(),
        network_overrides: Vec::new(),
        memory_budget_mib: Some(32),
    };
    let list = client.create_clones(&clones).unwrap();
    assert_eq!(list.clones.len(), 2);
    assert_eq!(list.clones[1].api_sock, "/run/c1.sock");
    assert_eq!(list.running_us, Some(4200), "running_us travels");

    // Errors: the handler's, the router's (never reaching the handler), raw statuses.
    let busy = SnapshotCreate {
        snapshot_path: "/busy".into(),
        ..snap.clone()
    };
    match client.create_snapshot(&busy) {
        Err(ClientError::Api {
            status: 409,
            message,
        }) => assert!(message.contains("retry")),
        other => panic!("{other:?}"),
    }
    let fc = SnapshotCreate {
        mem_file_path: Some("/mem".into()),
        ..snap.clone()
    };
    match client.create_snapshot(&fc) {
        Err(ClientError::Api {
            status: 400,
            message,
        }) => {
            assert!(message.contains("mem_file_path"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let bad = CloneRequest {
        count: 0,
        ..clones.clone()
    };
    assert!(matches!(
        client.create_clones(&bad),
        Err(ClientError::Api { status: 400, .. })
    ));
    let (status, body) = client.request("GET", "/nope", None).unwrap();
    assert_eq!(status, 404);
    assert!(String::from_utf8(body).unwrap().contains("fault_message"));
    assert_eq!(client.request("DELETE", "/vm", None).unwrap().0, 405);
    assert_eq!(
        client.request("PATCH", "/vm", None).unwrap().0,
        400,
        "empty body"
    );
    assert!(matches!(
        client.request("GET", "/ HTTP/1.1\r\nX: y", None),
        Err(ClientError::InvalidRequest(_))
    ));
    // Too large: the server answers 413 without reading the body.
    let huge = " ".repeat(70 * 1024);
    assert_eq!(
        client
            .request("PUT", "/snapshot/create", Some(&huge))
            .unwrap()
            .0,
        413
    );
    // Deep nesting within the body limit does not overflow the api thread's small stack.
    let deep = "[".repeat(60 * 1024);
    assert_eq!(
        client
            .request("PUT", "/snapshot/create", Some(&deep))
            .unwrap()
            .0,
        400
    );
    let deep = format!(
        "{{\"snapshot_path\": \"x\", \"mem_file_path\": {}",
        "[".repeat(60 * 1024)
    );
    assert_eq!(
        client
            .request("PUT", "/snapshot/create", Some(&deep))
            .unwrap()
            .0,
        400
    );

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 6, "{calls:?}");
    assert_eq!(calls[0], ApiRequest::GetInfo);
    assert!(matches!(&calls[1], ApiRequest::PatchVm(c) if c.state == VmState::Paused));
    assert!(matches!(&calls[2], ApiRequest::PatchVm(c) if c.state == VmState::Resumed));
    assert_eq!(calls[3], ApiRequest::CreateSnapshot(snap));
    assert_eq!(calls[4], ApiRequest::CreateClones(clones));
    handle.shutdown();
}

#[test]
fn keep_alive_and_pipelining_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, calls, path) = serve(dir.path(), Duration::from_secs(5));
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\nPATCH /vm HTTP/1.1\r\nContent-Length: 18\r\n\r\n{\"state\":\"Paused\"}")
        .unwrap();
    s.write_all(b"GET /vm HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert_eq!(out.matches("HTTP/1.1 ").count(), 3, "{out}");
    assert!(out.contains("HTTP/1.1 200 OK") && out.contains("HTTP/1.1 204 No Content"));
    assert!(out.contains("HTTP/1.1 405 Method Not Allowed"));
    assert_eq!(calls.lock().unwrap().len(), 2);
    handle.shutdown();
}

#[test]
fn client_errors_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.sock");
    let err = ApiClient::new(&missing).info().unwrap_err();
    assert!(matches!(err, ClientError::NoSocket(_)));
    assert!(err.to_string().contains("--api-sock"), "{err}");

    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let err = ApiClient::new(&stale).info().unwrap_err();
    assert!(matches!(err, ClientError::Refused(_)), "{err:?}");
    assert!(err.to_string().contains("exited"), "{err}");

    // A server that accepts and never answers: the client's timeout ends the wait.
    let mute = dir.path().join("mute.sock");
    let _listener = UnixListener::bind(&mute).unwrap();
    let err = ApiClient::new(&mute)
        .with_timeout(Duration::from_millis(100))
        .info()
        .unwrap_err();
    assert!(matches!(err, ClientError::Io { .. }), "{err:?}");
}

#[test]
fn bind_replaces_a_stale_socket_but_not_a_live_one_or_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    drop(UnixListener::bind(&path).unwrap());
    assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
    let handle = ApiServer::bind(&path)
        .unwrap()
        .spawn(recording(Calls::default()))
        .unwrap();
    assert_eq!(ApiClient::new(&path).info().unwrap().id, "vm0");

    let err = ApiServer::bind(&path).unwrap_err();
    assert!(matches!(err, ApiServerError::InUse(_)));
    assert!(
        err.to_string().contains("pick another --api-sock path"),
        "{err}"
    );
    assert_eq!(
        ApiClient::new(&path).info().unwrap().id,
        "vm0",
        "still served"
    );
    handle.shutdown();

    let file = dir.path().join("notes.txt");
    fs::write(&file, "keep me").unwrap();
    let err = ApiServer::bind(&file).unwrap_err();
    assert!(matches!(err, ApiServerError::NotASocket(_)), "{err:?}");
    assert_eq!(fs::read_to_string(&file).unwrap(), "keep me");

    let err = ApiServer::bind(dir.path().join("no/such/dir/api.sock")).unwrap_err();
    assert!(matches!(err, ApiServerError::Bind { .. }), "{err:?}");
}

/// Counts drops, to see that the handler (owned by the thread) is gone after shutdown.
struct DropFlag(Arc<Mutex<bool>>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = true;
    }
}

#[test]
fn shutdown_joins_the_thread_and_unlinks_the_socket_even_mid_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let dropped = Arc::new(Mutex::new(false));
    let flag = DropFlag(dropped.clone());
    let mut server = ApiServer::bind(&path).unwrap();
    server.set_idle_timeout(Duration::from_secs(60));
    let handle = server
        .spawn(Box::new(move |_| {
            let _keep = &flag;
            ApiResponse::no_content()
        }))
        .unwrap();
    assert_eq!(handle.path(), path);
    // A connected client that sends half a request keeps the thread inside a connection.
    let mut silent = UnixStream::connect(&path).unwrap();
    silent.write_all(b"GET / HT").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    handle.shutdown();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(
        *dropped.lock().unwrap(),
        "the thread and its handler are gone"
    );
    assert!(!path.exists());
    assert!(matches!(
        ApiClient::new(&path).info(),
        Err(ClientError::NoSocket(_))
    ));

    // The path is free for the next server; dropping a handle shuts it down too.
    let handle = ApiServer::bind(&path)
        .unwrap()
        .spawn(recording(Calls::default()))
        .unwrap();
    drop(handle);
    assert!(!path.exists());
    // So does dropping a server that was never spawned.
    drop(ApiServer::bind(&path).unwrap());
    assert!(!path.exists());
}

#[test]
fn a_silent_or_trickling_client_does_not_wedge_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let idle = Duration::from_millis(200);
    let (handle, _calls, path) = serve(dir.path(), idle);
    let _silent = UnixStream::connect(&path).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    assert_eq!(ApiClient::new(&path).info().unwrap().id, "vm0");
    assert!(t.elapsed() < idle * 5, "{:?}", t.elapsed());

    // A byte every 50 ms never completes a request within the idle timeout.
    let mut slow = UnixStream::connect(&path).unwrap();
    let t = Instant::now();
    for b in b"GET / HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n" {
        if slow.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        if t.elapsed() > Duration::from_secs(2) {
            break;
        }
    }
    let mut out = Vec::new();
    let _ = slow.read_to_end(&mut out);
    assert!(
        out.is_empty(),
        "cut off without an answer: {}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(ApiClient::new(&path).info().unwrap().id, "vm0");
    handle.shutdown();
}

#[test]
fn balloon_helpers_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, calls, path) = serve(dir.path(), Duration::from_secs(5));
    let client = ApiClient::new(&path);
    let balloon = densevm_api::Balloon {
        amount_mib: 64,
        deflate_on_oom: true,
        stats_polling_interval_s: 1,
    };
    client.put_balloon(&balloon).unwrap();
    client.set_balloon_target(96).unwrap();
    // The fake answers Firecracker's shape; densevm's additions default.
    let info = client.balloon().unwrap();
    assert_eq!(
        (
            info.amount_mib,
            info.deflate_on_oom,
            info.stats_polling_interval_s
        ),
        (64, true, 1)
    );
    assert_eq!((info.actual_mib, info.free_page_reporting), (0, false));
    let stats = client.balloon_stats().unwrap();
    assert_eq!((stats.target_mib, stats.actual_mib), (64, 32));
    assert_eq!(stats.available_memory, Some(100 << 20));
    assert_eq!(stats.swap_in, None);
    client.set_balloon_stats_interval(5).unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            ApiRequest::PutBalloon(balloon),
            ApiRequest::PatchBalloon(densevm_api::BalloonUpdate { amount_mib: 96 }),
            ApiRequest::GetBalloon,
            ApiRequest::GetBalloonStats,
            ApiRequest::PatchBalloonStats(densevm_api::BalloonStatsUpdate {
                stats_polling_interval_s: 5
            }),
        ]
    );
    handle.shutdown();
}

#[test]
fn a_router_of_its_own_serves_text_and_json_on_the_same_http_code() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.sock");
    let server = ApiServer::bind(&path).unwrap();
    let handle = server
        .spawn_router(Box::new(|req: &densevm_api::http::HttpRequest| {
            match (req.method.as_str(), req.path.as_str()) {
                ("GET", "/metrics") => {
                    ApiResponse::text("text/plain; version=0.0.4", "up 1\n".into())
                }
                ("POST", "/things") => ApiResponse::json(201, &serde_json::json!({"n": 1})),
                _ => ApiResponse::error(404, "nothing here"),
            }
            .into()
        }))
        .unwrap();
    let client = ApiClient::new(&path);
    assert_eq!(
        client.request("GET", "/metrics", None).unwrap(),
        (200, b"up 1\n".to_vec())
    );
    let v: serde_json::Value = client.call("POST", "/things", Some("{}")).unwrap();
    assert_eq!(v["n"], 1);
    match client.checked("GET", "/x", None) {
        Err(ClientError::Api {
            status: 404,
            message,
        }) => assert_eq!(message, "nothing here"),
        other => panic!("{other:?}"),
    }
    // The raw exchange carries the text content type.
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.contains("Content-Type: text/plain; version=0.0.4\r\n"),
        "{out}"
    );
    handle.shutdown();
}

#[test]
fn vsock_helper_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, calls, path) = serve(dir.path(), Duration::from_secs(5));
    let v = ApiClient::new(&path).vsock().unwrap();
    assert_eq!((v.guest_cid, v.uds_path.as_str()), (3, "/run/v.sock"));
    assert_eq!(calls.lock().unwrap().clone(), vec![ApiRequest::GetVsock]);
    handle.shutdown();
}

#[test]
fn memory_tier_helpers_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (handle, calls, path) = serve(dir.path(), Duration::from_secs(5));
    let client = ApiClient::new(&path);
    client.set_memory_budget(48).unwrap();
    let t = client.memory_tier().unwrap();
    assert_eq!(
        (t.budget_mib, t.resident_kib, t.evicted_swap),
        (64, 60 << 10, 7)
    );
    assert_eq!(
        calls.lock().unwrap().clone(),
        vec![
            ApiRequest::PatchMemoryTier(densevm_api::MemoryTierUpdate { budget_mib: 48 }),
            ApiRequest::GetMemoryTier,
        ]
    );
    handle.shutdown();
}

#[test]
fn a_later_reply_does_not_hold_up_other_requests_and_is_bounded() {
    use densevm_api::{Reply, MAX_LATER};
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("later.sock");
    // Each slow request waits until the test releases it.
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Arc::new(Mutex::new(release_rx));
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&started);
    let handle = ApiServer::bind(&path)
        .unwrap()
        .spawn_router(Box::new(
            move |req: &densevm_api::http::HttpRequest| match req.path.as_str() {
                "/slow" => {
                    let rx = Arc::clone(&release_rx);
                    let counter = Arc::clone(&counter);
                    Reply::Later(Box::new(move || {
                        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let _ = rx.lock().unwrap().recv();
                        ApiResponse::json(200, &serde_json::json!({"slow": true}))
                    }))
                }
                _ => ApiResponse::json(200, &serde_json::json!({"quick": true})).into(),
            },
        ))
        .unwrap();
    let slow: Vec<_> = (0..MAX_LATER)
        .map(|_| {
            let p = path.clone();
            std::thread::spawn(move || {
                ApiClient::new(&p)
                    .with_timeout(Duration::from_secs(60))
                    .request("GET", "/slow", None)
                    .unwrap()
            })
        })
        .collect();
    let client = ApiClient::new(&path);
    // Once every slow request is in progress, one more is refused with 503, while a
    // quick one is answered at once.
    let t = Instant::now();
    while started.load(std::sync::atomic::Ordering::SeqCst) < MAX_LATER {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the slow requests never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (status, body) = client.request("GET", "/slow", None).unwrap();
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("in progress"));
    let v: serde_json::Value = client.call("GET", "/quick", None).unwrap();
    assert_eq!(v["quick"], true);
    for _ in 0..MAX_LATER {
        release_tx.send(()).unwrap();
    }
    for t in slow {
        let (status, body) = t.join().unwrap();
        assert_eq!((status, body), (200, br#"{"slow":true}"#.to_vec()));
    }
    handle.shutdown();
}
