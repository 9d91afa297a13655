//! x86_64 CPU state set-up (GDT, identity page tables, long-mode registers, CPUID) and the
//! firmware tables a Linux guest reads (ACPI, MP).

pub mod acpi;
pub mod cpuid;
pub mod gdt;
pub mod mptable;
pub mod paging;
pub mod regs;
pub mod vmgenid;

/// Every firmware table a Linux guest reads, as `(guest address, bytes)`: ACPI's, the MP
/// floating pointer, and the MP configuration table after the last ACPI table in the
/// same reserved area (below the VM generation ID's page).
pub fn firmware_tables(cpus: u32) -> Vec<(u64, Vec<u8>)> {
    let mut tables = acpi::build_tables(cpus);
    let end = tables
        .iter()
        .map(|(at, bytes)| at + bytes.len() as u64)
        .max()
        .unwrap_or(acpi::RSDP_ADDR);
    let mp_at = end.next_multiple_of(16);
    assert!(
        mp_at + mptable::config_table_len(cpus) as u64 <= vmgenid::VMGENID_ADDR,
        "the MP table ({mp_at:#x}) overlaps the VM generation ID"
    );
    tables.extend(mptable::build_tables(
        cpus,
        acpi::ioapic_id(cpus),
        acpi::IOAPIC_ADDR,
        acpi::LAPIC_ADDR,
        mp_at as u32,
    ));
    tables
}

#[cfg(test)]
mod tests {
    #[test]
    fn firmware_tables_for_254_cpus_fit_their_reserved_areas() {
        let tables = super::firmware_tables(254);
        let mut spans: Vec<(u64, u64)> = tables
            .iter()
            .map(|(at, bytes)| (*at, at + bytes.len() as u64))
            .collect();
        spans.sort();
        for pair in spans.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "overlap: {pair:x?}");
        }
        let (pointer, table) = (&tables[tables.len() - 2], &tables[tables.len() - 1]);
        assert_eq!(pointer.0, super::mptable::MPF_ADDR);
        assert!(
            pointer.0 + 16 <= 0xa_0000,
            "the pointer stays in base memory's last KiB"
        );
        assert!(table.0 >= super::acpi::RSDP_ADDR);
        assert!(table.0 + table.1.len() as u64 <= super::vmgenid::VMGENID_ADDR);
    }
}
