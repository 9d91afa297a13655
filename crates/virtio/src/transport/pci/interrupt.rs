//! A virtio-pci device's interrupts: the [`Interrupt`] its device raises, turned into the
//! MSI-X vector the driver chose for each queue and for configuration changes.

use super::common_cfg::{status, NO_VECTOR};
use crate::Interrupt;
use densevm_devices::pci::{Msix, MsixState, PciStateError};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU8, Ordering};
use std::sync::Mutex;

const ISR_QUEUE: u8 = 1;
const ISR_CONFIG: u8 = 2;

/// Interrupt state shared by a virtio-pci transport (vCPU threads) and its device's workers.
pub struct PciInterrupt {
    msix: Mutex<Msix>,
    queue_vectors: Vec<AtomicU16>,
    config_vector: AtomicU16,
    isr: AtomicU8,
    needs_reset: AtomicBool,
    /// Configuration changes the device announced ([`Interrupt::notify_config`]): added to
    /// the common configuration's `config_generation`, so a driver reading a multi-byte
    /// configuration field across a change sees the generation move (virtio 1.2 §2.5.1).
    config_changes: AtomicU8,
}

impl PciInterrupt {
    pub(super) fn new(msix: Msix, queues: usize) -> Self {
        Self {
            msix: Mutex::new(msix),
            queue_vectors: (0..queues).map(|_| AtomicU16::new(NO_VECTOR)).collect(),
            config_vector: AtomicU16::new(NO_VECTOR),
            isr: AtomicU8::new(0),
            needs_reset: AtomicBool::new(false),
            config_changes: AtomicU8::new(0),
        }
    }

    fn msix(&self) -> std::sync::MutexGuard<'_, Msix> {
        self.msix.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn vector_count(&self) -> usize {
        self.msix().len()
    }

    pub(super) fn set_vectors(&self, config: u16, queues: impl Iterator<Item = u16>) {
        self.config_vector.store(config, Ordering::Release);
        for (slot, v) in self.queue_vectors.iter().zip(queues) {
            slot.store(v, Ordering::Release);
        }
    }

    pub(super) fn reset(&self) {
        self.set_vectors(NO_VECTOR, std::iter::repeat(NO_VECTOR));
        self.isr.store(0, Ordering::Release);
        self.needs_reset.store(false, Ordering::Release);
    }

    pub(super) fn needs_reset_bits(&self) -> u8 {
        if self.needs_reset.load(Ordering::Acquire) {
            status::DEVICE_NEEDS_RESET
        } else {
            0
        }
    }

    /// The transport itself found the device unusable (bad rings at activation).
    pub(super) fn fail(&self) {
        self.needs_reset();
    }

    /// `config_generation` as the driver reads it: the registers' value moved on by every
    /// configuration change since the function was built.
    pub(super) fn config_generation(&self, base: u8) -> u8 {
        base.wrapping_add(self.config_changes.load(Ordering::Acquire))
    }

    pub(super) fn take_isr(&self) -> u8 {
        self.isr.swap(0, Ordering::AcqRel)
    }

    pub(super) fn set_msix_control(&self, enabled: bool, masked: bool) {
        self.msix().set_control(enabled, masked);
    }

    pub(super) fn read_msix_table(&self, offset: u64, data: &mut [u8]) {
        self.msix().read_table(offset, data);
    }

    pub(super) fn write_msix_table(&self, offset: u64, data: &[u8]) {
        self.msix().write_table(offset, data);
    }

    pub(super) fn read_msix_pba(&self, offset: u64, data: &mut [u8]) {
        self.msix().read_pba(offset, data);
    }

    /// The ISR byte (not cleared) and whether the device needs a reset.
    pub(super) fn save_isr(&self) -> (u8, bool) {
        (
            self.isr.load(Ordering::Acquire),
            self.needs_reset.load(Ordering::Acquire),
        )
    }

    pub(super) fn restore_isr(&self, isr: u8, needs_reset: bool) {
        self.isr.store(isr, Ordering::Release);
        self.needs_reset.store(needs_reset, Ordering::Release);
    }

    pub(super) fn save_msix(&self) -> MsixState {
        self.msix().save_state()
    }

    pub(super) fn restore_msix(&self, state: &MsixState) -> Result<(), PciStateError> {
        self.msix().restore_state(state)
    }

    fn raise(&self, vector: u16, isr: u8) {
        self.isr.fetch_or(isr, Ordering::AcqRel);
        if vector != NO_VECTOR {
            self.msix().trigger(vector);
        }
    }
}

impl Interrupt for PciInterrupt {
    fn notify_queue(&self, queue: u16) {
        let vector = self
            .queue_vectors
            .get(usize::from(queue))
            .map_or(NO_VECTOR, |v| v.load(Ordering::Acquire));
        self.raise(vector, ISR_QUEUE);
    }

    fn notify_config(&self) {
        // The generation moves before the interrupt, so a driver woken by it reads the new one.
        self.config_changes.fetch_add(1, Ordering::AcqRel);
        self.raise(self.config_vector.load(Ordering::Acquire), ISR_CONFIG);
    }

    fn needs_reset(&self) {
        if !self.needs_reset.swap(true, Ordering::AcqRel) {
            self.notify_config();
        }
    }
}
