//! Keeping the read-only KVM slots of external regions (pmem lower layers) up to date.
//!
//! A guest write to a page in a `KVM_MEM_READONLY` slot exits to the VMM, which copies the
//! page up (crate::write_fault). The page is then writable on the host, but the slot over
//! it is still read-only, so every later store to it exits too: a 4 KiB page written with
//! 8-byte stores costs 512 exits. When handlers report such stale exits, the control thread
//! asks each region for the ranges that are still read-only, and where they changed, pauses
//! the vCPUs and re-registers the region's slots.
//!
//! Re-registering costs a pause of every vCPU and KVM slot updates, so it happens only after
//! [`FIRST_THRESHOLD`] stale exits since the last attempt. The vCPU that counts the last of
//! them parks itself at once (it would only keep exiting) and notifies the control thread.
//! An attempt that changes nothing (the ranges are at their slot budget, so copied-up pages
//! stay covered) doubles the threshold, and one that changes something resets it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::memory::{coalesce_ranges, RegionInfo, MAX_READONLY_RANGES};
use crate::vstate::pause::PauseGate;
use crate::vstate::vm::{Vm, VmError};

/// Returns a region's current read-only `(offset, len)` ranges.
pub type RangesFn = Arc<dyn Fn() -> Vec<(u64, u64)> + Send + Sync>;

/// Stale exits after which the first refresh is attempted.
pub const FIRST_THRESHOLD: u64 = crate::vstate::vcpu::FIRST_STALE_NOTICE;
/// The most stale exits the threshold grows to.
const MAX_THRESHOLD: u64 = 1 << 20;
/// The longest a refresh waits for the vCPUs to park.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the refresher did during a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReadonlySlotStats {
    /// Writes that exited although their page was writable already.
    pub stale_exits: u64,
    /// Times the slots of a region were re-registered.
    pub refreshes: u64,
    /// KVM slots deleted or added by those refreshes (unchanged slots stay registered).
    pub slot_updates: u64,
    /// Attempts that found nothing to change.
    pub unchanged: u64,
    /// Attempts abandoned because the vCPUs did not park in time.
    pub pause_timeouts: u64,
    /// Total time the vCPUs spent paused for refreshes, in microseconds.
    pub paused_us: u64,
}

struct Tracked {
    /// Index of the region in the VM's registered memory.
    index: usize,
    info: RegionInfo,
    ranges: RangesFn,
}

/// The control thread's view of every region whose read-only ranges can shrink.
pub struct ReadonlySlots {
    regions: Vec<Tracked>,
    threshold: u64,
    stats: ReadonlySlotStats,
}

impl ReadonlySlots {
    /// Tracks `regions`: `(index in the registered memory, its info as registered, where
    /// its current read-only ranges come from)`.
    pub fn new(regions: Vec<(usize, RegionInfo, RangesFn)>) -> Self {
        Self {
            regions: regions
                .into_iter()
                .map(|(index, info, ranges)| Tracked {
                    index,
                    info,
                    ranges,
                })
                .collect(),
            threshold: FIRST_THRESHOLD,
            stats: ReadonlySlotStats::default(),
        }
    }

    /// The counters so far; `stale_exits` is the total the vCPUs reported.
    pub fn stats(&self, stale_exits: u64) -> ReadonlySlotStats {
        ReadonlySlotStats {
            stale_exits,
            ..self.stats
        }
    }

    /// Called when the vCPUs reported enough stale exits ([`VcpuEvent::StaleReadonlySlot`]),
    /// with a pause already requested: re-registers the slots of every region whose
    /// read-only ranges changed (pausing all vCPUs, `kick` gets them out of `KVM_RUN`).
    /// Returns how many more stale exits to wait for before the next call. The caller
    /// re-arms the notice with that and only then resumes the vCPUs ([`PauseGate::resume`]),
    /// so no stale exit slips between the two. An error means a region may be left without
    /// memory: the VM must stop.
    ///
    /// [`VcpuEvent::StaleReadonlySlot`]: crate::vstate::vcpu::VcpuEvent::StaleReadonlySlot
    pub fn refresh(
        &mut self,
        vm: &mut Vm,
        gate: &PauseGate,
        kick: impl Fn(),
    ) -> Result<u64, VmError> {
        let changes = self.changes(vm);
        tracing::debug!(
            "read-only slots: refresh after {} stale exits; {} region(s) changed, read-only ranges now {:?}",
            self.threshold,
            changes.len(),
            changes.iter().map(|(_, r)| r.len()).collect::<Vec<_>>()
        );
        if changes.is_empty() {
            self.stats.unchanged += 1;
            self.threshold = (self.threshold * 2).min(MAX_THRESHOLD);
            return Ok(self.threshold);
        }
        let t0 = Instant::now();
        if !gate.pause(kick, PAUSE_TIMEOUT) {
            self.stats.pause_timeouts += 1;
            tracing::warn!("read-only slots not refreshed: the vCPUs did not pause in time");
            return Ok(self.threshold);
        }
        let result = self.apply(vm, changes);
        self.stats.paused_us += t0.elapsed().as_micros() as u64;
        self.threshold = FIRST_THRESHOLD;
        result.map(|()| self.threshold)
    }

    /// Re-registers, with every vCPU already parked (a user pause), the slots of each
    /// region whose read-only ranges changed, e.g. after its image was swapped; returns
    /// how many regions changed.
    pub fn sync(&mut self, vm: &mut Vm) -> Result<usize, VmError> {
        let changes = self.changes(vm);
        let n = changes.len();
        self.apply(vm, changes)?;
        Ok(n)
    }

    /// Each region whose current read-only ranges (coalesced to its slot budget) differ
    /// from its registered ones, with the new ranges.
    fn changes(&self, vm: &Vm) -> Vec<(usize, Vec<(u64, u64)>)> {
        let mut changes = Vec::new();
        for (i, r) in self.regions.iter().enumerate() {
            // Writable pieces sit between read-only ones: n ranges need up to 2n + 1 slots.
            let budget = (vm.slot_budget(r.index).saturating_sub(1) / 2).min(MAX_READONLY_RANGES);
            let now = coalesce_ranges((r.ranges)(), r.info.size, budget);
            if now != r.info.kvm_readonly {
                changes.push((i, now));
            }
        }
        changes
    }

    /// Re-registers the slots of each changed region (the vCPUs must be parked).
    fn apply(
        &mut self,
        vm: &mut Vm,
        changes: Vec<(usize, Vec<(u64, u64)>)>,
    ) -> Result<(), VmError> {
        for (i, ranges) in changes {
            let r = &mut self.regions[i];
            let mut info = r.info.clone();
            info.kvm_readonly = ranges;
            let updates = vm.replace_region_slots(r.index, &info.slot_pieces())?;
            self.stats.slot_updates += updates as u64;
            r.info = info;
            self.stats.refreshes += 1;
        }
        Ok(())
    }
}
