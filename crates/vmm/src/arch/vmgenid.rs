//! Virtual Machine Generation ID (Microsoft's "VM Generation ID" spec, Linux's
//! `drivers/virt/vmgenid.c`): 16 random bytes at a fixed guest-physical address, described
//! by an ACPI device, that change whenever the VM becomes a new instance (restored from a
//! snapshot, cloned). A Linux guest reads them at boot and again on `Notify(VGEN, 0x80)`;
//! when they changed it reseeds its RNG at once (`add_vmfork_randomness`: "crng reseeded
//! due to virtual machine fork") and sends a `NEW_VMGENID=1` uevent.
//!
//! The notification comes from an ACPI Generic Event Device (`ACPI0013`, Linux's
//! `drivers/acpi/evged.c`, always built in with ACPI) with one edge-triggered interrupt on
//! IOAPIC pin [`GED_GSI`]: its `_EVT` method notifies `\_SB_.VGEN`. A single event needs no
//! status register, so the GED is AML only; the VMM raises it by pulsing the GSI
//! ([`notify_guest`]).
//!
//! Where the ID lives: [`VMGENID_ADDR`], the last page of the 64 KiB below 0xf0000 in the
//! area `boot/linux.rs` reserves in the e820 map for the ACPI tables
//! (`acpi::RSDP_ADDR..acpi::ACPI_AREA_END`, type 2). Linux never allocates reserved memory
//! and maps the ID with `memremap(MEMREMAP_WB)`; the tables (ACPI's, then the MP
//! configuration table) are placed from 0xe0040 and `arch::firmware_tables` keeps them
//! below this page. 0xe0000–0xeffff is outside the ranges
//! Linux scans for MP (0xf0000–0xfffff, the EBDA) and SMBIOS/DMI (0xf0000–0xfffff)
//! signatures, so random bytes there can never be mistaken for a firmware table.

use acpi_tables::aml::{
    Arg, Device, Equal, If, Interrupt, Method, Name, Notify, Package, Path, ResourceTemplate,
};
use acpi_tables::{Aml, AmlSink};
use kvm_ioctls::VmFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest-physical address of the 16-byte generation ID (e820-reserved, see the module
/// documentation).
pub const VMGENID_ADDR: u64 = 0xe_f000;
/// Size of the generation ID.
pub const VMGENID_LEN: usize = 16;
/// The IOAPIC pin (GSI) of the Generic Event Device: edge-triggered, active high. GSI 4
/// is COM1; 5 is otherwise unused (the PIT is 0, virtio's MSI routes start at 24).
pub const GED_GSI: u32 = 5;
/// The ACPI notification value meaning "device check / the ID changed" for VGEN.
const NOTIFY_VALUE: u8 = 0x80;

/// Why a generation ID could not be written.
#[derive(Debug, thiserror::Error)]
pub enum VmGenIdError {
    /// getrandom(2) failed.
    #[error("cannot draw a VM generation ID from getrandom(2): {0}")]
    Random(#[source] std::io::Error),
    /// The ID's page is not in guest memory.
    #[error("cannot write the VM generation ID at {VMGENID_ADDR:#x}: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    /// KVM_IRQ_LINE failed (no in-kernel irqchip?).
    #[error("cannot raise the VM generation ID notification (GSI {GED_GSI}): {0}")]
    Notify(#[source] std::io::Error),
}

impl From<VmGenIdError> for crate::VmmError {
    fn from(e: VmGenIdError) -> Self {
        let (what, source) = match e {
            VmGenIdError::Random(source) => ("getrandom (VM generation ID)", source),
            VmGenIdError::GuestMemory(e) => (
                "writing the VM generation ID into guest memory",
                std::io::Error::other(e),
            ),
            VmGenIdError::Notify(source) => ("KVM_IRQ_LINE (VM generation ID)", source),
        };
        crate::VmmError::Host { what, source }
    }
}

/// 16 bytes from the host's entropy pool (getrandom(2), retried on EINTR).
pub fn fresh_id() -> Result<[u8; VMGENID_LEN], VmGenIdError> {
    let mut id = [0u8; VMGENID_LEN];
    let mut filled = 0;
    while filled < id.len() {
        let rest = &mut id[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes for the whole
        // call; getrandom writes at most that many bytes into it.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(VmGenIdError::Random(err));
        }
        filled += n as usize;
    }
    Ok(id)
}

/// Writes a fresh random generation ID into guest memory at [`VMGENID_ADDR`] and returns
/// it. For Linux guests only (probe guests use that memory for themselves): at boot, next
/// to the ACPI tables. A restore or clone calls [`new_instance`] instead.
pub fn write_new_id(mem: &GuestMemoryMmap) -> Result<[u8; VMGENID_LEN], VmGenIdError> {
    let id = fresh_id()?;
    mem.write_slice(&id, GuestAddress(VMGENID_ADDR))?;
    Ok(id)
}

/// A restored VM or a clone is a new instance: writes a fresh ID and raises the GED
/// interrupt ([`notify_guest`]), so the guest reseeds its RNG when it runs. Call it for a
/// restored Linux guest once the in-kernel irqchip and every vCPU's state (its LAPIC) are
/// restored, before or after the vCPU threads start.
pub fn new_instance(mem: &GuestMemoryMmap, vm: &VmFd) -> Result<[u8; VMGENID_LEN], VmGenIdError> {
    let id = write_new_id(mem)?;
    notify_guest(vm).map_err(VmGenIdError::Notify)?;
    Ok(id)
}

/// The generation ID currently in guest memory.
pub fn read_id(mem: &GuestMemoryMmap) -> Result<[u8; VMGENID_LEN], VmGenIdError> {
    let mut id = [0u8; VMGENID_LEN];
    mem.read_slice(&mut id, GuestAddress(VMGENID_ADDR))?;
    Ok(id)
}

/// Tells the guest the generation ID changed: pulses [`GED_GSI`] (KVM_IRQ_LINE high, then
/// low) on the in-kernel IOAPIC, so the GED's `_EVT` runs `Notify(\_SB_.VGEN, 0x80)`. The
/// VM must have an in-kernel irqchip whose state is final (KVM_SET_IRQCHIP and every
/// vCPU's KVM_SET_LAPIC done), or the interrupt is overwritten: it then waits in the
/// LAPIC until the vCPU runs. Safe from any thread; a guest that has not bound the GED
/// (its IOAPIC pin still masked) loses the edge, and reads the ID when it binds.
pub fn notify_guest(vm: &VmFd) -> std::io::Result<()> {
    let line = |level| {
        vm.set_irq_line(GED_GSI, level)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    };
    line(true)?;
    line(false)
}

/// The DSDT objects for the generation ID, to place inside `Scope(\_SB_)`:
///
/// ```text
/// Device (VGEN) {
///     Name (_HID, "QEMUVGID")            // any HID; Linux matches the _CID
///     Name (_CID, "VM_GEN_COUNTER")
///     Name (_DDN, "VM_Gen_Counter")      // what Windows looks for
///     Name (_STA, 0x0F)
///     Name (ADDR, Package { 0x000EF000, 0 })   // low, high 32 bits of VMGENID_ADDR
/// }
/// Device (GED0) {
///     Name (_HID, "ACPI0013")
///     Name (_UID, 0)
///     Name (_CRS, ResourceTemplate { Interrupt (Consumer, Edge, ActiveHigh, Exclusive) {5} })
///     Method (_EVT, 1) { If (Arg0 == 5) { Notify (\_SB_.VGEN, 0x80) } }
/// }
/// ```
pub struct VmGenIdAml;

impl Aml for VmGenIdAml {
    fn to_aml_bytes(&self, sink: &mut dyn AmlSink) {
        let hid = Name::new("_HID".into(), &"QEMUVGID");
        let cid = Name::new("_CID".into(), &"VM_GEN_COUNTER");
        let ddn = Name::new("_DDN".into(), &"VM_Gen_Counter");
        let sta = Name::new("_STA".into(), &0x0fu8);
        let lo = VMGENID_ADDR as u32;
        let hi = (VMGENID_ADDR >> 32) as u32;
        let addr_pkg = Package::new(vec![&lo, &hi]);
        let addr = Name::new("ADDR".into(), &addr_pkg);
        Device::new("VGEN".into(), vec![&hid, &cid, &ddn, &sta, &addr]).to_aml_bytes(sink);

        let ged_hid = Name::new("_HID".into(), &"ACPI0013");
        let ged_uid = Name::new("_UID".into(), &0u8);
        let irq = Interrupt::new(true, true, false, false, GED_GSI);
        let crs = ResourceTemplate::new(vec![&irq]);
        let ged_crs = Name::new("_CRS".into(), &crs);
        let vgen = Path::new("\\_SB_.VGEN");
        let notify = Notify::new(&vgen, &NOTIFY_VALUE);
        let gsi = GED_GSI;
        let is_ours = Equal::new(&Arg(0), &gsi);
        let when = If::new(&is_ours, vec![&notify]);
        let evt = Method::new("_EVT".into(), 1, false, vec![&when]);
        Device::new("GED0".into(), vec![&ged_hid, &ged_uid, &ged_crs, &evt]).to_aml_bytes(sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aml() -> Vec<u8> {
        let mut out = Vec::new();
        VmGenIdAml.to_aml_bytes(&mut out);
        out
    }

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    /// AML string object: StringPrefix, the bytes, NUL.
    fn aml_string(s: &str) -> Vec<u8> {
        let mut v = vec![0x0d];
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        v
    }

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    #[test]
    fn aml_names_the_device_and_its_ids() {
        let aml = aml();
        for name in ["VGEN", "GED0", "ADDR", "_EVT", "_CRS", "_STA"] {
            assert!(find(&aml, name.as_bytes()).is_some(), "{name} missing");
        }
        for (name, value) in [
            ("_HID", "QEMUVGID"),
            ("_CID", "VM_GEN_COUNTER"),
            ("_DDN", "VM_Gen_Counter"),
            ("_HID", "ACPI0013"),
        ] {
            let mut obj = vec![0x08]; // NameOp
            obj.extend_from_slice(name.as_bytes());
            obj.extend_from_slice(&aml_string(value));
            assert!(
                find(&aml, &obj).is_some(),
                "Name({name}, \"{value}\") missing"
            );
        }
    }

    #[test]
    fn aml_addr_package_holds_the_id_address() {
        let aml = aml();
        let at = find(&aml, b"ADDR").expect("ADDR") + 4;
        // PackageOp, PkgLength (one byte: the package is short), NumElements 2, then the
        // low half as a DWordConst and the high half (0) as ZeroOp.
        let mut expect = vec![0x12, 0, 2, 0x0c];
        expect.extend_from_slice(&(VMGENID_ADDR as u32).to_le_bytes());
        expect.push(0x00);
        expect[1] = (expect.len() - 1) as u8;
        assert_eq!(&aml[at..at + expect.len()], &expect[..]);
        let lo = u32::from_le_bytes(aml[at + 4..at + 8].try_into().unwrap());
        assert_eq!(u64::from(lo), VMGENID_ADDR);
    }

    #[test]
    fn aml_ged_interrupt_and_notify() {
        let aml = aml();
        // Extended Interrupt descriptor: consumer, edge, active high, exclusive; 1 GSI.
        let mut irq = vec![0x89, 6, 0, 0b0011, 1];
        irq.extend_from_slice(&GED_GSI.to_le_bytes());
        assert!(find(&aml, &irq).is_some(), "GED interrupt descriptor");
        // NotifyOp \_SB_.VGEN (DualNamePrefix) 0x80 (BytePrefix).
        let mut notify = vec![0x86, b'\\', 0x2e];
        notify.extend_from_slice(b"_SB_VGEN");
        notify.extend_from_slice(&[0x0a, 0x80]);
        assert!(find(&aml, &notify).is_some(), "Notify(\\_SB_.VGEN, 0x80)");
        // If (LEqual (Arg0, 5)).
        assert!(find(&aml, &[0x93, 0x68, 0x0a, GED_GSI as u8]).is_some());
    }

    #[test]
    fn ids_are_written_and_differ() {
        let mem = mem();
        assert_eq!(read_id(&mem).unwrap(), [0; VMGENID_LEN]);
        let first = write_new_id(&mem).unwrap();
        assert_ne!(first, [0; VMGENID_LEN]);
        assert_eq!(read_id(&mem).unwrap(), first);
        let second = write_new_id(&mem).unwrap();
        assert_ne!(first, second);
        assert_eq!(read_id(&mem).unwrap(), second);
        // Only the 16 bytes change.
        let mut around = [0u8; 2];
        mem.read_slice(&mut around[..1], GuestAddress(VMGENID_ADDR - 1))
            .unwrap();
        mem.read_slice(
            &mut around[1..],
            GuestAddress(VMGENID_ADDR + VMGENID_LEN as u64),
        )
        .unwrap();
        assert_eq!(around, [0, 0]);
    }

    #[test]
    fn writing_outside_guest_memory_fails() {
        let small = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        assert!(matches!(
            write_new_id(&small),
            Err(VmGenIdError::GuestMemory(_))
        ));
    }

    #[test]
    fn notify_pulses_the_line() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            eprintln!("skipped: no /dev/kvm");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        notify_guest(&vm).unwrap();
        let mem = mem();
        let id = new_instance(&mem, &vm).unwrap();
        assert_eq!(read_id(&mem).unwrap(), id);
        // Without an irqchip there is no line to raise.
        let bare = kvm.create_vm().unwrap();
        assert!(matches!(
            new_instance(&mem, &bare),
            Err(VmGenIdError::Notify(_))
        ));
    }
}
