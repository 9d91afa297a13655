//! densevm's debug ports: exit with a code (0x501), trace mark (0x502), probe fault (0x503),
//! sleep (0x504).

use crate::{BusDevice, GuestRequest};
use std::time::Duration;

/// First debug port.
pub const DEBUG_PORT_BASE: u64 = 0x501;
/// Number of debug ports.
pub const DEBUG_PORT_LEN: u64 = 4;
/// Longest sleep one write to the sleep port (0x504) asks for, in milliseconds. A longer
/// guest sleep is a loop of writes, so the vCPU thread comes back to KVM_RUN at least this
/// often and sees the VMM's stop request (--timeout, guest exit on another vCPU) in time.
pub const MAX_SLEEP_SLICE_MS: u64 = 100;

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
            3 => {
                // Sleep on the writing vCPU's thread: the guest idles without burning a
                // host CPU. Bounded per write (see MAX_SLEEP_SLICE_MS).
                let ms = u64::from(value).min(MAX_SLEEP_SLICE_MS);
                std::thread::sleep(Duration::from_millis(ms));
                None
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn ports() {
        let mut d = DebugPort;
        assert_eq!(d.write(0, &[3, 0, 0, 0]), Some(GuestRequest::Exit(3)));
        assert_eq!(d.write(1, &[0x10]), Some(GuestRequest::TraceMark(0x10)));
        assert_eq!(d.write(2, &[14]), Some(GuestRequest::GuestFault(14)));
        assert_eq!(d.write(0, &[]), None);
    }

    #[test]
    fn sleep_port_sleeps_at_most_one_slice() {
        let mut d = DebugPort;
        let t0 = Instant::now();
        assert_eq!(d.write(3, &[20]), None);
        assert!(t0.elapsed() >= Duration::from_millis(20), "slept 20 ms");
        let t1 = Instant::now();
        assert_eq!(d.write(3, &[255]), None);
        let slept = t1.elapsed();
        assert!(
            slept >= Duration::from_millis(MAX_SLEEP_SLICE_MS),
            "slept {slept:?}"
        );
        // Lower bound exact; the cap is checked loosely (a loaded host may oversleep) but
        // well below the 255 ms asked for.
        assert!(
            slept < Duration::from_millis(240),
            "capped: slept {slept:?}"
        );
    }
}
