//! The host side of the guest agent protocol (`lab/guest/agent.c`; docs/vsock.md).
//!
//! A connection reaches the agent through the VM's vsock device in Firecracker's hybrid
//! mode ([`connect`]: `CONNECT <port>\n`, the device answers `OK <port>\n`). Then frames
//! (one type byte, a little-endian u32 length, the payload) go both ways:
//!
//! | type | way          | payload                                                   |
//! |------|--------------|-----------------------------------------------------------|
//! | `R`  | host → agent | timeout ms (u32), argc (u32), envc (u32), NUL-ended strings |
//! | `I`  | host → agent | stdin bytes                                               |
//! | `C`  | host → agent | stdin closed                                              |
//! | `O`  | agent → host | stdout bytes                                              |
//! | `E`  | agent → host | stderr bytes                                              |
//! | `X`  | agent → host | exit code (i32), how it ended (u8), a message             |
//!
//! [`run`] streams a command's output to writers (what `densevm exec` does);
//! [`exec_collected`] gathers it into memory up to a cap (what the fleet's
//! `POST /vms/{id}/exec` does). Neither knows about VMs: any hybrid vsock socket will do.

use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

/// The agent's default vsock port.
pub const AGENT_PORT: u32 = 52;

/// The largest frame accepted from the agent.
const MAX_FRAME: usize = 1 << 20;

/// How long past a command's timeout [`exec_collected`] waits for the agent's report.
pub const REPORT_GRACE: Duration = Duration::from_secs(30);

/// How long the vsock device waits for the guest to accept, plus a margin.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(4);

/// Why a command could not be run or its end not learnt.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The request itself is wrong (empty argv, NUL bytes, too large).
    #[error("{0}")]
    Request(String),
    /// No agent could be reached: no socket, or the guest refused the connection.
    #[error("{0}")]
    Unreachable(String),
    /// The other end broke the protocol or the connection ended early.
    #[error("{0}")]
    Protocol(String),
    /// Reading or writing the connection (or the caller's writers) failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> AgentError {
    move |source| AgentError::Io { what, source }
}

/// How a command ended, as the agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitReport {
    /// Exit code (128 + signal when killed; 124 on timeout; 126/127 when it could not
    /// start).
    pub code: i32,
    /// 0 exited, 1 killed by a signal, 2 timed out, 3 could not start.
    pub how: u8,
    /// The agent's message (signal name, why it could not start).
    pub message: String,
}

impl ExitReport {
    /// `how` as a word: `exited`, `signaled`, `timed_out` or `not_started`.
    pub fn how_name(&self) -> &'static str {
        match self.how {
            0 => "exited",
            1 => "signaled",
            2 => "timed_out",
            _ => "not_started",
        }
    }
}

/// One frame: type, little-endian length, payload.
pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(5 + payload.len());
    f.push(kind);
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// The request frame: timeout, argv, environment (`NAME=VALUE` entries).
pub fn request(
    argv: &[String],
    env: &[String],
    timeout: Option<Duration>,
) -> Result<Vec<u8>, AgentError> {
    if argv.is_empty() {
        return Err(AgentError::Request(
            "give the command to run, e.g. densevm exec --api-sock PATH -- uname -r".into(),
        ));
    }
    for e in env {
        if !e.contains('=') || e.starts_with('=') {
            return Err(AgentError::Request(format!(
                "environment entry {e:?}: give NAME=VALUE"
            )));
        }
    }
    let mut p = Vec::new();
    let ms = timeout.map_or(0, |t| t.as_millis().clamp(1, u128::from(u32::MAX)) as u32);
    p.extend_from_slice(&ms.to_le_bytes());
    p.extend_from_slice(&(argv.len() as u32).to_le_bytes());
    p.extend_from_slice(&(env.len() as u32).to_le_bytes());
    for s in argv.iter().chain(env) {
        if s.as_bytes().contains(&0) {
            return Err(AgentError::Request(
                "arguments and environment entries cannot contain NUL bytes".into(),
            ));
        }
        p.extend_from_slice(s.as_bytes());
        p.push(0);
    }
    if p.len() > MAX_FRAME {
        return Err(AgentError::Request(
            "the command line and environment exceed 1 MiB".into(),
        ));
    }
    Ok(frame(b'R', &p))
}

/// Opens a hybrid-vsock connection to `port`: `CONNECT <port>` and the device's `OK`.
pub fn connect(uds: &Path, port: u32) -> Result<UnixStream, AgentError> {
    let mut s = UnixStream::connect(uds).map_err(|e| {
        AgentError::Unreachable(format!(
            "cannot connect to the vsock socket {}: {e}; is the VM running with --vsock ...,uds={}?",
            uds.display(),
            uds.display()
        ))
    })?;
    s.write_all(format!("CONNECT {port}\n").as_bytes())
        .map_err(io("sending CONNECT to the vsock socket"))?;
    s.set_read_timeout(Some(HANDSHAKE_WAIT))
        .map_err(io("setting a read timeout"))?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) if line.len() < 64 => line.push(byte[0]),
            _ => {
                return Err(AgentError::Unreachable(format!(
                    "no agent answered on vsock port {port}: the guest refused or did not \
                     accept the connection (is densevm-agent running in the guest, with the \
                     vsock and vmw_vsock_virtio_transport modules loaded? --wait SECS waits \
                     for a booting guest)"
                )))
            }
        }
    }
    if !line.starts_with(b"OK ") {
        return Err(AgentError::Protocol(format!(
            "the vsock device answered '{}' instead of OK",
            String::from_utf8_lossy(&line)
        )));
    }
    s.set_read_timeout(None)
        .map_err(io("clearing the read timeout"))?;
    Ok(s)
}

/// Sends the request over `conn`, forwards `stdin` (on a thread; `None`: an empty stdin),
/// copies the command's output to `out` and `err` as it comes, and returns how it ended.
pub fn run(
    conn: UnixStream,
    request: &[u8],
    stdin: Option<Box<dyn Read + Send>>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<ExitReport, AgentError> {
    let mut w = conn.try_clone().map_err(io("duplicating the connection"))?;
    w.write_all(request).map_err(|_| {
        AgentError::Protocol("the agent closed the connection before taking the request".into())
    })?;
    match stdin {
        None => w
            .write_all(&frame(b'C', &[]))
            .map_err(io("closing the command's stdin"))?,
        Some(input) => {
            std::thread::Builder::new()
                .name("exec-stdin".into())
                .spawn(move || forward_stdin(input, w))
                .map_err(io("starting the stdin thread"))?;
        }
    }
    let mut r = BufReader::with_capacity(128 << 10, conn);
    let mut payload = Vec::new();
    loop {
        let mut hdr = [0u8; 5];
        if let Err(e) = r.read_exact(&mut hdr) {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                return Err(AgentError::Protocol(
                    "the agent sent nothing for longer than the command's timeout and a \
                     grace period (is the guest paused or hung?)"
                        .into(),
                ));
            }
            return Err(AgentError::Protocol(
                "the agent closed the connection before reporting an exit status (did the \
                 guest stop, or the agent die?)"
                    .into(),
            ));
        }
        let len = u32::from_le_bytes([hdr[1], hdr[2], hdr[3], hdr[4]]) as usize;
        if len > MAX_FRAME {
            return Err(AgentError::Protocol(format!(
                "the agent sent a frame of {len} bytes: not a densevm agent?"
            )));
        }
        payload.resize(len, 0);
        r.read_exact(&mut payload).map_err(|_| {
            AgentError::Protocol("the agent's connection ended inside a frame".into())
        })?;
        match hdr[0] {
            b'O' => {
                out.write_all(&payload).map_err(io("writing stdout"))?;
                out.flush().map_err(io("writing stdout"))?;
            }
            b'E' => {
                err.write_all(&payload).map_err(io("writing stderr"))?;
                err.flush().map_err(io("writing stderr"))?;
            }
            b'X' if len >= 5 => {
                return Ok(ExitReport {
                    code: i32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]),
                    how: payload[4],
                    message: String::from_utf8_lossy(&payload[5..]).into_owned(),
                })
            }
            other => {
                return Err(AgentError::Protocol(format!(
                    "the agent sent an unknown frame type {other:#x}: not a densevm agent?"
                )))
            }
        }
    }
}

fn forward_stdin(mut input: Box<dyn Read + Send>, mut w: UnixStream) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if w.write_all(&frame(b'I', &buf[..n])).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = w.write_all(&frame(b'C', &[]));
}

/// A command's output gathered in memory by [`exec_collected`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collected {
    /// How it ended.
    pub exit: ExitReport,
    /// Its stdout, at most the cap.
    pub stdout: Vec<u8>,
    /// Its stderr, at most the cap.
    pub stderr: Vec<u8>,
    /// Whether output beyond the cap was dropped (the command still ran to its end).
    pub truncated: bool,
}

/// A writer keeping at most `cap` bytes and counting what it dropped.
struct Capped {
    buf: Vec<u8>,
    cap: usize,
    dropped: bool,
}

impl Write for Capped {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = self.cap.saturating_sub(self.buf.len());
        self.buf.extend_from_slice(&data[..data.len().min(room)]);
        self.dropped |= data.len() > room;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `argv` through the agent behind the hybrid vsock socket `uds`, with `stdin` as its
/// whole input, and gathers up to `cap` bytes of each of stdout and stderr.
pub fn exec_collected(
    uds: &Path,
    port: u32,
    argv: &[String],
    env: &[String],
    stdin: Vec<u8>,
    timeout: Option<Duration>,
    cap: usize,
) -> Result<Collected, AgentError> {
    let req = request(argv, env, timeout)?;
    let conn = connect(uds, port)?;
    if let Some(t) = timeout {
        // The agent ends the command at its timeout; a guest that is paused or hung
        // must not hold the caller for ever.
        conn.set_read_timeout(Some(t + REPORT_GRACE))
            .map_err(io("setting a read timeout"))?;
    }
    let input: Option<Box<dyn Read + Send>> = if stdin.is_empty() {
        None
    } else {
        Some(Box::new(std::io::Cursor::new(stdin)))
    };
    let mut out = Capped {
        buf: Vec::new(),
        cap,
        dropped: false,
    };
    let mut err = Capped {
        buf: Vec::new(),
        cap,
        dropped: false,
    };
    let exit = run(conn, &req, input, &mut out, &mut err)?;
    Ok(Collected {
        exit,
        truncated: out.dropped || err.dropped,
        stdout: out.buf,
        stderr: err.buf,
    })
}

#[cfg(test)]
mod tests;
