//! `densevm exec`: runs a command in a guest through the guest agent (`lab/guest/agent.c`)
//! over the VM's vsock device, forwarding stdin, printing stdout and stderr as they come,
//! and exiting with the command's exit code. The protocol is crates/agent's
//! (docs/vsock.md).

use anyhow::{bail, Context};
use clap::Args;
use densevm_agent::{connect, request, run, AGENT_PORT};
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

// Arguments of `densevm exec`.
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
        let attempt = vsock_socket(&args).and_then(|uds| Ok(connect(&uds, args.port)?));
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
