//! A type-0 configuration space: header, one 32-bit memory BAR, capabilities.

use super::state::{ConfigSpaceState, PciStateError};

/// Capability ID of MSI-X.
pub const CAP_ID_MSIX: u8 = 0x11;
/// Capability ID of vendor-specific capabilities (virtio's structure pointers).
pub const CAP_ID_VENDOR: u8 = 0x09;

const REGS: usize = 64;
const STATUS_CAP_LIST: u32 = 1 << 4;
/// Command bits a guest may set: memory space, bus master, INTx disable.
const COMMAND_WRITABLE: u32 = 0x0406;
const BAR0: usize = 4;
const CAP_PTR: usize = 13;
const FIRST_CAP: usize = 0x40;

/// Identity of a function.
#[derive(Debug, Clone, Copy)]
pub struct PciHeader {
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Revision.
    pub revision: u8,
    /// Class code (class, subclass, programming interface).
    pub class: u32,
    /// Subsystem vendor ID.
    pub subsystem_vendor: u16,
    /// Subsystem ID.
    pub subsystem: u16,
}

/// The 256-byte configuration space of one function.
#[derive(Debug, Clone)]
pub struct ConfigSpace {
    regs: [u32; REGS],
    writable: [u32; REGS],
    bar: Option<(u32, u32)>,
    bar_sizing: bool,
    next_cap: usize,
    last_cap_next: usize,
    relocation_logged: bool,
}

impl ConfigSpace {
    /// A header with no BAR and no capabilities (no INTx pin: MSI-X only).
    pub fn new(h: &PciHeader) -> Self {
        let mut regs = [0u32; REGS];
        regs[0] = u32::from(h.device) << 16 | u32::from(h.vendor);
        regs[2] = (h.class & 0xff_ffff) << 8 | u32::from(h.revision);
        regs[11] = u32::from(h.subsystem) << 16 | u32::from(h.subsystem_vendor);
        let mut writable = [0u32; REGS];
        writable[1] = COMMAND_WRITABLE;
        writable[15] = 0xff; // interrupt line
        Self {
            regs,
            writable,
            bar: None,
            bar_sizing: false,
            next_cap: FIRST_CAP,
            last_cap_next: CAP_PTR * 4,
            relocation_logged: false,
        }
    }

    /// Gives the function BAR 0: 32-bit, non-prefetchable memory at `addr` (aligned to
    /// `size`, a power of two of at least 4 KiB).
    pub fn set_bar0(&mut self, addr: u32, size: u32) {
        debug_assert!(size.is_power_of_two() && size >= 4096 && addr % size == 0);
        self.bar = Some((addr, size));
        self.regs[BAR0] = addr;
    }

    /// Appends a capability with `body` after its ID and next-pointer bytes; returns its
    /// byte offset. Its bytes are read-only until [`allow_write`](Self::allow_write).
    ///
    /// # Panics
    /// When the capabilities outgrow the 256-byte space (a construction bug, not guest input).
    pub fn add_capability(&mut self, id: u8, body: &[u8]) -> usize {
        let at = self.next_cap;
        let len = (2 + body.len()).next_multiple_of(4);
        assert!(
            at + len <= REGS * 4,
            "PCI capabilities overflow config space"
        );
        self.set_byte(self.last_cap_next, at as u8);
        self.set_byte(at, id);
        self.set_byte(at + 1, 0);
        for (i, b) in body.iter().enumerate() {
            self.set_byte(at + 2 + i, *b);
        }
        self.regs[1] |= STATUS_CAP_LIST << 16;
        self.last_cap_next = at + 1;
        self.next_cap = at + len;
        at
    }

    /// Lets the guest write `bits` of the value starting at byte `at` (within one dword).
    pub fn allow_write(&mut self, at: usize, bits: u32) {
        self.writable[at / 4] |= bits << ((at % 4) * 8);
    }

    fn set_byte(&mut self, at: usize, v: u8) {
        let shift = (at % 4) * 8;
        self.regs[at / 4] = self.regs[at / 4] & !(0xff << shift) | u32::from(v) << shift;
    }

    /// The dword at index `reg` (all ones past the space).
    pub fn read(&self, reg: usize) -> u32 {
        if reg == BAR0 && self.bar_sizing {
            if let Some((_, size)) = self.bar {
                return !(size - 1);
            }
        }
        self.regs.get(reg).copied().unwrap_or(u32::MAX)
    }

    /// The 16-bit value at byte `at`.
    pub fn read_u16(&self, at: usize) -> u16 {
        (self.read(at / 4) >> ((at % 4) * 8)) as u16
    }

    /// A guest write of `data` at byte `offset` of dword `reg`: only writable bits change;
    /// BAR 0 answers sizing (all ones) and otherwise stays where densevm put it.
    pub fn write(&mut self, reg: usize, offset: usize, data: &[u8]) {
        if reg >= REGS || offset + data.len() > 4 {
            return;
        }
        let mut bytes = [0u8; 4];
        bytes[offset..offset + data.len()].copy_from_slice(data);
        let value = u32::from_le_bytes(bytes);
        let mask = if data.len() >= 4 {
            u32::MAX
        } else {
            ((1u32 << (data.len() * 8)) - 1) << (offset * 8)
        };
        if reg == BAR0 {
            if let Some((addr, _)) = self.bar {
                if data.len() == 4 {
                    self.bar_sizing = value == u32::MAX;
                    if !self.bar_sizing && value & !0xf != addr && !self.relocation_logged {
                        self.relocation_logged = true;
                        tracing::warn!("guest tried to move a PCI BAR from {addr:#x} to {value:#x}; densevm keeps BARs where it placed them");
                    }
                }
            }
            return;
        }
        let w = self.writable[reg] & mask;
        self.regs[reg] = self.regs[reg] & !w | value & w;
    }

    /// The registers as the guest left them (for a snapshot).
    pub fn save_state(&self) -> ConfigSpaceState {
        ConfigSpaceState {
            regs: self.regs.to_vec(),
            bar_sizing: self.bar_sizing,
        }
    }

    /// Applies a saved state to this space, built as the saved one was: only bits the guest
    /// can write may differ, and BAR 0 must be where this function's is. Nothing changes
    /// when the state is refused.
    pub fn restore_state(&mut self, state: &ConfigSpaceState) -> Result<(), PciStateError> {
        let regs: &[u32; REGS] =
            state
                .regs
                .as_slice()
                .try_into()
                .map_err(|_| PciStateError::ConfigLength {
                    got: state.regs.len(),
                })?;
        for (reg, (&saved, &current)) in regs.iter().zip(&self.regs).enumerate() {
            if reg == BAR0 {
                if saved != current {
                    return Err(PciStateError::BarMoved { saved, current });
                }
            } else if (saved ^ current) & !self.writable[reg] != 0 {
                return Err(PciStateError::ReadOnlyBits {
                    reg,
                    saved,
                    current,
                });
            }
        }
        self.regs = *regs;
        self.bar_sizing = state.bar_sizing && self.bar.is_some();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> PciHeader {
        PciHeader {
            vendor: 0x1af4,
            device: 0x1042,
            revision: 1,
            class: 0x01_80_00,
            subsystem_vendor: 0x1af4,
            subsystem: 0x40,
        }
    }

    #[test]
    fn header_bar_sizing_and_read_only_bits() {
        let mut c = ConfigSpace::new(&header());
        c.set_bar0(0xc000_0000, 0x8000);
        assert_eq!(c.read(0), 0x1042_1af4);
        assert_eq!(c.read(2), 0x0180_0001);
        c.write(0, 0, &[0; 4]);
        assert_eq!(c.read(0), 0x1042_1af4, "IDs are read-only");
        c.write(4, 0, &u32::MAX.to_le_bytes());
        assert_eq!(c.read(4), 0xffff_8000, "sizing reads the size mask");
        c.write(4, 0, &0xc000_0000u32.to_le_bytes());
        assert_eq!(c.read(4), 0xc000_0000);
        c.write(4, 0, &0xd000_0000u32.to_le_bytes());
        assert_eq!(c.read(4), 0xc000_0000, "BARs stay where densevm put them");
        c.write(1, 0, &0xffffu16.to_le_bytes());
        assert_eq!(
            c.read(1) & 0xffff,
            0x0406,
            "only memory, bus master, INTx-disable"
        );
        assert_eq!(c.read(5), 0, "no second BAR");
        assert_eq!(c.read(64), u32::MAX);
    }

    #[test]
    fn capabilities_chain_and_honour_writable_ranges() {
        let mut c = ConfigSpace::new(&header());
        let a = c.add_capability(CAP_ID_VENDOR, &[14, 1, 0, 0]);
        let b = c.add_capability(CAP_ID_MSIX, &[3, 0, 0, 0x40, 0, 0, 0, 0x50, 0, 0]);
        c.allow_write(b + 2, 0xc000);
        assert_eq!(c.read(1) >> 16 & 0x10, 0x10, "capability list bit");
        assert_eq!(c.read(13) & 0xff, a as u32);
        assert_eq!(c.read(a / 4) >> 8 & 0xff, b as u32, "first links to second");
        assert_eq!(c.read(b / 4) >> 8 & 0xff, 0, "last ends the list");
        c.write(b / 4, 2, &0xffffu16.to_le_bytes());
        assert_eq!(
            c.read_u16(b + 2),
            0xc003,
            "control bits written, table size kept"
        );
        c.write(b / 4 + 1, 0, &[0xff; 4]);
        assert_eq!(c.read(b / 4 + 1), 0x4000, "table offset is read-only");
    }

    #[test]
    fn state_round_trips_and_only_writable_bits_may_differ() {
        let build = || {
            let mut c = ConfigSpace::new(&header());
            c.set_bar0(0xc000_0000, 0x8000);
            let m = c.add_capability(CAP_ID_MSIX, &[1, 0, 0, 0x40, 0, 0, 0, 0x50, 0, 0]);
            c.allow_write(m + 2, 0xc000);
            (c, m)
        };
        let (mut a, m) = build();
        a.write(1, 0, &0x0406u16.to_le_bytes());
        a.write(m / 4, 2, &0x8000u16.to_le_bytes());
        a.write(4, 0, &u32::MAX.to_le_bytes());
        let saved = a.save_state();
        let (mut b, _) = build();
        b.restore_state(&saved).unwrap();
        assert_eq!(b.read(1) & 0xffff, 0x0406, "command register");
        assert_eq!(b.read_u16(m + 2), 0x8001, "MSI-X enable");
        assert_eq!(b.read(4), 0xffff_8000, "still sizing");
        assert_eq!(b.save_state(), saved);

        let (mut c, _) = build();
        let before = c.save_state();
        let mut bad = saved.clone();
        bad.regs[0] = 0x1043_1af4;
        let e = c.restore_state(&bad).unwrap_err();
        assert!(
            matches!(e, PciStateError::ReadOnlyBits { reg: 0, .. }),
            "{e}"
        );
        bad = saved.clone();
        bad.regs[4] = 0xd000_0000;
        let e = c.restore_state(&bad).unwrap_err();
        assert!(matches!(e, PciStateError::BarMoved { .. }), "{e}");
        bad = saved.clone();
        bad.regs.truncate(10);
        let e = c.restore_state(&bad).unwrap_err();
        assert!(e.to_string().contains("10 dwords"), "{e}");
        assert_eq!(c.save_state(), before, "a refused state changes nothing");
    }
}
