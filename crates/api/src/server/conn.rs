//! One connection of the API server, and the waiting: every read first polls the
//! connection and the stop eventfd with the request deadline as timeout.

use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{ApiResponse, LaterReply, Reply, LATER_THREAD_STACK, MAX_LATER};
use crate::http::{write_response, write_response_typed, HttpError, HttpRequest, RequestReader};

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Flow {
    Next,
    Stop,
}

pub(super) fn serve_connection(
    stream: UnixStream,
    wake: BorrowedFd<'_>,
    idle: Duration,
    handler: &mut dyn FnMut(&HttpRequest) -> Reply,
) -> Flow {
    // Blocking I/O; the deadline is enforced by poll, SO_RCVTIMEO/SO_SNDTIMEO back it up.
    let set = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(idle)))
        .and_then(|()| stream.set_write_timeout(Some(idle)));
    if let Err(e) = set {
        tracing::warn!("api: cannot set up a connection: {e}");
        return Flow::Next;
    }
    let conn = Conn {
        stream: &stream,
        wake,
        deadline: Instant::now() + idle,
        stopped: false,
    };
    let mut reader = RequestReader::new(conn);
    loop {
        let mut send_continue = || (&stream).write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
        let req = match reader.read_request_with_continue(&mut send_continue) {
            Ok(Some(req)) => req,
            Ok(None) => return Flow::Next,
            Err(HttpError::Status { status, message }) => {
                tracing::debug!("api: bad request: {status} {message}");
                let resp = ApiResponse::error(status, message);
                let _ = write_response(&mut &stream, resp.status, resp.body.as_deref(), false);
                return Flow::Next;
            }
            Err(HttpError::Io(e)) => {
                if reader.get_ref().stopped {
                    return Flow::Stop;
                }
                tracing::debug!("api: connection dropped: {e}");
                return Flow::Next;
            }
        };
        tracing::debug!(method = %req.method, path = %req.path, "api request");
        let resp = match handler(&req) {
            Reply::Now(resp) => resp,
            Reply::Later(work) => match answer_later(&stream, work) {
                Ok(()) => return Flow::Next,
                Err(resp) => resp,
            },
        };
        if let Err(e) = write_response_typed(
            &mut &stream,
            resp.status,
            resp.content_type,
            resp.body.as_deref(),
            req.keep_alive,
        ) {
            tracing::debug!("api: cannot write the response: {e}");
            return Flow::Next;
        }
        if !req.keep_alive {
            return Flow::Next;
        }
        reader.get_mut().deadline = Instant::now() + idle;
    }
}

/// [`Reply::Later`] requests in progress.
static LATER: AtomicUsize = AtomicUsize::new(0);

/// Hands the connection to an `api-later` thread that runs `work`, writes its answer and
/// closes the connection. The error is the answer to give at once instead (503: too many
/// in progress, or no thread).
fn answer_later(stream: &UnixStream, work: LaterReply) -> Result<(), ApiResponse> {
    if LATER.fetch_add(1, Ordering::AcqRel) >= MAX_LATER {
        LATER.fetch_sub(1, Ordering::AcqRel);
        return Err(ApiResponse::error(
            503,
            format!("{MAX_LATER} long requests are already in progress; try again when one ends"),
        ));
    }
    let busy = |e: io::Error| {
        LATER.fetch_sub(1, Ordering::AcqRel);
        ApiResponse::error(503, format!("cannot start a thread for this request: {e}"))
    };
    let conn = stream.try_clone().map_err(busy)?;
    std::thread::Builder::new()
        .name("api-later".into())
        .stack_size(LATER_THREAD_STACK)
        .spawn(move || {
            let resp = work();
            // The answer may be long in coming: the client gets the usual idle timeout to
            // take it, from now.
            if let Err(e) = write_response_typed(
                &mut &conn,
                resp.status,
                resp.content_type,
                resp.body.as_deref(),
                false,
            ) {
                tracing::debug!("api: cannot write a late response: {e}");
            }
            LATER.fetch_sub(1, Ordering::AcqRel);
        })
        .map(|_| ())
        .map_err(busy)
}

/// The connection as the reader sees it: each read first waits (poll) for data, the
/// request deadline or the stop signal.
struct Conn<'a> {
    stream: &'a UnixStream,
    wake: BorrowedFd<'a>,
    deadline: Instant,
    stopped: bool,
}

impl Read for Conn<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match wait_readable(self.stream.as_fd(), self.wake, Some(left))? {
            Ready::Readable => self.stream.read(buf),
            Ready::TimedOut => Err(io::Error::new(
                ErrorKind::TimedOut,
                "the client sent no whole request within the idle timeout",
            )),
            Ready::Stop => {
                self.stopped = true;
                Err(io::Error::other("the API server is shutting down"))
            }
        }
    }
}

pub(super) enum Ready {
    Readable,
    TimedOut,
    Stop,
}

/// Waits until `fd` is readable (or hung up), `wake` is signalled, or `timeout` passes.
pub(super) fn wait_readable(
    fd: BorrowedFd<'_>,
    wake: BorrowedFd<'_>,
    timeout: Option<Duration>,
) -> io::Result<Ready> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so a sub-millisecond remainder does not spin.
                i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
            }
        };
        let mut fds = [
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfds, and its length is passed.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[0].revents != 0 {
            return Ok(Ready::Stop);
        }
        if fds[1].revents != 0 {
            return Ok(Ready::Readable);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(Ready::TimedOut);
        }
    }
}

pub(super) fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::Interrupted | ErrorKind::ConnectionAborted
    )
}
