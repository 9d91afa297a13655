//! `POST /vms/{id}/exec`: a command run in a VM's guest through its agent (crates/agent),
//! reached over the VM's vsock device. The API thread checks the request and hands the
//! run to a thread of its own ([`densevm_api::Reply::Later`]), so a long command holds up
//! no other request and never the fleet's lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use densevm_agent::{exec_collected, AgentError, AGENT_PORT};
use densevm_api::request::ApiErrorResponse;
use densevm_api::ApiResponse;

use crate::launcher::VmControl;
use crate::spec::bad;
use crate::types::{ExecResult, VmExec};

/// The most stdout (and, apart, stderr) an answer carries.
pub const OUTPUT_CAP: usize = 16 << 20;

/// The longest (and default) timeout.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// Checks a request before anything runs; returns its timeout.
pub fn check(req: &VmExec) -> Result<Duration, ApiErrorResponse> {
    if req.argv.is_empty() || req.argv[0].is_empty() {
        return Err(bad(
            "argv must name the command, e.g. {\"argv\": [\"uname\", \"-r\"]}",
        ));
    }
    if let Some(e) = req
        .env
        .iter()
        .find(|e| !e.contains('=') || e.starts_with('='))
    {
        return Err(bad(format!("env entry {e:?}: give NAME=VALUE")));
    }
    let strings = req.argv.iter().chain(&req.env).chain(&req.stdin);
    if req.argv.iter().chain(&req.env).any(|s| s.contains('\0')) {
        return Err(bad("argv and env entries may not contain NUL bytes"));
    }
    if strings.map(String::len).sum::<usize>() > OUTPUT_CAP {
        return Err(bad("argv, env and stdin together exceed 16 MiB"));
    }
    if req.port == Some(0) || req.port == Some(u32::MAX) {
        return Err(bad("port must be 1 to 4294967294"));
    }
    match req.timeout_s {
        None => Ok(MAX_TIMEOUT),
        Some(t) if t > 0.0 && t <= MAX_TIMEOUT.as_secs_f64() => Ok(Duration::from_secs_f64(t)),
        Some(t) => Err(bad(format!(
            "timeout_s {t} is out of range: more than 0, at most {}",
            MAX_TIMEOUT.as_secs()
        ))),
    }
}

/// Runs a checked request in the VM `id` behind `control`, on the calling thread, and
/// gives the answer: 200 with an [`ExecResult`] whatever the command's exit code, 400 when
/// the VM has no vsock device, 502 when no agent answers or the connection breaks.
pub fn run(control: Arc<dyn VmControl>, id: &str, req: VmExec, timeout: Duration) -> ApiResponse {
    let t0 = Instant::now();
    let uds = match control.vsock_uds() {
        Ok(u) => u,
        Err(e) => {
            return ApiResponse::error(
                400,
                format!(
                    "VM {id} has no vsock device to reach a guest agent through ({e}); create \
                     it with vsock_cid"
                ),
            )
        }
    };
    let stdin = req.stdin.map(String::into_bytes).unwrap_or_default();
    match exec_collected(
        &uds,
        req.port.unwrap_or(AGENT_PORT),
        &req.argv,
        &req.env,
        stdin,
        Some(timeout),
        OUTPUT_CAP,
    ) {
        Ok(c) => ApiResponse::ok(&ExecResult {
            exit_code: c.exit.code,
            status: c.exit.how_name().to_owned(),
            message: c.exit.message,
            stdout: String::from_utf8_lossy(&c.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&c.stderr).into_owned(),
            truncated: c.truncated,
            duration_ms: t0.elapsed().as_millis() as u64,
        }),
        Err(AgentError::Request(m)) => ApiResponse::error(400, m),
        Err(e) => ApiResponse::error(502, format!("VM {id}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(argv: &[&str]) -> VmExec {
        VmExec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn requests_are_checked() {
        assert_eq!(check(&req(&["true"])).unwrap(), MAX_TIMEOUT);
        let t = VmExec {
            timeout_s: Some(1.5),
            ..req(&["true"])
        };
        assert_eq!(check(&t).unwrap(), Duration::from_millis(1500));
        for bad in [
            req(&[]),
            req(&[""]),
            req(&["a\0b"]),
            VmExec {
                env: vec!["NOEQUALS".into()],
                ..req(&["true"])
            },
            VmExec {
                env: vec!["=x".into()],
                ..req(&["true"])
            },
            VmExec {
                timeout_s: Some(0.0),
                ..req(&["true"])
            },
            VmExec {
                timeout_s: Some(f64::NAN),
                ..req(&["true"])
            },
            VmExec {
                timeout_s: Some(7200.0),
                ..req(&["true"])
            },
            VmExec {
                port: Some(0),
                ..req(&["true"])
            },
            VmExec {
                stdin: Some("x".repeat(OUTPUT_CAP + 1)),
                ..req(&["cat"])
            },
        ] {
            let e = check(&bad).unwrap_err();
            assert_eq!(e.status, 400, "{bad:?}");
        }
    }
}
