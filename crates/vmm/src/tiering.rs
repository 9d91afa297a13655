//! `--memory-budget`: guest RAM kept under a DRAM budget by `densevm_tier` (cold pages
//! compressed or written to a swap file, served back through userfaultfd; see
//! docs/tiering.md).
//!
//! The tier belongs to the VM's [`RamFile`] (it tiers that file's RAM regions): a balloon
//! release goes through it ([`RamFile::discard`]), a snapshot holds it still while it copies
//! RAM and adds the tiered pages ([`crate::snapshot::ram::write_memory`]), and a clone
//! template first moves every page back into the file and ends it (the file becomes the
//! clones' template; the VM's RAM goes private over it, which the tier does not serve).

use crate::balloon::{lock_ram, SharedRam};
use crate::memory::{is_ram, GuestMemory};
use crate::snapshot::ram::RamFile;
use crate::vmm::VmmError;
pub use densevm_tier::TierStats;
use densevm_tier::{Area, Tier, TierConfig};
use std::path::PathBuf;

/// Smallest budget accepted: below this a guest spends its time in faults.
pub const MIN_BUDGET: u64 = 4 << 20;

/// How `--memory-budget` asked for tiering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierSettings {
    /// DRAM for guest RAM: resident pages plus the compressed store.
    pub budget: u64,
    /// Most bytes the compressed store may hold (`None`: a quarter of the budget).
    pub compressed_max: Option<u64>,
    /// Where the swap file goes (created unlinked).
    pub swap_dir: PathBuf,
}

/// Checks a budget for a VM with `memory_bytes` of RAM.
pub fn check_budget(budget: u64, memory_bytes: u64) -> Result<(), String> {
    if budget < MIN_BUDGET {
        return Err(format!(
            "a memory budget of {} KiB is below the {} MiB minimum",
            budget >> 10,
            MIN_BUDGET >> 20
        ));
    }
    if budget > memory_bytes {
        tracing::debug!("memory budget above the VM's RAM: the tier will have nothing to do");
    }
    Ok(())
}

/// Starts tiering the RAM regions of `memory`, which live in `ram`'s file mapped shared.
pub fn start(
    memory: &GuestMemory,
    ram: &mut RamFile,
    settings: &TierSettings,
) -> Result<(), VmmError> {
    check_budget(settings.budget, u64::MAX).map_err(VmmError::Config)?;
    let file = match (&ram.file, ram.shared) {
        (Some(file), true) => file.clone(),
        _ => {
            return Err(VmmError::Config(
                "--memory-budget needs guest RAM in a memory file of the VM's own (not --merge all, which keeps RAM anonymous for KSM)".into(),
            ))
        }
    };
    let areas = memory
        .regions()
        .iter()
        .filter(|r| is_ram(&r.name))
        .map(|r| Area {
            offset: r.gpa,
            host_addr: r.host_addr,
            len: r.size,
        })
        .collect();
    let tier = Tier::start(
        file,
        areas,
        TierConfig {
            budget: settings.budget,
            compressed_max: settings.compressed_max,
            swap_dir: settings.swap_dir.clone(),
        },
    )
    .map_err(|e| VmmError::Config(format!("--memory-budget: {e}")))?;
    ram.tier = Some(tier);
    Ok(())
}

/// The API's hold on a VM's tier.
#[derive(Clone)]
pub struct TierHandle {
    ram: SharedRam,
}

impl TierHandle {
    pub(crate) fn new(ram: SharedRam) -> Self {
        Self { ram }
    }

    /// The tier's counters, or `None` when the VM runs without one (no budget, or it
    /// ended when the VM became a clone template).
    pub fn stats(&self) -> Option<TierStats> {
        lock_ram(&self.ram).tier.as_ref().map(|t| t.stats())
    }

    /// Sets a new budget in bytes.
    pub fn set_budget(&self, bytes: u64) -> Result<(), String> {
        check_budget(bytes, u64::MAX)?;
        match lock_ram(&self.ram).tier.as_ref() {
            Some(t) => {
                t.set_budget(bytes);
                Ok(())
            }
            None => Err(
                "this VM has no memory tier: start it with --memory-budget SIZE (a VM that became a clone template leaves its tier)"
                    .into(),
            ),
        }
    }
}
