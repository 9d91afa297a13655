//! Clones as processes: each clone of a running VM is a `densevm run --restore` process
//! started here, with its own sockets and copy-on-write disk overlays.

use densevm_api::types::CloneInfo;
use densevm_virtio::block::{open_pcow, BackendHandle};
use densevm_vmm::TemplateHook;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn overlay_path(dir: &Path, disk: usize, who: &str) -> PathBuf {
    dir.join(format!("disk{disk}.{who}.pcow"))
}

fn pmem_overlay_path(dir: &Path, n: usize, who: &str) -> PathBuf {
    dir.join(format!("pmem{n}.{who}.pcow"))
}

/// Creates a pcow overlay at `path` over `base` (same size and cluster size).
fn create_overlay(path: &Path, base: &Path) -> Result<(), String> {
    let chain = pcow::Chain::open(base, pcow::OpenOptions::default())
        .map_err(|e| format!("disk {}: {e}", base.display()))?;
    let opts = pcow::CreateOptions {
        virtual_size: chain.virtual_size(),
        cluster_size: chain.cluster_size(),
        backing: Some(base.display().to_string()),
    };
    drop(chain);
    pcow::create_file(path, &opts).map_err(|e| format!("overlay {}: {e}", path.display()))
}

/// The work done while the VM is paused for a clone template: every writable disk's top
/// image is frozen as the base of one overlay per clone and of a new overlay the parent
/// goes on in (its device is moved onto it, the device being quiesced). Each `--pmem`
/// image likewise, its region mapped again over the parent's overlay at the same address.
/// Then the clones are started on the frozen RAM file (into `started`; the caller waits
/// for them), while the VMM moves the parent's RAM off the file. `req` says how many, in
/// which directory, and on which taps.
pub fn template_hook(
    req: &densevm_api::CloneRequest,
    specs: &crate::cmd::devices::DeviceSpecs,
    handles: Vec<BackendHandle>,
    tops: Arc<Mutex<Vec<PathBuf>>>,
    pmem: crate::cmd::pmem::PmemRegions,
    started: Arc<Mutex<Option<Starting>>>,
) -> TemplateHook {
    let dir = PathBuf::from(&req.snapshot_path);
    let count = req.count;
    let opts = CloneOpts {
        nets: req.network_overrides.clone(),
        memory_budget_mib: req.memory_budget_mib,
    };
    let writable: Vec<usize> = specs
        .disks
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.readonly)
        .map(|(i, _)| i)
        .collect();
    Box::new(move |ram: BorrowedFd<'_>| {
        let mut tops = tops.lock().unwrap_or_else(|p| p.into_inner());
        for &n in &writable {
            let base = tops[n].clone();
            for k in 0..count {
                create_overlay(&overlay_path(&dir, n, &format!("clone-{k}")), &base)?;
            }
            let parent = overlay_path(&dir, n, "parent");
            create_overlay(&parent, &base)?;
            let backend = open_pcow(&parent, true).map_err(|e| e.to_string())?;
            handles[n].replace(backend).map_err(|e| e.to_string())?;
            tops[n] = parent;
        }
        for n in 0..pmem.len() {
            let base = pmem.path(n);
            for k in 0..count {
                create_overlay(&pmem_overlay_path(&dir, n, &format!("clone-{k}")), &base)?;
            }
            let parent = pmem_overlay_path(&dir, n, "parent");
            create_overlay(&parent, &base)?;
            pmem.move_to(n, &parent)
                .map_err(|e| format!("pmem{n}: {}", crate::output::error_chain(&e)))?;
        }
        // The clones run before the parent's RAM leaves the file (the VMM does that after
        // this hook): the remap would slow their start, and nothing writes the file while
        // the parent is paused.
        let starting = start_clones(&dir, count, Some(ram), &opts)
            .map_err(|e| crate::output::error_chain(&e))?;
        let mut slot = started.lock().unwrap_or_else(|p| p.into_inner());
        slot.insert(starting)
            .wait_running()
            .map_err(|e| crate::output::error_chain(&e))
    })
}

/// A clone's writable disks and its `--pmem` images are its own overlays in the template
/// directory; its vsock socket is `<uds>.clone-<index>` (the template's stays in use).
pub fn use_clone_overlays(specs: &mut crate::cmd::devices::DeviceSpecs, dir: &Path, index: u32) {
    if let Some(v) = &mut specs.vsock {
        let mut uds = v.uds.clone().into_os_string();
        uds.push(format!(".clone-{index}"));
        v.uds = uds.into();
    }
    for (n, d) in specs.disks.iter_mut().enumerate() {
        let overlay = overlay_path(dir, n, &format!("clone-{index}"));
        if !d.readonly && overlay.exists() {
            d.path = overlay;
            d.pcow = true;
        }
    }
    for (n, p) in specs.pmem.iter_mut().enumerate() {
        let overlay = pmem_overlay_path(dir, n, &format!("clone-{index}"));
        if overlay.exists() {
            *p = overlay;
        }
    }
}

/// Clone processes started, not known to run yet.
pub struct Starting {
    children: Vec<(Proc, OwnedFd, PathBuf)>,
    infos: Vec<CloneInfo>,
    spawned: Instant,
    /// When the last clone said its vCPUs run.
    pub running: Option<Instant>,
}

/// How clones are started besides their number and directory.
#[derive(Debug, Default)]
pub struct CloneOpts {
    /// Each clone's network interfaces on taps of its own (`{index}`: the clone's).
    pub nets: Vec<densevm_api::NetworkOverride>,
    /// `--memory-budget` for each clone, MiB.
    pub memory_budget_mib: Option<u32>,
}

/// Starts `count` `densevm run --restore DIR` processes, each with its API socket, console
/// socket and console file in DIR ([`Starting::wait`] waits until their vCPUs run). `ram`
/// is a frozen template's RAM file, inherited by each clone; without it the clones map
/// DIR/memory.
pub fn start_clones(
    dir: &Path,
    count: u32,
    ram: Option<BorrowedFd<'_>>,
    opts: &CloneOpts,
) -> anyhow::Result<Starting> {
    let exe = std::env::current_exe()?;
    // Clones started earlier from the same directory keep their numbers and sockets.
    let first = (0..)
        .find(|k| !dir.join(format!("clone-{k}.console")).exists())
        .unwrap_or(0);
    let mut starting = Starting {
        children: Vec::new(),
        infos: Vec::new(),
        spawned: Instant::now(),
        running: None,
    };
    for index in first..first + count {
        if let Err(e) = spawn_one(&exe, dir, index, ram, opts, &mut starting) {
            starting.kill();
            return Err(e);
        }
    }
    starting.spawned = Instant::now();
    Ok(starting)
}

/// Starts clone `index` into `starting`: through the clone launcher when this VMM has
/// one (`densevm run --api-sock`: no VMM thread may start programs), else directly (the
/// `densevm vm clone-from` command).
fn spawn_one(
    exe: &Path,
    dir: &Path,
    index: u32,
    ram: Option<BorrowedFd<'_>>,
    opts: &CloneOpts,
    starting: &mut Starting,
) -> anyhow::Result<()> {
    use crate::cmd::launcher::Arg;
    let sock = dir.join(format!("clone-{index}.sock"));
    let console = dir.join(format!("clone-{index}.console"));
    let console_sock = dir.join(format!("clone-{index}.console.sock"));
    let out = OwnedFd::from(std::fs::File::create(&console)?);
    let err = out.try_clone()?;
    let (ready_rx, ready_tx) = pipe()?;
    let lit = |s: &dyn AsRef<std::ffi::OsStr>| Arg::Lit(s.as_ref().to_owned());
    let mut args = vec![
        lit(&exe),
        lit(&"run"),
        lit(&"--trace"),
        lit(&"--restore"),
        lit(&dir),
        lit(&"--api-sock"),
        lit(&sock),
        lit(&"--id"),
        lit(&format!("clone-{index}")),
        lit(&"--clone-index"),
        lit(&index.to_string()),
        lit(&"--console-sock"),
        lit(&console_sock),
        lit(&"--ready-fd"),
        Arg::Fd(ready_tx.as_fd()),
    ];
    // Clones inherit `--seccomp off` and `--seccomp log`.
    if let Some(mode) = crate::cmd::seccomp::Seccomp::for_clones() {
        args.extend([lit(&"--seccomp"), lit(&mode)]);
    }
    if let Some(fd) = ram {
        args.extend([lit(&"--ram-fd"), Arg::Fd(fd)]);
    }
    if let Some(mib) = opts.memory_budget_mib {
        args.extend([lit(&"--memory-budget"), lit(&format!("{mib}M"))]);
    }
    for o in &opts.nets {
        args.extend([
            lit(&"--net-override"),
            lit(&format!("{}={}", o.iface_id, o.for_clone(index))),
        ]);
    }
    let t = Instant::now();
    let proc = if crate::cmd::launcher::running() {
        Proc::Launched(crate::cmd::launcher::spawn(&args, &out, &err)?)
    } else {
        Proc::Child(spawn_direct(&args, out, err)?)
    };
    tracing::debug!("clone {index}: spawned in {:?}", t.elapsed());
    drop(ready_tx);
    starting.infos.push(CloneInfo {
        index,
        pid: proc.id(),
        api_sock: sock.display().to_string(),
        console: console.display().to_string(),
    });
    starting.children.push((proc, ready_rx, console));
    Ok(())
}

/// Starts `args` (the first is the program) as a child of this process.
fn spawn_direct(
    args: &[crate::cmd::launcher::Arg<'_>],
    out: OwnedFd,
    err: OwnedFd,
) -> anyhow::Result<std::process::Child> {
    use crate::cmd::launcher::Arg;
    let mut keep = Vec::new();
    let argv: Vec<std::ffi::OsString> = args
        .iter()
        .map(|a| match a {
            Arg::Lit(s) => s.clone(),
            Arg::Fd(fd) => {
                keep.push(fd.as_raw_fd());
                fd.as_raw_fd().to_string().into()
            }
        })
        .collect();
    crate::cmd::launcher::start_process(&argv, out, err, keep).map_err(anyhow::Error::msg)
}

/// A clone process: a child of this process, or of the clone launcher (which reaps it).
enum Proc {
    Child(std::process::Child),
    Launched(u32),
}

impl Proc {
    fn id(&self) -> u32 {
        match self {
            Proc::Child(c) => c.id(),
            Proc::Launched(pid) => *pid,
        }
    }

    fn kill(&mut self) {
        match self {
            Proc::Child(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            // SAFETY: kill only sends a signal; the launcher reaps the process.
            Proc::Launched(pid) => unsafe {
                libc::kill(*pid as libc::pid_t, libc::SIGKILL);
            },
        }
    }

    /// How it ended, if it did and this process can tell.
    fn status(&mut self) -> String {
        match self {
            Proc::Child(c) => match c.try_wait() {
                Ok(Some(s)) => s.to_string(),
                _ => "still running".into(),
            },
            Proc::Launched(_) => "the launcher logs how it ended".into(),
        }
    }
}

impl Starting {
    /// Kills the clones and reaps them.
    pub fn kill(mut self) {
        for (child, _, _) in &mut self.children {
            child.kill();
        }
    }

    /// Waits until each clone writes its ready byte (its API socket is up before that).
    pub fn wait_running(&mut self) -> anyhow::Result<()> {
        let deadline = self.spawned + Duration::from_secs(30);
        for (child, ready, console) in &mut self.children {
            if !wait_ready(ready, deadline)? {
                let status = child.status();
                anyhow::bail!(
                    "clone {} ({status}) did not start its vCPUs within 30 s; see {}",
                    child.id(),
                    console.display()
                );
            }
        }
        let now = Instant::now();
        tracing::debug!(
            "clones running {:?} after the last spawn",
            now - self.spawned
        );
        self.running = Some(now);
        Ok(())
    }

    /// The running clones; they are reaped in the background when they end, so none
    /// lingers as a zombie of this VMM.
    pub fn finish(self) -> Vec<CloneInfo> {
        let children: Vec<_> = self
            .children
            .into_iter()
            .filter_map(|(p, _, console)| match p {
                Proc::Child(c) => Some((c, console)),
                Proc::Launched(_) => None,
            })
            .collect();
        if !children.is_empty() {
            let _ = std::thread::Builder::new()
                .name("clone-reaper".into())
                .stack_size(64 << 10)
                .spawn(move || {
                    densevm_seccomp::enter(densevm_seccomp::ThreadKind::CloneReaper);
                    for (mut child, console) in children {
                        match child.wait() {
                            Ok(s) if s.success() => {}
                            Ok(s) => tracing::warn!(
                                "clone {} ended: {s}; see {}",
                                child.id(),
                                console.display()
                            ),
                            Err(e) => tracing::warn!("clone {}: wait: {e}", child.id()),
                        }
                    }
                });
        }
        self.infos
    }

    /// Waits until the clones run ([`wait_running`](Self::wait_running)), then
    /// [`finish`](Self::finish)es.
    pub fn wait(mut self) -> anyhow::Result<Vec<CloneInfo>> {
        if let Err(e) = self.wait_running() {
            self.kill();
            return Err(e);
        }
        Ok(self.finish())
    }
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, owned from here on.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Waits until the clone writes its ready byte (true) or closes the pipe by exiting, or
/// the deadline passes (false).
fn wait_ready(ready: &OwnedFd, deadline: Instant) -> std::io::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: ready.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll reads and writes one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(false);
        }
        let mut byte = 0u8;
        // SAFETY: reads at most one byte into `byte`.
        let got = unsafe { libc::read(ready.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) };
        return Ok(got == 1);
    }
}

/// A restored clone tells the VMM that started it that its vCPUs run.
pub fn signal_ready(fd: i32) -> Box<dyn FnOnce() + Send> {
    Box::new(move || {
        // SAFETY: --ready-fd names a descriptor the parent densevm handed this process for
        // this one byte; it is owned (and closed) here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let _ = std::fs::File::from(fd).write_all(&[1]);
    })
}
