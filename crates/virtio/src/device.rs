//! The device side of virtio: what a transport needs from every device.

use crate::state::{QueuePosition, StateError};
use crate::{Interrupt, Mem};
use std::sync::Arc;
use thiserror::Error;
use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

/// One virtqueue as the driver configured it, with the eventfd that the transport (or KVM,
/// through an ioeventfd) signals when the driver notifies the queue.
pub struct DeviceQueue {
    /// Ring addresses, size, and the device's position in it.
    pub queue: Queue,
    /// Signalled on every driver notification of this queue.
    pub event: EventFd,
}

/// Why a device could not start.
#[derive(Debug, Error)]
pub enum ActivateError {
    /// The driver enabled a different number of queues than the device serves.
    #[error("the driver set up {got} queues, the device needs {want}")]
    QueueCount {
        /// Queues the device needs.
        want: usize,
        /// Queues given.
        got: usize,
    },
    /// A queue's rings are outside guest memory or misaligned.
    #[error("queue {0} is not valid (rings outside guest memory or misaligned)")]
    InvalidQueue(usize),
    /// A worker thread or eventfd could not be created.
    #[error("cannot start the device worker: {0}")]
    Host(#[from] std::io::Error),
}

/// A virtio device: configuration space, features, and queue service once activated.
///
/// The transport calls these from vCPU threads (configuration accesses) or the VMM; the
/// device's request handling runs on its own worker thread started by [`activate`].
///
/// [`activate`]: VirtioDevice::activate
pub trait VirtioDevice: Send {
    /// The virtio device type ([`crate::device_type`]).
    fn device_type(&self) -> u32;
    /// The largest size of each queue (its number of queues is this slice's length).
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits the device offers (including [`crate::features::VERSION_1`]).
    fn features(&self) -> u64;
    /// The driver accepted these features (a subset of [`features`](Self::features)).
    fn ack_features(&mut self, features: u64);
    /// Reads `data.len()` bytes of the device configuration space at `offset`; bytes past
    /// its end read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// A driver write to the configuration space (ignored where the spec makes it read-only).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Starts serving: the driver set `DRIVER_OK` with these queues.
    fn activate(
        &mut self,
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        queues: Vec<DeviceQueue>,
    ) -> Result<(), ActivateError>;
    /// Stops serving and returns to the state before activation (a driver reset): the worker
    /// is stopped and joined, requests in flight are completed or dropped, nothing is left
    /// running. Called also when the device was never activated.
    fn reset(&mut self);
    /// Whether the device is serving (activated and not reset since; a quiesced device is
    /// still active).
    fn is_active(&self) -> bool;

    /// Stops serving for a snapshot without a reset: the worker completes every request it
    /// popped (used ring written, interrupt raised) and is joined; the device keeps its
    /// queues for [`resume`](Self::resume). Returns each queue's position; empty when the
    /// device is not active. The default (devices without save/restore) refuses an active
    /// device with [`StateError::Unsupported`].
    fn quiesce(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        if self.is_active() {
            Err(StateError::unsupported(self.device_type()))
        } else {
            Ok(Vec::new())
        }
    }

    /// Serves again after [`quiesce`](Self::quiesce), with the same queues (the VM goes on).
    /// Nothing to do for a device that is not quiesced.
    fn resume(&mut self) -> Result<(), StateError> {
        Ok(())
    }

    /// The device's own state (accepted features, what configuration writes changed) as
    /// JSON. The default refuses with [`StateError::Unsupported`].
    fn save_state(&self) -> Result<serde_json::Value, StateError> {
        Err(StateError::unsupported(self.device_type()))
    }

    /// Applies a [`save_state`](Self::save_state) value to this freshly built, inactive
    /// device (the transport activates it afterwards). The value is untrusted: a state that
    /// does not fit is an error, and the device is unchanged.
    fn restore_state(&mut self, _state: &serde_json::Value) -> Result<(), StateError> {
        Err(StateError::unsupported(self.device_type()))
    }
}

/// The queue of a one-queue device, checked: exactly one queue, rings inside guest memory,
/// `VIRTIO_RING_F_EVENT_IDX` applied as `acked_features` say.
pub fn single_queue(
    queues: Vec<DeviceQueue>,
    mem: &Mem,
    acked_features: u64,
) -> Result<DeviceQueue, ActivateError> {
    use virtio_queue::QueueT;
    let got = queues.len();
    let Some(mut dq) = queues.into_iter().next().filter(|_| got == 1) else {
        return Err(ActivateError::QueueCount { want: 1, got });
    };
    if !dq.queue.is_valid(mem) {
        return Err(ActivateError::InvalidQueue(0));
    }
    dq.queue
        .set_event_idx(acked_features & crate::features::RING_EVENT_IDX != 0);
    Ok(dq)
}

/// Reads `data.len()` bytes of a configuration space `config` at `offset`; bytes past its
/// end read as zero.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if let Some(src) = config.get(start..) {
        let n = src.len().min(data.len());
        data[..n].copy_from_slice(&src[..n]);
    }
}
