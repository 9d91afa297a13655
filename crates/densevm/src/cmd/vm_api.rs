//! The per-VM API socket of `densevm run --api-sock`: maps API requests onto the VM's
//! control handle, and starts clone processes.

use densevm_api::request::ApiRequest;
use densevm_api::server::{ApiResponse, ApiServer, ApiServerHandle};
use densevm_api::types::{
    CloneInfo, CloneList, InstanceInfo, InstanceState, SnapshotType, VmState,
};
use densevm_virtio::block::{open_pcow, BackendHandle};
use densevm_vmm::{ControlError, RunState, TemplateHook, VmmHandle};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn error_response(e: ControlError) -> ApiResponse {
    let status = match e {
        ControlError::Conflict(_) => 409,
        ControlError::Unsupported(_) => 400,
        ControlError::Ended => 409,
        ControlError::Failed(_) | ControlError::Timeout(_) => 500,
    };
    ApiResponse::error(status, e.to_string())
}

/// Serves `handle` on `path` until the returned handle is shut down.
pub fn serve(
    path: &Path,
    id: String,
    handle: VmmHandle,
    specs: crate::cmd::devices::DeviceSpecs,
    disk_handles: Vec<BackendHandle>,
) -> anyhow::Result<ApiServerHandle> {
    let server = ApiServer::bind(path)?;
    // Where each writable disk's top image is now (it moves to an overlay at every clone).
    let tops: Arc<Mutex<Vec<PathBuf>>> = Arc::new(Mutex::new(
        specs.disks.iter().map(|d| d.path.clone()).collect(),
    ));
    let handler = move |request: ApiRequest| -> ApiResponse {
        match request {
            ApiRequest::GetInfo => match handle.state() {
                Ok(state) => ApiResponse::ok(&InstanceInfo {
                    id: id.clone(),
                    state: match state {
                        RunState::Running => InstanceState::Running,
                        RunState::Paused => InstanceState::Paused,
                    },
                    vmm_version: env!("CARGO_PKG_VERSION").into(),
                    app_name: "densevm".into(),
                }),
                Err(e) => error_response(e),
            },
            ApiRequest::PatchVm(change) => {
                let result = match change.state {
                    VmState::Paused => handle.pause(),
                    VmState::Resumed => handle.resume(),
                };
                match result {
                    Ok(()) => ApiResponse::no_content(),
                    Err(e) => error_response(e),
                }
            }
            ApiRequest::CreateSnapshot(params) => {
                let dir = PathBuf::from(&params.snapshot_path);
                let result = match params.snapshot_type {
                    SnapshotType::Full => handle.snapshot(dir).map(|_| ()),
                    // A template kept for later clones from the directory needs its RAM
                    // in a file there: that is a full snapshot (clones map its memory
                    // file private). Clones of the running VM use POST /clones.
                    SnapshotType::Template => handle.snapshot(dir).map(|_| ()),
                };
                match result {
                    Ok(()) => ApiResponse::no_content(),
                    Err(e) => error_response(e),
                }
            }
            ApiRequest::CreateClones(req) => {
                if let Some(d) = specs.disks.iter().find(|d| !d.readonly && !d.pcow) {
                    return ApiResponse::error(
                        400,
                        format!(
                            "clones of a VM with a writable raw --disk ({}) are not supported: each clone gets a copy-on-write pcow overlay of its disks, which needs a pcow image (`densevm image convert -f raw -O pcow`), or attach the disk with ,readonly",
                            d.path.display()
                        ),
                    );
                }
                let dir = PathBuf::from(&req.snapshot_path);
                let hook = overlay_hook(
                    dir.clone(),
                    req.count,
                    &specs,
                    disk_handles.clone(),
                    tops.clone(),
                );
                match handle.template(dir.clone(), hook) {
                    Ok(template) => match spawn_clones(&dir, req.count, Some(&template.ram)) {
                        Ok(clones) => ApiResponse::ok(&CloneList { clones }),
                        Err(e) => ApiResponse::error(500, format!("{e:#}")),
                    },
                    Err(e) => error_response(e),
                }
            }
        }
    };
    Ok(server.spawn(Box::new(handler))?)
}

fn overlay_path(dir: &Path, disk: usize, who: &str) -> PathBuf {
    dir.join(format!("disk{disk}.{who}.pcow"))
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
/// goes on in (its device is moved onto it, the device being quiesced).
fn overlay_hook(
    dir: PathBuf,
    count: u32,
    specs: &crate::cmd::devices::DeviceSpecs,
    handles: Vec<BackendHandle>,
    tops: Arc<Mutex<Vec<PathBuf>>>,
) -> TemplateHook {
    let writable: Vec<usize> = specs
        .disks
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.readonly)
        .map(|(i, _)| i)
        .collect();
    Box::new(move || {
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
        Ok(())
    })
}

/// A clone's writable disks are its own overlays in the template directory.
pub fn use_clone_overlays(specs: &mut crate::cmd::devices::DeviceSpecs, dir: &Path, index: u32) {
    for (n, d) in specs.disks.iter_mut().enumerate() {
        let overlay = overlay_path(dir, n, &format!("clone-{index}"));
        if !d.readonly && overlay.exists() {
            d.path = overlay;
            d.pcow = true;
        }
    }
}

/// Starts `count` `densevm run --restore DIR` processes, each with its API socket and
/// console file in DIR, and waits until each answers on its socket. `ram` is a frozen
/// template's RAM file (inherited as descriptor 3); without it the clones map DIR/memory.
pub fn spawn_clones(
    dir: &Path,
    count: u32,
    ram: Option<&OwnedFd>,
) -> anyhow::Result<Vec<CloneInfo>> {
    let exe = std::env::current_exe()?;
    let existing = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".sock"))
        .count() as u32;
    let mut children = Vec::new();
    let mut infos = Vec::new();
    for i in 0..count {
        let index = existing + i;
        let sock = dir.join(format!("clone-{index}.sock"));
        let console = dir.join(format!("clone-{index}.console"));
        let console_sock = dir.join(format!("clone-{index}.console.sock"));
        let out = std::fs::File::create(&console)?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(&exe);
        cmd.arg("run")
            .arg("--restore")
            .arg(dir)
            .arg("--api-sock")
            .arg(&sock)
            .arg("--id")
            .arg(format!("clone-{index}"))
            .arg("--clone-index")
            .arg(index.to_string())
            .arg("--console-sock")
            .arg(&console_sock)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let raw = ram.map(|fd| fd.as_raw_fd());
        if raw.is_some() {
            cmd.arg("--ram-fd").arg("3");
        }
        // SAFETY: between fork and exec only async-signal-safe calls: dup2 (or fcntl when
        // the template already is descriptor 3) gives the child the template as
        // descriptor 3 without CLOEXEC, setsid detaches it from
        // the parent's session so the clone outlives a terminal hangup.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(raw) = raw {
                    // dup2 onto itself keeps FD_CLOEXEC: clear it instead.
                    let rc = if raw == 3 {
                        libc::fcntl(3, libc::F_SETFD, 0)
                    } else {
                        libc::dup2(raw, 3)
                    };
                    if rc < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                libc::setsid();
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        infos.push(CloneInfo {
            index,
            pid: child.id(),
            api_sock: sock.display().to_string(),
            console: console.display().to_string(),
        });
        children.push((child, sock));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for (child, sock) in &mut children {
        loop {
            if densevm_api::client::ApiClient::new(sock.clone())
                .info()
                .is_ok()
            {
                break;
            }
            if let Some(status) = child.try_wait()? {
                anyhow::bail!(
                    "clone {} exited ({status}) before it answered on {}; see its console file",
                    sock.display(),
                    sock.display()
                );
            }
            if Instant::now() >= deadline {
                anyhow::bail!("clone {} did not answer within 30 s", sock.display());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Reap the clones when they end, so none lingers as a zombie of this VMM.
    let _ = std::thread::Builder::new()
        .name("clone-reaper".into())
        .stack_size(64 << 10)
        .spawn(move || {
            for (mut child, _) in children {
                let _ = child.wait();
            }
        });
    Ok(infos)
}
