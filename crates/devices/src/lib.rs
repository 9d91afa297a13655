//! densevm's emulated devices and the buses that route guest port and MMIO accesses to
//! them. Devices see nothing of KVM or the VMM core: they answer accesses and may return a
//! [`GuestRequest`] that the VMM acts on (stop the VM, record a trace mark, ...).

pub mod bus;
pub mod legacy;
pub mod pci;

pub use bus::{Bus, BusDevice, BusError};

/// Something a guest access asks of the VMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestRequest {
    /// The guest asked to end the VM with this process exit code (debug-exit port).
    Exit(u8),
    /// The guest asked for a reset (i8042 0xfe, ACPI reset register); densevm ends the VM.
    Reset,
    /// The guest powered off (ACPI S5).
    PowerOff,
    /// The guest recorded a boot trace mark.
    TraceMark(u8),
    /// The probe guest hit a CPU exception with this vector.
    GuestFault(u8),
    /// The probe guest idles this many milliseconds on its vCPU thread (sleep port); the
    /// vCPU naps outside the guest and wakes early when the VMM pauses or stops it.
    Sleep(u8),
}
