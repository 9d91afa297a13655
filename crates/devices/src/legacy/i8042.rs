//! The i8042 keyboard controller, for its one job here: CPU reset (0xfe to port 0x64).

use crate::{BusDevice, GuestRequest};
use std::sync::atomic::{AtomicBool, Ordering};
use vm_superio::Trigger;

/// Base port of the controller (data port 0x60; command/status port 0x64).
pub const I8042_BASE: u64 = 0x60;
/// Ports covered: 0x60..=0x64.
pub const I8042_LEN: u64 = 5;

/// Records that the guest asked for a reset.
#[derive(Default)]
struct ResetFlag(AtomicBool);

impl Trigger for ResetFlag {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// The i8042 as a bus device.
pub struct I8042 {
    dev: vm_superio::I8042Device<ResetFlag>,
}

impl Default for I8042 {
    fn default() -> Self {
        Self {
            dev: vm_superio::I8042Device::new(ResetFlag::default()),
        }
    }
}

impl I8042 {
    /// A controller with no pending reset.
    pub fn new() -> Self {
        Self::default()
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = self.dev.read(offset as u8);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<GuestRequest> {
        let value = *data.first()?;
        let Ok(()) = self.dev.write(offset as u8, value);
        self.dev
            .reset_evt()
            .0
            .swap(false, Ordering::Relaxed)
            .then_some(GuestRequest::Reset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command() {
        let mut dev = I8042::new();
        assert_eq!(dev.write(4, &[0x01]), None);
        assert_eq!(dev.write(0, &[0xfe]), None);
        assert_eq!(dev.write(4, &[0xfe]), Some(GuestRequest::Reset));
        assert_eq!(dev.write(4, &[0x00]), None);
    }
}
