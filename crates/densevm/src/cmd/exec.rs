//! `densevm exec`: runs a command in a guest through the guest agent (`lab/guest/agent.c`)
//! over the VM's vsock device, forwarding stdin, printing stdout and stderr as they come,
//! and exiting with the command's exit code (docs/vsock.md has the protocol).

use anyhow::{bail, Context};
use clap::Args;
use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The agent's default vsock port.
pub const AGENT_PORT: u32 = 52;

/// The largest frame accepted from the agent.
const MAX_FRAME: usize = 1 << 20;

/// How long the vsock device waits for the guest to accept, plus a margin.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(4);

/// Arguments of `densevm exec`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// The VM's API socket (`densevm run --api-sock`); the vsock socket is read from its
    /// GET /vsock.
    #[arg(long, value_name = "PATH", required_unless_present = "vsock_uds")]
    pub api_sock: Option<PathBuf>,
    /// The vsock device's unix socket (`--vsock cid=N,uds=PATH`), instead of --api-sock.
    #[arg(long, value_name = "PATH", conflicts_with = "api_sock")]
    pub vsock_uds: Option<PathBuf>,
    /// The agent's vsock port.
    #[arg(long, default_value_t = AGENT_PORT)]
    pub port: u32,
    /// Kill the command (and its process group) after this many seconds; exit code 124.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Keep trying to reach the agent for up to this many seconds (a guest still booting).
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub wait: f64,
    /// An environment variable for the command (repeatable). Without any, the command gets
    /// the agent's default PATH and HOME.
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Give the command an empty stdin instead of forwarding this one.
    #[arg(long)]
    pub no_stdin: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// How the command ended, as the agent reports it.
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

/// One frame: type, little-endian length, payload.
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(5 + payload.len());
    f.push(kind);
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// The request frame: timeout, argv, environment.
pub fn request(
    argv: &[String],
    env: &[String],
    timeout: Option<Duration>,
) -> anyhow::Result<Vec<u8>> {
    if argv.is_empty() {
        bail!("give the command to run after --, e.g. densevm exec --api-sock PATH -- uname -r");
    }
    let mut p = Vec::new();
    let ms = timeout.map_or(0, |t| t.as_millis().clamp(1, u128::from(u32::MAX)) as u32);
    p.extend_from_slice(&ms.to_le_bytes());
    p.extend_from_slice(&(argv.len() as u32).to_le_bytes());
    p.extend_from_slice(&(env.len() as u32).to_le_bytes());
    for s in argv.iter().chain(env) {
        if s.as_bytes().contains(&0) {
            bail!("arguments and environment entries cannot contain NUL bytes");
        }
        p.extend_from_slice(s.as_bytes());
        p.push(0);
    }
    if p.len() > MAX_FRAME {
        bail!("the command line and environment exceed 1 MiB");
    }
    Ok(frame(b'R', &p))
}

/// Opens a hybrid-vsock connection to `port`: `CONNECT <port>` and the device's `OK`.
pub fn connect(uds: &Path, port: u32) -> anyhow::Result<UnixStream> {
    let mut s = UnixStream::connect(uds).with_context(|| {
        format!(
            "cannot connect to the vsock socket {}: is the VM running with --vsock ...,uds={}?",
            uds.display(),
            uds.display()
        )
    })?;
    s.write_all(format!("CONNECT {port}\n").as_bytes())?;
    s.set_read_timeout(Some(HANDSHAKE_WAIT))?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) if line.len() < 64 => line.push(byte[0]),
            _ => bail!(
                "no agent answered on vsock port {port}: the guest refused or did not accept \
                 the connection (is densevm-agent running in the guest, with the vsock and \
                 vmw_vsock_virtio_transport modules loaded? --wait SECS waits for a booting guest)"
            ),
        }
    }
    if !line.starts_with(b"OK ") {
        bail!(
            "the vsock device answered '{}' instead of OK",
            String::from_utf8_lossy(&line)
        );
    }
    s.set_read_timeout(None)?;
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
) -> anyhow::Result<ExitReport> {
    let mut w = conn.try_clone()?;
    w.write_all(request)
        .context("the agent closed the connection before taking the request")?;
    match stdin {
        None => w.write_all(&frame(b'C', &[]))?,
        Some(mut input) => {
            std::thread::Builder::new()
                .name("exec-stdin".into())
                .spawn(move || {
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
                })?;
        }
    }
    let mut r = BufReader::with_capacity(128 << 10, conn);
    let mut payload = Vec::new();
    loop {
        let mut hdr = [0u8; 5];
        if r.read_exact(&mut hdr).is_err() {
            bail!("the agent closed the connection before reporting an exit status (did the guest stop, or the agent die?)");
        }
        let len = u32::from_le_bytes([hdr[1], hdr[2], hdr[3], hdr[4]]) as usize;
        if len > MAX_FRAME {
            bail!("the agent sent a frame of {len} bytes: not a densevm agent?");
        }
        payload.resize(len, 0);
        r.read_exact(&mut payload)
            .context("the agent's connection ended inside a frame")?;
        match hdr[0] {
            b'O' => {
                out.write_all(&payload)?;
                out.flush()?;
            }
            b'E' => {
                err.write_all(&payload)?;
                err.flush()?;
            }
            b'X' if len >= 5 => {
                return Ok(ExitReport {
                    code: i32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]),
                    how: payload[4],
                    message: String::from_utf8_lossy(&payload[5..]).into_owned(),
                })
            }
            other => bail!("the agent sent an unknown frame type {other:#x}: not a densevm agent?"),
        }
    }
}

/// The vsock device's socket: given, or asked from the VM's API.
fn vsock_socket(args: &ExecArgs) -> anyhow::Result<PathBuf> {
    match (&args.vsock_uds, &args.api_sock) {
        (Some(u), _) => Ok(u.clone()),
        (None, Some(api)) => {
            let info = densevm_api::ApiClient::new(api)
                .vsock()
                .with_context(|| format!("GET /vsock on {}", api.display()))?;
            Ok(PathBuf::from(info.uds_path))
        }
        (None, None) => bail!("give --api-sock PATH (or --vsock-uds PATH)"),
    }
}

/// `densevm exec`.
pub fn main(args: ExecArgs) -> anyhow::Result<i32> {
    let timeout = match args.timeout {
        Some(s) if !(s > 0.0 && s.is_finite()) => {
            bail!("--timeout must be a positive number of seconds")
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    if !(args.wait >= 0.0 && args.wait.is_finite()) {
        bail!("--wait must be a number of seconds >= 0");
    }
    for e in &args.env {
        if !e.contains('=') || e.starts_with('=') {
            bail!("--env {e}: give NAME=VALUE");
        }
    }
    let req = request(&args.command, &args.env, timeout)?;
    let deadline = Instant::now() + Duration::from_secs_f64(args.wait);
    // Both the API (a VM still being restored) and the agent (a guest still booting) may
    // not be there yet: --wait covers both.
    let conn = loop {
        let attempt = vsock_socket(&args).and_then(|uds| connect(&uds, args.port));
        match attempt {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("exec: {e:#}; trying again");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => return Err(e),
        }
    };
    let stdin: Option<Box<dyn Read + Send>> = if args.no_stdin {
        None
    } else {
        Some(Box::new(std::io::stdin()))
    };
    let report = run(
        conn,
        &req,
        stdin,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr(),
    )?;
    match report.how {
        0 => {}
        1 => eprintln!(
            "densevm exec: the command was killed by a signal ({})",
            report.message
        ),
        2 => eprintln!("densevm exec: the command {}", report.message),
        _ => eprintln!("densevm exec: {}", report.message),
    }
    Ok(report.code)
}

#[cfg(test)]
mod tests;
