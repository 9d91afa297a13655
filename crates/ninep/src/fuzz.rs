//! The `codec` fuzz target's entry point (`fuzz/fuzz_targets/codec.rs`), also replayed over
//! its corpus (`fuzz/corpus/codec`) and seeded random and mutated inputs by
//! `tests/fuzz_corpus.rs`: the 9P codec and the server core. Any byte string handed to a
//! session must produce exactly one well-formed response frame, and any frame that decodes
//! must re-encode to the same bytes.

use std::sync::{Arc, OnceLock};

use crate::{decode_request, Config, Request, Server};

fn server() -> &'static Arc<Server> {
    static SERVER: OnceLock<Arc<Server>> = OnceLock::new();
    SERVER.get_or_init(|| {
        // One fixed directory with the same contents for every run: nothing new is left
        // behind in the temp dir.
        let dir = std::env::temp_dir().join("densevm-9p-fuzz-share");
        std::fs::create_dir_all(dir.join("d")).expect("fuzz export dir");
        std::fs::write(dir.join("f"), b"fuzz").expect("fuzz export file");
        // Read-only: the fuzzer explores the protocol, not the host filesystem.
        Server::new(
            &dir,
            Config {
                readonly: true,
                ..Config::default()
            },
        )
        .expect("fuzz server")
    })
}

/// One input: a request frame (its size field corrected unless the input starts with
/// 0xff, so that most inputs reach the body decoders) handed to a fresh session with fid 0
/// attached.
pub fn codec(raw: &[u8]) {
    let mut frame = raw.to_vec();
    if frame.len() >= 4 && frame[0] != 0xff {
        let n = frame.len() as u32;
        frame[..4].copy_from_slice(&n.to_le_bytes());
    }
    let data = frame.as_slice();
    if let Ok((tag, req)) = decode_request(data, 1 << 20) {
        let mut again = Vec::new();
        req.encode(tag, &mut again);
        assert_eq!(again, data, "decode/encode must round-trip");
    }
    let session = server().session();
    // Attach fid 0 so that fid-taking requests reach the filesystem code.
    let mut out = Vec::new();
    let mut attach = Vec::new();
    Request::Attach {
        fid: 0,
        afid: u32::MAX,
        uname: b"",
        aname: b"",
        n_uname: 0,
    }
    .encode(1, &mut attach);
    session.handle(&attach, &mut out);
    out.clear();
    // Odd lengths go as the stream transport does: the non-blocking path first; a declined
    // request must leave `out` untouched, and then the blocking path answers. Even lengths
    // take the blocking path only.
    if raw.len() % 2 == 0 || session.handle_nowait(data, &mut out).is_none() {
        assert!(out.is_empty(), "a declined request appends nothing");
        session.handle(data, &mut out);
    }
    assert!(out.len() >= 7);
    assert_eq!(
        u32::from_le_bytes([out[0], out[1], out[2], out[3]]) as usize,
        out.len()
    );
    assert_eq!(out[4] % 2, 1);
}
