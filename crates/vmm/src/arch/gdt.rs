//! A flat GDT for 64-bit guests and the matching KVM segment descriptors.

use kvm_bindings::kvm_segment;
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// Guest-physical address where the boot GDT is written.
pub const BOOT_GDT_ADDR: u64 = 0x500;
/// Selector of the 64-bit code segment.
pub const CODE64_SELECTOR: u16 = 0x08;
/// Selector of the flat data segment.
pub const DATA_SELECTOR: u16 = 0x10;
/// Selector of the (placeholder) task state segment.
pub const TSS_SELECTOR: u16 = 0x18;
/// Selector of the 32-bit flat code segment (PVH entry).
pub const CODE32_SELECTOR: u16 = 0x20;

/// The boot GDT: null, 64-bit code, data, TSS, 32-bit code.
pub const BOOT_GDT: [u64; 5] = [
    0,
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
    gdt_entry(0xc09b, 0, 0xfffff),
];

/// Writes [`BOOT_GDT`] at [`BOOT_GDT_ADDR`].
pub fn write_boot_gdt(mem: &GuestMemoryMmap) -> Result<(), GuestMemoryError> {
    let bytes: Vec<u8> = BOOT_GDT.iter().flat_map(|e| e.to_le_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(BOOT_GDT_ADDR))
}

/// Packs a GDT descriptor from flags (access byte in the low 8 bits, G/DB/L/AVL in bits
/// 12..15), base and limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
}

/// Decodes a GDT descriptor into the segment KVM expects in `kvm_sregs`.
pub fn kvm_segment_from_gdt(entry: u64, selector: u16) -> kvm_segment {
    let base = ((entry >> 16) & 0x00ff_ffff) | ((entry >> 32) & 0xff00_0000);
    let raw_limit = ((entry & 0xffff) | ((entry >> 32) & 0x000f_0000)) as u32;
    let g = ((entry >> 55) & 1) as u8;
    let limit = if g == 1 {
        (raw_limit << 12) | 0xfff
    } else {
        raw_limit
    };
    kvm_segment {
        base,
        limit,
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g,
        avl: ((entry >> 52) & 1) as u8,
        unusable: u8::from(((entry >> 47) & 1) == 0),
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code64_descriptor() {
        let seg = kvm_segment_from_gdt(BOOT_GDT[1], CODE64_SELECTOR);
        assert_eq!(
            (seg.l, seg.db, seg.present, seg.s, seg.type_, seg.g),
            (1, 0, 1, 1, 0xb, 1)
        );
        assert_eq!(seg.limit, 0xffff_ffff);
        let data = kvm_segment_from_gdt(BOOT_GDT[2], DATA_SELECTOR);
        assert_eq!((data.l, data.db, data.type_), (0, 1, 3));
        let code32 = kvm_segment_from_gdt(BOOT_GDT[4], CODE32_SELECTOR);
        assert_eq!((code32.l, code32.db), (0, 1));
        assert_eq!(kvm_segment_from_gdt(0, 0).unusable, 1);
    }
}
