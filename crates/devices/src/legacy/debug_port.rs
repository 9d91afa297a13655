//! densevm's debug ports: exit with a code (0x501), trace mark (0x502), probe fault (0x503).

use crate::{BusDevice, GuestRequest};

/// First debug port.
pub const DEBUG_PORT_BASE: u64 = 0x501;
/// Number of debug ports.
pub const DEBUG_PORT_LEN: u64 = 3;

/// The debug ports as one bus device. Reads return 0.
#[derive(Debug, Default)]
pub struct DebugPort;

impl BusDevice for DebugPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<GuestRequest> {
        let value = *data.first()?;
        match offset {
            0 => Some(GuestRequest::Exit(value)),
            1 => Some(GuestRequest::TraceMark(value)),
            2 => Some(GuestRequest::GuestFault(value)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports() {
        let mut d = DebugPort;
        assert_eq!(d.write(0, &[3, 0, 0, 0]), Some(GuestRequest::Exit(3)));
        assert_eq!(d.write(1, &[0x10]), Some(GuestRequest::TraceMark(0x10)));
        assert_eq!(d.write(2, &[14]), Some(GuestRequest::GuestFault(14)));
        assert_eq!(d.write(0, &[]), None);
    }
}
