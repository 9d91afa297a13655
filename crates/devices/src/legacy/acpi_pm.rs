//! The hardware-reduced ACPI sleep-control and reset registers (FADT `SLEEP_CONTROL_REG`
//! and `RESET_REG`): how an ACPI guest powers off or resets the VM.

use crate::{BusDevice, GuestRequest};

/// Port of the sleep control register; the reset register follows it.
pub const ACPI_PM_BASE: u64 = 0x3c0;
/// Ports covered: sleep control, reset.
pub const ACPI_PM_LEN: u64 = 2;
/// The value the guest writes to the reset register.
pub const ACPI_RESET_VALUE: u8 = 0x1;
/// The sleep type the DSDT's `_S5` package advertises for soft-off.
pub const ACPI_S5_SLEEP_TYPE: u8 = 5;

const SLP_EN: u8 = 1 << 5;

/// Sleep-control and reset registers as one bus device.
#[derive(Debug, Default)]
pub struct AcpiPm;

impl BusDevice for AcpiPm {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<GuestRequest> {
        let value = *data.first()?;
        match offset {
            0 if value & SLP_EN != 0 && (value >> 2) & 0x7 == ACPI_S5_SLEEP_TYPE => {
                Some(GuestRequest::PowerOff)
            }
            1 if value == ACPI_RESET_VALUE => Some(GuestRequest::Reset),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_and_reset() {
        let mut pm = AcpiPm;
        assert_eq!(
            pm.write(0, &[(5 << 2) | SLP_EN]),
            Some(GuestRequest::PowerOff)
        );
        assert_eq!(pm.write(0, &[5 << 2]), None);
        assert_eq!(pm.write(0, &[(3 << 2) | SLP_EN]), None);
        assert_eq!(pm.write(1, &[1]), Some(GuestRequest::Reset));
        assert_eq!(pm.write(1, &[2]), None);
    }
}
