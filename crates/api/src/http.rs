//! HTTP/1.1 framing with `httparse`: reading requests off a byte stream (partial reads,
//! pipelining, keep-alive, bounded header and body) and writing responses.

use std::io::{self, ErrorKind, Read, Write};

/// Largest header block (request line and headers) accepted: 8 KiB.
pub const MAX_HEADER_BYTES: usize = 8 * 1024;
/// Largest request body accepted: 64 KiB.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most headers in one request.
pub const MAX_HEADERS: usize = 32;
/// Bytes asked of the stream per read.
const READ_CHUNK: usize = 4096;

/// One request, framed and read completely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// The method, as sent ("GET", "PATCH", ...).
    pub method: String,
    /// The request target, as sent (query string included).
    pub path: String,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
    /// Whether the connection stays open after the response: HTTP/1.1 unless
    /// `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`.
    pub keep_alive: bool,
}

/// Why no request could be read.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The request is malformed or beyond a limit: answer with this status and message,
    /// then close the connection (the stream is out of step).
    #[error("HTTP {status}: {message}")]
    Status {
        /// 400, 411, 413, 431, 501 or 505.
        status: u16,
        /// What was wrong and what to do.
        message: String,
    },
    /// The stream failed, timed out or ended in the middle of a request: close it.
    #[error("reading the request: {0}")]
    Io(#[from] io::Error),
}

impl HttpError {
    fn status(status: u16, message: impl Into<String>) -> Self {
        Self::Status {
            status,
            message: message.into(),
        }
    }
}

/// The parts of a header block that matter here.
struct Head {
    method: String,
    path: String,
    len: usize,
    content_length: Option<usize>,
    keep_alive: bool,
    expect_continue: bool,
}

/// Reads requests one after another from a stream, keeping bytes read past the end of one
/// request (a pipelined next request) for the next call.
pub struct RequestReader<R> {
    inner: R,
    buf: Vec<u8>,
}

impl<R: Read> RequestReader<R> {
    /// A reader over `inner`.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: Vec::new(),
        }
    }

    /// The stream.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The stream, mutably.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Bytes read but not yet part of a returned request.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// The next request; `Ok(None)` when the stream ends cleanly between requests.
    pub fn read_request(&mut self) -> Result<Option<HttpRequest>, HttpError> {
        self.read_request_with_continue(&mut || Ok(()))
    }

    /// As [`read_request`](Self::read_request); `send_continue` is called (to write
    /// `100 Continue`) when the client sent `Expect: 100-continue` and its body has not
    /// arrived yet.
    pub fn read_request_with_continue(
        &mut self,
        send_continue: &mut dyn FnMut() -> io::Result<()>,
    ) -> Result<Option<HttpRequest>, HttpError> {
        let head = loop {
            if let Some(head) = parse_head(&self.buf)? {
                break head;
            }
            if self.buf.len() >= MAX_HEADER_BYTES {
                return Err(too_large_head());
            }
            if self.fill()? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(mid_request_eof());
            }
        };
        let body_len = head.content_length.unwrap_or(0);
        let total = head.len + body_len;
        if self.buf.len() < total && head.expect_continue {
            send_continue()?;
        }
        while self.buf.len() < total {
            if self.fill()? == 0 {
                return Err(mid_request_eof());
            }
        }
        let body = self.buf[head.len..total].to_vec();
        self.buf.drain(..total);
        Ok(Some(HttpRequest {
            method: head.method,
            path: head.path,
            body,
            keep_alive: head.keep_alive,
        }))
    }

    /// One read of up to [`READ_CHUNK`] bytes appended to the buffer; 0 at end of stream.
    fn fill(&mut self) -> io::Result<usize> {
        let old = self.buf.len();
        self.buf.resize(old + READ_CHUNK, 0);
        let res = loop {
            match self.inner.read(&mut self.buf[old..]) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let n = *res.as_ref().unwrap_or(&0);
        self.buf.truncate(old + n.min(READ_CHUNK));
        res
    }
}

fn too_large_head() -> HttpError {
    HttpError::status(
        431,
        format!("request header block exceeds {MAX_HEADER_BYTES} bytes or {MAX_HEADERS} headers"),
    )
}

fn mid_request_eof() -> HttpError {
    HttpError::Io(io::Error::new(
        ErrorKind::UnexpectedEof,
        "connection closed in the middle of a request",
    ))
}

/// Parses the header block at the start of `buf`: `None` while it is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, HttpError> {
    if buf.is_empty() {
        return Ok(None);
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(too_large_head()),
        Err(e) => {
            return Err(HttpError::status(
                400,
                format!("malformed HTTP request ({e}); send HTTP/1.1 with a JSON body"),
            ))
        }
    };
    if len > MAX_HEADER_BYTES {
        return Err(too_large_head());
    }
    let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HttpError::status(400, "incomplete request line"));
    };
    if version > 1 {
        return Err(HttpError::status(
            505,
            "only HTTP/1.0 and HTTP/1.1 are served",
        ));
    }
    let mut head = Head {
        method: method.to_owned(),
        path: path.to_owned(),
        len,
        content_length: None,
        keep_alive: version == 1,
        expect_continue: false,
    };
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = parse_content_length(value)?;
            if head.content_length.is_some_and(|m| m != n) {
                return Err(HttpError::status(400, "conflicting Content-Length headers"));
            }
            head.content_length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if !value.eq_ignore_ascii_case("identity") {
                return Err(HttpError::status(
                    501,
                    format!(
                        "Transfer-Encoding {value:?} is not supported; send the body in one \
                         piece with a Content-Length header"
                    ),
                ));
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    head.keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") {
                    head.keep_alive = true;
                }
            }
        } else if h.name.eq_ignore_ascii_case("expect") {
            head.expect_continue = value.eq_ignore_ascii_case("100-continue");
        }
    }
    if head.content_length.is_none() && matches!(method, "PUT" | "PATCH" | "POST") {
        return Err(HttpError::status(
            411,
            format!("{method} needs a Content-Length header; send the JSON body in one piece"),
        ));
    }
    Ok(Some(head))
}

fn parse_content_length(value: &str) -> Result<usize, HttpError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HttpError::status(
            400,
            format!("bad Content-Length {value:?}: it must be a decimal byte count"),
        ));
    }
    match value.parse::<usize>() {
        Ok(n) if n <= MAX_BODY_BYTES => Ok(n),
        _ => Err(HttpError::status(
            413,
            format!("request body of {value} bytes exceeds the {MAX_BODY_BYTES}-byte limit"),
        )),
    }
}

/// The reason phrase of the statuses this API uses.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// Writes one response in a single `write_all`: status line, `Content-Type:
/// application/json` and `Content-Length` when there is a body (none for 204), and
/// `Connection: close` unless `keep_alive`.
pub fn write_response<W: Write + ?Sized>(
    w: &mut W,
    status: u16,
    body: Option<&[u8]>,
    keep_alive: bool,
) -> io::Result<()> {
    write_response_typed(w, status, "application/json", body, keep_alive)
}

/// As [`write_response`], with the body's `Content-Type`.
pub fn write_response_typed<W: Write + ?Sized>(
    w: &mut W,
    status: u16,
    content_type: &str,
    body: Option<&[u8]>,
    keep_alive: bool,
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nServer: densevm\r\n",
        reason(status)
    );
    let body = body.filter(|_| status != 204 && status != 304 && status >= 200);
    if let Some(body) = body {
        out.push_str(&format!("Content-Type: {content_type}\r\n"));
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    } else if status != 204 && status != 304 && status >= 200 {
        out.push_str("Content-Length: 0\r\n");
    }
    if !keep_alive {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body.unwrap_or(&[]));
    w.write_all(&bytes)?;
    w.flush()
}
