//! The API client: one fresh connection per request (`Connection: close`), the response
//! framed with `httparse` and `Content-Length`, non-2xx answers turned into
//! [`ClientError::Api`] with the server's `fault_message`.

use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::types::{
    ApiError, Balloon, BalloonInfo, BalloonStats, BalloonStatsUpdate, BalloonUpdate, CloneList,
    CloneRequest, InstanceInfo, MemoryTierInfo, MemoryTierUpdate, SnapshotCreate, VmState,
    VmStateChange,
};

/// How long the client waits for the server by default (snapshots and clones take time).
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest response header block the client reads.
const MAX_RESPONSE_HEAD: usize = 16 * 1024;
/// Largest response body the client reads.
const MAX_RESPONSE_BODY: usize = 4 * 1024 * 1024;

/// Why a request through the client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing at the socket path.
    #[error("no API socket at {0}: is the VM running with --api-sock {0}?")]
    NoSocket(String),
    /// A socket file is there but nobody listens.
    #[error("nothing listens on {0} (the VM has exited?)")]
    Refused(String),
    /// The socket is not ours to use.
    #[error("no permission to connect to {0}: the API socket is mode 0600, run as the VM's user")]
    PermissionDenied(String),
    /// Another connection failure.
    #[error("cannot connect to the API socket {path}: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// The failure.
        source: io::Error,
    },
    /// The connection failed or timed out mid-exchange.
    #[error("talking to the API at {path}: {source}")]
    Io {
        /// The socket path.
        path: String,
        /// The failure.
        source: io::Error,
    },
    /// The server's answer is not a well-formed HTTP response or not the JSON expected.
    #[error("bad response from the API at {path}: {message}")]
    BadResponse {
        /// The socket path.
        path: String,
        /// What was wrong.
        message: String,
    },
    /// The method or path cannot go on a request line.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The server answered with an error status.
    #[error("API error {status}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The server's `fault_message` (or its body, if it sent no error JSON).
        message: String,
    },
}

/// A client of one VM's API socket.
#[derive(Debug, Clone)]
pub struct ApiClient {
    path: PathBuf,
    timeout: Duration,
}

impl ApiClient {
    /// A client of the socket at `path` (nothing is connected until a request).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            timeout: DEFAULT_CLIENT_TIMEOUT,
        }
    }

    /// Sets how long one read or write may wait for the server (default 120 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `GET /`.
    pub fn info(&self) -> Result<InstanceInfo, ClientError> {
        self.call("GET", "/", None)
    }

    /// `PATCH /vm {"state": "Paused"}`.
    pub fn pause(&self) -> Result<(), ClientError> {
        self.set_state(VmState::Paused)
    }

    /// `PATCH /vm {"state": "Resumed"}`.
    pub fn resume(&self) -> Result<(), ClientError> {
        self.set_state(VmState::Resumed)
    }

    /// `PUT /snapshot/create`.
    pub fn create_snapshot(&self, params: &SnapshotCreate) -> Result<(), ClientError> {
        let body = self.to_json(params)?;
        self.checked("PUT", "/snapshot/create", Some(&body))
            .map(drop)
    }

    /// `POST /clones`.
    pub fn create_clones(&self, params: &CloneRequest) -> Result<CloneList, ClientError> {
        let body = self.to_json(params)?;
        self.call("POST", "/clones", Some(&body))
    }

    /// `PUT /balloon`: set up the balloon.
    pub fn put_balloon(&self, balloon: &Balloon) -> Result<(), ClientError> {
        self.send_json("PUT", "/balloon", balloon)
    }

    /// `PATCH /balloon`: a new balloon target, in MiB.
    pub fn set_balloon_target(&self, amount_mib: u32) -> Result<(), ClientError> {
        self.send_json("PATCH", "/balloon", &BalloonUpdate { amount_mib })
    }

    /// `GET /balloon`: the settings, the target and the size the guest reached.
    pub fn balloon(&self) -> Result<BalloonInfo, ClientError> {
        self.call("GET", "/balloon", None)
    }

    /// `GET /balloon/statistics`.
    pub fn balloon_stats(&self) -> Result<BalloonStats, ClientError> {
        self.call("GET", "/balloon/statistics", None)
    }

    /// `PATCH /balloon/statistics`: how often the guest reports, in seconds (0: never).
    pub fn set_balloon_stats_interval(&self, seconds: u32) -> Result<(), ClientError> {
        let update = BalloonStatsUpdate {
            stats_polling_interval_s: seconds,
        };
        self.send_json("PATCH", "/balloon/statistics", &update)
    }

    /// `GET /memory-tier`: the DRAM budget and the tier's counters.
    pub fn memory_tier(&self) -> Result<MemoryTierInfo, ClientError> {
        self.call("GET", "/memory-tier", None)
    }

    /// `GET /vsock`: the guest CID and the unix socket of the VM's vsock device.
    pub fn vsock(&self) -> Result<crate::types::VsockInfo, ClientError> {
        self.call("GET", "/vsock", None)
    }

    /// `PATCH /memory-tier`: a new DRAM budget, in MiB.
    pub fn set_memory_budget(&self, budget_mib: u32) -> Result<(), ClientError> {
        self.send_json("PATCH", "/memory-tier", &MemoryTierUpdate { budget_mib })
    }

    /// Sends `value` as the JSON body of `method path`; any 2xx answer is success.
    pub fn send_json<T: Serialize + ?Sized>(
        &self,
        method: &str,
        path: &str,
        value: &T,
    ) -> Result<(), ClientError> {
        let body = self.to_json(value)?;
        self.checked(method, path, Some(&body)).map(drop)
    }

    /// `method path` with an optional JSON body; the 2xx answer's body parsed as `T`.
    pub fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<T, ClientError> {
        let bytes = self.checked(method, path, body)?;
        serde_json::from_slice(&bytes).map_err(|e| self.bad(format!("{method} {path}: {e}")))
    }

    fn set_state(&self, state: VmState) -> Result<(), ClientError> {
        let body = self.to_json(&VmStateChange { state })?;
        self.checked("PATCH", "/vm", Some(&body)).map(drop)
    }

    fn to_json<T: Serialize + ?Sized>(&self, value: &T) -> Result<String, ClientError> {
        serde_json::to_string(value).map_err(|e| ClientError::InvalidRequest(e.to_string()))
    }

    /// [`request`](Self::request), with a non-2xx status turned into [`ClientError::Api`];
    /// the body of the 2xx answer.
    pub fn checked(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Vec<u8>, ClientError> {
        let (status, bytes) = self.request(method, path, body)?;
        if (200..300).contains(&status) {
            return Ok(bytes);
        }
        let message = match serde_json::from_slice::<ApiError>(&bytes) {
            Ok(e) => e.fault_message,
            Err(_) if bytes.is_empty() => format!("HTTP {status} without a message"),
            Err(_) => String::from_utf8_lossy(&bytes[..bytes.len().min(1024)]).into_owned(),
        };
        Err(ClientError::Api { status, message })
    }

    /// Sends one request on a fresh connection and returns the status and body, whatever
    /// the status. A `body` goes with `Content-Type: application/json`; PUT, PATCH and
    /// POST without one send `Content-Length: 0`.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(ClientError::InvalidRequest(format!("method {method:?}")));
        }
        if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(ClientError::InvalidRequest(format!("path {path:?}")));
        }
        let mut stream = self.connect()?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\
             Connection: close\r\n"
        );
        match body {
            Some(b) => req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            )),
            None if matches!(method, "PUT" | "PATCH" | "POST") => {
                req.push_str("Content-Length: 0\r\n\r\n")
            }
            None => req.push_str("\r\n"),
        }
        let sent = stream.write_all(req.as_bytes());
        // A server that refuses the request (413, say) may answer and close before taking
        // all of it: read its answer even if the write failed.
        match read_response(&mut stream) {
            Ok(r) => Ok(r),
            Err(e) => Err(match (sent, e) {
                (Err(w), _) => self.io(w),
                (Ok(()), Fault::Io(e)) => self.io(e),
                (Ok(()), Fault::Bad(m)) => self.bad(m),
            }),
        }
    }

    fn connect(&self) -> Result<UnixStream, ClientError> {
        let shown = self.path.display().to_string();
        let stream = UnixStream::connect(&self.path).map_err(|e| match e.kind() {
            ErrorKind::NotFound => ClientError::NoSocket(shown.clone()),
            ErrorKind::ConnectionRefused => ClientError::Refused(shown.clone()),
            ErrorKind::PermissionDenied => ClientError::PermissionDenied(shown.clone()),
            _ => ClientError::Connect {
                path: shown.clone(),
                source: e,
            },
        })?;
        stream
            .set_read_timeout(Some(self.timeout))
            .and_then(|()| stream.set_write_timeout(Some(self.timeout)))
            .map_err(|e| self.io(e))?;
        Ok(stream)
    }

    fn io(&self, source: io::Error) -> ClientError {
        ClientError::Io {
            path: self.path.display().to_string(),
            source,
        }
    }

    fn bad(&self, message: String) -> ClientError {
        ClientError::BadResponse {
            path: self.path.display().to_string(),
            message,
        }
    }
}

/// Why a response could not be read.
#[derive(Debug)]
enum Fault {
    Io(io::Error),
    Bad(String),
}

/// Reads one response: interim 1xx responses are skipped; the body is `Content-Length`
/// bytes, none for 204/304, else everything up to the end of the stream.
fn read_response<R: Read>(r: &mut R) -> Result<(u16, Vec<u8>), Fault> {
    let mut buf = Vec::new();
    let (status, head_len, content_length) = loop {
        if let Some((status, len, cl)) = parse_response_head(&buf)? {
            if (100..200).contains(&status) {
                buf.drain(..len);
                continue;
            }
            break (status, len, cl);
        }
        if buf.len() > MAX_RESPONSE_HEAD {
            return Err(Fault::Bad("response header block too large".into()));
        }
        if fill(r, &mut buf)? == 0 {
            return Err(Fault::Bad(if buf.is_empty() {
                "the server closed the connection without answering".into()
            } else {
                "the server closed the connection mid-response".into()
            }));
        }
    };
    let no_body = status == 204 || status == 304;
    let want = if no_body { Some(0) } else { content_length };
    loop {
        let have = buf.len() - head_len;
        if want.is_some_and(|w| have >= w) {
            break;
        }
        if have > MAX_RESPONSE_BODY {
            return Err(Fault::Bad("response body too large".into()));
        }
        match fill(r, &mut buf) {
            Ok(0) if want.is_none() => break,
            Ok(0) => {
                return Err(Fault::Bad(
                    "the server closed the connection mid-body".into(),
                ))
            }
            Ok(_) => {}
            Err(e) => return Err(e),
        }
    }
    let end = want.map_or(buf.len(), |w| head_len + w);
    Ok((status, buf[head_len..end].to_vec()))
}

/// Status, header length and Content-Length of a complete response head at `buf`'s start.
fn parse_response_head(buf: &[u8]) -> Result<Option<(u16, usize, Option<usize>)>, Fault> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Fault::Bad(format!("malformed HTTP response: {e}"))),
    };
    let status = resp.code.unwrap_or(0);
    let mut content_length = None;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value).unwrap_or("").trim();
            match v.parse::<usize>() {
                Ok(n) if n <= MAX_RESPONSE_BODY => content_length = Some(n),
                _ => return Err(Fault::Bad(format!("bad Content-Length {v:?}"))),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Fault::Bad("chunked responses are not supported".into()));
        }
    }
    Ok(Some((status, len, content_length)))
}

fn fill<R: Read>(r: &mut R, buf: &mut Vec<u8>) -> Result<usize, Fault> {
    let mut chunk = [0u8; 4096];
    loop {
        match r.read(&mut chunk) {
            Ok(n) => {
                let n = n.min(chunk.len());
                buf.extend_from_slice(&chunk[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(Fault::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<(u16, Vec<u8>), Fault> {
        read_response(&mut &bytes[..])
    }

    #[test]
    fn responses_are_framed_by_content_length_or_eof() {
        let (s, b) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}extra").unwrap();
        assert_eq!((s, &b[..]), (200, &b"{}"[..]));
        let (s, b) = parse(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap();
        assert_eq!((s, b.len()), (204, 0));
        let (s, b) = parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 400 Bad\r\n\r\nxyz").unwrap();
        assert_eq!((s, &b[..]), (400, &b"xyz"[..]));
    }

    #[test]
    fn bad_responses_are_errors() {
        assert!(matches!(parse(b""), Err(Fault::Bad(_))));
        assert!(matches!(parse(b"garbage\r\n\r\n"), Err(Fault::Bad(_))));
        assert!(matches!(
            parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}"),
            Err(Fault::Bad(_))
        ));
        assert!(matches!(
            parse(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"),
            Err(Fault::Bad(_))
        ));
    }
}
