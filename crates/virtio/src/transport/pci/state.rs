//! Saving a virtio-pci function and building one from a snapshot (issue #11).
//!
//! [`VirtioPci::save_state`] quiesces the device (its worker completes what it popped and is
//! joined) and captures the common configuration with each queue's position, the ISR, the
//! device's own state, the PCI configuration space and the MSI-X table. The source VM goes
//! on after [`VirtioPci::resume`].
//!
//! [`VirtioPci::restore`] builds the function as [`VirtioPci::new`] does, checks the state
//! against it (it comes from a file) and applies it. Like a saved function it is quiesced:
//! [`VirtioPci::resume`] activates a device the driver had running, with the saved rings and
//! positions (the driver never sees a reset). The VMM calls it once the vCPUs' and the
//! irqchip's state are back, so that no interrupt the device raises at once (for requests
//! the driver made available just before the snapshot) is overwritten by `KVM_SET_LAPIC`.

use super::{build_queue, status, QueueConfig, VirtioPci, NO_VECTOR};
use crate::state::{device_name, StateError};
use crate::{features, DeviceQueue, Mem, VirtioDevice};
use densevm_devices::pci::{ConfigSpaceState, MsiRoutes, MsixState, MsixVector, PciStateError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use virtio_queue::QueueT;

/// Everything a snapshot holds of one virtio-pci function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtioPciState {
    /// The virtio device type ([`crate::device_type`]).
    pub device_type: u32,
    /// The common configuration registers and the queues.
    pub common: CommonCfgState,
    /// The ISR status byte (not yet read by the driver).
    pub isr: u8,
    /// The device hit an error and waits for a driver reset (`DEVICE_NEEDS_RESET`).
    pub needs_reset: bool,
    /// The device's own state ([`VirtioDevice::save_state`]).
    pub device: serde_json::Value,
    /// The PCI configuration space (BAR, command register, MSI-X control bits).
    pub config_space: ConfigSpaceState,
    /// The MSI-X table, pending bits, enable and function mask.
    pub msix: MsixState,
}

/// The common configuration structure (virtio 1.2 §4.1.4.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommonCfgState {
    /// Features the device offered (must match on restore).
    pub device_features: u64,
    /// Features the driver accepted.
    pub driver_features: u64,
    /// `device_feature_select`.
    pub device_feature_select: u32,
    /// `driver_feature_select`.
    pub driver_feature_select: u32,
    /// `queue_select`.
    pub queue_select: u16,
    /// `msix_config`: the configuration-change vector.
    pub msix_config: u16,
    /// `device_status`.
    pub status: u8,
    /// `config_generation`.
    pub config_generation: u8,
    /// Every queue, in order.
    pub queues: Vec<QueueState>,
}

/// One virtqueue: the driver's setup and the device's position in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueState {
    /// Size the driver chose.
    pub size: u16,
    /// The driver enabled it (`queue_enable`).
    pub ready: bool,
    /// MSI-X vector of its used-buffer interrupts.
    pub msix_vector: u16,
    /// Descriptor table address.
    pub desc: u64,
    /// Available ring address.
    pub avail: u64,
    /// Used ring address.
    pub used: u64,
    /// Next available entry the device pops (0 unless the device was serving).
    pub next_avail: u16,
    /// Next used entry the device writes.
    pub next_used: u16,
    /// `VIRTIO_RING_F_EVENT_IDX` in use.
    pub event_idx: bool,
}

/// The MSI-X capability's control bits in a saved configuration space.
fn msix_control(config: &ConfigSpaceState, msix_cap: usize) -> Option<(bool, bool)> {
    let control = (config.regs.get(msix_cap / 4)? >> 16) as u16;
    Some((control & 0x8000 != 0, control & 0x4000 != 0))
}

impl VirtioPci {
    /// Quiesces the device (see [`VirtioDevice::quiesce`]) and returns the function's state.
    /// The device stays quiesced: call [`resume`](Self::resume) for the VM to go on. On an
    /// error nothing stays quiesced.
    pub fn save_state(&mut self) -> Result<VirtioPciState, StateError> {
        let positions = match &self.restored {
            // Restored and not resumed yet: the positions are the restored ones.
            Some(queues) => queues
                .iter()
                .map(|q| crate::QueuePosition {
                    next_avail: q.next_avail,
                    next_used: q.next_used,
                })
                .collect(),
            None => self.device.quiesce()?,
        };
        let state = self.capture(&positions);
        if state.is_err() {
            let _ = self.device.resume();
        }
        state
    }

    /// Serves again: after [`save_state`](Self::save_state) (the source VM continues), or for
    /// the first time after [`restore`](Self::restore) (the device is activated with the
    /// saved queues). Nothing to do otherwise. A restored device that cannot start also
    /// asks the driver for a reset (`DEVICE_NEEDS_RESET`).
    pub fn resume(&mut self) -> Result<(), StateError> {
        match self.restored.take() {
            Some(queues) => self.activate_restored(&queues).inspect_err(|_| {
                self.interrupt.fail();
            }),
            None => self.device.resume(),
        }
    }

    fn capture(&self, positions: &[crate::QueuePosition]) -> Result<VirtioPciState, StateError> {
        let device = self.device.save_state()?;
        let c = &self.common;
        if !positions.is_empty() && positions.len() != c.queues.len() {
            return Err(StateError::device_state(
                self.device.device_type(),
                format!(
                    "it reported {} queue positions for {} queues (a device bug)",
                    positions.len(),
                    c.queues.len()
                ),
            ));
        }
        let event_idx = c.driver_features & features::RING_EVENT_IDX != 0;
        let queues = c
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let p = positions.get(i);
                QueueState {
                    size: q.size,
                    ready: q.enabled,
                    msix_vector: q.msix_vector,
                    desc: q.desc,
                    avail: q.avail,
                    used: q.used,
                    next_avail: p.map_or(0, |p| p.next_avail),
                    next_used: p.map_or(0, |p| p.next_used),
                    event_idx,
                }
            })
            .collect();
        let (isr, needs_reset) = self.interrupt.save_isr();
        Ok(VirtioPciState {
            device_type: self.device.device_type(),
            common: CommonCfgState {
                device_features: c.device_features,
                driver_features: c.driver_features,
                device_feature_select: c.device_feature_select,
                driver_feature_select: c.driver_feature_select,
                queue_select: c.queue_select,
                msix_config: c.msix_config,
                status: c.status,
                config_generation: self.interrupt.config_generation(c.config_generation),
                queues,
            },
            isr,
            needs_reset,
            device,
            config_space: self.config.save_state(),
            msix: self.interrupt.save_msix(),
        })
    }

    /// Builds the function as [`new`](Self::new) does and applies `state` to it: registers,
    /// configuration space, MSI-X table (every programmed vector routed again through
    /// `routes`), ISR, the device's own state. The function is quiesced: a device the driver
    /// had running starts serving, with the saved rings and positions, at
    /// [`resume`](Self::resume). The state is checked first: a state that does not fit this
    /// device or is inconsistent is an error, never a panic.
    pub fn restore(
        device: Box<dyn VirtioDevice>,
        mem: Mem,
        bar: u32,
        vectors: Vec<MsixVector>,
        routes: Arc<dyn MsiRoutes>,
        state: &VirtioPciState,
    ) -> Result<Self, StateError> {
        let current = device.device_type();
        if state.device_type != current {
            return Err(StateError::DeviceType {
                saved: state.device_type,
                current,
            });
        }
        let mut t =
            Self::new(device, mem, bar, vectors, routes).map_err(|source| StateError::Host {
                device: device_name(current),
                op: "create the queue eventfds",
                source,
            })?;
        let activate = t.check(state)?;
        t.config.restore_state(&state.config_space)?;
        t.device.restore_state(&state.device)?;
        t.interrupt.restore_msix(&state.msix)?;
        let s = &state.common;
        let c = &mut t.common;
        c.driver_features = s.driver_features;
        c.device_feature_select = s.device_feature_select;
        c.driver_feature_select = s.driver_feature_select;
        c.queue_select = s.queue_select;
        c.msix_config = s.msix_config;
        c.status = s.status;
        c.config_generation = s.config_generation;
        for (qc, qs) in c.queues.iter_mut().zip(&s.queues) {
            qc.size = qs.size;
            qc.enabled = qs.ready;
            qc.msix_vector = qs.msix_vector;
            qc.desc = qs.desc;
            qc.avail = qs.avail;
            qc.used = qs.used;
        }
        t.interrupt.restore_isr(state.isr, state.needs_reset);
        t.sync_vectors();
        if activate {
            t.restored = Some(s.queues.clone());
        }
        Ok(t)
    }

    /// Checks `state` against this freshly built function; returns whether the device must
    /// be activated (the driver set `DRIVER_OK` and the device did not need a reset).
    fn check(&self, state: &VirtioPciState) -> Result<bool, StateError> {
        let name = device_name(state.device_type);
        let s = &state.common;
        let nvec = self.interrupt.vector_count();
        if state.msix.entries.len() != nvec {
            return Err(PciStateError::MsixTableSize {
                saved: state.msix.entries.len(),
                current: nvec,
            }
            .into());
        }
        let regs = state.config_space.regs.len();
        let control = msix_control(&state.config_space, self.msix_cap)
            .filter(|_| regs == 64)
            .ok_or(PciStateError::ConfigLength { got: regs })?;
        if control != (state.msix.enabled, state.msix.function_masked) {
            return Err(StateError::MsixControl);
        }
        if s.device_features != self.common.device_features {
            return Err(StateError::Features {
                device: name,
                saved: s.device_features,
                current: self.common.device_features,
            });
        }
        if s.driver_features & !s.device_features != 0 {
            return Err(StateError::AckedFeatures {
                acked: s.driver_features,
                offered: s.device_features,
            });
        }
        if s.queues.len() != self.common.queues.len() {
            return Err(StateError::QueueCount {
                device: name,
                saved: s.queues.len(),
                current: self.common.queues.len(),
            });
        }
        let vector_ok = |v: u16| v == NO_VECTOR || usize::from(v) < nvec;
        for v in std::iter::once(s.msix_config).chain(s.queues.iter().map(|q| q.msix_vector)) {
            if !vector_ok(v) {
                return Err(StateError::Vector {
                    vector: v,
                    count: nvec,
                });
            }
        }
        for (queue, (qs, qc)) in s.queues.iter().zip(&self.common.queues).enumerate() {
            if !qs.size.is_power_of_two() || qs.size > qc.max_size {
                return Err(StateError::QueueSize {
                    queue,
                    size: qs.size,
                    max: qc.max_size,
                });
            }
        }
        let activate = s.status & status::DRIVER_OK != 0
            && s.status & status::FEATURES_OK != 0
            && s.status & status::FAILED == 0
            && !state.needs_reset;
        if !activate {
            return Ok(false);
        }
        if !s.queues.iter().any(|q| q.ready) {
            return Err(StateError::NoReadyQueue);
        }
        let event_idx = s.driver_features & features::RING_EVENT_IDX != 0;
        for (queue, (qs, qc)) in s.queues.iter().zip(&self.common.queues).enumerate() {
            if !qs.ready {
                continue;
            }
            if qs.event_idx != event_idx {
                return Err(StateError::EventIdx { queue });
            }
            let in_flight = qs.next_avail.wrapping_sub(qs.next_used);
            if in_flight > qs.size {
                return Err(StateError::QueuePosition {
                    queue,
                    in_flight,
                    size: qs.size,
                });
            }
            let valid = build_queue(&queue_config(qc.max_size, qs), qs.event_idx)
                .is_ok_and(|q| q.is_valid(&self.mem));
            if !valid {
                return Err(StateError::RingOutsideMemory { queue });
            }
        }
        Ok(true)
    }

    /// Starts the device with the saved queues, at their saved positions.
    fn activate_restored(&mut self, saved: &[QueueState]) -> Result<(), StateError> {
        let name = device_name(self.device.device_type());
        let activate_error = |source| StateError::Activate {
            device: name,
            source,
        };
        let mut queues = Vec::with_capacity(saved.len());
        for (i, (qs, qc)) in saved.iter().zip(&self.common.queues).enumerate() {
            let mut queue = build_queue(&queue_config(qc.max_size, qs), qs.event_idx)
                .map_err(|_| StateError::RingOutsideMemory { queue: i })?;
            queue.set_next_avail(qs.next_avail);
            queue.set_next_used(qs.next_used);
            let event = self.events[i]
                .try_clone()
                .map_err(|e| activate_error(e.into()))?;
            queues.push(DeviceQueue { queue, event });
        }
        let irq: Arc<dyn crate::Interrupt> = self.interrupt.clone();
        self.device
            .activate(self.mem.clone(), irq, queues)
            .map_err(activate_error)
    }
}

fn queue_config(max_size: u16, qs: &QueueState) -> QueueConfig {
    QueueConfig {
        max_size,
        size: qs.size,
        msix_vector: qs.msix_vector,
        enabled: qs.ready,
        desc: qs.desc,
        avail: qs.avail,
        used: qs.used,
    }
}
