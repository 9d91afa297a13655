//! The API server: one thread named `api` (128 KiB stack) accepting on a unix socket and
//! serving one connection at a time. Each request must arrive whole within the idle
//! timeout (5 s) of the connection's start or of the previous response, so a silent or
//! trickling client cannot wedge the API. An eventfd stops the thread at once, whatever it
//! is waiting for.

use std::fs;
use std::io::{self, ErrorKind};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::http::HttpRequest;
use crate::request::{parse_route, ApiErrorResponse, ApiRequest};
use crate::types::ApiError;

mod conn;

use conn::{is_transient, serve_connection, wait_readable, Flow, Ready};

/// How long a connection may take to deliver one whole request.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Stack of the `api` thread.
pub const API_THREAD_STACK: usize = 128 * 1024;

/// Serves the API requests: called on the `api` thread, one request at a time.
pub type ApiHandler = Box<dyn FnMut(ApiRequest) -> ApiResponse + Send>;

/// Serves raw HTTP requests with its own route table (see [`ApiServer::spawn_router`]).
pub type HttpHandler = Box<dyn FnMut(&HttpRequest) -> Reply + Send>;

/// Work that answers a request later, on a thread of its own (see [`Reply::Later`]).
pub type LaterReply = Box<dyn FnOnce() -> ApiResponse + Send>;

/// How a route table answers a request.
pub enum Reply {
    /// At once, on the `api` thread.
    Now(ApiResponse),
    /// For a request that takes long (a command run in a guest): the closure runs on a
    /// thread of its own (`api-later`), which writes its answer and closes the connection,
    /// while the `api` thread goes on serving others. At most [`MAX_LATER`] run at once;
    /// beyond that the request gets 503.
    Later(LaterReply),
}

impl From<ApiResponse> for Reply {
    fn from(r: ApiResponse) -> Self {
        Reply::Now(r)
    }
}

/// How many [`Reply::Later`] requests may be in progress at once.
pub const MAX_LATER: usize = 16;

/// Stack of an `api-later` thread.
const LATER_THREAD_STACK: usize = 256 * 1024;

/// The content type of JSON bodies.
pub const JSON: &str = "application/json";

/// A response: status and an optional body (JSON unless `content_type` says otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiResponse {
    /// HTTP status.
    pub status: u16,
    /// The body, if any.
    pub body: Option<Vec<u8>>,
    /// The body's `Content-Type`.
    pub content_type: &'static str,
}

impl ApiResponse {
    /// 204 No Content.
    pub fn no_content() -> Self {
        Self {
            status: 204,
            body: None,
            content_type: JSON,
        }
    }

    /// 200 with `value` as JSON (500 if it cannot be serialized).
    pub fn ok<T: Serialize + ?Sized>(value: &T) -> Self {
        Self::json(200, value)
    }

    /// `status` with `value` as JSON (500 if it cannot be serialized).
    pub fn json<T: Serialize + ?Sized>(status: u16, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => Self {
                status,
                body: Some(body),
                content_type: JSON,
            },
            Err(e) => Self::error(500, format!("cannot serialize the response: {e}")),
        }
    }

    /// 200 with a body that is not JSON (e.g. Prometheus text), of this content type.
    pub fn text(content_type: &'static str, body: String) -> Self {
        Self {
            status: 200,
            body: Some(body.into_bytes()),
            content_type,
        }
    }

    /// `status` with Firecracker's error body `{"fault_message": msg}`.
    pub fn error(status: u16, msg: impl Into<String>) -> Self {
        let err = ApiError {
            fault_message: msg.into(),
        };
        Self {
            status,
            body: Some(serde_json::to_vec(&err).unwrap_or_default()),
            content_type: JSON,
        }
    }
}

impl From<ApiErrorResponse> for ApiResponse {
    fn from(e: ApiErrorResponse) -> Self {
        Self::error(e.status, e.message)
    }
}

/// Why the API socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// A live server answers on the path.
    #[error("another densevm serves {0}; pick another --api-sock path")]
    InUse(PathBuf),
    /// The path is something other than a socket; it was left alone.
    #[error(
        "{0} exists and is not a socket; densevm leaves it alone: pick another --api-sock path"
    )]
    NotASocket(PathBuf),
    /// Looking at, probing or removing a stale socket failed.
    #[error("cannot reuse the API socket path {path}: {source}")]
    Stale {
        /// The socket path.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// bind(2) or chmod failed.
    #[error("cannot bind the API socket {path}: {source} (the directory must exist and be writable; socket paths are limited to 107 bytes)")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
}

/// A bound API socket, not yet served.
#[derive(Debug)]
pub struct ApiServer {
    listener: UnixListener,
    path: PathBuf,
    ino: (u64, u64),
    idle_timeout: Duration,
}

impl ApiServer {
    /// Binds a unix socket at `path` with mode 0600. A socket already there that nobody
    /// answers (a VMM that died) is replaced; one that answers is an error, and so is a
    /// path that is not a socket (which is left untouched).
    pub fn bind(path: impl AsRef<Path>) -> Result<Self, ApiServerError> {
        let path = path.as_ref().to_path_buf();
        let stale = |source| ApiServerError::Stale {
            path: path.clone(),
            source,
        };
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(stale(e)),
            Ok(m) if !m.file_type().is_socket() => return Err(ApiServerError::NotASocket(path)),
            Ok(_) => match UnixStream::connect(&path) {
                Ok(_) => return Err(ApiServerError::InUse(path)),
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    tracing::info!(path = %path.display(), "removing a stale API socket");
                    fs::remove_file(&path).map_err(stale)?;
                }
                Err(e) => return Err(stale(e)),
            },
        }
        let bind_err = |source| ApiServerError::Bind {
            path: path.clone(),
            source,
        };
        let listener = UnixListener::bind(&path).map_err(bind_err)?;
        let set_up = fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
            .and_then(|()| listener.set_nonblocking(true))
            .and_then(|()| fs::symlink_metadata(&path));
        match set_up {
            Ok(m) => Ok(Self {
                listener,
                ino: (m.dev(), m.ino()),
                path,
                idle_timeout: DEFAULT_IDLE_TIMEOUT,
            }),
            Err(e) => {
                let _ = fs::remove_file(&path);
                Err(bind_err(e))
            }
        }
    }

    /// How long a connection may take to deliver each whole request (default 5 s).
    pub fn set_idle_timeout(&mut self, timeout: Duration) {
        self.idle_timeout = timeout.max(Duration::from_millis(1));
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves the socket on a new thread named `api` until [`ApiServerHandle::shutdown`]:
    /// each request is routed by [`parse_route`] and, if valid, handed to `handler`.
    pub fn spawn(self, mut handler: ApiHandler) -> io::Result<ApiServerHandle> {
        self.spawn_router(Box::new(move |req: &HttpRequest| {
            Reply::Now(match parse_route(&req.method, &req.path, &req.body) {
                Ok(r) => handler(r),
                Err(e) => e.into(),
            })
        }))
    }

    /// As [`spawn`](Self::spawn), with the caller's own route table: `router` gets every
    /// well-formed HTTP request (method, path with its query, body) and answers it. The
    /// HTTP framing, limits, timeouts and shutdown are the same.
    pub fn spawn_router(self, mut handler: HttpHandler) -> io::Result<ApiServerHandle> {
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh eventfd that nothing else owns.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let thread_wake = Arc::clone(&wake);
        let path = self.path.clone();
        let ino = self.ino;
        // If the thread cannot start, the closure (and `self` in it) is dropped, which
        // unlinks the socket.
        let thread = std::thread::Builder::new()
            .name("api".into())
            .stack_size(API_THREAD_STACK)
            .spawn(move || {
                densevm_seccomp::enter(densevm_seccomp::ThreadKind::Api);
                self.accept_loop(thread_wake.as_fd(), &mut *handler)
            })?;
        Ok(ApiServerHandle {
            thread: Some(thread),
            wake,
            path,
            ino,
        })
    }

    fn accept_loop(&self, wake: BorrowedFd<'_>, handler: &mut dyn FnMut(&HttpRequest) -> Reply) {
        loop {
            match wait_readable(self.listener.as_fd(), wake, None) {
                Ok(Ready::Stop) => return,
                Ok(_) => {}
                Err(e) => {
                    tracing::error!("api: poll on the listener failed: {e}; the API stops");
                    return;
                }
            }
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if is_transient(&e) => continue,
                Err(e) => {
                    tracing::warn!("api: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            if serve_connection(stream, wake, self.idle_timeout, handler) == Flow::Stop {
                return;
            }
        }
    }
}

impl Drop for ApiServer {
    /// Unlinks the socket path (if it is still this server's socket): a bound socket that
    /// nobody accepts on would leave clients waiting forever.
    fn drop(&mut self) {
        unlink_if_ours(&self.path, self.ino);
    }
}

fn unlink_if_ours(path: &Path, ino: (u64, u64)) {
    match fs::symlink_metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == ino => {
            if let Err(e) = fs::remove_file(path) {
                tracing::warn!("api: cannot remove {}: {e}", path.display());
            }
        }
        _ => {}
    }
}

/// The running server; shutting it down (or dropping it) stops the thread and removes the
/// socket path.
#[derive(Debug)]
pub struct ApiServerHandle {
    thread: Option<JoinHandle<()>>,
    wake: Arc<OwnedFd>,
    path: PathBuf,
    ino: (u64, u64),
}

impl ApiServerHandle {
    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops the `api` thread (at once, even mid-connection), joins it and unlinks the
    /// socket path (if it is still this server's socket).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
        let n = unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if n != 8 {
            tracing::error!(
                "api: cannot signal the api thread: {}",
                io::Error::last_os_error()
            );
        }
        if thread.join().is_err() {
            tracing::error!("api: the api thread panicked");
        }
        unlink_if_ours(&self.path, self.ino);
    }
}

impl Drop for ApiServerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
