//! virtio-pci (virtio 1.2 §4.1), modern only: a PCI function whose BAR 0 holds the common
//! configuration, ISR, device configuration and notification structures, and the MSI-X table
//! and pending bits. Queue notifications reach the device as eventfd signals (KVM ioeventfds
//! at [`VirtioPci::notify_addresses`], or this transport when a write exits to it); its
//! interrupts leave through [`PciInterrupt`] as MSI-X vectors.
//!
//! Snapshots (`state.rs`): [`VirtioPci::save_state`] quiesces the device and captures the
//! function ([`VirtioPciState`]), [`VirtioPci::resume`] lets the source go on, and
//! [`VirtioPci::restore`] builds a function from a saved state without a reset, which
//! serves from [`VirtioPci::resume`] on.

mod common_cfg;
#[cfg(any(test, feature = "test-utils"))]
pub mod fuzz;
mod interrupt;
mod state;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod tests;

pub use common_cfg::{status, Action, CommonCfg, QueueConfig, NO_VECTOR};
pub use interrupt::PciInterrupt;
pub use state::{CommonCfgState, QueueState, VirtioPciState};

use crate::{features, DeviceQueue, Mem, VirtioDevice};
use densevm_devices::pci::{
    ConfigSpace, MsiRoutes, Msix, MsixVector, PciFunction, PciHeader, CAP_ID_MSIX, CAP_ID_VENDOR,
};
use densevm_devices::{BusDevice, GuestRequest};
use std::sync::Arc;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

/// Red Hat's virtio vendor ID.
pub const VIRTIO_PCI_VENDOR: u16 = 0x1af4;
/// Modern device IDs are this plus the device type.
pub const VIRTIO_PCI_DEVICE_BASE: u16 = 0x1040;
/// Size of BAR 0.
pub const BAR_SIZE: u32 = 0x8000;
const COMMON_CFG: u64 = 0x0000;
const ISR_CFG: u64 = 0x1000;
const DEVICE_CFG: u64 = 0x2000;
const NOTIFY_CFG: u64 = 0x3000;
const MSIX_TABLE: u64 = 0x4000;
const MSIX_PBA: u64 = 0x5000;
const REGION_LEN: u64 = 0x1000;
/// Bytes between the notification addresses of consecutive queues.
pub const NOTIFY_MULTIPLIER: u32 = 4;

// virtio_pci_cap cfg_type values.
const CAP_COMMON: u8 = 1;
const CAP_NOTIFY: u8 = 2;
const CAP_ISR: u8 = 3;
const CAP_DEVICE: u8 = 4;

/// One virtio device presented as a PCI function.
pub struct VirtioPci {
    device: Box<dyn VirtioDevice>,
    config: ConfigSpace,
    msix_cap: usize,
    common: CommonCfg,
    events: Vec<EventFd>,
    interrupt: Arc<PciInterrupt>,
    mem: Mem,
    bar: u64,
    /// Restored from a snapshot with the device running: its queues, activated by
    /// [`VirtioPci::resume`].
    restored: Option<Vec<QueueState>>,
}

/// Builds a `virtio_pci_cap` body (everything after the ID and next bytes).
fn virtio_cap(cfg_type: u8, offset: u64, length: u64, extra: Option<u32>) -> Vec<u8> {
    let cap_len: u8 = if extra.is_some() { 20 } else { 16 };
    let mut b = vec![cap_len, cfg_type, 0 /* bar */, 0 /* id */, 0, 0];
    b.extend_from_slice(&(offset as u32).to_le_bytes());
    b.extend_from_slice(&(length as u32).to_le_bytes());
    if let Some(x) = extra {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

/// The device side of a queue as the driver programmed it (or a snapshot restored it). An
/// enabled queue's size must be valid and its rings aligned; a disabled one is never served.
fn build_queue(qc: &QueueConfig, event_idx: bool) -> Result<Queue, virtio_queue::Error> {
    let mut q = Queue::new(qc.max_size)?;
    if qc.enabled {
        q.try_set_size(qc.size)?;
        q.try_set_desc_table_address(GuestAddress(qc.desc))?;
        q.try_set_avail_ring_address(GuestAddress(qc.avail))?;
        q.try_set_used_ring_address(GuestAddress(qc.used))?;
    } else {
        q.set_size(qc.size);
        q.set_desc_table_address(Some(qc.desc as u32), Some((qc.desc >> 32) as u32));
        q.set_avail_ring_address(Some(qc.avail as u32), Some((qc.avail >> 32) as u32));
        q.set_used_ring_address(Some(qc.used as u32), Some((qc.used >> 32) as u32));
    }
    q.set_event_idx(event_idx);
    q.set_ready(qc.enabled);
    Ok(q)
}

impl VirtioPci {
    /// MSI-X vectors a device needs: one per queue and one for configuration changes.
    pub fn vectors_needed(device: &dyn VirtioDevice) -> usize {
        device.queue_max_sizes().len() + 1
    }

    /// Presents `device` with BAR 0 at `bar` (32-bit, [`BAR_SIZE`]-aligned) and the given
    /// MSI-X vectors ([`vectors_needed`](Self::vectors_needed) of them, routed through
    /// `routes`).
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: Mem,
        bar: u32,
        vectors: Vec<MsixVector>,
        routes: Arc<dyn MsiRoutes>,
    ) -> std::io::Result<Self> {
        let device_type = device.device_type();
        let class = match device_type {
            crate::device_type::BLOCK => 0x01_80_00, // mass storage, other
            _ => 0xff_00_00,
        };
        let mut config = ConfigSpace::new(&PciHeader {
            vendor: VIRTIO_PCI_VENDOR,
            device: VIRTIO_PCI_DEVICE_BASE + device_type as u16,
            revision: 1,
            class,
            subsystem_vendor: VIRTIO_PCI_VENDOR,
            subsystem: 0x40,
        });
        config.set_bar0(bar, BAR_SIZE);
        let nvec = vectors.len() as u16;
        config.add_capability(
            CAP_ID_VENDOR,
            &virtio_cap(CAP_COMMON, COMMON_CFG, 0x38, None),
        );
        config.add_capability(CAP_ID_VENDOR, &virtio_cap(CAP_ISR, ISR_CFG, 4, None));
        config.add_capability(
            CAP_ID_VENDOR,
            &virtio_cap(CAP_DEVICE, DEVICE_CFG, REGION_LEN, None),
        );
        config.add_capability(
            CAP_ID_VENDOR,
            &virtio_cap(CAP_NOTIFY, NOTIFY_CFG, REGION_LEN, Some(NOTIFY_MULTIPLIER)),
        );
        let mut msix_body = (nvec.saturating_sub(1)).to_le_bytes().to_vec();
        msix_body.extend_from_slice(&(MSIX_TABLE as u32).to_le_bytes()); // BIR 0
        msix_body.extend_from_slice(&(MSIX_PBA as u32).to_le_bytes());
        let msix_cap = config.add_capability(CAP_ID_MSIX, &msix_body);
        config.allow_write(msix_cap + 2, 0xc000); // enable, function mask
        let queues = device.queue_max_sizes().len();
        let events = (0..queues)
            .map(|_| EventFd::new(libc::EFD_NONBLOCK))
            .collect::<std::io::Result<Vec<_>>>()?;
        let common = CommonCfg::new(
            device.features() | features::VERSION_1,
            device.queue_max_sizes(),
        );
        let interrupt = Arc::new(PciInterrupt::new(Msix::new(vectors, routes), queues));
        Ok(Self {
            device,
            config,
            msix_cap,
            common,
            events,
            interrupt,
            mem,
            bar: u64::from(bar),
            restored: None,
        })
    }

    /// Guest-physical address of each queue's notification register and the eventfd to
    /// signal for it (for KVM ioeventfds: any write there only signals the eventfd).
    pub fn notify_addresses(&self) -> Vec<(u64, &EventFd)> {
        self.events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    self.bar + NOTIFY_CFG + i as u64 * u64::from(NOTIFY_MULTIPLIER),
                    e,
                )
            })
            .collect()
    }

    /// Guest-physical base of BAR 0.
    pub fn bar(&self) -> u64 {
        self.bar
    }

    /// The device's type.
    pub fn device_type(&self) -> u32 {
        self.device.device_type()
    }

    /// Whether the device is serving.
    pub fn is_active(&self) -> bool {
        self.device.is_active()
    }

    /// Device status as the driver reads it.
    pub fn status(&self) -> u8 {
        self.common.status | self.interrupt.needs_reset_bits()
    }

    fn reset(&mut self) {
        self.restored = None;
        self.device.reset();
        self.common.reset();
        self.interrupt.reset();
        for e in &self.events {
            let _ = e.read();
        }
    }

    fn sync_vectors(&mut self) {
        let nvec = self.interrupt.vector_count();
        let valid = |v: u16| if usize::from(v) < nvec { v } else { NO_VECTOR };
        // A vector the device cannot use reads back as NO_VECTOR (virtio 1.2 §4.1.5.1.2).
        self.common.msix_config = valid(self.common.msix_config);
        for q in &mut self.common.queues {
            q.msix_vector = valid(q.msix_vector);
        }
        self.interrupt.set_vectors(
            self.common.msix_config,
            self.common.queues.iter().map(|q| q.msix_vector),
        );
    }

    fn activate(&mut self) {
        let event_idx = self.common.driver_features & features::RING_EVENT_IDX != 0;
        let mut queues = Vec::new();
        for (i, qc) in self.common.queues.iter().enumerate() {
            let q = match build_queue(qc, event_idx) {
                Ok(q) => q,
                Err(e) => {
                    tracing::warn!(
                        "virtio device type {}: queue {i}: {e}; the device needs a reset",
                        self.device.device_type()
                    );
                    return self.interrupt.fail();
                }
            };
            if qc.enabled && !q.is_valid(&self.mem) {
                tracing::warn!(
                    "virtio device type {}: queue {i} rings are outside guest memory or misaligned; the device needs a reset",
                    self.device.device_type()
                );
                return self.interrupt.fail();
            }
            let event = match self.events[i].try_clone() {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!("virtio: eventfd clone: {e}");
                    return self.interrupt.fail();
                }
            };
            queues.push(DeviceQueue { queue: q, event });
        }
        self.device.ack_features(self.common.driver_features);
        let irq: Arc<dyn crate::Interrupt> = self.interrupt.clone();
        if let Err(e) = self.device.activate(self.mem.clone(), irq, queues) {
            tracing::error!(
                "virtio device type {} could not start: {e}",
                self.device.device_type()
            );
            self.interrupt.fail();
        }
    }

    fn write_common(&mut self, offset: u64, data: &[u8]) {
        match self.common.write(offset, data) {
            Action::None => {}
            Action::Reset => self.reset(),
            Action::Activate => {
                self.sync_vectors();
                self.activate();
            }
            Action::VectorsChanged => self.sync_vectors(),
        }
    }
}

impl PciFunction for VirtioPci {
    fn config_read(&mut self, reg: usize) -> u32 {
        self.config.read(reg)
    }

    fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]) {
        self.config.write(reg, offset, data);
        if reg == self.msix_cap / 4 {
            let control = self.config.read_u16(self.msix_cap + 2);
            self.interrupt
                .set_msix_control(control & 0x8000 != 0, control & 0x4000 != 0);
        }
    }
}

impl BusDevice for VirtioPci {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let (region, at) = (offset & !(REGION_LEN - 1), offset & (REGION_LEN - 1));
        match region {
            COMMON_CFG => {
                self.common.read(at, data);
                // device_status (0x14) and config_generation (0x15) also hold what the
                // device's interrupt side changed.
                for (i, b) in data.iter_mut().enumerate() {
                    match at + i as u64 {
                        0x14 => *b = self.status(),
                        0x15 => {
                            *b = self
                                .interrupt
                                .config_generation(self.common.config_generation)
                        }
                        _ => {}
                    }
                }
            }
            ISR_CFG if at == 0 => {
                if let Some(b) = data.first_mut() {
                    *b = self.interrupt.take_isr();
                }
            }
            DEVICE_CFG => self.device.read_config(at, data),
            MSIX_TABLE => self.interrupt.read_msix_table(at, data),
            MSIX_PBA => self.interrupt.read_msix_pba(at, data),
            _ => {}
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<GuestRequest> {
        let (region, at) = (offset & !(REGION_LEN - 1), offset & (REGION_LEN - 1));
        match region {
            COMMON_CFG => self.write_common(at, data),
            DEVICE_CFG => self.device.write_config(at, data),
            NOTIFY_CFG => {
                // Reached only where no ioeventfd catches the write.
                let queue = (at / u64::from(NOTIFY_MULTIPLIER)) as usize;
                if let Some(e) = self.events.get(queue) {
                    let _ = e.write(1);
                }
            }
            MSIX_TABLE => self.interrupt.write_msix_table(at, data),
            _ => {}
        }
        None
    }
}
