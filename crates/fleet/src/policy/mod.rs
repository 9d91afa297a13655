//! The memory policy: a pure, deterministic function from what the daemon measured this
//! tick (host, every VM, the state carried from earlier ticks) to a list of balloon
//! targets to set, each with its reason. No I/O and no clock: the tick number is an input,
//! so simulated hosts drive it in tests exactly as the daemon does once a second.
//!
//! Sizes are MiB. A VM's *effective* memory is its RAM minus its balloon; the user's
//! `min_mib`/`max_mib` bound the effective memory, so its balloon stays within
//! `[memory - max, memory - min]`.
//!
//! The rules (docs/fleet.md has them with their numbers):
//! 1. **Reclaim** — host `MemAvailable` under the low watermark, or PSI `some avg10` over
//!    its limit: inflate balloons until `MemAvailable` is back at the middle of the band,
//!    idle VMs first, then low before normal before high priority; never under a VM's
//!    `min`, nor under what its guest uses besides page cache plus headroom; never a guest
//!    that is short of memory itself.
//! 2. **Grow** — `MemAvailable` over the high watermark and no PSI: deflate the balloons of
//!    guests short of memory (low `available`, major faults, swap-in), high priority first,
//!    never over `max`, giving away at most `MemAvailable - high`.
//! 3. **Make room** — between the watermarks while a guest is short: inflate idle VMs of
//!    strictly lower priority until `MemAvailable` passes the high watermark, so rule 2
//!    can hand the memory on.
//! 4. **Squeeze** — every `squeeze_period_ticks`, an idle VM is inflated step by step
//!    toward what its guest uses besides page cache (plus headroom), so stale cache goes
//!    back to the host. The result is kept: memory returns through rule 2 when the guest
//!    needs it.
//!
//! Against oscillation: nothing happens between the watermarks except rules 3 and 4; a VM
//! is not deflated within `reverse_cooldown_ticks` of being inflated nor the reverse; a
//! VM whose balloon has not reached its last target is left alone; every change is at most
//! `step_mib` per VM per tick, and changes under `min_change_mib` are not made. A VM
//! without guest statistics (no balloon device, or none reported yet) is never touched.
//!
//! DRAM budgets (module [`budget`]) cover what balloons cannot: under the low watermark the
//! budgets of tiered VMs the balloon rules left alone this tick (busy, short, without a
//! balloon) are lowered toward a floor, low priority first; over the high watermark the
//! budgets the policy lowered are raised back toward what the user set.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod budget;
#[cfg(test)]
mod tests;

pub use budget::{budget_kinds, BudgetAction, BudgetDirection, TierInput};

/// A VM's priority class: who gives memory first and who gets it first.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Cheap VMs: inflated first, grown last.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Expensive VMs: inflated last, grown first.
    High,
}

impl Priority {
    /// "low", "normal" or "high".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Normal => "normal",
            Self::High => "high",
        }
    }
}

/// The policy's numbers. [`PolicyConfig::for_host`] gives the defaults for a host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyConfig {
    /// Reclaim when host `MemAvailable` falls under this.
    pub low_watermark_mib: u64,
    /// Give memory to short guests only while `MemAvailable` stays over this.
    pub high_watermark_mib: u64,
    /// Reclaim when the host's memory PSI `some avg10` (percent) reaches this.
    pub psi_some_limit: f64,
    /// Largest balloon change per VM per tick.
    pub step_mib: u64,
    /// Smaller changes are not made.
    pub min_change_mib: u64,
    /// A VM using less CPU than this (percent of one CPU, over a tick)...
    pub idle_cpu_pct: f64,
    /// ...for this many ticks in a row is idle.
    pub idle_after_ticks: u32,
    /// An idle VM is squeezed once per this many ticks.
    pub squeeze_period_ticks: u64,
    /// A guest is short of memory when its `available` is under the larger of this...
    pub short_available_mib: u64,
    /// ...and this percentage of its effective memory,
    pub short_available_pct: u64,
    /// or it had this many major faults in a tick, or it swapped anything in.
    pub short_major_faults: u64,
    /// Ticks after an inflate before the VM may be deflated, and the reverse (and the
    /// same between lowering a DRAM budget and raising it).
    pub reverse_cooldown_ticks: u64,
    /// Most host memory one lowering of a VM's DRAM budget frees, and the largest raise.
    #[serde(default = "budget::default_step")]
    pub budget_step_mib: u64,
    /// The policy lowers no budget under this percentage of the VM's RAM...
    #[serde(default = "budget::default_floor_pct")]
    pub budget_floor_pct: u64,
    /// ...nor under this (nor under what the user set, if that is lower).
    #[serde(default = "budget::default_floor_mib")]
    pub budget_floor_mib: u64,
}

impl PolicyConfig {
    /// The defaults for a host with `mem_total_mib` of RAM: low watermark 10% of it (at
    /// least 128 MiB), high watermark 20% (at least low + 128 MiB), PSI limit 10%, 64 MiB
    /// steps, 4 MiB smallest change, idle below 2% CPU for 10 ticks, a squeeze every 300
    /// ticks, short under max(32 MiB, 10%) available or 64 major faults a tick, 15 ticks
    /// of cooldown.
    pub fn for_host(mem_total_mib: u64) -> Self {
        let low = (mem_total_mib / 10).max(128);
        Self {
            low_watermark_mib: low,
            high_watermark_mib: (mem_total_mib / 5).max(low + 128),
            psi_some_limit: 10.0,
            step_mib: 64,
            min_change_mib: 4,
            idle_cpu_pct: 2.0,
            idle_after_ticks: 10,
            squeeze_period_ticks: 300,
            short_available_mib: 32,
            short_available_pct: 10,
            short_major_faults: 64,
            reverse_cooldown_ticks: 15,
            budget_step_mib: budget::default_step(),
            budget_floor_pct: budget::default_floor_pct(),
            budget_floor_mib: budget::default_floor_mib(),
        }
    }

    /// Why these numbers cannot work, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.low_watermark_mib >= self.high_watermark_mib {
            return Err(format!(
                "the low watermark ({} MiB) must be under the high watermark ({} MiB)",
                self.low_watermark_mib, self.high_watermark_mib
            ));
        }
        if self.step_mib == 0 || self.min_change_mib > self.step_mib {
            return Err("step must be > 0 and at least the smallest change".into());
        }
        if !(self.idle_cpu_pct > 0.0 && self.idle_cpu_pct <= 100.0) {
            return Err(format!(
                "the idle CPU threshold ({}%) must be over 0% and at most 100%",
                self.idle_cpu_pct
            ));
        }
        if self.short_available_pct >= 50 {
            return Err("short_available_pct must be under 50".into());
        }
        if self.budget_step_mib == 0 || self.budget_floor_pct > 100 {
            return Err(
                "the budget step must be > 0 and the budget floor at most 100% of RAM".into(),
            );
        }
        Ok(())
    }
}

/// The host this tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct HostSample {
    /// `MemTotal`.
    pub mem_total_mib: u64,
    /// `MemAvailable`.
    pub mem_available_mib: u64,
    /// `/proc/pressure/memory` `some avg10` (percent), 0 when PSI is missing.
    pub psi_some_avg10: f64,
    /// `full avg10` (reported, not used by the rules).
    pub psi_full_avg10: f64,
}

/// A guest's balloon statistics this tick, with its fault and swap counts since the last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestStats {
    /// The balloon size the guest has reached.
    pub balloon_actual_mib: u64,
    /// The guest's total memory.
    pub total_mib: u64,
    /// Memory it does not use at all.
    pub free_mib: u64,
    /// Memory it could use without swapping.
    pub available_mib: u64,
    /// Its page cache.
    pub caches_mib: u64,
    /// Major faults since the last tick.
    pub major_faults_delta: u64,
    /// KiB swapped in since the last tick.
    pub swap_in_delta_kib: u64,
}

impl GuestStats {
    /// What the guest of a VM with `memory_mib` of RAM uses besides page cache and its
    /// balloon, so cannot give back: the larger of `total - free - caches` and
    /// `total - available`, less the balloon when `total` holds it.
    ///
    /// `caches` (Linux's file pages) holds tmpfs and shared memory too, which a guest
    /// without swap cannot drop; `available` leaves them out (in the nested lab, reclaim
    /// inflated a high-priority guest whose workload filled a tmpfs, because its tmpfs
    /// looked like cache). Linux keeps inflated pages in its total (`MemTotal`) when the
    /// balloon has deflate-on-OOM, as every fleet VM's has, and takes them out otherwise;
    /// counted as used, the balloon would raise the guest's floor with every inflate, so
    /// that reclaim stalled with most of the guest's cache still there (the lab: 512 MiB
    /// guests holding 230 MiB of cache stopped at about 290 MiB). A guest's total is under
    /// its RAM by what its kernel reserves, so `total + actual > RAM` tells the two apart.
    pub fn need_mib(&self, memory_mib: u64) -> u64 {
        let besides_cache = self
            .total_mib
            .saturating_sub(self.free_mib)
            .saturating_sub(self.caches_mib);
        let unavailable = self.total_mib.saturating_sub(self.available_mib);
        let used = besides_cache.max(unavailable);
        if self.total_mib + self.balloon_actual_mib > memory_mib {
            used.saturating_sub(self.balloon_actual_mib)
        } else {
            used
        }
    }
}

/// One VM as the policy sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmInput {
    /// The fleet's id of the VM.
    pub id: String,
    /// Its class.
    pub priority: Priority,
    /// Its RAM.
    pub memory_mib: u64,
    /// Least effective memory.
    pub min_mib: u64,
    /// Most effective memory.
    pub max_mib: u64,
    /// The balloon target last set.
    pub balloon_mib: u64,
    /// CPU used over the last tick, percent of one CPU (None: not known yet).
    pub cpu_pct: Option<f64>,
    /// Its guest's statistics (None: no balloon device, or none reported yet).
    pub stats: Option<GuestStats>,
    /// Its memory tier (None: no DRAM budget, or its counters could not be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<TierInput>,
}

impl VmInput {
    /// RAM minus balloon.
    pub fn effective_mib(&self) -> u64 {
        self.memory_mib.saturating_sub(self.balloon_mib)
    }
}

/// Everything one tick decides on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyInput {
    /// Tick number (one per second in the daemon).
    pub tick: u64,
    /// The host.
    pub host: HostSample,
    /// Every running VM.
    pub vms: Vec<VmInput>,
}

/// Whether an action inflates or deflates a balloon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Balloon grows: the guest gives memory back to the host.
    Inflate,
    /// Balloon shrinks: the guest gets memory.
    Deflate,
}

/// Why an action was taken (a fixed set, so each is a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Host `MemAvailable` under the low watermark.
    HostLowMemory,
    /// Host memory PSI over its limit.
    HostPressure,
    /// The guest is short of memory and the host has room.
    GuestShort,
    /// A higher-priority guest is short; this idle VM makes room.
    MakeRoom,
    /// Periodic squeeze of an idle VM: stale page cache goes back to the host.
    StaleCache,
    /// Host `MemAvailable` over the high watermark: a budget the policy lowered goes back
    /// up toward what the user set.
    HostRecovered,
}

impl Reason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HostLowMemory => "host_low_memory",
            Self::HostPressure => "host_pressure",
            Self::GuestShort => "guest_short",
            Self::MakeRoom => "make_room",
            Self::StaleCache => "stale_cache",
            Self::HostRecovered => "host_recovered",
        }
    }
}

/// Set VM `vm`'s balloon to `balloon_mib`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    /// The VM.
    pub vm: String,
    /// The new balloon target.
    pub balloon_mib: u64,
    /// The target before.
    pub from_mib: u64,
    /// Inflate or deflate.
    pub direction: Direction,
    /// Why (the metric label).
    pub reason: Reason,
    /// Why, with the numbers (for the log).
    pub detail: String,
}

/// The host's band this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostMode {
    /// Under the low watermark or over the PSI limit.
    Reclaim,
    /// Between the watermarks.
    Hold,
    /// Over the high watermark.
    Grow,
}

/// What the policy remembers about a VM between ticks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmMemory {
    /// Ticks in a row under the idle CPU threshold.
    pub idle_ticks: u32,
    /// Last tick it was inflated.
    pub last_inflate: Option<u64>,
    /// Last tick it was deflated.
    pub last_deflate: Option<u64>,
    /// When its last squeeze ended (or it was first seen).
    pub squeezed_at: u64,
    /// A squeeze is under way.
    pub squeezing: bool,
    /// Last tick its DRAM budget was lowered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_lowered: Option<u64>,
    /// Last tick its DRAM budget was raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_raised: Option<u64>,
}

/// What the policy carries from tick to tick.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyState {
    /// Per VM, by id.
    pub vms: BTreeMap<String, VmMemory>,
}

/// The outcome of one tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The host's band.
    pub mode: HostMode,
    /// Balloon targets to set, in order.
    pub actions: Vec<Action>,
    /// DRAM budgets to set, in order (after the balloon targets).
    pub budgets: Vec<BudgetAction>,
    /// The state for the next tick.
    pub state: PolicyState,
}

/// A VM with what this tick derived about it.
struct View<'a> {
    vm: &'a VmInput,
    mem: VmMemory,
    idle: bool,
    /// Guest statistics known.
    known: bool,
    /// Stats known and the balloon has reached its target (so it may be inflated more).
    ready: bool,
    short: bool,
    /// Least effective memory an inflate may leave it.
    floor: u64,
    acted: bool,
}

/// One tick of the policy: pure and deterministic (VMs are visited in a fixed order, ties
/// broken by id).
pub fn decide(cfg: &PolicyConfig, state: &PolicyState, input: &PolicyInput) -> Decision {
    let tick = input.tick;
    let mut views: Vec<View<'_>> = input
        .vms
        .iter()
        .map(|vm| view(cfg, state, vm, tick))
        .collect();
    views.sort_by(|a, b| a.vm.id.cmp(&b.vm.id));
    let host = &input.host;
    let avail = host.mem_available_mib;
    let mode = if avail < cfg.low_watermark_mib || host.psi_some_avg10 >= cfg.psi_some_limit {
        HostMode::Reclaim
    } else if avail > cfg.high_watermark_mib {
        HostMode::Grow
    } else {
        HostMode::Hold
    };
    let mut actions = Vec::new();
    let mut budgets = Vec::new();
    match mode {
        HostMode::Reclaim => {
            let (reason, why) = if avail < cfg.low_watermark_mib {
                let why = format!(
                    "host MemAvailable {avail} MiB < low watermark {} MiB",
                    cfg.low_watermark_mib
                );
                (Reason::HostLowMemory, why)
            } else {
                let why = format!(
                    "host memory PSI some avg10 {:.1}% >= {:.1}%",
                    host.psi_some_avg10, cfg.psi_some_limit
                );
                (Reason::HostPressure, why)
            };
            let middle = (cfg.low_watermark_mib + cfg.high_watermark_mib) / 2;
            let need = middle.saturating_sub(avail).max(cfg.step_mib);
            let left = reclaim(
                cfg,
                &mut views,
                &mut actions,
                need,
                None,
                reason,
                &why,
                tick,
            );
            budget::lower(cfg, &mut views, &mut budgets, left, reason, &why, tick);
        }
        HostMode::Grow => {
            let room = grow(cfg, &mut views, &mut actions, avail, tick);
            budget::raise(cfg, &mut views, &mut budgets, room, avail, tick);
        }
        HostMode::Hold => {
            let neediest = views
                .iter()
                .filter(|v| v.known && v.short && v.vm.effective_mib() < v.vm.max_mib)
                .map(|v| (v.vm.priority, v.vm.id.clone()))
                .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            if let Some((prio, id)) = neediest {
                let why = format!(
                    "VM {id} ({}) is short of memory and host MemAvailable {avail} MiB is \
                     not above the high watermark {} MiB",
                    prio.as_str(),
                    cfg.high_watermark_mib
                );
                let need = cfg.high_watermark_mib - avail + cfg.step_mib;
                reclaim(
                    cfg,
                    &mut views,
                    &mut actions,
                    need,
                    Some(prio),
                    Reason::MakeRoom,
                    &why,
                    tick,
                );
            }
        }
    }
    squeeze(cfg, &mut views, &mut actions, tick);
    let state = PolicyState {
        vms: views
            .into_iter()
            .map(|v| (v.vm.id.clone(), v.mem))
            .collect(),
    };
    Decision {
        mode,
        actions,
        budgets,
        state,
    }
}

fn view<'a>(cfg: &PolicyConfig, state: &PolicyState, vm: &'a VmInput, tick: u64) -> View<'a> {
    let mut mem = state.vms.get(&vm.id).cloned().unwrap_or(VmMemory {
        squeezed_at: tick,
        ..Default::default()
    });
    mem.idle_ticks = match vm.cpu_pct {
        Some(pct) if pct < cfg.idle_cpu_pct => mem.idle_ticks.saturating_add(1),
        _ => 0,
    };
    let idle = mem.idle_ticks >= cfg.idle_after_ticks;
    let eff = vm.effective_mib();
    let known = vm.stats.is_some();
    let (ready, short, floor) = match &vm.stats {
        Some(s) => {
            let ready = s.balloon_actual_mib.abs_diff(vm.balloon_mib) <= cfg.min_change_mib;
            let threshold = short_threshold(cfg, eff);
            let short = s.available_mib < threshold
                || s.major_faults_delta >= cfg.short_major_faults
                || s.swap_in_delta_kib > 0;
            (ready, short, guest_floor(cfg, vm, s))
        }
        None => (false, false, vm.min_mib),
    };
    View {
        vm,
        mem,
        idle,
        known,
        ready,
        short,
        floor,
        acted: false,
    }
}

/// A guest with less `available` than this is short of memory.
fn short_threshold(cfg: &PolicyConfig, effective_mib: u64) -> u64 {
    cfg.short_available_mib
        .max(effective_mib * cfg.short_available_pct / 100)
}

/// The least effective memory an inflate may leave: the VM's min, and enough for its
/// guest's use besides page cache to leave twice the "short" threshold available, so an
/// inflate never makes the guest short (which would call for a deflate: oscillation).
fn guest_floor(cfg: &PolicyConfig, vm: &VmInput, s: &GuestStats) -> u64 {
    let need = s.need_mib(vm.memory_mib);
    let pct = cfg.short_available_pct.min(49);
    let relative = (need * 100).div_ceil(100 - 2 * pct);
    vm.min_mib
        .max(need + 2 * cfg.short_available_mib)
        .max(relative)
        .min(vm.max_mib)
}

fn cooled(last: Option<u64>, tick: u64, cooldown: u64) -> bool {
    last.is_none_or(|t| tick.saturating_sub(t) >= cooldown)
}

/// Inflates balloons for `need` MiB of host memory; returns what is still needed.
#[allow(clippy::too_many_arguments)]
fn reclaim(
    cfg: &PolicyConfig,
    views: &mut [View<'_>],
    actions: &mut Vec<Action>,
    need: u64,
    below: Option<Priority>,
    reason: Reason,
    why: &str,
    tick: u64,
) -> u64 {
    let mut order: Vec<usize> = (0..views.len())
        .filter(|&i| {
            let v = &views[i];
            v.ready
                && !v.short
                && !v.acted
                && below.is_none_or(|p| v.idle && v.vm.priority < p)
                && cooled(v.mem.last_deflate, tick, cfg.reverse_cooldown_ticks)
                && gainable(v) >= cfg.min_change_mib
        })
        .collect();
    // Idle first, then low priority first, then the most to give first.
    order.sort_by(|&a, &b| {
        let (a, b) = (&views[a], &views[b]);
        b.idle
            .cmp(&a.idle)
            .then(a.vm.priority.cmp(&b.vm.priority))
            .then(gainable(b).cmp(&gainable(a)))
            .then(a.vm.id.cmp(&b.vm.id))
    });
    let mut left = need;
    for i in order {
        if left < cfg.min_change_mib {
            break;
        }
        let v = &mut views[i];
        // An inflate takes the guest's free memory first, which free page reporting has
        // given back to the host already: only what it takes beyond that (page cache)
        // frees host memory, so the balloon grows by the free memory plus the gain.
        let room = v.vm.effective_mib() - v.floor;
        let free = free_mib(v).min(room);
        let gain = cfg.step_mib.min(room - free).min(left);
        if gain < cfg.min_change_mib {
            continue;
        }
        let amount = free + gain;
        left -= gain;
        let detail = format!(
            "{why}: inflate {} ({}{}) by {amount} MiB ({gain} MiB for the host, {free} MiB \
             the guest had free) to {} MiB of guest memory (floor {} MiB)",
            v.vm.id,
            v.vm.priority.as_str(),
            if v.idle { ", idle" } else { "" },
            v.vm.effective_mib() - amount,
            v.floor
        );
        push(actions, v, v.vm.balloon_mib + amount, reason, detail, tick);
    }
    left
}

/// The guest's free memory (0 without statistics): free page reporting has returned it to
/// the host already.
fn free_mib(v: &View<'_>) -> u64 {
    v.vm.stats.map_or(0, |s| s.free_mib)
}

/// What inflating a VM down to its floor would free on the host: its memory above the
/// floor that is not free in the guest.
fn gainable(v: &View<'_>) -> u64 {
    v.vm.effective_mib()
        .saturating_sub(v.floor)
        .saturating_sub(free_mib(v))
}

/// Deflates the balloons of short guests; returns the room over the high watermark left.
fn grow(
    cfg: &PolicyConfig,
    views: &mut [View<'_>],
    actions: &mut Vec<Action>,
    avail: u64,
    tick: u64,
) -> u64 {
    let mut order: Vec<usize> = (0..views.len())
        .filter(|&i| {
            let v = &views[i];
            v.known
                && v.short
                && v.vm.effective_mib() < v.vm.max_mib
                && cooled(v.mem.last_inflate, tick, cfg.reverse_cooldown_ticks)
        })
        .collect();
    // High priority first, then the least available first.
    order.sort_by(|&a, &b| {
        let (a, b) = (&views[a], &views[b]);
        let avail = |v: &View<'_>| v.vm.stats.map_or(0, |s| s.available_mib);
        b.vm.priority
            .cmp(&a.vm.priority)
            .then(avail(a).cmp(&avail(b)))
            .then(a.vm.id.cmp(&b.vm.id))
    });
    let mut budget = avail - cfg.high_watermark_mib;
    for i in order {
        let v = &mut views[i];
        // A guest that deflated on its own (deflate-on-OOM: its balloon under the target)
        // is deflated from where its balloon is: a target between the two would make the
        // short guest inflate again.
        let actual =
            v.vm.stats
                .map_or(v.vm.balloon_mib, |s| s.balloon_actual_mib);
        let from = v.vm.balloon_mib.min(actual);
        let room = v.vm.max_mib.saturating_sub(v.vm.memory_mib - from);
        let amount = cfg.step_mib.min(room).min(budget).min(from);
        let to = from - amount;
        if v.vm.balloon_mib - to < cfg.min_change_mib {
            continue;
        }
        budget -= amount;
        let s = v.vm.stats.unwrap_or_default();
        let own = if from < v.vm.balloon_mib {
            format!(
                " (its balloon deflated on its own to {from} MiB, under the target {} MiB)",
                v.vm.balloon_mib
            )
        } else {
            String::new()
        };
        let detail = format!(
            "guest {} ({}) is short of memory (available {} MiB, {} major faults, {} KiB \
             swapped in) and host MemAvailable {avail} MiB > high watermark {} MiB: deflate \
             by {amount} MiB to {} MiB of guest memory (max {} MiB){own}",
            v.vm.id,
            v.vm.priority.as_str(),
            s.available_mib,
            s.major_faults_delta,
            s.swap_in_delta_kib,
            cfg.high_watermark_mib,
            v.vm.memory_mib - to,
            v.vm.max_mib
        );
        push(actions, v, to, Reason::GuestShort, detail, tick);
    }
    budget
}

fn squeeze(cfg: &PolicyConfig, views: &mut [View<'_>], actions: &mut Vec<Action>, tick: u64) {
    for v in views.iter_mut() {
        if !(v.mem.squeezing || tick.saturating_sub(v.mem.squeezed_at) >= cfg.squeeze_period_ticks)
        {
            continue;
        }
        let eligible = v.ready
            && v.idle
            && !v.short
            && !v.acted
            && cooled(v.mem.last_deflate, tick, cfg.reverse_cooldown_ticks);
        if !eligible {
            // Due but busy, short or without statistics: squeezed as soon as it can be;
            // a squeeze under way is interrupted and waits for the next period.
            if v.mem.squeezing {
                v.mem.squeezing = false;
                v.mem.squeezed_at = tick;
            }
            continue;
        }
        let eff = v.vm.effective_mib();
        let amount = cfg.step_mib.min(eff.saturating_sub(v.floor));
        if amount < cfg.min_change_mib {
            // Squeezed as far as it goes: the next one after a period.
            v.mem.squeezing = false;
            v.mem.squeezed_at = tick;
            continue;
        }
        v.mem.squeezing = true;
        let s = v.vm.stats.unwrap_or_default();
        let detail = format!(
            "periodic squeeze of idle {} ({}): its guest uses {} MiB besides {} MiB of page \
             cache; inflate by {amount} MiB to {} MiB of guest memory (floor {} MiB)",
            v.vm.id,
            v.vm.priority.as_str(),
            s.need_mib(v.vm.memory_mib),
            s.caches_mib,
            eff - amount,
            v.floor
        );
        push(
            actions,
            v,
            v.vm.balloon_mib + amount,
            Reason::StaleCache,
            detail,
            tick,
        );
    }
}

fn push(
    actions: &mut Vec<Action>,
    v: &mut View<'_>,
    balloon_mib: u64,
    reason: Reason,
    detail: String,
    tick: u64,
) {
    let direction = if balloon_mib > v.vm.balloon_mib {
        v.mem.last_inflate = Some(tick);
        Direction::Inflate
    } else {
        v.mem.last_deflate = Some(tick);
        Direction::Deflate
    };
    v.acted = true;
    actions.push(Action {
        vm: v.vm.id.clone(),
        balloon_mib,
        from_mib: v.vm.balloon_mib,
        direction,
        reason,
        detail,
    });
}
