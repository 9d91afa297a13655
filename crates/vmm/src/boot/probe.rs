//! Loading the probe guest: memory layout, page tables, GDT, command block, entry state.

use super::EntryState;
use crate::arch::{gdt, paging, regs};
use densevm_probe::{abi, encode_block, BlockError, Command, Region};
use kvm_bindings::{kvm_regs, kvm_sregs};
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Start of the probe's per-vCPU stacks.
pub const STACKS_BASE: u64 = 0x20_0000;
/// Stack size per vCPU.
pub const STACK_SIZE: u64 = 0x1_0000;
/// Start of the RAM the probe script addresses as `ram`.
pub const WORKLOAD_BASE: u64 = 0x40_0000;
/// Most vCPUs the probe layout has stacks for.
pub const MAX_PROBE_CPUS: u32 = ((WORKLOAD_BASE - STACKS_BASE) / STACK_SIZE) as u32;
/// Smallest RAM a probe VM can have.
pub const MIN_PROBE_MEMORY: u64 = WORKLOAD_BASE + (4 << 20);

/// Failure to place the probe in guest memory.
#[derive(Debug, Error)]
pub enum ProbeLoadError {
    /// RAM too small for the probe's fixed layout.
    #[error("the probe guest needs at least {} MiB of memory, got {} KiB", MIN_PROBE_MEMORY >> 20, .0 >> 10)]
    TooLittleMemory(u64),
    /// More vCPUs than the layout supports.
    #[error("the probe guest supports at most {MAX_PROBE_CPUS} vCPUs, got {0}")]
    TooManyCpus(u32),
    /// The script does not fit the VM's regions.
    #[error(transparent)]
    Block(#[from] BlockError),
    /// Guest memory too large to identity-map.
    #[error("the probe identity-maps at most {} GiB of guest-physical space", .0 >> 30)]
    TooLarge(u64),
    /// Writing into guest memory failed.
    #[error("writing the probe into guest memory failed: {0}")]
    Write(#[from] vm_memory::GuestMemoryError),
}

/// A probe guest placed in memory, ready to start.
pub struct ProbeBoot;

/// The named regions the probe script can address: `ram` (the workload part of RAM)
/// and every extra region (`pmem0`, ...).
pub fn probe_regions(ram_size: u64, extra: &[(String, u64, u64)]) -> Vec<Region> {
    let mut regions = vec![Region {
        name: "ram".into(),
        gpa: WORKLOAD_BASE,
        size: ram_size.saturating_sub(WORKLOAD_BASE),
    }];
    regions.extend(extra.iter().map(|(name, gpa, size)| Region {
        name: name.clone(),
        gpa: *gpa,
        size: *size,
    }));
    regions
}

/// Writes GDT, page tables (covering `[0, phys_end]` rounded up to 1 GiB, so the first
/// unbacked address is mapped too), image and command block.
pub fn load_probe(
    mem: &GuestMemoryMmap,
    ram_size: u64,
    phys_end: u64,
    cpus: u32,
    script: &[Command],
    extra_regions: &[(String, u64, u64)],
    tsc_khz: u64,
) -> Result<ProbeBoot, ProbeLoadError> {
    if ram_size < MIN_PROBE_MEMORY {
        return Err(ProbeLoadError::TooLittleMemory(ram_size));
    }
    if cpus == 0 || cpus > MAX_PROBE_CPUS {
        return Err(ProbeLoadError::TooManyCpus(cpus));
    }
    let regions = probe_regions(ram_size, extra_regions);
    let block = encode_block(script, &regions, cpus, tsc_khz)?;
    gdt::write_boot_gdt(mem)?;
    let tables = paging::identity_map(phys_end + 1, false).map_err(ProbeLoadError::TooLarge)?;
    for (addr, bytes) in tables {
        mem.write_slice(&bytes, GuestAddress(addr))?;
    }
    mem.write_slice(densevm_probe::PROBE_IMAGE, GuestAddress(abi::LOAD_ADDR))?;
    mem.write_slice(&block, GuestAddress(abi::BLOCK_ADDR))?;
    Ok(ProbeBoot)
}

impl EntryState for ProbeBoot {
    fn sregs(&self, _index: u32, defaults: kvm_sregs) -> kvm_sregs {
        regs::long_mode_sregs(defaults)
    }

    fn regs(&self, index: u32) -> kvm_regs {
        let stack_top = STACKS_BASE + STACK_SIZE * (u64::from(index) + 1) - 16;
        regs::entry_regs(abi::LOAD_ADDR, stack_top, u64::from(index), abi::BLOCK_ADDR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use densevm_probe::parse_script;

    #[test]
    fn layout_checks() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        let script = parse_script("touch 1M; exit 0").unwrap();
        assert!(load_probe(&mem, 16 << 20, 16 << 20, 2, &script, &[], 0).is_ok());
        let image: Vec<u8> = {
            let mut v = vec![0u8; 16];
            mem.read_slice(&mut v, GuestAddress(abi::LOAD_ADDR))
                .unwrap();
            v
        };
        assert_eq!(&image[..], &densevm_probe::PROBE_IMAGE[..16]);
        assert!(matches!(
            load_probe(&mem, 1 << 20, 1 << 20, 1, &script, &[], 0),
            Err(ProbeLoadError::TooLittleMemory(_))
        ));
        assert!(matches!(
            load_probe(&mem, 16 << 20, 16 << 20, 99, &script, &[], 0),
            Err(ProbeLoadError::TooManyCpus(99))
        ));
        let too_big = parse_script("touch 13M").unwrap();
        assert!(matches!(
            load_probe(&mem, 16 << 20, 16 << 20, 1, &too_big, &[], 0),
            Err(ProbeLoadError::Block(_))
        ));
    }
}
