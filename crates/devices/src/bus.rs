//! Address-range buses for port I/O and MMIO, with O(log n) dispatch.

use crate::GuestRequest;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// A device that answers accesses inside its range. Offsets are relative to the range base.
pub trait BusDevice: Send {
    /// Fills `data` for a read at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Handles a write at `offset`; may ask the VMM to act.
    fn write(&mut self, offset: u64, data: &[u8]) -> Option<GuestRequest>;
}

/// Why a device could not be inserted.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BusError {
    /// The new range overlaps a registered one.
    #[error("bus range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap {
        /// Base of the rejected range.
        base: u64,
        /// Length of the rejected range.
        len: u64,
    },
    /// A zero-length range.
    #[error("bus range at {0:#x} has zero length")]
    Empty(u64),
}

type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// A set of non-overlapping ranges, each served by one device.
#[derive(Default, Clone)]
pub struct Bus {
    ranges: BTreeMap<u64, (u64, SharedDevice)>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `device` for `[base, base + len)`.
    pub fn insert(&mut self, device: SharedDevice, base: u64, len: u64) -> Result<(), BusError> {
        if len == 0 {
            return Err(BusError::Empty(base));
        }
        let end = base
            .checked_add(len)
            .ok_or(BusError::Overlap { base, len })?;
        let overlaps_prev = self
            .ranges
            .range(..end)
            .next_back()
            .is_some_and(|(&b, &(l, _))| b + l > base);
        if overlaps_prev {
            return Err(BusError::Overlap { base, len });
        }
        self.ranges.insert(base, (len, device));
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<(u64, &SharedDevice)> {
        let (&base, (len, dev)) = self.ranges.range(..=addr).next_back()?;
        (addr - base < *len).then_some((addr - base, dev))
    }

    /// Dispatches a read; returns false if no device covers `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((offset, dev)) => {
                lock(dev).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a write; `None` in the outer option means no device covers `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> Option<Option<GuestRequest>> {
        let (offset, dev) = self.find(addr)?;
        Some(lock(dev).write(offset, data))
    }
}

fn lock(dev: &SharedDevice) -> std::sync::MutexGuard<'_, dyn BusDevice + 'static> {
    // A device that panicked while locked has state we can still use for I/O.
    dev.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(u8);
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(self.0.wrapping_add(offset as u8));
        }
        fn write(&mut self, _offset: u64, data: &[u8]) -> Option<GuestRequest> {
            self.0 = data[0];
            Some(GuestRequest::TraceMark(data[0]))
        }
    }

    #[test]
    fn dispatch_and_overlap() {
        let mut bus = Bus::new();
        bus.insert(Arc::new(Mutex::new(Echo(10))), 0x100, 8)
            .unwrap();
        bus.insert(Arc::new(Mutex::new(Echo(20))), 0x108, 8)
            .unwrap();
        assert_eq!(
            bus.insert(Arc::new(Mutex::new(Echo(0))), 0x104, 2),
            Err(BusError::Overlap {
                base: 0x104,
                len: 2
            })
        );
        assert_eq!(
            bus.insert(Arc::new(Mutex::new(Echo(0))), 0xfc, 8),
            Err(BusError::Overlap { base: 0xfc, len: 8 })
        );
        let mut b = [0u8; 1];
        assert!(bus.read(0x103, &mut b));
        assert_eq!(b[0], 13);
        assert!(bus.read(0x108, &mut b));
        assert_eq!(b[0], 20);
        assert!(!bus.read(0x110, &mut b));
        assert!(!bus.read(0xff, &mut b));
        assert_eq!(
            bus.write(0x109, &[5]),
            Some(Some(GuestRequest::TraceMark(5)))
        );
        assert_eq!(bus.write(0x200, &[5]), None);
    }
}
