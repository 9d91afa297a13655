//! `--balloon` parsing and the `/balloon` API arms against a real (inactive) device.

use super::*;
use densevm_api::parse_route;
use densevm_virtio::balloon::{Balloon, BalloonMemory};
use std::sync::Arc;

#[test]
fn balloon_flag_defaults_and_options() {
    let c = parse_balloon("amount_mib=64").unwrap();
    assert_eq!(
        c,
        BalloonConfig {
            amount_mib: 64,
            deflate_on_oom: false,
            stats_polling_interval_s: 1,
            free_page_reporting: true,
        }
    );
    let c = parse_balloon("amount_mib=0,deflate_on_oom,stats_interval_s=5,free_page_reporting=off")
        .unwrap();
    assert!(c.deflate_on_oom && !c.free_page_reporting);
    assert_eq!(c.stats_polling_interval_s, 5);
    let c = parse_balloon("deflate_on_oom=off,stats_interval_s=0").unwrap();
    assert!(!c.deflate_on_oom);
    assert_eq!((c.amount_mib, c.stats_polling_interval_s), (0, 0));
}

#[test]
fn bad_balloon_flags_say_what_to_give() {
    for (spec, want) in [
        ("", "needs its options"),
        ("amount_mib=-1", "not a number of MiB"),
        ("amount_mib=lots", "not a number of MiB"),
        ("amount_mib", "not a number of MiB"),
        ("stats_interval_s=70000", "0 to 65535"),
        ("free_page_reporting=maybe", "give on or off"),
        ("size=64", "unknown option 'size=64'"),
    ] {
        let e = parse_balloon(spec).unwrap_err().to_string();
        assert!(e.contains(want), "{spec}: {e}");
    }
    let c = parse_balloon("amount_mib=300").unwrap();
    let e = check_balloon(&c, 256 << 20).unwrap_err().to_string();
    assert!(e.contains("give 0 to 256"), "{e}");
    check_balloon(&c, 512 << 20).unwrap();
}

struct NoMemory;
impl BalloonMemory for NoMemory {
    fn release(&self, _: u64, _: u64) -> std::io::Result<()> {
        Ok(())
    }
}

fn api(config: BalloonConfig) -> (Balloon, BalloonApi) {
    let (device, handle) = Balloon::new(&config, Arc::new(NoMemory)).unwrap();
    let api = BalloonApi {
        handle,
        created: config,
        memory_bytes: 256 << 20,
    };
    (device, api)
}

fn call(b: Option<&BalloonApi>, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let req = parse_route(method, path, body.as_bytes()).expect("a valid route");
    let r = answer(b, req);
    let v = r
        .body
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or(serde_json::Value::Null);
    (r.status, v)
}

fn fault(v: &serde_json::Value) -> &str {
    v["fault_message"].as_str().unwrap_or("")
}

#[test]
fn api_arms_answer_with_the_handle() {
    let config = parse_balloon("amount_mib=16,deflate_on_oom").unwrap();
    let (_device, b) = api(config);
    let (s, v) = call(Some(&b), "GET", "/balloon", "");
    assert_eq!(s, 200);
    assert_eq!(v["amount_mib"], 16);
    assert_eq!(v["target_pages"], 16 * 256);
    assert_eq!(v["actual_mib"], 0);
    assert_eq!(v["deflate_on_oom"], true);
    assert_eq!(v["free_page_reporting"], true);
    assert_eq!(v["stats_polling_interval_s"], 1);

    assert_eq!(
        call(Some(&b), "PATCH", "/balloon", r#"{"amount_mib": 128}"#).0,
        204
    );
    assert_eq!(b.handle.target_pages(), 128 * 256);
    assert_eq!(
        call(Some(&b), "PATCH", "/balloon", r#"{"amount_mib": 256}"#).0,
        204
    );
    let (s, v) = call(Some(&b), "PATCH", "/balloon", r#"{"amount_mib": 257}"#);
    assert_eq!(s, 400);
    assert!(fault(&v).contains("give 0 to 256"), "{v}");
    assert_eq!(
        b.handle.target_pages(),
        256 * 256,
        "a refused target changed it"
    );

    // Statistics before the guest sent any: the sizes only.
    let (s, v) = call(Some(&b), "GET", "/balloon/statistics", "");
    assert_eq!(s, 200);
    assert_eq!(v["target_mib"], 256);
    assert!(v.get("free_memory").is_none(), "{v}");
    let body = r#"{"stats_polling_interval_s": 5}"#;
    assert_eq!(call(Some(&b), "PATCH", "/balloon/statistics", body).0, 204);
    assert_eq!(b.handle.stats_interval(), 5);
    let body = r#"{"stats_polling_interval_s": 65536}"#;
    let (s, v) = call(Some(&b), "PATCH", "/balloon/statistics", body);
    assert_eq!(s, 400);
    assert!(fault(&v).contains("0 to 65535"), "{v}");

    let body = r#"{"amount_mib": 1, "deflate_on_oom": false}"#;
    let (s, v) = call(Some(&b), "PUT", "/balloon", body);
    assert_eq!(s, 400);
    assert!(fault(&v).contains("--balloon"), "{v}");
}

#[test]
fn without_statistics_or_a_balloon_the_routes_say_what_to_do() {
    let (_device, b) = api(parse_balloon("stats_interval_s=0").unwrap());
    let (s, v) = call(Some(&b), "GET", "/balloon/statistics", "");
    assert_eq!(s, 400);
    assert!(fault(&v).contains("stats_interval_s=1"), "{v}");
    let body = r#"{"stats_polling_interval_s": 1}"#;
    let (s, v) = call(Some(&b), "PATCH", "/balloon/statistics", body);
    assert_eq!(s, 400);
    assert!(fault(&v).contains("without statistics"), "{v}");

    for (m, p, body) in [
        ("GET", "/balloon", ""),
        ("PATCH", "/balloon", r#"{"amount_mib": 1}"#),
        ("GET", "/balloon/statistics", ""),
        (
            "PUT",
            "/balloon",
            r#"{"amount_mib": 1, "deflate_on_oom": true}"#,
        ),
    ] {
        let (s, v) = call(None, m, p, body);
        assert_eq!(s, 400, "{m} {p}");
        assert!(fault(&v).contains("--balloon amount_mib=0"), "{v}");
    }
}
