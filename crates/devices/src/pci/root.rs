//! Configuration mechanism #1 (ports 0xcf8–0xcff): the address latch, a host bridge at
//! 00:00.0 and the functions added at 00:01.0, 00:02.0, ... Every other function reads as
//! absent (all ones).

use super::state::{PciRootState, PciStateError};
use crate::{BusDevice, GuestRequest};
use std::sync::{Arc, Mutex};

/// Address port (the data port follows at +4).
pub const PCI_CONFIG_BASE: u64 = 0xcf8;
/// Ports covered: address (4) and data (4).
pub const PCI_CONFIG_LEN: u64 = 8;

const ENABLE: u32 = 1 << 31;
/// Intel, as Linux's type-1 sanity check wants a known host bridge vendor.
const VENDOR_INTEL: u16 = 0x8086;
const HOST_BRIDGE_ID: u16 = 0x0d57;
const CLASS_HOST_BRIDGE: u32 = 0x06_00_00;
/// Device numbers on bus 0 (0 is the host bridge).
const MAX_DEVICES: usize = 32;

/// A PCI function's configuration space as the guest reaches it.
pub trait PciFunction: Send {
    /// The dword at config-space dword index `reg` (0..64).
    fn config_read(&mut self, reg: usize) -> u32;
    /// A write of `data` (1, 2 or 4 bytes) at byte `offset` within dword `reg`.
    fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]);
}

type SharedFunction = Arc<Mutex<dyn PciFunction>>;

/// The config-space ports, the host bridge and the functions on bus 0.
#[derive(Default)]
pub struct PciRoot {
    address: u32,
    functions: Vec<Option<SharedFunction>>,
}

impl PciRoot {
    /// A root with only the host bridge.
    pub fn new() -> Self {
        Self {
            address: 0,
            functions: vec![None; MAX_DEVICES],
        }
    }

    /// Adds `function` at the next free device number (function 0); returns the device
    /// number, or `None` when bus 0 is full.
    pub fn add(&mut self, function: SharedFunction) -> Option<u8> {
        let slot = (1..MAX_DEVICES).find(|&d| self.functions[d].is_none())?;
        self.functions[slot] = Some(function);
        Some(slot as u8)
    }

    /// The latched function, if it exists: `None` for absent ones, `Some(None)` for the
    /// host bridge.
    fn target(&self) -> Option<Option<&SharedFunction>> {
        if self.address & ENABLE == 0 {
            return None;
        }
        let bus = (self.address >> 16) & 0xff;
        let device = ((self.address >> 11) & 0x1f) as usize;
        let function = (self.address >> 8) & 0x7;
        if bus != 0 || function != 0 {
            return None;
        }
        if device == 0 {
            return Some(None);
        }
        self.functions.get(device)?.as_ref().map(Some)
    }

    fn host_bridge_dword(register: usize) -> u32 {
        match register {
            0 => u32::from(HOST_BRIDGE_ID) << 16 | u32::from(VENDOR_INTEL),
            2 => CLASS_HOST_BRIDGE << 8, // class code, revision 0
            _ => 0,                      // command/status, header type 0, no BARs
        }
    }

    fn config_dword(&self) -> u32 {
        let reg = ((self.address & 0xfc) >> 2) as usize;
        match self.target() {
            None => u32::MAX,
            Some(None) => Self::host_bridge_dword(reg),
            Some(Some(f)) => lock(f).config_read(reg),
        }
    }
}

impl PciRoot {
    fn slots(&self) -> Vec<u8> {
        (1..MAX_DEVICES)
            .filter(|&d| self.functions[d].is_some())
            .map(|d| d as u8)
            .collect()
    }

    /// The address latch and the host bridge (for a snapshot). The functions are saved
    /// through their own devices (virtio-pci transports).
    pub fn save_state(&self) -> PciRootState {
        PciRootState {
            address: self.address,
            host_bridge: (0..64).map(Self::host_bridge_dword).collect(),
            slots: self.slots(),
        }
    }

    /// Applies a saved state. Call it after adding the restored functions, in the order of
    /// the snapshot's VM: the device numbers holding a function must be the saved ones.
    /// Nothing changes when the state is refused.
    pub fn restore_state(&mut self, state: &PciRootState) -> Result<(), PciStateError> {
        if state.host_bridge.len() != 64 {
            return Err(PciStateError::ConfigLength {
                got: state.host_bridge.len(),
            });
        }
        for (reg, &saved) in state.host_bridge.iter().enumerate() {
            let current = Self::host_bridge_dword(reg);
            if saved != current {
                return Err(PciStateError::HostBridge {
                    reg,
                    saved,
                    current,
                });
            }
        }
        let current = self.slots();
        if state.slots != current {
            return Err(PciStateError::Slots {
                saved: state.slots.clone(),
                current,
            });
        }
        self.address = state.address;
        Ok(())
    }
}

fn lock(f: &SharedFunction) -> std::sync::MutexGuard<'_, dyn PciFunction + 'static> {
    f.lock().unwrap_or_else(|p| p.into_inner())
}

impl BusDevice for PciRoot {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = if offset < 4 {
            self.address
        } else {
            self.config_dword()
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
            return None;
        }
        let within = (offset - 4) as usize;
        if within + data.len() > 4 {
            return None;
        }
        let reg = ((self.address & 0xfc) >> 2) as usize;
        if let Some(Some(f)) = self.target() {
            lock(f).config_write(reg, within, data);
        }
        // The host bridge's registers are read-only.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read32(d: &mut PciRoot, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        d.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    struct Regs([u32; 64]);
    impl PciFunction for Regs {
        fn config_read(&mut self, reg: usize) -> u32 {
            self.0[reg]
        }
        fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]) {
            let mut b = self.0[reg].to_le_bytes();
            b[offset..offset + data.len()].copy_from_slice(data);
            self.0[reg] = u32::from_le_bytes(b);
        }
    }

    #[test]
    fn host_bridge_answers_and_other_functions_are_absent() {
        let mut d = PciRoot::new();
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

    #[test]
    fn added_functions_get_their_config_accesses() {
        let mut d = PciRoot::new();
        let mut regs = [0u32; 64];
        regs[0] = 0x1042_1af4;
        let f: SharedFunction = Arc::new(Mutex::new(Regs(regs)));
        assert_eq!(d.add(f.clone()), Some(1));
        d.write(0, &(0x8000_0000u32 | 1 << 11).to_le_bytes());
        assert_eq!(read32(&mut d, 4), 0x1042_1af4);
        // A word write at +2 of dword 1 lands at byte offset 2.
        d.write(0, &(0x8000_0004u32 | 1 << 11).to_le_bytes());
        d.write(6, &0xbeefu16.to_le_bytes());
        assert_eq!(read32(&mut d, 4), 0xbeef_0000);
        // Function 1 of device 1 and bus 1 are absent.
        d.write(0, &(0x8000_0000u32 | 1 << 11 | 1 << 8).to_le_bytes());
        assert_eq!(read32(&mut d, 4), u32::MAX);
        d.write(0, &(0x8001_0000u32 | 1 << 11).to_le_bytes());
        assert_eq!(read32(&mut d, 4), u32::MAX);
        for _ in 2..32 {
            assert!(d.add(f.clone()).is_some());
        }
        assert_eq!(
            d.add(f),
            None,
            "bus 0 holds 31 functions besides the bridge"
        );
    }

    #[test]
    fn state_keeps_the_latch_and_checks_the_slots() {
        let f: SharedFunction = Arc::new(Mutex::new(Regs([7; 64])));
        let mut a = PciRoot::new();
        a.add(f.clone());
        a.write(0, &(0x8000_0008u32 | 1 << 11).to_le_bytes());
        let saved = a.save_state();
        assert_eq!(saved.slots, [1]);

        let mut b = PciRoot::new();
        let e = b.restore_state(&saved).unwrap_err();
        assert!(matches!(e, PciStateError::Slots { .. }), "{e}");
        assert!(e.to_string().contains("same order"), "{e}");
        b.add(f);
        let mut bad = saved.clone();
        bad.host_bridge[0] = 0x1234_5678;
        let e = b.restore_state(&bad).unwrap_err();
        assert!(matches!(e, PciStateError::HostBridge { reg: 0, .. }), "{e}");
        bad.host_bridge.truncate(3);
        assert!(b.restore_state(&bad).is_err());
        assert_eq!(read32(&mut b, 0), 0, "a refused state changes nothing");
        b.restore_state(&saved).unwrap();
        assert_eq!(read32(&mut b, 0), 0x8000_0808, "the latch");
        assert_eq!(read32(&mut b, 4), 7, "reads the function it latched");
        assert_eq!(b.save_state(), saved);
    }
}
