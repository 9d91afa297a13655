//! Whatever bytes a client sends, the HTTP reader and the router answer without a panic:
//! the fuzz seeds, random bytes and mutated seeds go through the fuzz entry point.

use std::path::Path;

use densevm_api::fuzz::api_request;
use densevm_api::http::{HttpError, RequestReader};
use densevm_api::parse_route;
use proptest::prelude::*;

fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/api_request");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/api_request") {
        out.push(std::fs::read(entry.unwrap().path()).unwrap());
    }
    out
}

#[test]
fn fuzz_seeds_replay() {
    let seeds = seeds();
    assert!(seeds.len() >= 5, "only {} seeds", seeds.len());
    for seed in &seeds {
        api_request(seed);
    }
}

#[test]
fn the_seeds_mean_what_their_names_say() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/api_request");
    let first = |name: &str| {
        let data = std::fs::read(dir.join(name)).unwrap();
        let mut r = RequestReader::new(&data[..]);
        match r.read_request() {
            Ok(Some(req)) => match parse_route(&req.method, &req.path, &req.body) {
                Ok(_) => 200,
                Err(e) => e.status,
            },
            Ok(None) => 0,
            Err(HttpError::Status { status, .. }) => status,
            Err(HttpError::Io(_)) => 1,
        }
    };
    assert_eq!(first("get_info"), 200);
    assert_eq!(first("patch_pause"), 200);
    assert_eq!(first("snapshot_template"), 200);
    assert_eq!(first("pipelined"), 200);
    assert_eq!(first("snapshot_firecracker"), 400);
    assert_eq!(first("clones_over_limit"), 400);
    assert_eq!(first("bad_json_truncated"), 400);
    assert_eq!(first("chunked"), 501);
    assert_eq!(first("garbage_tls"), 400);
    assert_eq!(first("conflicting_length"), 400);
    assert_eq!(first("balloon_patch"), 200);
    assert_eq!(first("balloon_stats_then_bad_put"), 200);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        api_request(&data);
    }

    #[test]
    fn mutated_seeds_never_panic(
        pick in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let seeds = seeds();
        let mut data = pick.get(&seeds).clone();
        for (at, byte) in edits {
            let i = at.index(data.len());
            data[i] = byte;
        }
        api_request(&data);
        data.truncate(cut.index(data.len() + 1));
        api_request(&data);
    }
}
