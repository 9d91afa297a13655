//! The daemon: the shared state, the tick (measure, decide, apply, count) and the serving
//! loop: one `api` thread for the REST API and the calling thread for the ticks; no async
//! runtime.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use densevm_api::{ApiServer, BalloonStats, MemoryTierInfo};

use crate::host::{ProcFs, ProcSample};
use crate::launcher::VmControl;
use crate::metrics::Counters;
use crate::policy::{self, Action, GuestStats, HostMode, HostSample, PolicyConfig, PolicyState};
use crate::policy::{BudgetAction, PolicyInput, TierInput, VmInput};
use crate::registry::Registry;
use crate::types::{CgroupInfo, FleetInfo, GuestMemory, TierMemory};

/// A pending balloon target is retried every this many ticks.
const PENDING_RETRY_TICKS: u64 = 10;

/// A running VM to measure: id, pid, control, a pending balloon target to send, whether
/// it has a memory tier to read.
type Target = (String, u32, Arc<dyn VmControl>, Option<u64>, bool);

/// Counters of a VM between ticks.
#[derive(Debug, Clone, Copy, Default)]
struct Prev {
    cpu_ticks: u64,
    at: Option<Instant>,
    major_faults: Option<u64>,
    swap_in: Option<u64>,
}

/// Everything the API thread and the tick share.
pub struct State {
    /// The VMs.
    pub registry: Registry,
    /// Decisions and ticks counted.
    pub counters: Counters,
    /// The policy's numbers.
    pub policy: PolicyConfig,
    policy_state: PolicyState,
    /// The host at the last tick.
    pub host: Option<HostSample>,
    /// Its band at the last tick.
    pub mode: Option<HostMode>,
    /// The cgroup hard stop, or why there is none.
    pub cgroup: CgroupInfo,
    /// What the operator should know.
    pub warnings: Vec<String>,
    prev: BTreeMap<String, Prev>,
}

/// The daemon's state, shared between its two threads.
#[derive(Clone)]
pub struct Fleet {
    state: Arc<Mutex<State>>,
    procfs: ProcFs,
}

impl Fleet {
    /// A fleet over `registry`; `procfs` is where host and process figures are read.
    pub fn new(
        registry: Registry,
        policy: PolicyConfig,
        cgroup: CgroupInfo,
        procfs: ProcFs,
    ) -> Self {
        let mut warnings = Vec::new();
        if let Some(why) = &cgroup.missing {
            warnings.push(format!(
                "no hard memory stop: VMs run without a cgroup memory.max ({why}); the balloon \
                 policy alone keeps the host from swapping"
            ));
        }
        if !procfs.has_psi() {
            warnings.push(
                "no memory pressure (PSI) from this kernel: only MemAvailable drives the policy"
                    .into(),
            );
        }
        warnings.push(
            "VMs without a balloon device (this densevm build) report no guest statistics: the \
             policy leaves them alone"
                .into(),
        );
        for w in &warnings {
            tracing::warn!("{w}");
        }
        Self {
            state: Arc::new(Mutex::new(State {
                registry,
                counters: Counters::default(),
                policy,
                policy_state: PolicyState::default(),
                host: None,
                mode: None,
                cgroup,
                warnings,
                prev: BTreeMap::new(),
            })),
            procfs,
        }
    }

    /// The shared state (a poisoned lock is taken over: the state stays consistent
    /// between statements).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `GET /`.
    pub fn info(&self) -> FleetInfo {
        let s = self.lock();
        let running = s.registry.vms().filter(|v| v.exit.is_none()).count();
        let total = s.registry.vms().count();
        FleetInfo {
            app_name: "densevm-fleet".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            state_dir: s.registry.config().state_dir.display().to_string(),
            running,
            exited: total - running,
            cgroup: s.cgroup.clone(),
            policy: s.policy.clone(),
            host: s.host,
            mode: s.mode,
            ticks: s.counters.ticks,
            warnings: s.warnings.clone(),
        }
    }

    /// One tick: reap, measure every running VM and the host, run the policy, apply its
    /// actions through each VM's API, log and count them.
    pub fn tick(&self) {
        let (tick, targets) = {
            let mut s = self.lock();
            s.registry.reap();
            let tick = s.counters.ticks;
            let targets: Vec<Target> = s
                .registry
                .vms()
                .filter(|v| v.exit.is_none())
                .map(|v| {
                    let pending =
                        (v.pending && tick % PENDING_RETRY_TICKS == 0).then_some(v.balloon_mib);
                    let tiered = v.budget_mib.is_some();
                    (v.id.clone(), v.vmm_pid(), v.control(), pending, tiered)
                })
                .collect();
            (tick, targets)
        };
        // Measure without the lock: the API stays responsive while VMs answer.
        let mut measured = Vec::new();
        for (id, pid, control, pending, tiered) in targets {
            let pending_result = pending.map(|mib| (mib, set(&*control, mib)));
            let proc = self.procfs.process(pid);
            let stats = control.balloon_stats();
            let tier = tiered.then(|| control.memory_tier());
            measured.push((id, proc, stats, tier, pending_result, control));
        }
        let host = self.procfs.host();
        let now = Instant::now();
        let mut s = self.lock();
        let s = &mut *s;
        let mut vms = Vec::new();
        let mut controls = BTreeMap::new();
        for (id, proc, stats, tier, pending, control) in measured {
            let hz = self.procfs.clock_ticks();
            let prev = s.prev.entry(id.clone()).or_default();
            let Some(vm) = s.registry.vm_mut(&id) else {
                continue;
            };
            if let Some((mib, result)) = pending {
                match result {
                    Ok(()) if vm.balloon_mib == mib => vm.pending = false,
                    Ok(()) => {}
                    Err(e) => vm.measured.balloon_error = Some(e),
                }
            }
            let cpu_pct = proc.and_then(|p| cpu_pct(prev, p, now, hz));
            if let Some(p) = proc {
                vm.measured.rss_kib = p.rss_kib;
                vm.measured.pss_kib = p.pss_kib;
            }
            vm.measured.cpu_pct = cpu_pct;
            let guest = match stats {
                Ok(st) => {
                    vm.measured.balloon_error = None;
                    guest_stats(prev, &st)
                }
                Err(e) => {
                    vm.measured.balloon_error = Some(e);
                    None
                }
            };
            vm.measured.guest = guest.map(|g| GuestMemory {
                balloon_actual_mib: g.balloon_actual_mib,
                total_mib: g.total_mib,
                free_mib: g.free_mib,
                available_mib: g.available_mib,
                caches_mib: g.caches_mib,
            });
            match tier {
                Some(Ok(t)) => {
                    vm.measured.tier = Some(tier_memory(&t));
                    vm.measured.tier_error = None;
                }
                Some(Err(e)) => vm.measured.tier_error = Some(e),
                None => {}
            }
            // The policy works from the budget the fleet set (a PATCH may have come in
            // since the VM answered) and what the tier holds.
            let tier = match (vm.budget_mib, vm.budget_user_mib, &vm.measured.tier) {
                (Some(budget), Some(user), Some(t)) if vm.measured.tier_error.is_none() => {
                    Some(TierInput {
                        budget_mib: budget,
                        user_budget_mib: user,
                        used_mib: (t.resident_kib + t.compressed_kib).div_ceil(1024),
                    })
                }
                _ => None,
            };
            vms.push(VmInput {
                id: id.clone(),
                priority: vm.priority,
                memory_mib: vm.memory_mib,
                min_mib: vm.min_mib,
                max_mib: vm.max_mib,
                balloon_mib: vm.balloon_mib,
                cpu_pct,
                // A target not yet delivered: the policy waits for it.
                stats: guest.filter(|_| !vm.pending),
                tier,
            });
            controls.insert(id, control);
        }
        let live: Vec<String> = s.registry.vms().map(|v| v.id.clone()).collect();
        s.prev.retain(|id, _| live.contains(id));
        s.counters.ticks += 1;
        let Some(host) = host else {
            tracing::error!("cannot read /proc/meminfo: no policy this tick");
            return;
        };
        s.host = Some(host);
        let decision = policy::decide(&s.policy, &s.policy_state, &PolicyInput { tick, host, vms });
        s.policy_state = decision.state;
        s.mode = Some(decision.mode);
        for a in decision.actions {
            let Some(control) = controls.get(&a.vm) else {
                continue;
            };
            let result = set(&**control, a.balloon_mib);
            record(s, &a, result);
        }
        for b in decision.budgets {
            let Some(control) = controls.get(&b.vm) else {
                continue;
            };
            let result = u32::try_from(b.budget_mib)
                .map_err(|_| format!("{} MiB is too large", b.budget_mib))
                .and_then(|mib| control.set_memory_budget(mib));
            record_budget(s, &b, result);
        }
    }

    /// Serves the API on `sock` and ticks every `period` until `stop` is set.
    pub fn serve(&self, sock: &Path, period: Duration, stop: &AtomicBool) -> Result<(), String> {
        let server = ApiServer::bind(sock).map_err(|e| e.to_string())?;
        let api = self.clone();
        let handle = server
            .spawn_router(Box::new(move |req| crate::api::handle(&api, req)))
            .map_err(|e| format!("cannot start the API thread: {e}"))?;
        tracing::info!(sock = %sock.display(), "fleet API serving");
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            self.tick();
            next += period;
            let now = Instant::now();
            if next < now {
                next = now;
            }
            // Sleep in short slices so a stop request is seen within 100 ms.
            while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                std::thread::sleep((next - Instant::now()).min(Duration::from_millis(100)));
            }
        }
        handle.shutdown();
        tracing::info!("fleet daemon stopping; its VMs keep running (a new daemon adopts them)");
        Ok(())
    }
}

fn set(control: &dyn VmControl, mib: u64) -> Result<(), String> {
    let amount = u32::try_from(mib).map_err(|_| format!("{mib} MiB is too large"))?;
    control.set_balloon(amount)
}

fn record(s: &mut State, a: &Action, result: Result<(), String>) {
    let key = (a.direction, a.reason);
    match result {
        Ok(()) => {
            tracing::info!(
                vm = %a.vm,
                direction = crate::metrics::direction_label(a.direction),
                reason = a.reason.as_str(),
                from_mib = a.from_mib,
                to_mib = a.balloon_mib,
                "{}",
                a.detail
            );
            *s.counters.actions.entry(key).or_default() += 1;
            if let Some(vm) = s.registry.vm_mut(&a.vm) {
                vm.balloon_mib = a.balloon_mib;
                vm.measured.balloon_error = None;
            }
        }
        Err(e) => {
            tracing::warn!(vm = %a.vm, reason = a.reason.as_str(), "{}: not applied: {e}", a.detail);
            *s.counters.action_errors.entry(key).or_default() += 1;
            if let Some(vm) = s.registry.vm_mut(&a.vm) {
                vm.measured.balloon_error = Some(e);
            }
        }
    }
}

fn record_budget(s: &mut State, b: &BudgetAction, result: Result<(), String>) {
    let key = (b.direction, b.reason);
    match result {
        Ok(()) => {
            tracing::info!(
                vm = %b.vm,
                direction = b.direction.as_str(),
                reason = b.reason.as_str(),
                from_mib = b.from_mib,
                to_mib = b.budget_mib,
                "{}",
                b.detail
            );
            *s.counters.budget_actions.entry(key).or_default() += 1;
            if let Some(vm) = s.registry.vm_mut(&b.vm) {
                vm.budget_mib = Some(b.budget_mib);
                vm.measured.tier_error = None;
            }
        }
        Err(e) => {
            tracing::warn!(vm = %b.vm, reason = b.reason.as_str(), "{}: not applied: {e}", b.detail);
            *s.counters.budget_action_errors.entry(key).or_default() += 1;
            if let Some(vm) = s.registry.vm_mut(&b.vm) {
                vm.measured.tier_error = Some(e);
            }
        }
    }
}

/// The fleet's view of a VM's `GET /memory-tier`.
fn tier_memory(t: &MemoryTierInfo) -> TierMemory {
    TierMemory {
        budget_mib: t.budget_mib,
        resident_kib: t.resident_kib,
        compressed_pages: t.compressed_pages,
        compressed_kib: t.compressed_kib,
        swap_pages: t.swap_pages,
        evicted: t.evicted_zero + t.evicted_clean + t.evicted_compressed + t.evicted_swap,
        missing_faults: t.missing_faults,
        minor_faults: t.minor_faults,
        service_cpu_us: t.service_cpu_us,
    }
}

fn cpu_pct(prev: &mut Prev, p: ProcSample, now: Instant, hz: u64) -> Option<f64> {
    let last = prev.at.replace(now);
    let before = std::mem::replace(&mut prev.cpu_ticks, p.cpu_ticks);
    let secs = now.duration_since(last?).as_secs_f64();
    if secs <= 0.0 || hz == 0 {
        return None;
    }
    let used = p.cpu_ticks.saturating_sub(before) as f64 / hz as f64;
    Some(used / secs * 100.0)
}

/// The policy's view of a balloon's statistics; `None` until the guest reported its
/// memory (total, free, available).
fn guest_stats(prev: &mut Prev, st: &BalloonStats) -> Option<GuestStats> {
    let mib = |b: u64| b >> 20;
    let faults = st.major_faults;
    let swap_in = st.swap_in;
    let major_faults_delta = match (prev.major_faults, faults) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let swap_in_delta_kib = match (prev.swap_in, swap_in) {
        (Some(a), Some(b)) => b.saturating_sub(a) >> 10,
        _ => 0,
    };
    prev.major_faults = faults;
    prev.swap_in = swap_in;
    Some(GuestStats {
        balloon_actual_mib: u64::from(st.actual_mib),
        total_mib: mib(st.total_memory?),
        free_mib: mib(st.free_memory?),
        available_mib: mib(st.available_memory?),
        caches_mib: mib(st.disk_caches.unwrap_or(0)),
        major_faults_delta,
        swap_in_delta_kib,
    })
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGTERM and SIGINT set the returned flag (the daemon then stops; its VMs, in
/// their own process groups, keep running).
pub fn stop_on_signals() -> &'static AtomicBool {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe; the
        // sigaction struct is zeroed (no flags, empty mask) and lives across the call.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as *const () as usize;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    &STOP
}
