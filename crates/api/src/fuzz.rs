//! The fuzz entry point (target `api_request` in `fuzz/`), also replayed by
//! `cargo test -p densevm-api` over the seed corpus and random inputs.

use std::io::{self, Read};

use crate::http::{write_response, HttpError, RequestReader, MAX_BODY_BYTES};
use crate::request::parse_route;
use crate::server::ApiResponse;

/// A stream that hands out `data` in pieces of 1..=`step` bytes (the step varies), so
/// requests arrive split the way a socket may split them.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
    turn: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.turn = self.turn.wrapping_add(1);
        let n = (1 + self.turn % self.step)
            .min(buf.len())
            .min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Feeds `data` to the HTTP request reader, split into reads of sizes picked by a hash
/// of the data (so seeds stay plain HTTP), routes every request read and writes its
/// response into memory. Must never panic.
pub fn api_request(data: &[u8]) {
    let h = data
        .iter()
        .fold(0u32, |h, &b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let step = match h % 4 {
        0 => 4096,
        _ => 1 + (h as usize >> 2) % 64,
    };
    let mut reader = RequestReader::new(Trickle {
        data,
        step,
        turn: 0,
    });
    let mut out = Vec::new();
    // Each request consumes at least one byte, so this ends.
    loop {
        match reader.read_request() {
            Ok(Some(req)) => {
                assert!(req.body.len() <= MAX_BODY_BYTES);
                let resp = match parse_route(&req.method, &req.path, &req.body) {
                    Ok(r) => ApiResponse::ok(&format!("{r:?}")),
                    Err(e) => {
                        assert!(matches!(e.status, 400 | 404 | 405));
                        e.into()
                    }
                };
                let _ = write_response(&mut out, resp.status, resp.body.as_deref(), req.keep_alive);
            }
            Ok(None) | Err(HttpError::Io(_)) => return,
            Err(HttpError::Status { status, message }) => {
                let resp = ApiResponse::error(status, message);
                let _ = write_response(&mut out, resp.status, resp.body.as_deref(), false);
                return;
            }
        }
        out.clear();
    }
}
