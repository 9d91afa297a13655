//! The Intel MultiProcessor Specification (1.4) tables for Linux guests: a floating
//! pointer in the last KiB of base memory and the configuration table it points to (one
//! processor entry per vCPU, the ISA bus, the IOAPIC, ISA IRQ *n* on IOAPIC pin *n*, LINT0
//! ExtINT and LINT1 NMI), the same machine the ACPI MADT describes.
//!
//! Why a VM with ACPI has them: before Linux reads ACPI it looks for a floating pointer in
//! three places, in this order, and stops at the first it finds: the first KiB of memory,
//! the last KiB of base memory (639 KiB, [`MPF_ADDR`]) and the 64 KiB BIOS area at
//! 0xf0000. Its scanner (`smp_scan_config`) maps the rest of the range anew for each
//! 16-byte step, so an empty BIOS area costs ~4,096 temporary mappings of 1–16 pages and
//! ~70,000 single-page TLB flushes. Each `invlpg` is a VM exit wherever the host shadows
//! the guest's page tables (a nested hypervisor without usable nested paging, as in the
//! lab), and there those flushes took ~10 s of a 35 s Debian boot. Found at 639 KiB, the
//! search ends there. With ACPI's local APICs and IOAPIC, Linux then ignores the table's
//! entries; with `acpi=off` it uses them, which is why they are complete and right.
//!
//! Where: the floating pointer at [`MPF_ADDR`], in the area `boot/linux.rs` reserves in the
//! e820 map (0x9fc00–0xa0000, type 2); the configuration table wherever the caller puts it
//! in reserved memory (after the ACPI tables: 255 vCPUs need 5.4 KiB, more than the 1,008
//! bytes left after the pointer).

/// Guest-physical address of the MP floating pointer (639 KiB: the second place Linux
/// scans, and e820-reserved).
pub const MPF_ADDR: u64 = 0x9_fc00;
/// The local APIC version a processor entry names (KVM's in-kernel local APIC).
const LAPIC_VERSION: u8 = 0x14;
/// The IOAPIC version (KVM's in-kernel IOAPIC).
const IOAPIC_VERSION: u8 = 0x11;
/// IOAPIC pins: ISA IRQ n is pin n for every n below this (KVM's default GSI routing).
const IOAPIC_PINS: u8 = 24;
const ISA_BUS: u8 = 0;

/// The table's size in bytes for `cpus` vCPUs (header and entries, the pointer aside).
pub fn config_table_len(cpus: u32) -> usize {
    44 + 20 * cpus as usize + 8 + 8 + 8 * IOAPIC_PINS as usize + 2 * 8
}

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

/// The floating pointer (at [`MPF_ADDR`]) and the configuration table (at `table_addr`)
/// for `cpus` vCPUs whose IOAPIC has the id `ioapic_id` and its registers at
/// `ioapic_addr`; the local APICs at `lapic_addr`.
pub fn build_tables(
    cpus: u32,
    ioapic_id: u8,
    ioapic_addr: u32,
    lapic_addr: u32,
    table_addr: u32,
) -> Vec<(u64, Vec<u8>)> {
    let mut entries = Vec::with_capacity(config_table_len(cpus) - 44);
    let mut count = 0u16;
    for cpu in 0..cpus {
        entries.push(0); // processor
        entries.push(cpu as u8); // local APIC id
        entries.push(LAPIC_VERSION);
        entries.push(if cpu == 0 { 0b11 } else { 0b01 }); // enabled, bootstrap processor
        entries.extend_from_slice(&0x600u32.to_le_bytes()); // signature: family 6
        entries.extend_from_slice(&0x201u32.to_le_bytes()); // features: FPU, APIC
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[1, ISA_BUS]); // bus
    entries.extend_from_slice(b"ISA   ");
    entries.extend_from_slice(&[2, ioapic_id, IOAPIC_VERSION, 1]); // IOAPIC, enabled
    entries.extend_from_slice(&ioapic_addr.to_le_bytes());
    count += 2;
    for pin in 0..IOAPIC_PINS {
        // I/O interrupt: vectored, the bus's polarity and trigger, ISA IRQ `pin` -> `pin`.
        entries.extend_from_slice(&[3, 0, 0, 0, ISA_BUS, pin, ioapic_id, pin]);
        count += 1;
    }
    // Local interrupts: ExtINT on LINT0 and NMI on LINT1 of every local APIC (0xff).
    entries.extend_from_slice(&[4, 3, 0, 0, ISA_BUS, 0, 0xff, 0]);
    entries.extend_from_slice(&[4, 1, 0, 0, ISA_BUS, 0, 0xff, 1]);
    count += 2;

    let len = 44 + entries.len();
    debug_assert_eq!(len, config_table_len(cpus));
    let mut table = Vec::with_capacity(len);
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&(len as u16).to_le_bytes());
    table.push(4); // specification 1.4
    table.push(0); // checksum, below
    table.extend_from_slice(b"DENSEVM ");
    table.extend_from_slice(b"densevm     ");
    table.extend_from_slice(&0u32.to_le_bytes()); // no OEM table
    table.extend_from_slice(&0u16.to_le_bytes());
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&lapic_addr.to_le_bytes());
    table.extend_from_slice(&[0; 4]); // no extended table
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut pointer = Vec::with_capacity(16);
    pointer.extend_from_slice(b"_MP_");
    pointer.extend_from_slice(&table_addr.to_le_bytes());
    pointer.extend_from_slice(&[1, 4, 0]); // 16 bytes long, specification 1.4, checksum
    pointer.extend_from_slice(&[0; 5]); // a configuration table (no default one), no IMCR
    pointer[10] = checksum(&pointer);
    vec![(MPF_ADDR, pointer), (u64::from(table_addr), table)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    #[test]
    fn the_pointer_and_table_parse_back() {
        let tables = build_tables(3, 3, 0xfec0_0000, 0xfee0_0000, 0xe_8000);
        let (at, pointer) = &tables[0];
        assert_eq!(*at, MPF_ADDR);
        assert_eq!(pointer.len(), 16);
        assert_eq!(&pointer[..4], b"_MP_");
        assert_eq!(sum(pointer), 0, "pointer checksum");
        assert_eq!(
            u32::from_le_bytes(pointer[4..8].try_into().unwrap()),
            0xe_8000
        );
        assert_eq!((pointer[8], pointer[9], pointer[11]), (1, 4, 0));

        let (at, table) = &tables[1];
        assert_eq!(*at, 0xe_8000);
        assert_eq!(&table[..4], b"PCMP");
        assert_eq!(sum(table), 0, "table checksum");
        let len = u16::from_le_bytes(table[4..6].try_into().unwrap()) as usize;
        assert_eq!(
            (len, table.len()),
            (config_table_len(3), config_table_len(3))
        );
        assert_eq!(
            u32::from_le_bytes(table[36..40].try_into().unwrap()),
            0xfee0_0000
        );
        // Walk the entries as Linux does: each type has its fixed size.
        let count = u16::from_le_bytes(table[34..36].try_into().unwrap());
        let (mut at, mut cpus, mut pins) = (44, Vec::new(), Vec::new());
        for _ in 0..count {
            match table[at] {
                0 => {
                    cpus.push((table[at + 1], table[at + 3]));
                    at += 20;
                }
                1 => {
                    assert_eq!(&table[at + 2..at + 8], b"ISA   ");
                    at += 8;
                }
                2 => {
                    assert_eq!((table[at + 1], table[at + 3]), (3, 1));
                    assert_eq!(
                        u32::from_le_bytes(table[at + 4..at + 8].try_into().unwrap()),
                        0xfec0_0000
                    );
                    at += 8;
                }
                3 => {
                    assert_eq!(table[at + 6], 3, "destination IOAPIC id");
                    assert_eq!(table[at + 5], table[at + 7], "ISA IRQ n on pin n");
                    pins.push(table[at + 7]);
                    at += 8;
                }
                4 => at += 8,
                other => panic!("entry type {other} at {at}"),
            }
        }
        assert_eq!(at, len, "entries fill the table exactly");
        assert_eq!(cpus, vec![(0, 0b11), (1, 0b01), (2, 0b01)]);
        assert_eq!(pins, (0..IOAPIC_PINS).collect::<Vec<_>>());
    }

    #[test]
    fn the_table_for_255_cpus_is_the_size_it_says() {
        let tables = build_tables(255, 255, 0xfec0_0000, 0xfee0_0000, 0xe_8000);
        assert_eq!(tables[1].1.len(), config_table_len(255));
        assert_eq!(sum(&tables[1].1), 0);
        assert!(config_table_len(255) < 0x1800);
    }
}
