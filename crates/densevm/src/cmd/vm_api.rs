//! The per-VM API socket of `densevm run --api-sock`: maps API requests onto the VM's
//! control handle, its balloon (`cmd/balloon.rs`) and its memory tier (`cmd/tier.rs`),
//! and starts clone processes.

use crate::cmd::clones::{template_hook, Starting};
use densevm_api::request::ApiRequest;
use densevm_api::server::{ApiResponse, ApiServer, ApiServerHandle};
use densevm_api::types::{CloneList, InstanceInfo, InstanceState, VmState};
use densevm_virtio::block::BackendHandle;
use densevm_vmm::{ControlError, RunState, VmmHandle};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn error_response(e: ControlError) -> ApiResponse {
    let status = match e {
        ControlError::Conflict(_) => 409,
        ControlError::Unsupported(_) => 400,
        ControlError::Ended => 409,
        ControlError::Failed(_) | ControlError::Timeout(_) => 500,
    };
    ApiResponse::error(status, e.to_string())
}

/// What the API reaches of a VM's memory besides its control handle.
pub struct MemoryApi {
    /// The balloon, if the VM has one.
    pub balloon: Option<crate::cmd::balloon::BalloonApi>,
    /// The memory tier, if the VM runs with `--memory-budget`.
    pub tier: Option<densevm_vmm::tiering::TierHandle>,
}

/// Serves `handle` on `path` until the returned handle is shut down.
pub fn serve(
    path: &Path,
    id: String,
    handle: VmmHandle,
    specs: crate::cmd::devices::DeviceSpecs,
    disk_handles: Vec<BackendHandle>,
    pmem: crate::cmd::pmem::PmemRegions,
    memory: MemoryApi,
) -> anyhow::Result<ApiServerHandle> {
    let MemoryApi { balloon, tier } = memory;
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
            // "Full" and "Template" are written alike: a template kept on disk for later
            // clones needs its RAM in a file there, which a full snapshot is (clones map
            // its memory file private). Clones of the running VM use POST /clones.
            ApiRequest::CreateSnapshot(params) => {
                match handle.snapshot(PathBuf::from(&params.snapshot_path)) {
                    Ok(_) => ApiResponse::no_content(),
                    Err(e) => error_response(e),
                }
            }
            ApiRequest::CreateClones(req) => {
                let arrived = std::time::Instant::now();
                if let Err(why) =
                    crate::cmd::devices::check_clone_nets(&specs.nets, &req.network_overrides)
                {
                    return ApiResponse::error(400, format!("cannot clone: {why}"));
                }
                if let Some(mib) = req.memory_budget_mib {
                    if let Err(why) = densevm_vmm::tiering::check_budget(u64::from(mib) << 20) {
                        return ApiResponse::error(400, format!("cannot clone: {why}"));
                    }
                }
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
                let started: Arc<Mutex<Option<Starting>>> = Arc::default();
                let hook = template_hook(
                    &req,
                    &specs,
                    disk_handles.clone(),
                    tops.clone(),
                    pmem.clone(),
                    started.clone(),
                );
                let result = handle.template(dir, hook);
                let starting = started.lock().unwrap_or_else(|p| p.into_inner()).take();
                match (result, starting) {
                    (Ok(_), Some(starting)) => {
                        let running_us = starting
                            .running
                            .map(|at| at.saturating_duration_since(arrived).as_micros() as u64);
                        ApiResponse::ok(&CloneList {
                            clones: starting.finish(),
                            running_us,
                        })
                    }
                    (Ok(_), None) => ApiResponse::error(500, "the template started no clones"),
                    (Err(e), starting) => {
                        // Clones started before a later step failed are not reported as
                        // made: end them.
                        if let Some(s) = starting {
                            s.kill();
                        }
                        error_response(e)
                    }
                }
            }
            request @ (ApiRequest::PutBalloon(_)
            | ApiRequest::PatchBalloon(_)
            | ApiRequest::GetBalloon
            | ApiRequest::GetBalloonStats
            | ApiRequest::PatchBalloonStats(_)) => {
                crate::cmd::balloon::answer(balloon.as_ref(), request)
            }
            ApiRequest::GetVsock => match &specs.vsock {
                Some(v) => ApiResponse::ok(&densevm_api::VsockInfo {
                    guest_cid: v.guest_cid,
                    uds_path: v.uds.display().to_string(),
                }),
                None => ApiResponse::error(
                    400,
                    "no vsock device: start the VM with densevm run --vsock cid=N,uds=PATH",
                ),
            },
            request @ (ApiRequest::GetMemoryTier | ApiRequest::PatchMemoryTier(_)) => {
                crate::cmd::tier::answer(tier.as_ref(), request)
            }
        }
    };
    Ok(server.spawn(Box::new(handler))?)
}
