//! Identity-mapped page tables (2 MiB pages) for 64-bit guests started in long mode.

/// Guest-physical address of the PML4; the PDPT and page directories follow it.
pub const PML4_ADDR: u64 = 0x10000;
/// End (exclusive) of the area reserved for boot page tables.
pub const PAGE_TABLES_END: u64 = 0x10_0000;
const PAGE: u64 = 4096;
const GIB: u64 = 1 << 30;

/// Most guest-physical memory the boot page tables can identity-map.
pub const MAX_IDENTITY_MAPPED: u64 = (PAGE_TABLES_END - PML4_ADDR - 2 * PAGE) / PAGE * GIB;

/// Builds tables identity-mapping `[0, limit)` (rounded up to 1 GiB) with 2 MiB pages,
/// accessible from user mode too when `user` is set. Returns `(guest address, bytes)`
/// chunks to write, PML4 first.
pub fn identity_map(limit: u64, user: bool) -> Result<Vec<(u64, Vec<u8>)>, u64> {
    // present | writable (| user)
    let flags: u64 = if user { 0x7 } else { 0x3 };
    let gibs = limit.div_ceil(GIB).max(1);
    if gibs * GIB > MAX_IDENTITY_MAPPED {
        return Err(MAX_IDENTITY_MAPPED);
    }
    let pdpt_addr = PML4_ADDR + PAGE;
    let pd_base = pdpt_addr + PAGE;
    let mut pml4 = vec![0u8; PAGE as usize];
    pml4[..8].copy_from_slice(&(pdpt_addr | flags).to_le_bytes());
    let mut pdpt = vec![0u8; PAGE as usize];
    let mut pds = vec![0u8; (gibs * PAGE) as usize];
    for g in 0..gibs {
        let pd_addr = pd_base + g * PAGE;
        pdpt[(g * 8) as usize..(g * 8 + 8) as usize]
            .copy_from_slice(&(pd_addr | flags).to_le_bytes());
        for e in 0..512u64 {
            let phys = g * GIB + (e << 21);
            let off = ((g * 512 + e) * 8) as usize;
            // page size (2 MiB)
            pds[off..off + 8].copy_from_slice(&(phys | flags | 0x80).to_le_bytes());
        }
    }
    Ok(vec![(PML4_ADDR, pml4), (pdpt_addr, pdpt), (pd_base, pds)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_requested_range() {
        let chunks = identity_map(3 * GIB + 1, false).unwrap();
        assert_eq!(chunks[0].0, PML4_ADDR);
        let pds = &chunks[2].1;
        assert_eq!(pds.len(), 4 * 4096);
        let last = u64::from_le_bytes(pds[pds.len() - 8..].try_into().unwrap());
        assert_eq!(last, (4 * GIB - (2 << 20)) | 0x83);
        assert!(identity_map(MAX_IDENTITY_MAPPED + 1, true).is_err());
    }
}
