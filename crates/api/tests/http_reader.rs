//! The HTTP request reader: split reads, pipelining, limits, framing errors, EOF.

use std::io::{self, Read};

use densevm_api::http::{
    write_response, HttpError, HttpRequest, RequestReader, MAX_BODY_BYTES, MAX_HEADER_BYTES,
};

/// Hands out the data `step` bytes per read.
struct Chunks<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Chunks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn reader(data: &[u8], step: usize) -> RequestReader<Chunks<'_>> {
    RequestReader::new(Chunks { data, step })
}

fn status_of(data: &[u8]) -> u16 {
    match reader(data, 4096).read_request() {
        Err(HttpError::Status { status, .. }) => status,
        other => panic!("expected an error status, got {other:?}"),
    }
}

const PATCH: &[u8] =
    b"PATCH /vm HTTP/1.1\r\nHost: x\r\nContent-Length: 19\r\n\r\n{\"state\":\"Paused\"}\n";

#[test]
fn a_request_split_over_many_reads_is_whole() {
    for step in [1, 2, 3, 7, 50, 4096] {
        let mut r = reader(PATCH, step);
        let req = r.read_request().unwrap().unwrap();
        assert_eq!(
            req,
            HttpRequest {
                method: "PATCH".into(),
                path: "/vm".into(),
                body: b"{\"state\":\"Paused\"}\n".to_vec(),
                keep_alive: true,
            },
            "step {step}"
        );
        assert!(r.read_request().unwrap().is_none(), "clean EOF");
    }
}

#[test]
fn pipelined_requests_are_not_lost() {
    let mut data = PATCH.to_vec();
    data.extend_from_slice(b"GET / HTTP/1.1\r\n\r\nGET /?a HTTP/1.1\r\nConnection: close\r\n\r\n");
    for step in [1, 13, 4096] {
        let mut r = reader(&data, step);
        assert_eq!(r.read_request().unwrap().unwrap().method, "PATCH");
        let get = r.read_request().unwrap().unwrap();
        assert_eq!((get.path.as_str(), get.keep_alive), ("/", true));
        let last = r.read_request().unwrap().unwrap();
        assert_eq!((last.path.as_str(), last.keep_alive), ("/?a", false));
        assert!(r.read_request().unwrap().is_none());
    }
}

#[test]
fn keep_alive_follows_version_and_connection() {
    let one = |data: &[u8]| {
        reader(data, 4096)
            .read_request()
            .unwrap()
            .unwrap()
            .keep_alive
    };
    assert!(one(b"GET / HTTP/1.1\r\n\r\n"));
    assert!(!one(b"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n"));
    assert!(!one(b"GET / HTTP/1.0\r\n\r\n"));
    assert!(one(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
}

#[test]
fn oversize_header_block_is_431() {
    let mut data = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    data.resize(MAX_HEADER_BYTES + 100, b'a');
    assert_eq!(status_of(&data), 431);
    data.extend_from_slice(b"\r\n\r\n");
    assert_eq!(status_of(&data), 431);
    let many: String = (0..40).map(|i| format!("X-{i}: y\r\n")).collect();
    assert_eq!(
        status_of(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()),
        431
    );
}

#[test]
fn oversize_body_is_413_before_reading_it() {
    let head = format!(
        "PUT /snapshot/create HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        MAX_BODY_BYTES + 1
    );
    assert_eq!(status_of(head.as_bytes()), 413);
    assert_eq!(
        status_of(b"PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999999999\r\n\r\n"),
        413
    );
    // Exactly the limit is fine.
    let mut ok =
        format!("PUT /x HTTP/1.1\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n").into_bytes();
    ok.resize(ok.len() + MAX_BODY_BYTES, b' ');
    let req = reader(&ok, 4096).read_request().unwrap().unwrap();
    assert_eq!(req.body.len(), MAX_BODY_BYTES);
}

#[test]
fn body_without_content_length_is_411() {
    for m in ["PUT", "PATCH", "POST"] {
        assert_eq!(
            status_of(format!("{m} /vm HTTP/1.1\r\n\r\n{{}}").as_bytes()),
            411,
            "{m}"
        );
    }
    // GET needs none.
    assert!(reader(b"GET / HTTP/1.1\r\n\r\n", 1)
        .read_request()
        .unwrap()
        .is_some());
}

#[test]
fn chunked_bodies_are_501_with_advice() {
    let data = b"PATCH /vm HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    match reader(data, 4096).read_request() {
        Err(HttpError::Status {
            status: 501,
            message,
        }) => {
            assert!(message.contains("Content-Length"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_framing_is_400() {
    assert_eq!(status_of(b"\x00\x01\x02garbage\r\n\r\n"), 400);
    assert_eq!(
        status_of(b"GET / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n"),
        400
    );
    assert_eq!(
        status_of(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
        400
    );
    assert_eq!(
        status_of(b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"),
        400
    );
    assert_eq!(status_of(b"GET / HTTP/2.0\r\n\r\n"), 400);
}

#[test]
fn eof_mid_request_is_an_io_error() {
    for data in [
        &b"GET / HTT"[..],
        b"PATCH /vm HTTP/1.1\r\nContent-Length: 10\r\n\r\n{\"a\"",
    ] {
        match reader(data, 3).read_request() {
            Err(HttpError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn expect_continue_is_answered_only_when_the_body_is_missing() {
    let data = b"PUT /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}";
    let mut calls = 0;
    let mut r = reader(data, 64);
    r.read_request_with_continue(&mut || {
        calls += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(calls, 0, "the body came with the head");
    let mut r = reader(data, 1);
    let req = r
        .read_request_with_continue(&mut || {
            calls += 1;
            Ok(())
        })
        .unwrap()
        .unwrap();
    assert_eq!((calls, &req.body[..]), (1, &b"{}"[..]));
}

#[test]
fn responses_are_framed() {
    let mut out = Vec::new();
    write_response(&mut out, 200, Some(b"{}"), true).unwrap();
    assert_eq!(
        out,
        b"HTTP/1.1 200 OK\r\nServer: densevm\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    );
    out.clear();
    write_response(&mut out, 204, None, false).unwrap();
    assert_eq!(
        out,
        b"HTTP/1.1 204 No Content\r\nServer: densevm\r\nConnection: close\r\n\r\n"
    );
}
