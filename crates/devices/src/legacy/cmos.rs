//! A minimal MC146818 CMOS RTC (ports 0x70/0x71): the wall-clock time in BCD from the host
//! clock, with "update in progress" never set, so a guest's RTC probe finishes at once
//! instead of timing out on an absent chip.

use crate::{BusDevice, GuestRequest};
use std::time::{SystemTime, UNIX_EPOCH};

/// Index port (data port follows).
pub const CMOS_BASE: u64 = 0x70;
/// Ports covered: index, data.
pub const CMOS_LEN: u64 = 2;

const REG_A: u8 = 0x0a;
const REG_B: u8 = 0x0b;
const REG_C: u8 = 0x0c;
const REG_D: u8 = 0x0d;
const REG_CENTURY: u8 = 0x32;

/// The CMOS/RTC as a bus device.
#[derive(Debug)]
pub struct Cmos {
    index: u8,
    nvram: [u8; 128],
}

fn bcd(v: u64) -> u8 {
    (((v / 10) % 10) << 4 | (v % 10)) as u8
}

/// Civil date from days since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u64, u64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl Default for Cmos {
    fn default() -> Self {
        Self {
            index: 0,
            nvram: [0; 128],
        }
    }
}

/// The CMOS's saved state (the clock registers follow the host clock and are not saved).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CmosSnapshot {
    /// The selected register.
    pub index: u8,
    /// The 128 NVRAM bytes.
    pub nvram: Vec<u8>,
}

impl Cmos {
    /// A CMOS with zeroed NVRAM.
    pub fn new() -> Self {
        Self::default()
    }

    /// The state to save in a snapshot.
    pub fn state(&self) -> CmosSnapshot {
        CmosSnapshot {
            index: self.index,
            nvram: self.nvram.to_vec(),
        }
    }

    /// A CMOS in a saved state; NVRAM that is not 128 bytes is refused.
    pub fn from_state(state: &CmosSnapshot) -> Result<Self, String> {
        let nvram: [u8; 128] = state.nvram.as_slice().try_into().map_err(|_| {
            format!(
                "CMOS state holds {} NVRAM bytes, not 128",
                state.nvram.len()
            )
        })?;
        Ok(Self {
            index: state.index & 0x7f,
            nvram,
        })
    }

    fn register(&self, reg: u8, now_secs: u64) -> u8 {
        let days = (now_secs / 86_400) as i64;
        let secs = now_secs % 86_400;
        let (year, month, day) = civil_from_days(days);
        match reg {
            0x00 => bcd(secs % 60),
            0x02 => bcd(secs / 60 % 60),
            0x04 => bcd(secs / 3600),
            0x06 => bcd(((days + 4).rem_euclid(7) + 1) as u64),
            0x07 => bcd(day),
            0x08 => bcd(month),
            0x09 => bcd(year.rem_euclid(100) as u64),
            REG_CENTURY => bcd((year / 100) as u64),
            REG_A => 0x26, // 32.768 kHz time base, 1024 Hz rate, UIP clear
            REG_B => 0x02, // 24-hour mode, BCD
            REG_C => 0x00, // no interrupt flags
            REG_D => 0x80, // valid RAM and time
            r => self.nvram[usize::from(r & 0x7f)],
        }
    }
}

impl BusDevice for Cmos {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset == 1 {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            data[0] = self.register(self.index, now);
        } else {
            data[0] = self.index;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<GuestRequest> {
        let value = *data.first()?;
        match offset {
            0 => self.index = value & 0x7f, // bit 7 is the NMI mask
            _ if self.index > REG_D && self.index != REG_CENTURY => {
                self.nvram[usize::from(self.index)] = value
            }
            _ => {} // the clock itself is read-only: it follows the host
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bcd_time() {
        let cmos = Cmos::new();
        // 2026-11-22 13:45:07 UTC, a Sunday.
        let t = 1_795_355_107;
        assert_eq!(cmos.register(0x00, t), 0x07);
        assert_eq!(cmos.register(0x02, t), 0x45);
        assert_eq!(cmos.register(0x04, t), 0x13);
        assert_eq!(cmos.register(0x07, t), 0x22);
        assert_eq!(cmos.register(0x08, t), 0x11);
        assert_eq!(cmos.register(0x09, t), 0x26);
        assert_eq!(cmos.register(REG_CENTURY, t), 0x20);
        assert_eq!(cmos.register(0x06, t), 0x01);
        assert_eq!(
            cmos.register(REG_A, t) & 0x80,
            0,
            "update-in-progress must be clear"
        );
    }

    #[test]
    fn index_and_nvram() {
        let mut cmos = Cmos::new();
        cmos.write(0, &[0x80 | 0x40]);
        cmos.write(1, &[0x5a]);
        let mut b = [0u8];
        cmos.read(1, &mut b);
        assert_eq!(b[0], 0x5a);
        cmos.write(0, &[0x00]);
        cmos.write(1, &[0x99]); // the seconds register ignores writes
        cmos.read(1, &mut b);
        assert!(b[0] < 0x60);
    }
}
