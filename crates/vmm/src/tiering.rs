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
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

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
    /// Swap-file reader threads (`readers=N`); `None`: by the vCPU count ([`swap_readers`]).
    pub readers: Option<usize>,
    /// Offer KVM's async page faults to a booted guest (`async_pf=on`; default off, see
    /// [`crate::arch::cpuid::CpuidOptions`]). A restored guest keeps what it had.
    pub async_pf: bool,
    /// Whether the tier's service thread polls briefly for the next fault before it
    /// sleeps (`poll=on|off`, default on; `densevm_tier::TierConfig::poll_faults`).
    pub poll: bool,
}

/// Checks a budget (a budget above the VM's RAM is allowed: the tier then has nothing to
/// do until it is lowered).
pub fn check_budget(budget: u64) -> Result<(), String> {
    if budget < MIN_BUDGET {
        return Err(format!(
            "a memory budget of {} KiB is below the {} MiB minimum",
            budget >> 10,
            MIN_BUDGET >> 20
        ));
    }
    Ok(())
}

/// Starts tiering the RAM regions of `memory`, which live in `ram`'s file mapped shared.
/// With a `base` (a restored VM's snapshot memory), the RAM file starts empty and each
/// page is read from the base on its first access. `vcpus`: the VM's vCPU count, which
/// sets how many threads read pages back from the swap file ([`swap_readers`]).
pub fn start(
    memory: &GuestMemory,
    ram: &mut RamFile,
    settings: &TierSettings,
    base: Option<Arc<File>>,
    vcpus: usize,
) -> Result<(), VmmError> {
    check_budget(settings.budget).map_err(VmmError::Config)?;
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
            base,
            swap_readers: settings.readers.unwrap_or_else(|| swap_readers(vcpus)),
            poll_faults: settings.poll,
        },
    )
    .map_err(|e| VmmError::Config(format!("--memory-budget: {e}")))?;
    ram.tier = Some(tier);
    Ok(())
}

/// Swap-file reader threads for a VM with `vcpus` vCPUs unless `readers=N` says: 3 from 4
/// vCPUs on, none below. Readers let faults wait for the disk side by side, which only
/// several faulting threads can use, and each read they take costs a thread switch more:
/// at process level (docs/benchmarks.md, "Swap-file readers") 8 faulting threads gained
/// 10-41 % with 3 readers in every pair; with 4 threads (3 readers) or 2 (one) the pairs
/// went either way, −13 to +17 %.
pub fn swap_readers(vcpus: usize) -> usize {
    if vcpus >= 4 {
        MAX_DEFAULT_READERS
    } else {
        0
    }
}

/// Readers a VM gets by default from 4 vCPUs on.
const MAX_DEFAULT_READERS: usize = 3;

/// Most readers `readers=N` may ask for.
pub const MAX_READERS: usize = 16;

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
        check_budget(bytes)?;
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

#[cfg(test)]
mod tests {
    //! The VMM's paths through a running tier: a balloon release of tiered pages, a
    //! snapshot's copy of RAM and a template's return of every page, on real mappings.
    use super::*;
    use crate::balloon::GuestRamRelease;
    use crate::memory::{back_ram_with_file, ram_with_windows};
    use crate::snapshot::ram::{create_ram_file, write_memory};
    use densevm_virtio::balloon::BalloonMemory;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    use vm_memory::{Bytes, GuestAddress};

    const MIB: u64 = 1 << 20;
    const PAGE: usize = 4096;

    /// Page `n`'s bytes: half the pages compress, half do not.
    fn page(n: u64) -> Vec<u8> {
        let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..PAGE)
            .map(|i| {
                if n % 2 == 0 {
                    (n as u8) ^ (i as u8 & 0xf0)
                } else {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                }
            })
            .collect()
    }

    #[test]
    fn releases_snapshots_and_templates_see_tiered_pages_right() {
        let size = 16 * MIB;
        let file = Arc::new(create_ram_file(size).unwrap());
        let mut specs = ram_with_windows(size, 0, 4 << 30, Vec::new());
        back_ram_with_file(&mut specs, &file, true);
        let memory = GuestMemory::new(specs).unwrap();
        let ram: SharedRam = Arc::new(Mutex::new(RamFile::new(Some(file.clone()), true)));
        let settings = TierSettings {
            budget: 16 * MIB,
            compressed_max: Some(MIB),
            swap_dir: std::env::temp_dir(),
            readers: None,
            async_pf: false,
            poll: true,
        };
        start(&memory, &mut lock_ram(&ram), &settings, None, 1).unwrap();
        let pages = size / PAGE as u64;
        for n in 0..pages {
            memory
                .mem()
                .write_slice(&page(n), GuestAddress(n * PAGE as u64))
                .unwrap();
        }
        let tier = TierHandle::new(ram.clone());
        tier.set_budget(4 * MIB).unwrap();
        let t0 = Instant::now();
        while tier.stats().unwrap().resident > 5 * MIB {
            assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", tier.stats());
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = tier.stats().unwrap();
        assert!(s.swap_pages > 0 && s.compressed_pages > 0, "{s:?}");

        // A balloon release of 1 MiB at 2 MiB, most of it tiered: zeros from then on.
        let release = GuestRamRelease::new(memory.regions().to_vec(), ram.clone());
        release.release(2 * MIB, MIB).unwrap();
        let expect = |n: u64| {
            if (2 * MIB..3 * MIB).contains(&(n * PAGE as u64)) {
                vec![0u8; PAGE]
            } else {
                page(n)
            }
        };

        // A snapshot's memory file holds every page, tiered or not.
        let out = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(std::env::temp_dir())
            .unwrap();
        write_memory(memory.regions(), &lock_ram(&ram), &out).unwrap();
        let mut buf = vec![0u8; PAGE];
        for n in 0..pages {
            out.read_exact_at(&mut buf, n * PAGE as u64).unwrap();
            assert_eq!(buf, expect(n), "snapshot page {n}");
        }

        // A template: every page back in the RAM file, and the tier gone.
        let returned = lock_ram(&ram).end_tier().unwrap();
        assert!(returned >= 8 * MIB, "only {returned} bytes came back");
        assert!(tier.stats().is_none());
        assert!(tier
            .set_budget(8 * MIB)
            .unwrap_err()
            .contains("no memory tier"));
        for n in 0..pages {
            file.read_exact_at(&mut buf, n * PAGE as u64).unwrap();
            assert_eq!(buf, expect(n), "RAM file page {n}");
            let mut mapped = vec![0u8; PAGE];
            memory
                .mem()
                .read_slice(&mut mapped, GuestAddress(n * PAGE as u64))
                .unwrap();
            assert_eq!(mapped, expect(n), "mapped page {n}");
        }
    }

    #[test]
    fn tiering_refuses_anonymous_ram_and_tiny_budgets() {
        let memory = GuestMemory::new(ram_with_windows(4 * MIB, 0, 4 << 30, Vec::new())).unwrap();
        let mut ram = RamFile::new(None, false);
        let settings = TierSettings {
            budget: 8 * MIB,
            compressed_max: None,
            swap_dir: std::env::temp_dir(),
            readers: None,
            async_pf: false,
            poll: true,
        };
        let e = start(&memory, &mut ram, &settings, None, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--merge all"), "{e}");
        assert!(check_budget(MIB).unwrap_err().contains("minimum"));
    }
}
