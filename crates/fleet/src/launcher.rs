//! Starting VMs: a [`Launcher`] makes a [`VmProcess`] from a [`LaunchPlan`]. The real
//! one ([`ProcessLauncher`]) runs `densevm run ... --api-sock` as a child process in its
//! own process group (and cgroup); tests use fakes, so the registry and the API are
//! tested without /dev/kvm.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use densevm_api::{ApiClient, BalloonStats, MemoryTierInfo};

use crate::cgroup::VmCgroup;

/// Everything needed to start one VM.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    /// The VM's id.
    pub id: String,
    /// Arguments after `densevm run` (including `--api-sock`, `--console-sock`, `--id`).
    pub run_args: Vec<String>,
    /// The VM's API socket.
    pub api_sock: PathBuf,
    /// Where its console output (and the VMM's stderr) goes.
    pub console: PathBuf,
    /// The cgroup it starts in, if any.
    pub cgroup: Option<VmCgroup>,
}

/// Talks to a running VM (its API socket, for the real ones).
pub trait VmControl: Send + Sync {
    /// The balloon's statistics (`GET /balloon/statistics`).
    fn balloon_stats(&self) -> Result<BalloonStats, String>;
    /// A new balloon target (`PATCH /balloon`).
    fn set_balloon(&self, amount_mib: u32) -> Result<(), String>;
    /// Asks the guest to shut down; `Ok(false)` when the VM has no way to be asked.
    fn shutdown(&self) -> Result<bool, String>;
    /// The DRAM budget and the tier's counters (`GET /memory-tier`).
    fn memory_tier(&self) -> Result<MemoryTierInfo, String> {
        Err("this VM control has no memory tier".into())
    }
    /// A new DRAM budget (`PATCH /memory-tier`).
    fn set_memory_budget(&self, budget_mib: u32) -> Result<(), String> {
        let _ = budget_mib;
        Err("this VM control has no memory tier".into())
    }
    /// The host socket of the VM's vsock device (`GET /vsock`), where its guest agent is
    /// reached.
    fn vsock_uds(&self) -> Result<PathBuf, String> {
        Err("this VM control has no vsock device".into())
    }
}

/// A started VM process.
pub trait VmProcess: Send {
    /// Its process id.
    fn pid(&self) -> u32;
    /// The process running the VM, to measure (RSS, PSS, CPU): [`VmProcess::pid`] unless
    /// the VM is jailed, where that is the outer process and the VMM is its child.
    fn vmm_pid(&self) -> u32 {
        self.pid()
    }
    /// How it ended, once it has (reaps it).
    fn try_wait(&mut self) -> Result<Option<String>, String>;
    /// Sends `signal` to its process group.
    fn signal(&mut self, signal: i32) -> Result<(), String>;
    /// Its control channel.
    fn control(&self) -> Arc<dyn VmControl>;
}

/// Starts VMs.
pub trait Launcher: Send {
    /// Starts one and returns once it serves its API (or fails, saying why).
    fn launch(&mut self, plan: &LaunchPlan) -> Result<Box<dyn VmProcess>, String>;
}

/// A VM's API socket as its [`VmControl`].
#[derive(Debug, Clone)]
pub struct ApiControl {
    client: ApiClient,
}

impl ApiControl {
    /// The VM whose socket is at `path`; each call waits at most 2 s.
    pub fn new(path: &Path) -> Self {
        Self {
            client: ApiClient::new(path).with_timeout(Duration::from_secs(2)),
        }
    }
}

impl VmControl for ApiControl {
    fn balloon_stats(&self) -> Result<BalloonStats, String> {
        self.client.balloon_stats().map_err(|e| e.to_string())
    }

    fn set_balloon(&self, amount_mib: u32) -> Result<(), String> {
        self.client
            .set_balloon_target(amount_mib)
            .map_err(|e| e.to_string())
    }

    fn memory_tier(&self) -> Result<MemoryTierInfo, String> {
        self.client.memory_tier().map_err(|e| e.to_string())
    }

    fn set_memory_budget(&self, budget_mib: u32) -> Result<(), String> {
        self.client
            .set_memory_budget(budget_mib)
            .map_err(|e| e.to_string())
    }

    fn vsock_uds(&self) -> Result<PathBuf, String> {
        self.client
            .vsock()
            .map(|v| PathBuf::from(v.uds_path))
            .map_err(|e| e.to_string())
    }

    fn shutdown(&self) -> Result<bool, String> {
        // The per-VM API has no shutdown call yet (Firecracker's would be PUT /actions
        // {"action_type": "SendCtrlAltDel"}): the caller goes on to SIGTERM.
        Ok(false)
    }
}

/// How a process ended, in words.
pub fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}{}", signal_name(sig)),
        _ => status.to_string(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => " (SIGKILL: the OOM killer, or a delete)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        _ => "",
    }
}

/// Sends `signal` to process group `pid` (a VM's group is its own pid).
pub fn signal_group(pid: u32, signal: i32) -> Result<(), String> {
    let pgid = i32::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
    // SAFETY: kill takes no pointers; a negative pid names the process group.
    if unsafe { libc::kill(-pgid, signal) } < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

/// Every VM jailed (`densevm run --jail ROOT/ID --uid UID --gid GID --jail-id ID`):
/// docs/security.md, `## Jailed launch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailConfig {
    /// Where each VM's jail directory `ROOT/ID` is made (outside the state directory).
    pub root: PathBuf,
    /// The uid the VMMs run as.
    pub uid: u32,
    /// The gid the VMMs run as.
    pub gid: u32,
}

impl JailConfig {
    /// The `densevm run` arguments that jail VM `id`, after creating its jail directory
    /// and giving the VM's own directory (`vm_dir`: its sockets) to the jail's uid.
    pub fn prepare(&self, id: &str, vm_dir: &Path) -> Result<Vec<String>, String> {
        let dir = self.root.join(id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create the jail directory {}: {e}", dir.display()))?;
        std::os::unix::fs::chown(vm_dir, Some(self.uid), Some(self.gid)).map_err(|e| {
            format!(
                "cannot give {} to uid {} (the jailed VMM creates its sockets there): {e}",
                vm_dir.display(),
                self.uid
            )
        })?;
        Ok(vec![
            "--jail".into(),
            dir.display().to_string(),
            "--uid".into(),
            self.uid.to_string(),
            "--gid".into(),
            self.gid.to_string(),
            "--jail-id".into(),
            id.into(),
        ])
    }
}

/// Runs `densevm run` processes.
#[derive(Debug, Clone)]
pub struct ProcessLauncher {
    densevm: PathBuf,
    ready_timeout: Duration,
    jail: Option<JailConfig>,
}

impl ProcessLauncher {
    /// Runs the densevm binary at `densevm`; a VM must serve its API within 30 s.
    pub fn new(densevm: impl Into<PathBuf>) -> Self {
        Self {
            densevm: densevm.into(),
            ready_timeout: Duration::from_secs(30),
            jail: None,
        }
    }

    /// Jails every VM it starts.
    pub fn with_jail(mut self, jail: Option<JailConfig>) -> Self {
        self.jail = jail;
        self
    }

    /// How long a VM may take to serve its API.
    pub fn with_ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }
}

/// A `densevm run` child.
pub struct ChildVm {
    child: Child,
    control: Arc<ApiControl>,
    jailed: bool,
}

/// The first child of process `pid` (a jailed VM's VMM, PID 1 of its namespace).
pub fn first_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl VmProcess for ChildVm {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn vmm_pid(&self) -> u32 {
        let pid = self.child.id();
        if self.jailed {
            first_child(pid).unwrap_or(pid)
        } else {
            pid
        }
    }

    fn try_wait(&mut self) -> Result<Option<String>, String> {
        self.child
            .try_wait()
            .map(|s| s.map(describe_exit))
            .map_err(|e| e.to_string())
    }

    fn signal(&mut self, signal: i32) -> Result<(), String> {
        signal_group(self.child.id(), signal)
    }

    fn control(&self) -> Arc<dyn VmControl> {
        self.control.clone()
    }
}

impl Launcher for ProcessLauncher {
    fn launch(&mut self, plan: &LaunchPlan) -> Result<Box<dyn VmProcess>, String> {
        let out = File::create(&plan.console)
            .map_err(|e| format!("cannot create {}: {e}", plan.console.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let jail_args = match (&self.jail, plan.api_sock.parent()) {
            (Some(j), Some(dir)) => j.prepare(&plan.id, dir)?,
            _ => Vec::new(),
        };
        let mut cmd = Command::new(&self.densevm);
        cmd.arg("run")
            .args(&plan.run_args)
            .args(&jail_args)
            // Its own process group: signals to the daemon's group spare the VMs, and the
            // daemon can restart without taking them down.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let procs = plan
            .cgroup
            .as_ref()
            .map(VmCgroup::procs_for_join)
            .transpose()?;
        if let Some(procs) = &procs {
            let fd = procs.as_raw_fd();
            // SAFETY: the closure runs in the forked child before exec and only calls
            // write(2), which is async-signal-safe, on a descriptor the parent keeps open
            // until spawn returns. Writing "0" to cgroup.procs moves the writer (the child)
            // into the cgroup, so the VMM's every allocation is charged there.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start {} run (for VM {}): {e}",
                self.densevm.display(),
                plan.id
            )
        })?;
        drop(procs);
        let mut vm = ChildVm {
            child,
            control: Arc::new(ApiControl::new(&plan.api_sock)),
            jailed: self.jail.is_some(),
        };
        if let Err(e) = wait_ready(&mut vm, plan, self.ready_timeout) {
            let _ = vm.signal(libc::SIGKILL);
            let _ = vm.child.wait();
            return Err(e);
        }
        Ok(Box::new(vm))
    }
}

/// Waits until the VM answers `GET /` on its socket.
fn wait_ready(vm: &mut ChildVm, plan: &LaunchPlan, timeout: Duration) -> Result<(), String> {
    let client = ApiClient::new(&plan.api_sock).with_timeout(Duration::from_secs(1));
    let deadline = Instant::now() + timeout;
    loop {
        if client.info().is_ok() {
            return Ok(());
        }
        if let Some(how) = vm.try_wait()? {
            return Err(format!(
                "VM {} ended before serving its API ({how}): {}",
                plan.id,
                console_tail(&plan.console)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "VM {} did not serve its API within {} s: {}",
                plan.id,
                timeout.as_secs(),
                console_tail(&plan.console)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last lines of a console file, for an error message.
pub fn console_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(600);
    let tail = String::from_utf8_lossy(&text[start..]);
    let tail = tail.trim();
    if tail.is_empty() {
        format!("{} is empty", path.display())
    } else {
        format!("the end of {}: {tail}", path.display())
    }
}
