//! Legacy PC devices on the port I/O bus.

mod acpi_pm;
mod cmos;
mod debug_port;
mod i8042;
mod serial;

pub use acpi_pm::{AcpiPm, ACPI_PM_BASE, ACPI_PM_LEN, ACPI_RESET_VALUE, ACPI_S5_SLEEP_TYPE};
pub use cmos::{Cmos, CmosSnapshot, CMOS_BASE, CMOS_LEN};
pub use debug_port::{DebugPort, DEBUG_PORT_BASE, DEBUG_PORT_LEN};
pub use i8042::{I8042, I8042_BASE, I8042_LEN};
pub use serial::{EventFdTrigger, Serial, SerialSnapshot, COM1_BASE, COM1_GSI, SERIAL_LEN};
