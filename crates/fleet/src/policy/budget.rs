//! DRAM budgets: the policy's second lever, for the VMs a balloon cannot help.
//!
//! A VM started with a DRAM budget (`densevm run --memory-budget`, docs/tiering.md) keeps
//! its RAM's coldest pages out of DRAM, in a compressed store or a swap file of its own,
//! underneath the guest: it works on any guest, a busy one or one without a balloon. The
//! balloon rules run first; then, each tick:
//!
//! - **Lower** (host under the low watermark, or PSI at its limit; the balloon's reasons):
//!   what reclaim still needs after the balloons is taken from the budgets of tiered VMs
//!   that no balloon action touched this tick, low priority first, then busy before idle
//!   (an idle guest's balloon gives without the tier's faults), then the most to give.
//!   A budget is lowered from what the VM holds in DRAM now (its resident pages plus the
//!   compressed store: budget slack frees nothing) by at most `budget_step_mib`, never under
//!   its floor: `budget_floor_pct` of its RAM and at least `budget_floor_mib` (or the
//!   user's budget, when that is lower). A VM whose tier has not yet got down to its budget
//!   is not lowered again (as a balloon that has not reached its target), nor one whose
//!   budget was raised within `reverse_cooldown_ticks`.
//! - **Raise** (host over the high watermark): budgets under what the user set are raised
//!   toward it, at most `budget_step_mib` each, high priority first, sharing what the
//!   balloon rules left of `MemAvailable − high watermark`, never within
//!   `reverse_cooldown_ticks` of lowering it.
//!
//! Between the watermarks budgets stay as they are.

use serde::{Deserialize, Serialize};

use super::{cooled, PolicyConfig, Reason, View};

#[cfg(test)]
mod tests;

pub(super) fn default_step() -> u64 {
    64
}

pub(super) fn default_floor_pct() -> u64 {
    25
}

pub(super) fn default_floor_mib() -> u64 {
    16
}

/// A VM's memory tier as the policy sees it, MiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierInput {
    /// The budget in force.
    pub budget_mib: u64,
    /// The budget the user set (the policy raises a lowered budget back to it).
    pub user_budget_mib: u64,
    /// DRAM its RAM takes now: resident pages plus the compressed store (what the budget
    /// bounds).
    pub used_mib: u64,
}

impl TierInput {
    /// Whether the tier is down to its budget (within its slack, 1/32 of the budget and at
    /// least 1 MiB, docs/tiering.md, plus 1 MiB of rounding).
    fn settled(&self) -> bool {
        self.used_mib <= self.budget_mib + (self.budget_mib / 32).max(1) + 1
    }
}

/// Whether an action lowers or raises a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetDirection {
    /// Less DRAM for the VM: its coldest pages leave for the tier.
    Lower,
    /// More DRAM for the VM.
    Raise,
}

impl BudgetDirection {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lower => "lower",
            Self::Raise => "raise",
        }
    }
}

/// Set VM `vm`'s DRAM budget to `budget_mib`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetAction {
    /// The VM.
    pub vm: String,
    /// The new budget.
    pub budget_mib: u64,
    /// The budget before.
    pub from_mib: u64,
    /// Lower or raise.
    pub direction: BudgetDirection,
    /// Why (the metric label): `host_low_memory` or `host_pressure` lower,
    /// `host_recovered` raises.
    pub reason: Reason,
    /// Why, with the numbers (for the log).
    pub detail: String,
}

/// The least budget the policy leaves a VM.
pub(super) fn floor(cfg: &PolicyConfig, v: &View<'_>, t: &TierInput) -> u64 {
    (v.vm.memory_mib * cfg.budget_floor_pct / 100)
        .max(cfg.budget_floor_mib)
        .min(t.user_budget_mib)
}

/// What lowering a VM's budget to its floor would free on the host.
fn lowerable(cfg: &PolicyConfig, v: &View<'_>) -> u64 {
    v.vm.tier.map_or(0, |t| {
        t.used_mib
            .min(t.budget_mib)
            .saturating_sub(floor(cfg, v, &t))
    })
}

/// Lowers budgets for `need` MiB of host memory (what the balloons did not cover).
pub(super) fn lower(
    cfg: &PolicyConfig,
    views: &mut [View<'_>],
    out: &mut Vec<BudgetAction>,
    need: u64,
    reason: Reason,
    why: &str,
    tick: u64,
) {
    let mut order: Vec<usize> = (0..views.len())
        .filter(|&i| {
            let v = &views[i];
            v.vm.tier.is_some_and(|t| t.settled())
                && !v.acted
                && cooled(v.mem.budget_raised, tick, cfg.reverse_cooldown_ticks)
                && lowerable(cfg, v) >= cfg.min_change_mib
        })
        .collect();
    // Low priority first, then busy before idle, then the most to give.
    order.sort_by(|&a, &b| {
        let (a, b) = (&views[a], &views[b]);
        a.vm.priority
            .cmp(&b.vm.priority)
            .then(a.idle.cmp(&b.idle))
            .then(lowerable(cfg, b).cmp(&lowerable(cfg, a)))
            .then(a.vm.id.cmp(&b.vm.id))
    });
    let mut left = need;
    for i in order {
        if left < cfg.min_change_mib {
            break;
        }
        let v = &mut views[i];
        let Some(t) = v.vm.tier else { continue };
        let fl = floor(cfg, v, &t);
        let held = t.used_mib.min(t.budget_mib);
        let gain = cfg.budget_step_mib.min(held - fl).min(left);
        if gain < cfg.min_change_mib {
            continue;
        }
        left -= gain;
        let to = held - gain;
        let detail = format!(
            "{why}: lower the DRAM budget of {} ({}{}) from {} to {to} MiB ({gain} MiB for the \
             host; its RAM holds {} MiB of DRAM; floor {fl} MiB, the user's budget {} MiB)",
            v.vm.id,
            v.vm.priority.as_str(),
            if v.idle { ", idle" } else { ", busy" },
            t.budget_mib,
            t.used_mib,
            t.user_budget_mib
        );
        v.mem.budget_lowered = Some(tick);
        v.acted = true;
        out.push(BudgetAction {
            vm: v.vm.id.clone(),
            budget_mib: to,
            from_mib: t.budget_mib,
            direction: BudgetDirection::Lower,
            reason,
            detail,
        });
    }
}

/// Raises the budgets the policy lowered, sharing `room` MiB over the high watermark.
pub(super) fn raise(
    cfg: &PolicyConfig,
    views: &mut [View<'_>],
    out: &mut Vec<BudgetAction>,
    room: u64,
    avail: u64,
    tick: u64,
) {
    let mut order: Vec<usize> = (0..views.len())
        .filter(|&i| {
            let v = &views[i];
            v.vm.tier.is_some_and(|t| t.budget_mib < t.user_budget_mib)
                && !v.acted
                && cooled(v.mem.budget_lowered, tick, cfg.reverse_cooldown_ticks)
        })
        .collect();
    // High priority first, then the most below what the user set.
    let below = |v: &View<'_>| v.vm.tier.map_or(0, |t| t.user_budget_mib - t.budget_mib);
    order.sort_by(|&a, &b| {
        let (a, b) = (&views[a], &views[b]);
        b.vm.priority
            .cmp(&a.vm.priority)
            .then(below(b).cmp(&below(a)))
            .then(a.vm.id.cmp(&b.vm.id))
    });
    let mut room = room;
    for i in order {
        let v = &mut views[i];
        let Some(t) = v.vm.tier else { continue };
        let missing = t.user_budget_mib - t.budget_mib;
        let amount = cfg.budget_step_mib.min(missing).min(room);
        // The last bit back to the user's budget is made even when small.
        if amount == 0 || (amount < cfg.min_change_mib && amount < missing) {
            continue;
        }
        room -= amount;
        let to = t.budget_mib + amount;
        let detail = format!(
            "host MemAvailable {avail} MiB > high watermark {} MiB: raise the DRAM budget of \
             {} ({}) from {} to {to} MiB toward the user's {} MiB",
            cfg.high_watermark_mib,
            v.vm.id,
            v.vm.priority.as_str(),
            t.budget_mib,
            t.user_budget_mib
        );
        v.mem.budget_raised = Some(tick);
        v.acted = true;
        out.push(BudgetAction {
            vm: v.vm.id.clone(),
            budget_mib: to,
            from_mib: t.budget_mib,
            direction: BudgetDirection::Raise,
            reason: Reason::HostRecovered,
            detail,
        });
    }
}

/// Every (direction, reason) pair a budget action can have, so each counter exists from
/// the start.
pub fn budget_kinds() -> [(BudgetDirection, Reason); 3] {
    [
        (BudgetDirection::Lower, Reason::HostLowMemory),
        (BudgetDirection::Lower, Reason::HostPressure),
        (BudgetDirection::Raise, Reason::HostRecovered),
    ]
}
