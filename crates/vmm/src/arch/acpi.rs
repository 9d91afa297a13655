//! ACPI tables for Linux guests: RSDP → XSDT → {FADT (hardware-reduced, with sleep-control
//! and reset registers) → DSDT (`_S5_`, COM1, the PCI host bridge, the VM generation ID
//! and its Generic Event Device), MADT (one local APIC per vCPU, the IOAPIC)}.

use acpi_tables::aml::{
    AddressSpace as AmlAddressSpace, AddressSpaceCacheable, Device, EISAName, Interrupt, Name,
    Package, ResourceTemplate, Scope, IO,
};

/// The PCI memory window `[start, end)` the DSDT's host bridge declares (where densevm
/// places BARs: `device_manager::PCI_MMIO_BASE..PCI_MMIO_END`).
pub const PCI_MMIO_WINDOW: (u32, u32) = (0xd000_0000, 0xfe00_0000);
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use densevm_devices::legacy::{ACPI_PM_BASE, ACPI_RESET_VALUE, ACPI_S5_SLEEP_TYPE};

use super::vmgenid::{VmGenIdAml, VMGENID_ADDR};

/// Guest-physical address of the RSDP (inside the BIOS area Linux also scans).
pub const RSDP_ADDR: u64 = 0xe_0000;
/// End of the area reserved for ACPI tables.
pub const ACPI_AREA_END: u64 = 0x10_0000;
/// The in-kernel IOAPIC's MMIO base.
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
/// The local APIC's MMIO base.
pub const LAPIC_ADDR: u32 = 0xfee0_0000;

/// The IOAPIC's id: the first after the vCPUs' local APIC ids (the MADT and the MP table).
pub fn ioapic_id(cpus: u32) -> u8 {
    cpus as u8
}

const COM1_PORT: u16 = 0x3f8;
const COM1_IRQ: u32 = 4;
const OEM_ID: [u8; 6] = *b"DNSEVM";
const OEM_TABLE: [u8; 8] = *b"DENSEVM ";

fn bytes(aml: &dyn Aml) -> Vec<u8> {
    let mut out = Vec::new();
    aml.to_aml_bytes(&mut out);
    out
}

fn io_register(port: u64) -> GAS {
    GAS::new(AddressSpace::SystemIo, 8, 0, AccessSize::ByteAccess, port)
}

/// Builds every table for `cpus` vCPUs; returns `(guest address, bytes)` chunks, all
/// within `[RSDP_ADDR, VMGENID_ADDR)` (the generation ID's page, the rest of the reserved
/// `[RSDP_ADDR, ACPI_AREA_END)`, is written by `vmgenid::write_new_id`).
pub fn build_tables(cpus: u32) -> Vec<(u64, Vec<u8>)> {
    let mut next = RSDP_ADDR + 64;
    let mut place = |len: usize| {
        let at = next;
        next = (next + len as u64).next_multiple_of(16);
        at
    };

    let mut dsdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE, 1);
    let s5 = Package::new(vec![&ACPI_S5_SLEEP_TYPE]);
    dsdt.append_slice(&bytes(&Name::new("_S5_".into(), &s5)));
    // COM1 as an ACPI device: with hardware-reduced ACPI there is no legacy PIC and no
    // implicit ISA IRQ set-up, so the 8250 driver gets its interrupt (GSI 4, edge) from
    // this _CRS; without it the UART's transmit interrupt never reaches the guest.
    let hid = EISAName::new("PNP0501");
    let uid = 0u8;
    let io = IO::new(COM1_PORT, COM1_PORT, 1, 8);
    let irq = Interrupt::new(true, true, false, false, COM1_IRQ);
    let crs = ResourceTemplate::new(vec![&io, &irq]);
    let hid_name = Name::new("_HID".into(), &hid);
    let uid_name = Name::new("_UID".into(), &uid);
    let crs_name = Name::new("_CRS".into(), &crs);
    let com1 = Device::new("COM1".into(), vec![&hid_name, &uid_name, &crs_name]);
    // The PCI host bridge (virtio devices): Linux scans a PCI bus only for the roots ACPI
    // describes. Config access is mechanism #1 (ports 0xcf8–0xcff, no MCFG); bus 0 only;
    // BARs come from the 32-bit window densevm assigns them in.
    let pci_hid = EISAName::new("PNP0A08");
    let pci_cid = EISAName::new("PNP0A03");
    let zero = 0u8;
    let bus = AmlAddressSpace::new_bus_number(0u16, 0u16);
    let cfg_io = IO::new(0xcf8, 0xcf8, 1, 8);
    let mmio = AmlAddressSpace::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        PCI_MMIO_WINDOW.0,
        PCI_MMIO_WINDOW.1 - 1,
        None,
    );
    let pci_crs = ResourceTemplate::new(vec![&bus, &cfg_io, &mmio]);
    let pci_hid_name = Name::new("_HID".into(), &pci_hid);
    let pci_cid_name = Name::new("_CID".into(), &pci_cid);
    let pci_seg = Name::new("_SEG".into(), &zero);
    let pci_bbn = Name::new("_BBN".into(), &zero);
    let pci_uid = Name::new("_UID".into(), &zero);
    let pci_crs_name = Name::new("_CRS".into(), &pci_crs);
    let pci0 = Device::new(
        "PCI0".into(),
        vec![
            &pci_hid_name,
            &pci_cid_name,
            &pci_seg,
            &pci_bbn,
            &pci_uid,
            &pci_crs_name,
        ],
    );
    // The VM generation ID (VGEN) and the Generic Event Device that notifies it (GED0).
    dsdt.append_slice(&bytes(&Scope::new(
        "\\_SB_".into(),
        vec![&com1, &pci0, &VmGenIdAml],
    )));
    let dsdt_bytes = bytes(&dsdt);
    let dsdt_addr = place(dsdt_bytes.len());

    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE, 1)
        .dsdt_64(dsdt_addr)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::ResetRegSup);
    fadt.sleep_control_reg = io_register(ACPI_PM_BASE);
    fadt.sleep_status_reg = io_register(ACPI_PM_BASE);
    fadt.reset_reg = io_register(ACPI_PM_BASE + 1);
    fadt.reset_value = ACPI_RESET_VALUE;
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(*b"DENSEVM\0").into();
    let fadt_bytes = bytes(&fadt.finalize());
    let fadt_addr = place(fadt_bytes.len());

    let mut madt = MADT::new(
        OEM_ID,
        OEM_TABLE,
        1,
        LocalInterruptController::Address(LAPIC_ADDR),
    );
    for cpu in 0..cpus {
        madt.add_structure(ProcessorLocalApic::new(
            cpu as u8,
            cpu as u8,
            EnabledStatus::Enabled,
        ));
    }
    madt.add_structure(IoApic::new(ioapic_id(cpus), IOAPIC_ADDR, 0));
    let madt_bytes = bytes(&madt);
    let madt_addr = place(madt_bytes.len());

    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE, 1);
    xsdt.add_entry(fadt_addr);
    xsdt.add_entry(madt_addr);
    let xsdt_bytes = bytes(&xsdt);
    let xsdt_addr = place(xsdt_bytes.len());

    assert!(
        next <= VMGENID_ADDR,
        "ACPI tables ({next:#x}) overlap the VM generation ID"
    );

    let rsdp_bytes = bytes(&Rsdp::new(OEM_ID, xsdt_addr));
    vec![
        (RSDP_ADDR, rsdp_bytes),
        (dsdt_addr, dsdt_bytes),
        (fadt_addr, fadt_bytes),
        (madt_addr, madt_bytes),
        (xsdt_addr, xsdt_bytes),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checksum_ok(table: &[u8]) -> bool {
        table.iter().fold(0u8, |a, b| a.wrapping_add(*b)) == 0
    }

    #[test]
    fn tables_are_well_formed() {
        let tables = build_tables(4);
        assert_eq!(&tables[0].1[..8], b"RSD PTR ");
        let end = tables
            .iter()
            .map(|(a, b)| a + b.len() as u64)
            .max()
            .unwrap();
        assert!(end <= VMGENID_ADDR);
        for (addr, table) in &tables[1..] {
            let len = u32::from_le_bytes(table[4..8].try_into().unwrap()) as usize;
            assert_eq!(len, table.len(), "table at {addr:#x} length field");
            assert!(checksum_ok(table), "table at {addr:#x} checksum");
        }
        let madt = &tables[3].1;
        assert_eq!(&madt[..4], b"APIC");
        // header 44 bytes + 4 local APICs (8 bytes) + IOAPIC (12 bytes)
        assert_eq!(madt.len(), 44 + 4 * 8 + 12);
        let dsdt = &tables[1].1;
        assert!(dsdt.windows(4).any(|w| w == b"_S5_"));
        assert!(dsdt.windows(4).any(|w| w == b"COM1"));
        assert!(dsdt.windows(4).any(|w| w == b"PCI0"));
        assert!(dsdt.windows(4).any(|w| w == b"VGEN"));
        assert!(dsdt.windows(4).any(|w| w == b"GED0"));
    }

    #[test]
    fn tables_for_255_cpus_stay_below_the_generation_id() {
        let end = build_tables(255)
            .iter()
            .map(|(a, b)| a + b.len() as u64)
            .max()
            .unwrap();
        assert!(end <= VMGENID_ADDR, "tables end at {end:#x}");
        const { assert!(VMGENID_ADDR >= RSDP_ADDR && VMGENID_ADDR + 0x1000 <= ACPI_AREA_END) };
    }
}
