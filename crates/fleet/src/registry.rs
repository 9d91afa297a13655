//! The VM registry: create, list, inspect, change and delete VMs, each a process started
//! by a [`Launcher`] with its sockets, console and record under `STATE/vms/ID/`.
//! Exited processes are reaped and kept (with how they ended) until deleted. Each VM's
//! record (`vm.json`) lets a restarted daemon adopt the VMs an earlier one started.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use densevm_api::request::ApiErrorResponse;
use serde::{Deserialize, Serialize};

use crate::cgroup::{Cgroups, VmCgroup};
use crate::host::ProcFs;
use crate::launcher::{signal_group, ApiControl, LaunchPlan, Launcher, VmControl, VmProcess};
use crate::policy::Priority;
use crate::spec::{bad, check_bounds, check_budget, check_create};
pub use crate::spec::{run_args, valid_id, MIN_BUDGET_MIB};
use crate::types::{GuestMemory, TierMemory, VmCreate, VmInfo, VmPatch, VmStatus};

/// Longest unix socket path (sun_path holds 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// What the registry is set up with.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Where VM directories go (`STATE/vms/ID`).
    pub state_dir: PathBuf,
    /// Added to a VM's max memory for its cgroup's `memory.max`.
    pub overhead_mib: u64,
    /// How long a delete waits after SIGTERM before SIGKILL.
    pub grace: Duration,
}

/// What the daemon last measured of a VM.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// VMM RSS, KiB.
    pub rss_kib: u64,
    /// VMM PSS, KiB.
    pub pss_kib: u64,
    /// CPU over the last tick, percent of one CPU.
    pub cpu_pct: Option<f64>,
    /// Guest statistics, MiB.
    pub guest: Option<GuestMemory>,
    /// Why the balloon cannot be read or set.
    pub balloon_error: Option<String>,
    /// The tier's counters (VMs with a budget).
    pub tier: Option<TierMemory>,
    /// Why the tier cannot be read or its budget set.
    pub tier_error: Option<String>,
}

/// The record kept in `vm.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    spec: VmCreate,
    pid: u32,
    priority: Priority,
    min_mib: u64,
    max_mib: u64,
    balloon_mib: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget_user_mib: Option<u64>,
}

/// One VM.
pub struct Vm {
    /// Its id.
    pub id: String,
    spec: VmCreate,
    /// Priority class.
    pub priority: Priority,
    /// Guest RAM.
    pub memory_mib: u64,
    /// Least guest memory.
    pub min_mib: u64,
    /// Most guest memory.
    pub max_mib: u64,
    /// Balloon target last set (or to set: see `pending`).
    pub balloon_mib: u64,
    /// The balloon target still has to reach the VM.
    pub pending: bool,
    /// Its DRAM budget now (None: it has no tier).
    pub budget_mib: Option<u64>,
    /// The budget the user set; the policy lowers `budget_mib` under it and raises it back.
    pub budget_user_mib: Option<u64>,
    process: Box<dyn VmProcess>,
    /// How its process ended.
    pub exit: Option<String>,
    dir: PathBuf,
    cgroup: Option<VmCgroup>,
    /// The last tick's measurements.
    pub measured: Measured,
}

impl Vm {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The process running the VM (the jailed VMM of a jailed VM), to measure.
    pub fn vmm_pid(&self) -> u32 {
        self.process.vmm_pid()
    }

    /// Its control channel.
    pub fn control(&self) -> Arc<dyn VmControl> {
        self.process.control()
    }

    /// Its cgroup.
    pub fn cgroup(&self) -> Option<&VmCgroup> {
        self.cgroup.as_ref()
    }

    /// The VM as the API shows it.
    pub fn info(&self) -> VmInfo {
        VmInfo {
            id: self.id.clone(),
            status: if self.exit.is_some() {
                VmStatus::Exited
            } else {
                VmStatus::Running
            },
            exit: self.exit.clone(),
            pid: self.pid(),
            priority: self.priority,
            memory_mib: self.memory_mib,
            min_mib: self.min_mib,
            max_mib: self.max_mib,
            balloon_mib: self.balloon_mib,
            api_sock: self.dir.join("api.sock").display().to_string(),
            console: self.dir.join("console.log").display().to_string(),
            console_sock: self.dir.join("console.sock").display().to_string(),
            cgroup: self.cgroup.as_ref().map(|c| c.dir().display().to_string()),
            rss_kib: self.measured.rss_kib,
            pss_kib: self.measured.pss_kib,
            cpu_pct: self.measured.cpu_pct,
            guest: self.measured.guest,
            balloon_error: self.measured.balloon_error.clone(),
            memory_budget_mib: self.budget_mib,
            memory_budget_user_mib: self.budget_user_mib,
            tier: self.measured.tier,
            tier_error: self.measured.tier_error.clone(),
            spec: self.spec.clone(),
        }
    }

    fn record(&self) -> Record {
        Record {
            spec: self.spec.clone(),
            pid: self.pid(),
            priority: self.priority,
            min_mib: self.min_mib,
            max_mib: self.max_mib,
            balloon_mib: self.balloon_mib,
            budget_mib: self.budget_mib,
            budget_user_mib: self.budget_user_mib,
        }
    }

    fn save(&self) {
        let path = self.dir.join("vm.json");
        let text = serde_json::to_vec_pretty(&self.record()).unwrap_or_default();
        let tmp = self.dir.join("vm.json.tmp");
        if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path)) {
            tracing::warn!(vm = %self.id, "cannot write {}: {e}", path.display());
        }
    }
}

/// Every VM of the fleet.
pub struct Registry {
    cfg: RegistryConfig,
    launcher: Box<dyn Launcher>,
    cgroups: Option<Cgroups>,
    vms: BTreeMap<String, Vm>,
    next: u64,
    /// VM processes that ended (counted once each).
    pub exits_total: u64,
}
fn not_found(id: &str) -> ApiErrorResponse {
    ApiErrorResponse::new(
        404,
        format!(
            "no VM {}: GET /vms lists them",
            densevm_api::request::quote(id)
        ),
    )
}

impl Registry {
    /// An empty registry; `cgroups` is the fleet's cgroup when it has a memory controller.
    pub fn new(cfg: RegistryConfig, launcher: Box<dyn Launcher>, cgroups: Option<Cgroups>) -> Self {
        Self {
            cfg,
            launcher,
            cgroups,
            vms: BTreeMap::new(),
            next: 0,
            exits_total: 0,
        }
    }

    /// The fleet's cgroup, if any.
    pub fn cgroups(&self) -> Option<&Cgroups> {
        self.cgroups.as_ref()
    }

    /// The setup.
    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    fn vm_dir(&self, id: &str) -> PathBuf {
        self.cfg.state_dir.join("vms").join(id)
    }

    /// Starts a VM. 400 for a bad request, 409 for an id in use, 500 if it cannot start.
    pub fn create(&mut self, spec: VmCreate) -> Result<VmInfo, ApiErrorResponse> {
        let (min, max) = check_create(&spec)?;
        let id = match &spec.id {
            Some(id) if !valid_id(id) => {
                return Err(bad(format!(
                    "id {} is not valid: 1 to 64 letters, digits, '.', '_' or '-', not \
                     starting with '.'",
                    densevm_api::request::quote(id)
                )))
            }
            Some(id) => id.clone(),
            None => loop {
                let id = format!("vm-{}", self.next);
                self.next += 1;
                if !self.vms.contains_key(&id) && !self.vm_dir(&id).exists() {
                    break id;
                }
            },
        };
        if self.vms.contains_key(&id) {
            return Err(ApiErrorResponse::new(
                409,
                format!("VM {id} exists already"),
            ));
        }
        let dir = self.vm_dir(&id);
        let longest = dir.join("console.sock").display().to_string().len();
        if longest > MAX_SOCKET_PATH {
            return Err(bad(format!(
                "the VM's socket paths under {} would be {longest} bytes, over the {} a unix \
                 socket takes: use a shorter --state-dir or id",
                dir.display(),
                MAX_SOCKET_PATH
            )));
        }
        std::fs::create_dir_all(&dir).map_err(|e| {
            ApiErrorResponse::new(500, format!("cannot create {}: {e}", dir.display()))
        })?;
        let cgroup = match &self.cgroups {
            Some(cg) => Some(
                cg.create_vm(&id, (max + self.cfg.overhead_mib) << 20)
                    .map_err(|e| ApiErrorResponse::new(500, e))?,
            ),
            None => None,
        };
        let plan = LaunchPlan {
            id: id.clone(),
            run_args: run_args(&spec, &id, &dir),
            api_sock: dir.join("api.sock"),
            console: dir.join("console.log"),
            cgroup: cgroup.clone(),
        };
        let process = match self.launcher.launch(&plan) {
            Ok(p) => p,
            Err(e) => {
                if let Some(cg) = &cgroup {
                    cg.remove();
                }
                return Err(ApiErrorResponse::new(500, e));
            }
        };
        let vm = Vm {
            id: id.clone(),
            priority: spec.priority,
            memory_mib: spec.memory_mib,
            min_mib: min,
            max_mib: max,
            balloon_mib: spec.memory_mib - max,
            pending: spec.memory_mib > max,
            budget_mib: spec.memory_budget_mib,
            budget_user_mib: spec.memory_budget_mib,
            spec,
            process,
            exit: None,
            dir,
            cgroup,
            measured: Measured::default(),
        };
        vm.save();
        tracing::info!(vm = %id, pid = vm.pid(), "VM started");
        let info = vm.info();
        self.vms.insert(id, vm);
        Ok(info)
    }

    /// Every VM, by id.
    pub fn list(&mut self) -> Vec<VmInfo> {
        self.reap();
        self.vms.values().map(Vm::info).collect()
    }

    /// One VM.
    pub fn get(&mut self, id: &str) -> Result<VmInfo, ApiErrorResponse> {
        self.reap();
        self.vms.get(id).map(Vm::info).ok_or_else(|| not_found(id))
    }

    /// The VMs, for the tick loop.
    pub fn vms(&self) -> impl Iterator<Item = &Vm> {
        self.vms.values()
    }

    /// One VM, for the tick loop.
    pub fn vm_mut(&mut self, id: &str) -> Option<&mut Vm> {
        self.vms.get_mut(id)
    }

    /// Changes a VM's class, bounds or balloon target. A new target is sent to the VM at
    /// once (its error, if any, is the answer); bounds that leave the current target out
    /// move it in (sent on the next tick); a new max sets the cgroup's `memory.max`.
    pub fn patch(&mut self, id: &str, patch: VmPatch) -> Result<VmInfo, ApiErrorResponse> {
        self.reap();
        let overhead = self.cfg.overhead_mib;
        let vm = self.vms.get_mut(id).ok_or_else(|| not_found(id))?;
        if vm.exit.is_some() {
            return Err(ApiErrorResponse::new(
                409,
                format!(
                    "VM {id} has exited ({}); delete it",
                    vm.exit.as_deref().unwrap_or("")
                ),
            ));
        }
        let min = patch.min_mib.unwrap_or(vm.min_mib);
        let max = patch.max_mib.unwrap_or(vm.max_mib);
        check_bounds(vm.memory_mib, min, max)?;
        if let Some(b) = patch.memory_budget_mib {
            if vm.budget_user_mib.is_none() {
                return Err(ApiErrorResponse::new(
                    409,
                    format!(
                        "VM {id} has no memory tier: a budget is given when a VM is created \
                         (memory_budget_mib in POST /vms), not added later"
                    ),
                ));
            }
            check_budget(vm.memory_mib, b)?;
            let mib = u32::try_from(b).map_err(|_| bad("memory_budget_mib too large"))?;
            vm.process.control().set_memory_budget(mib).map_err(|e| {
                ApiErrorResponse::new(409, format!("VM {id} cannot set its memory budget: {e}"))
            })?;
            tracing::info!(vm = %id, from_mib = ?vm.budget_mib, to_mib = b, "memory budget set by the user");
            vm.budget_mib = Some(b);
            vm.budget_user_mib = Some(b);
            vm.measured.tier_error = None;
        }
        if let Some(b) = patch.balloon_mib {
            let left = vm.memory_mib.checked_sub(b);
            if left.is_none_or(|l| l < min || l > max) {
                return Err(bad(format!(
                    "impossible balloon target {b} MiB: VM {id} has {} MiB of RAM and must keep \
                     {min} to {max} MiB, so its balloon must be {} to {} MiB",
                    vm.memory_mib,
                    vm.memory_mib - max,
                    vm.memory_mib - min
                )));
            }
            let amount = u32::try_from(b).map_err(|_| bad("balloon_mib too large"))?;
            vm.process.control().set_balloon(amount).map_err(|e| {
                ApiErrorResponse::new(409, format!("VM {id} cannot set its balloon: {e}"))
            })?;
            vm.balloon_mib = b;
            vm.pending = false;
        }
        if let Some(p) = patch.priority {
            vm.priority = p;
        }
        if patch.max_mib.is_some_and(|m| m != vm.max_mib) {
            if let Some(cg) = &vm.cgroup {
                cg.set_max((max + overhead) << 20)
                    .map_err(|e| ApiErrorResponse::new(500, e))?;
            }
        }
        vm.min_mib = min;
        vm.max_mib = max;
        let clamped = vm
            .balloon_mib
            .clamp(vm.memory_mib - max, vm.memory_mib - min);
        if clamped != vm.balloon_mib {
            vm.balloon_mib = clamped;
            vm.pending = true;
        }
        vm.save();
        Ok(vm.info())
    }

    /// Stops and forgets a VM: its API's shutdown (where there is one), SIGTERM, after the
    /// grace period SIGKILL; then its cgroup and directory go.
    pub fn delete(&mut self, id: &str) -> Result<VmInfo, ApiErrorResponse> {
        self.reap();
        let mut vm = self.vms.remove(id).ok_or_else(|| not_found(id))?;
        if vm.exit.is_none() {
            let grace = self.cfg.grace;
            let asked = match vm.process.control().shutdown() {
                Ok(asked) => asked,
                Err(e) => {
                    tracing::debug!(vm = %id, "shutdown through the API failed: {e}");
                    false
                }
            };
            let mut how = if asked {
                wait_exit(&mut vm, grace)
            } else {
                None
            };
            for sig in [libc::SIGTERM, libc::SIGKILL] {
                if how.is_some() {
                    break;
                }
                if let Err(e) = vm.process.signal(sig) {
                    tracing::debug!(vm = %id, "signal {sig}: {e}");
                }
                how = wait_exit(&mut vm, grace);
            }
            match how {
                Some(how) => vm.exit = Some(how),
                None => {
                    // Still there after SIGKILL: keep it listed rather than lose it.
                    let msg = format!("VM {id} (pid {}) did not end after SIGKILL", vm.pid());
                    self.vms.insert(id.to_owned(), vm);
                    return Err(ApiErrorResponse::new(500, msg));
                }
            }
        }
        if let Some(cg) = &vm.cgroup {
            cg.remove();
        }
        if let Err(e) = std::fs::remove_dir_all(&vm.dir) {
            tracing::warn!(vm = %id, "cannot remove {}: {e}", vm.dir.display());
        }
        tracing::info!(vm = %id, exit = ?vm.exit, "VM deleted");
        Ok(vm.info())
    }

    /// Reaps VM processes that ended; returns (id, how) for each newly ended one.
    pub fn reap(&mut self) -> Vec<(String, String)> {
        let mut ended = Vec::new();
        for vm in self.vms.values_mut().filter(|v| v.exit.is_none()) {
            match vm.process.try_wait() {
                Ok(Some(how)) => {
                    tracing::warn!(vm = %vm.id, pid = vm.pid(), "VM process ended: {how}");
                    vm.exit = Some(how.clone());
                    ended.push((vm.id.clone(), how));
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(vm = %vm.id, "cannot wait for the VM process: {e}"),
            }
        }
        self.exits_total += ended.len() as u64;
        ended
    }

    /// Adopts the VMs an earlier daemon started (their `vm.json` records): those still
    /// running come back under management; the others are listed as exited.
    pub fn adopt(&mut self, procfs: &ProcFs) -> usize {
        let Ok(entries) = std::fs::read_dir(self.cfg.state_dir.join("vms")) else {
            return 0;
        };
        let mut n = 0;
        for e in entries.flatten() {
            let dir = e.path();
            let id = e.file_name().to_string_lossy().into_owned();
            let Ok(text) = std::fs::read(dir.join("vm.json")) else {
                continue;
            };
            let Ok(rec) = serde_json::from_slice::<Record>(&text) else {
                tracing::warn!("{}: not a VM record", dir.join("vm.json").display());
                continue;
            };
            if !valid_id(&id) || self.vms.contains_key(&id) {
                continue;
            }
            let api_sock = dir.join("api.sock");
            let adopted = Adopted {
                pid: rec.pid,
                marker: api_sock.display().to_string(),
                procfs: procfs.clone(),
                control: Arc::new(ApiControl::new(&api_sock)),
            };
            let exit = (!adopted.alive())
                .then(|| "ended while no fleet daemon was running (exit status unknown)".into());
            let cgroup = self.cgroups.as_ref().and_then(|c| {
                let d = c.parent().join(format!("vm-{id}"));
                d.exists()
                    .then(|| c.create_vm(&id, (rec.max_mib + self.cfg.overhead_mib) << 20))
            });
            let vm = Vm {
                id: id.clone(),
                priority: rec.priority,
                memory_mib: rec.spec.memory_mib,
                min_mib: rec.min_mib,
                max_mib: rec.max_mib,
                balloon_mib: rec.balloon_mib,
                pending: false,
                budget_mib: rec.budget_mib,
                budget_user_mib: rec.budget_user_mib,
                spec: rec.spec,
                process: Box::new(adopted),
                exit,
                dir,
                cgroup: cgroup.and_then(Result::ok),
                measured: Measured::default(),
            };
            tracing::info!(vm = %id, pid = rec.pid, exited = vm.exit.is_some(), "adopted");
            self.vms.insert(id, vm);
            n += 1;
        }
        n
    }
}

fn wait_exit(vm: &mut Vm, grace: Duration) -> Option<String> {
    let deadline = Instant::now() + grace;
    loop {
        match vm.process.try_wait() {
            Ok(Some(how)) => return Some(how),
            Ok(None) => {}
            Err(e) => return Some(format!("gone ({e})")),
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A VM process started by an earlier daemon: not this one's child, so it is watched
/// through `/proc` (its command line must still name its API socket) instead of waited for.
struct Adopted {
    pid: u32,
    marker: String,
    procfs: ProcFs,
    control: Arc<ApiControl>,
}

impl Adopted {
    fn alive(&self) -> bool {
        self.procfs
            .cmdline(self.pid)
            .is_some_and(|args| args.contains(&self.marker))
            && self.procfs.process(self.pid).is_some()
    }
}

impl VmProcess for Adopted {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn try_wait(&mut self) -> Result<Option<String>, String> {
        Ok((!self.alive())
            .then(|| "ended (exit status unknown: an earlier daemon started it)".into()))
    }

    fn signal(&mut self, signal: i32) -> Result<(), String> {
        if !self.alive() {
            return Ok(());
        }
        signal_group(self.pid, signal)
    }

    fn control(&self) -> Arc<dyn VmControl> {
        self.control.clone()
    }
}
