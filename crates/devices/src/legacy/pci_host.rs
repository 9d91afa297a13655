//! PCI configuration mechanism #1 (ports 0xcf8–0xcff) with one host bridge at 00:00.0 and
//! nothing else on bus 0.
//!
//! densevm has no PCI devices, but Linux only finishes its x86 resource survey (which
//! registers e820 persistent-memory ranges, the source of `/dev/pmemN` for `--pmem`)
//! after PCI initialises, and PCI only initialises when config space answers. The bridge is
//! read-only; every other function reads as absent (all ones).

use crate::{BusDevice, GuestRequest};

/// Address port (the data port follows at +4).
pub const PCI_CONFIG_BASE: u64 = 0xcf8;
/// Ports covered: address (4) and data (4).
pub const PCI_CONFIG_LEN: u64 = 8;

const ENABLE: u32 = 1 << 31;
/// Intel, as Linux's type-1 sanity check wants a known host bridge vendor.
const VENDOR_INTEL: u16 = 0x8086;
const DEVICE_ID: u16 = 0x0d57;
const CLASS_HOST_BRIDGE: u32 = 0x06_00_00;

/// The config-space ports and the host bridge behind them.
#[derive(Debug, Default)]
pub struct PciHostBridge {
    address: u32,
}

impl PciHostBridge {
    /// A bridge with no address latched.
    pub fn new() -> Self {
        Self::default()
    }

    /// The dword at config-space `register` of the latched function.
    fn config_dword(&self, register: u32) -> u32 {
        let bus_dev_fn = (self.address >> 8) & 0xffff;
        if self.address & ENABLE == 0 || bus_dev_fn != 0 {
            return u32::MAX;
        }
        match register {
            0x00 => u32::from(DEVICE_ID) << 16 | u32::from(VENDOR_INTEL),
            0x04 => 0x0000_0000,            // command, status
            0x08 => CLASS_HOST_BRIDGE << 8, // class code, revision 0
            0x0c => 0x0000_0000,            // header type 0, single function
            _ => 0,
        }
    }
}

impl BusDevice for PciHostBridge {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = if offset < 4 {
            self.address
        } else {
            self.config_dword(self.address & 0xfc)
        };
        let shift = (offset % 4) as usize;
        let bytes = value.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = bytes.get(shift + i).copied().unwrap_or(0xff);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<GuestRequest> {
        if offset < 4 {
            // Byte or word writes update their part of the latch (Linux's type-2 probe
            // writes one byte to 0xcfb).
            let mut bytes = self.address.to_le_bytes();
            for (i, b) in data.iter().enumerate() {
                if let Some(slot) = bytes.get_mut(offset as usize + i) {
                    *slot = *b;
                }
            }
            self.address = u32::from_le_bytes(bytes);
        }
        // Data writes: the bridge's registers are read-only.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read32(d: &mut PciHostBridge, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        d.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn host_bridge_answers_and_other_functions_are_absent() {
        let mut d = PciHostBridge::new();
        d.write(0, &0x8000_0000u32.to_le_bytes());
        assert_eq!(
            read32(&mut d, 0),
            0x8000_0000,
            "the address latch reads back"
        );
        assert_eq!(read32(&mut d, 4), 0x0d57_8086);
        d.write(0, &0x8000_0008u32.to_le_bytes());
        assert_eq!(read32(&mut d, 4) >> 8, 0x06_00_00);
        let mut word = [0u8; 2];
        d.read(6, &mut word);
        assert_eq!(
            u16::from_le_bytes(word),
            0x0600,
            "a word read at +2 of the data port"
        );
        d.write(0, &(0x8000_0000u32 | 1 << 11).to_le_bytes()); // device 1
        assert_eq!(read32(&mut d, 4), u32::MAX);
        d.write(0, &0x0000_0000u32.to_le_bytes()); // disabled
        assert_eq!(read32(&mut d, 4), u32::MAX);
        d.write(3, &[0x01]); // byte write to 0xcfb
        assert_eq!(read32(&mut d, 0), 0x0100_0000);
    }
}
