//! The virtio-pci common configuration structure (virtio 1.2 §4.1.4.3): feature negotiation,
//! device status and per-queue setup, as registers.

/// `queue_msix_vector` / `msix_config` value meaning "no vector".
pub const NO_VECTOR: u16 = 0xffff;

/// Device status bits (virtio 1.2 §2.1).
pub mod status {
    /// The guest found the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The guest has a driver for it.
    pub const DRIVER: u8 = 2;
    /// The driver is ready: the device may serve.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = 8;
    /// The device hit an error and needs a reset.
    pub const DEVICE_NEEDS_RESET: u8 = 0x40;
    /// The driver gave up on the device.
    pub const FAILED: u8 = 0x80;
}

/// One queue as the driver programs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Largest size the device supports.
    pub max_size: u16,
    /// Size the driver chose.
    pub size: u16,
    /// MSI-X vector of its used-buffer interrupts.
    pub msix_vector: u16,
    /// The driver enabled it.
    pub enabled: bool,
    /// Descriptor table address.
    pub desc: u64,
    /// Available (driver) ring address.
    pub avail: u64,
    /// Used (device) ring address.
    pub used: u64,
}

impl QueueConfig {
    fn new(max_size: u16) -> Self {
        Self {
            max_size,
            size: max_size,
            msix_vector: NO_VECTOR,
            enabled: false,
            desc: 0,
            avail: 0,
            used: 0,
        }
    }
}

/// What a register write asks the transport to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing beyond the register update.
    None,
    /// The driver wrote 0 to the status: reset the device.
    Reset,
    /// The driver set `DRIVER_OK`: activate the device.
    Activate,
    /// The driver's MSI-X vector choices changed.
    VectorsChanged,
}

/// The common configuration registers of one device.
#[derive(Debug, Clone)]
pub struct CommonCfg {
    /// Features the device offers.
    pub device_features: u64,
    /// Features the driver accepted.
    pub driver_features: u64,
    pub(super) device_feature_select: u32,
    pub(super) driver_feature_select: u32,
    /// Device status.
    pub status: u8,
    /// MSI-X vector for configuration changes.
    pub msix_config: u16,
    /// Configuration generation as power-on (or a snapshot) set it; the transport adds the
    /// configuration changes the device announced since (virtio-balloon's target).
    pub(super) config_generation: u8,
    pub(super) queue_select: u16,
    /// Every queue.
    pub queues: Vec<QueueConfig>,
}

impl CommonCfg {
    /// Registers for a device with these features and queue sizes.
    pub fn new(device_features: u64, queue_max_sizes: &[u16]) -> Self {
        Self {
            device_features,
            driver_features: 0,
            device_feature_select: 0,
            driver_feature_select: 0,
            status: 0,
            msix_config: NO_VECTOR,
            config_generation: 0,
            queue_select: 0,
            queues: queue_max_sizes
                .iter()
                .map(|&m| QueueConfig::new(m))
                .collect(),
        }
    }

    /// Back to the state after power-on (a driver reset).
    pub fn reset(&mut self) {
        *self = Self::new(
            self.device_features,
            &self.queues.iter().map(|q| q.max_size).collect::<Vec<_>>(),
        );
    }

    fn selected(&self) -> Option<&QueueConfig> {
        self.queues.get(usize::from(self.queue_select))
    }

    /// Reads the register at `offset` (`data.len()` of 1, 2 or 4 bytes).
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let q = self.selected();
        let value: u64 = match offset {
            0x00 => u64::from(self.device_feature_select),
            0x04 => match self.device_feature_select {
                0 => self.device_features & 0xffff_ffff,
                1 => self.device_features >> 32,
                _ => 0,
            },
            0x08 => u64::from(self.driver_feature_select),
            0x0c => match self.driver_feature_select {
                0 => self.driver_features & 0xffff_ffff,
                1 => self.driver_features >> 32,
                _ => 0,
            },
            0x10 => u64::from(self.msix_config),
            0x12 => self.queues.len() as u64,
            0x14 => u64::from(self.status),
            0x15 => u64::from(self.config_generation),
            0x16 => u64::from(self.queue_select),
            // An unknown queue reads as size 0 (it does not exist).
            0x18 => q.map_or(0, |q| u64::from(q.size)),
            0x1a => q.map_or(u64::from(NO_VECTOR), |q| u64::from(q.msix_vector)),
            0x1c => q.map_or(0, |q| u64::from(q.enabled)),
            0x1e => u64::from(self.queue_select), // queue_notify_off: one slot per queue
            0x20 => q.map_or(0, |q| q.desc),
            0x24 => q.map_or(0, |q| q.desc >> 32),
            0x28 => q.map_or(0, |q| q.avail),
            0x2c => q.map_or(0, |q| q.avail >> 32),
            0x30 => q.map_or(0, |q| q.used),
            0x34 => q.map_or(0, |q| q.used >> 32),
            _ => 0,
        };
        for (i, b) in data.iter_mut().enumerate() {
            *b = (value >> (8 * i)) as u8;
        }
    }

    /// A driver write of `data` at `offset`; returns what the transport must do.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Action {
        let mut bytes = [0u8; 8];
        let n = data.len().min(8);
        bytes[..n].copy_from_slice(&data[..n]);
        let value = u64::from_le_bytes(bytes);
        let v32 = value as u32;
        let v16 = value as u16;
        // Queue setup is only allowed while the queue is disabled and before DRIVER_OK.
        let setup_open = self.status & status::DRIVER_OK == 0;
        let select = usize::from(self.queue_select);
        let lo = |old: u64| old & !0xffff_ffff | u64::from(v32);
        let hi = |old: u64| old & 0xffff_ffff | u64::from(v32) << 32;
        let mut queue = |f: &mut dyn FnMut(&mut QueueConfig)| {
            if let Some(q) = self.queues.get_mut(select) {
                if setup_open && !q.enabled {
                    f(q)
                }
            }
        };
        match offset {
            0x00 => self.device_feature_select = v32,
            0x08 => self.driver_feature_select = v32,
            0x0c if self.status & status::FEATURES_OK == 0 => {
                let f = match self.driver_feature_select {
                    0 => self.driver_features & !0xffff_ffff | u64::from(v32),
                    1 => self.driver_features & 0xffff_ffff | u64::from(v32) << 32,
                    _ => self.driver_features,
                };
                self.driver_features = f;
            }
            0x10 => {
                self.msix_config = v16;
                return Action::VectorsChanged;
            }
            0x14 => return self.write_status(value as u8),
            0x16 => self.queue_select = v16,
            0x18 => queue(&mut |q| {
                // Split queues need a power-of-two size no larger than the maximum.
                if v16.is_power_of_two() && v16 <= q.max_size {
                    q.size = v16;
                }
            }),
            0x1a => {
                if let Some(q) = self.queues.get_mut(select) {
                    q.msix_vector = v16;
                    return Action::VectorsChanged;
                }
            }
            0x1c => queue(&mut |q| q.enabled = v16 == 1),
            0x20 => queue(&mut |q| q.desc = lo(q.desc)),
            0x24 => queue(&mut |q| q.desc = hi(q.desc)),
            0x28 => queue(&mut |q| q.avail = lo(q.avail)),
            0x2c => queue(&mut |q| q.avail = hi(q.avail)),
            0x30 => queue(&mut |q| q.used = lo(q.used)),
            0x34 => queue(&mut |q| q.used = hi(q.used)),
            _ => {}
        }
        Action::None
    }

    fn write_status(&mut self, new: u8) -> Action {
        if new == 0 {
            return Action::Reset;
        }
        let old = self.status;
        let mut new = new;
        // FEATURES_OK only sticks when the driver accepted nothing the device did not offer
        // and speaks virtio 1.x.
        if new & status::FEATURES_OK != 0 && old & status::FEATURES_OK == 0 {
            let ok = self.driver_features & !self.device_features == 0
                && self.driver_features & crate::features::VERSION_1 != 0;
            if !ok {
                new &= !status::FEATURES_OK;
            }
        }
        self.status = new;
        if new & status::DRIVER_OK != 0
            && old & status::DRIVER_OK == 0
            && new & status::FEATURES_OK != 0
            && new & status::FAILED == 0
        {
            return Action::Activate;
        }
        Action::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::VERSION_1;

    fn r32(c: &CommonCfg, off: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn negotiation_queue_setup_and_activation() {
        let mut c = CommonCfg::new(VERSION_1 | 1 << 9, &[128, 64]);
        c.write(0x00, &1u32.to_le_bytes());
        assert_eq!(r32(&c, 0x04), 1, "VERSION_1 in the high half");
        assert_eq!(r32(&c, 0x12) & 0xffff, 2);
        c.write(0x14, &[status::ACKNOWLEDGE | status::DRIVER]);
        c.write(0x08, &0u32.to_le_bytes());
        c.write(0x0c, &(1u32 << 9).to_le_bytes());
        c.write(0x08, &1u32.to_le_bytes());
        c.write(0x0c, &1u32.to_le_bytes());
        c.write(
            0x14,
            &[status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK],
        );
        assert_eq!(c.status & status::FEATURES_OK, status::FEATURES_OK);
        c.write(0x16, &1u16.to_le_bytes());
        assert_eq!(r32(&c, 0x18) & 0xffff, 64);
        c.write(0x18, &100u16.to_le_bytes());
        assert_eq!(c.queues[1].size, 64, "not a power of two: refused");
        c.write(0x18, &32u16.to_le_bytes());
        c.write(0x20, &0x1000u32.to_le_bytes());
        c.write(0x24, &0x1u32.to_le_bytes());
        c.write(0x1a, &3u16.to_le_bytes());
        c.write(0x1c, &1u16.to_le_bytes());
        c.write(0x20, &0x2000u32.to_le_bytes());
        assert_eq!(
            c.queues[1].desc, 0x1_0000_1000,
            "an enabled queue's rings are fixed"
        );
        assert_eq!(
            c.write(
                0x14,
                &[status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK]
            ),
            Action::Activate
        );
        assert_eq!(c.write(0x14, &[0]), Action::Reset);
        c.write(0x16, &9u16.to_le_bytes());
        assert_eq!(
            r32(&c, 0x18) & 0xffff,
            0,
            "a queue that does not exist has size 0"
        );
        c.write(0x1c, &1u16.to_le_bytes()); // ignored, no panic
    }

    #[test]
    fn features_the_device_did_not_offer_fail_negotiation() {
        let mut c = CommonCfg::new(VERSION_1, &[16]);
        c.write(0x08, &0u32.to_le_bytes());
        c.write(0x0c, &(1u32 << 5).to_le_bytes());
        c.write(0x08, &1u32.to_le_bytes());
        c.write(0x0c, &1u32.to_le_bytes());
        c.write(0x14, &[status::FEATURES_OK]);
        assert_eq!(c.status & status::FEATURES_OK, 0);
        assert_eq!(
            c.write(0x14, &[status::FEATURES_OK | status::DRIVER_OK]),
            Action::None
        );
    }
}
