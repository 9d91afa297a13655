//! Fuzzes the 9P codec and the server core: any byte string handed to a
//! session must produce exactly one well-formed response frame, and any frame
//! that decodes must re-encode to the same bytes.
#![no_main]

use std::sync::{Arc, OnceLock};

use densevm_9p::{decode_request, Config, Server};
use libfuzzer_sys::fuzz_target;

fn server() -> &'static Arc<Server> {
    static SERVER: OnceLock<Arc<Server>> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("densevm-9p-fuzz-{}", std::process::id()));
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

fuzz_target!(|raw: &[u8]| {
    // Most inputs get a correct size field so the fuzzer reaches the body
    // decoders; inputs starting with 0xff keep their own (framing errors).
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
    densevm_9p::Request::Attach {
        fid: 0,
        afid: u32::MAX,
        uname: b"",
        aname: b"",
        n_uname: 0,
    }
    .encode(1, &mut attach);
    session.handle(&attach, &mut out);
    out.clear();
    // Odd lengths go as the stream transport does: the non-blocking path
    // first; a declined request must leave `out` untouched, and then the
    // blocking path answers. Even lengths take the blocking path only.
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
});
