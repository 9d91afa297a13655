//! A fake launcher (VMs that are records in memory, with a balloon the test controls), a
//! fake /proc, and a fleet served on a socket in a temporary directory.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use densevm_api::{ApiServer, ApiServerHandle, BalloonStats, MemoryTierInfo};
use densevm_fleet::cgroup::Cgroups;
use densevm_fleet::host::ProcFs;
use densevm_fleet::launcher::{LaunchPlan, Launcher, VmControl, VmProcess};
use densevm_fleet::policy::PolicyConfig;
use densevm_fleet::registry::{Registry, RegistryConfig};
use densevm_fleet::types::CgroupInfo;
use densevm_fleet::{Fleet, FleetClient};

/// One fake VM's state.
#[derive(Debug, Clone, Default)]
pub struct FakeVm {
    pub plan_args: Vec<String>,
    pub cgroup: Option<PathBuf>,
    pub exit: Option<String>,
    pub signals: Vec<i32>,
    pub ignores_sigterm: bool,
    pub balloon: Option<u32>,
    pub balloon_sets: Vec<u32>,
    /// None: no balloon device.
    pub stats: Option<BalloonStats>,
    /// None: no memory tier (no budget).
    pub tier: Option<MemoryTierInfo>,
    pub budget_sets: Vec<u32>,
    /// None: no vsock device.
    pub vsock_uds: Option<PathBuf>,
}

pub type Vms = Arc<Mutex<BTreeMap<String, FakeVm>>>;

#[derive(Default, Clone)]
pub struct FakeLauncher {
    pub vms: Vms,
    pub fail: Arc<Mutex<Option<String>>>,
}

struct FakeProcess {
    id: String,
    pid: u32,
    vms: Vms,
}

struct FakeControl {
    id: String,
    vms: Vms,
}

impl VmControl for FakeControl {
    fn balloon_stats(&self) -> Result<BalloonStats, String> {
        let vms = self.vms.lock().unwrap();
        let vm = &vms[&self.id];
        vm.stats
            .map(|mut s| {
                let b = vm.balloon.unwrap_or(0);
                s.target_mib = b;
                s.actual_mib = b;
                s
            })
            .ok_or_else(|| "API error 400: no balloon device".to_string())
    }

    fn set_balloon(&self, amount_mib: u32) -> Result<(), String> {
        let mut vms = self.vms.lock().unwrap();
        let vm = vms.get_mut(&self.id).unwrap();
        if vm.stats.is_none() {
            return Err("API error 400: no balloon device".into());
        }
        vm.balloon = Some(amount_mib);
        vm.balloon_sets.push(amount_mib);
        Ok(())
    }

    fn shutdown(&self) -> Result<bool, String> {
        Ok(false)
    }

    fn memory_tier(&self) -> Result<MemoryTierInfo, String> {
        self.vms.lock().unwrap()[&self.id]
            .tier
            .ok_or_else(|| "API error 400: no memory tier".to_string())
    }

    fn vsock_uds(&self) -> Result<PathBuf, String> {
        self.vms.lock().unwrap()[&self.id]
            .vsock_uds
            .clone()
            .ok_or_else(|| "API error 400: no vsock device".to_string())
    }

    fn set_memory_budget(&self, budget_mib: u32) -> Result<(), String> {
        let mut vms = self.vms.lock().unwrap();
        let vm = vms.get_mut(&self.id).unwrap();
        let Some(t) = vm.tier.as_mut() else {
            return Err("API error 400: no memory tier".into());
        };
        t.budget_mib = budget_mib.into();
        vm.budget_sets.push(budget_mib);
        Ok(())
    }
}

impl VmProcess for FakeProcess {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn try_wait(&mut self) -> Result<Option<String>, String> {
        Ok(self.vms.lock().unwrap()[&self.id].exit.clone())
    }

    fn signal(&mut self, signal: i32) -> Result<(), String> {
        let mut vms = self.vms.lock().unwrap();
        let vm = vms.get_mut(&self.id).unwrap();
        vm.signals.push(signal);
        if signal == libc::SIGKILL || (signal == libc::SIGTERM && !vm.ignores_sigterm) {
            vm.exit = Some(format!("killed by signal {signal}"));
        }
        Ok(())
    }

    fn control(&self) -> Arc<dyn VmControl> {
        Arc::new(FakeControl {
            id: self.id.clone(),
            vms: self.vms.clone(),
        })
    }
}

impl Launcher for FakeLauncher {
    fn launch(&mut self, plan: &LaunchPlan) -> Result<Box<dyn VmProcess>, String> {
        if let Some(e) = self.fail.lock().unwrap().clone() {
            return Err(e);
        }
        let mut vms = self.vms.lock().unwrap();
        vms.insert(
            plan.id.clone(),
            FakeVm {
                plan_args: plan.run_args.clone(),
                cgroup: plan.cgroup.as_ref().map(|c| c.dir().to_path_buf()),
                ..Default::default()
            },
        );
        Ok(Box::new(FakeProcess {
            id: plan.id.clone(),
            // Far above pid_max: no /proc entry.
            pid: 1 << 30 | vms.len() as u32,
            vms: self.vms.clone(),
        }))
    }
}

/// A fake /proc with this host memory (MiB).
pub fn fake_proc(dir: &Path, total_mib: u64, available_mib: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("meminfo"),
        format!(
            "MemTotal: {} kB\nMemFree: 0 kB\nMemAvailable: {} kB\n",
            total_mib << 10,
            available_mib << 10
        ),
    )
    .unwrap();
}

pub struct TestFleet {
    pub dir: tempfile::TempDir,
    pub fleet: Fleet,
    pub launcher: FakeLauncher,
    pub client: FleetClient,
    pub sock: PathBuf,
    _server: ApiServerHandle,
}

impl TestFleet {
    pub fn new(cgroups: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let proc_dir = dir.path().join("proc");
        fake_proc(&proc_dir, 4096, 2048);
        let launcher = FakeLauncher::default();
        let cg = cgroups.then(|| {
            let parent = dir.path().join("cgroup");
            std::fs::create_dir_all(&parent).unwrap();
            Cgroups::at(parent)
        });
        let info = CgroupInfo {
            enabled: cg.is_some(),
            parent: cg.as_ref().map(|c| c.parent().display().to_string()),
            missing: (!cgroups).then(|| "test: no cgroups".into()),
            overhead_mib: 64,
        };
        let registry = Registry::new(
            RegistryConfig {
                state_dir: dir.path().join("state"),
                overhead_mib: 64,
                grace: Duration::from_millis(100),
            },
            Box::new(launcher.clone()),
            cg,
        );
        let mut policy = PolicyConfig::for_host(4096);
        policy.low_watermark_mib = 400;
        policy.high_watermark_mib = 800;
        let fleet = Fleet::new(registry, policy, info, ProcFs::new(&proc_dir));
        let sock = dir.path().join("fleet.sock");
        let api = fleet.clone();
        let server = ApiServer::bind(&sock)
            .unwrap()
            .spawn_router(Box::new(move |req| densevm_fleet::api::handle(&api, req)))
            .unwrap();
        let client = FleetClient::new(&sock);
        Self {
            dir,
            fleet,
            launcher,
            client,
            sock,
            _server: server,
        }
    }

    pub fn set_host(&self, total_mib: u64, available_mib: u64) {
        fake_proc(&self.dir.path().join("proc"), total_mib, available_mib);
    }

    pub fn fake(&self, id: &str) -> FakeVm {
        self.launcher.vms.lock().unwrap()[id].clone()
    }

    pub fn with_fake(&self, id: &str, f: impl FnOnce(&mut FakeVm)) {
        f(self.launcher.vms.lock().unwrap().get_mut(id).unwrap())
    }
}
