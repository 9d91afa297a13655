//! densevm's debug ports: exit with a code (0x501), trace mark (0x502), probe fault (0x503),
//! sleep (0x504), and the VM's instance number (0x505, read).

use crate::{BusDevice, GuestRequest};

/// First debug port.
pub const DEBUG_PORT_BASE: u64 = 0x501;
/// Number of debug ports (0x501..=0x505).
pub const DEBUG_PORT_LEN: u64 = 5;
/// Offset of the instance port (0x505) in the debug-port range: a read returns the VM's
/// instance number, little-endian (`inl` gets all 32 bits, `inb` the low byte); writes
/// are ignored.
pub const INSTANCE_PORT_OFFSET: u64 = 4;
/// Longest sleep one write to the sleep port (0x504) asks for, in milliseconds. A longer
/// guest sleep is a loop of writes, so the vCPU thread comes back to KVM_RUN at least this
/// often and sees the VMM's stop request (--timeout, guest exit on another vCPU) in time.
pub const MAX_SLEEP_SLICE_MS: u64 = 10;

/// The debug ports as one bus device. Reads return 0, except at the instance port.
///
/// The instance number tells VMs started from the same memory apart (clones of one
/// template: the probe's `fill-id` writes `(instance + 1) & 0xff`); it is 0 unless the
/// VMM sets it with [`DebugPort::with_instance`] or [`DebugPort::set_instance`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DebugPort {
    instance: u32,
}

impl DebugPort {
    /// The debug ports of a VM whose instance port reads `instance`.
    pub const fn with_instance(instance: u32) -> Self {
        DebugPort { instance }
    }

    /// Sets the number the instance port reads.
    pub fn set_instance(&mut self, instance: u32) {
        self.instance = instance;
    }

    /// The number the instance port reads.
    pub fn instance(&self) -> u32 {
        self.instance
    }
}

impl BusDevice for DebugPort {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset == INSTANCE_PORT_OFFSET {
            let value = self.instance.to_le_bytes();
            let n = data.len().min(value.len());
            data[..n].copy_from_slice(&value[..n]);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<GuestRequest> {
        let value = *data.first()?;
        match offset {
            0 => Some(GuestRequest::Exit(value)),
            1 => Some(GuestRequest::TraceMark(value)),
            2 => Some(GuestRequest::GuestFault(value)),
            // Sleep on the writing vCPU's thread (the VMM naps it, waking early for a
            // pause): the guest idles without burning a host CPU. Bounded per write (see
            // MAX_SLEEP_SLICE_MS).
            3 => Some(GuestRequest::Sleep(value.min(MAX_SLEEP_SLICE_MS as u8))),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports() {
        let mut d = DebugPort::default();
        assert_eq!(d.write(0, &[3, 0, 0, 0]), Some(GuestRequest::Exit(3)));
        assert_eq!(d.write(1, &[0x10]), Some(GuestRequest::TraceMark(0x10)));
        assert_eq!(d.write(2, &[14]), Some(GuestRequest::GuestFault(14)));
        assert_eq!(d.write(0, &[]), None);
        assert_eq!(d.write(INSTANCE_PORT_OFFSET, &[9]), None);
    }

    #[test]
    fn instance_port_reads_the_instance() {
        let read = |d: &mut DebugPort, offset: u64, len: usize| {
            let mut data = vec![0xffu8; len];
            d.read(offset, &mut data);
            data
        };
        // Unset: 0.
        let mut d = DebugPort::default();
        assert_eq!(d, DebugPort::with_instance(0));
        assert_eq!(read(&mut d, INSTANCE_PORT_OFFSET, 4), [0, 0, 0, 0]);
        let mut d = DebugPort::with_instance(0x0102_0304);
        assert_eq!(d.instance(), 0x0102_0304);
        assert_eq!(read(&mut d, INSTANCE_PORT_OFFSET, 4), [4, 3, 2, 1]);
        assert_eq!(read(&mut d, INSTANCE_PORT_OFFSET, 1), [4]);
        assert_eq!(read(&mut d, INSTANCE_PORT_OFFSET, 2), [4, 3]);
        // The other ports still read 0.
        for offset in 0..INSTANCE_PORT_OFFSET {
            assert_eq!(read(&mut d, offset, 4), [0, 0, 0, 0], "offset {offset}");
        }
        d.set_instance(3);
        assert_eq!(read(&mut d, INSTANCE_PORT_OFFSET, 4), [3, 0, 0, 0]);
        // Writes to the instance port do not change it.
        d.write(INSTANCE_PORT_OFFSET, &[7]);
        assert_eq!(d.instance(), 3);
        assert_eq!(DEBUG_PORT_BASE + INSTANCE_PORT_OFFSET, 0x505);
        assert_eq!(DEBUG_PORT_LEN, INSTANCE_PORT_OFFSET + 1);
    }

    #[test]
    fn sleep_port_asks_for_at_most_one_slice() {
        let mut d = DebugPort::default();
        assert_eq!(d.write(3, &[5]), Some(GuestRequest::Sleep(5)));
        assert_eq!(
            d.write(3, &[255]),
            Some(GuestRequest::Sleep(MAX_SLEEP_SLICE_MS as u8))
        );
        assert_eq!(d.write(3, &[]), None);
    }
}
