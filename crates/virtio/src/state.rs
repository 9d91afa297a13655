//! Saving and restoring virtio devices (snapshots, issue #11): what a device reports when it
//! is quiesced, and every reason a save or a restore fails.
//!
//! A restored state comes from a snapshot file: it is checked against the freshly built
//! device, and each inconsistency is its own [`StateError`], never a panic.

use crate::device_type;
use densevm_devices::pci::PciStateError;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Where a quiesced device stands in one of its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuePosition {
    /// The next available-ring entry the device will pop.
    pub next_avail: u16,
    /// The next used-ring entry the device will write.
    pub next_used: u16,
}

/// The name of a virtio device type, for messages.
pub fn device_name(device_type: u32) -> &'static str {
    match device_type {
        device_type::NET => "virtio-net",
        device_type::BLOCK => "virtio-blk",
        device_type::RNG => "virtio-rng",
        device_type::BALLOON => "virtio-balloon",
        device_type::P9 => "virtio-9p",
        device_type::PMEM => "virtio-pmem",
        device_type::VSOCK => "virtio-vsock",
        _ => "virtio device",
    }
}

/// Why a device's state cannot be saved or restored.
#[derive(Debug, Error)]
pub enum StateError {
    /// The device has no save/restore yet.
    #[error("{device} state cannot be saved yet ({why}); {what_to_do}")]
    Unsupported {
        /// Device name.
        device: &'static str,
        /// What is missing.
        why: &'static str,
        /// How to get a snapshot anyway.
        what_to_do: &'static str,
    },
    /// The device's worker thread panicked: its queues are lost.
    #[error(
        "the {device} worker thread ended unexpectedly (see the log before this): the device \
         no longer serves and its state cannot be saved; restart the VM"
    )]
    WorkerLost {
        /// Device name.
        device: &'static str,
    },
    /// A host operation failed (flushing a disk, starting a thread).
    #[error("{device}: cannot {op}: {source}")]
    Host {
        /// Device name.
        device: &'static str,
        /// What was attempted.
        op: &'static str,
        /// What failed.
        source: std::io::Error,
    },
    /// The snapshot has another kind of device in this place.
    #[error(
        "the snapshot has a {} here, this VM a {}: add the same devices in the same order as \
         the snapshot's VM",
        device_name(*saved), device_name(*current)
    )]
    DeviceType {
        /// Saved device type.
        saved: u32,
        /// This device's type.
        current: u32,
    },
    /// The device-specific state does not fit this device.
    #[error("the snapshot's {device} state does not fit this device: {reason}")]
    DeviceState {
        /// Device name.
        device: &'static str,
        /// What does not fit and what to do.
        reason: String,
    },
    /// The features the device offers differ from the snapshot's.
    #[error(
        "the snapshot's {device} offered features {saved:#x}, this one offers {current:#x}: \
         restore with the same device options (e.g. readonly) as the snapshot's VM"
    )]
    Features {
        /// Device name.
        device: &'static str,
        /// Offered in the snapshot.
        saved: u64,
        /// Offered now.
        current: u64,
    },
    /// The driver's accepted features are not a subset of the offered ones.
    #[error(
        "the snapshot's driver accepted features {acked:#x} that the device never offered \
         ({offered:#x}): the snapshot's state file is damaged"
    )]
    AckedFeatures {
        /// Accepted.
        acked: u64,
        /// Offered.
        offered: u64,
    },
    /// The snapshot has another number of queues.
    #[error(
        "the snapshot's {device} has {saved} queues, this one {current}: the state file is \
         damaged or from another densevm version"
    )]
    QueueCount {
        /// Device name.
        device: &'static str,
        /// Saved queues.
        saved: usize,
        /// This device's.
        current: usize,
    },
    /// A queue size that the device does not support.
    #[error(
        "queue {queue} of the snapshot has size {size}, but sizes are powers of two up to \
         {max}: the snapshot's state file is damaged"
    )]
    QueueSize {
        /// Queue index.
        queue: usize,
        /// Saved size.
        size: u16,
        /// The device's maximum.
        max: u16,
    },
    /// An enabled queue's rings are not in guest memory.
    #[error(
        "queue {queue} of the snapshot has rings outside guest memory or misaligned: the state \
         file does not belong to this memory file, or is damaged"
    )]
    RingOutsideMemory {
        /// Queue index.
        queue: usize,
    },
    /// Further ahead in the available ring than in the used ring than a queue holds.
    #[error(
        "queue {queue} of the snapshot has {in_flight} requests in flight, more than its size \
         {size}: the snapshot's state file is damaged"
    )]
    QueuePosition {
        /// Queue index.
        queue: usize,
        /// next_avail - next_used.
        in_flight: u16,
        /// Queue size.
        size: u16,
    },
    /// A queue's event-index flag disagrees with the accepted features.
    #[error(
        "queue {queue} of the snapshot disagrees with the accepted features on \
         VIRTIO_RING_F_EVENT_IDX: the snapshot's state file is damaged"
    )]
    EventIdx {
        /// Queue index.
        queue: usize,
    },
    /// DRIVER_OK without a queue to serve.
    #[error(
        "the snapshot's device status has DRIVER_OK but no queue enabled: the snapshot's state \
         file is damaged"
    )]
    NoReadyQueue,
    /// An MSI-X vector number beyond the table.
    #[error(
        "the snapshot selects MSI-X vector {vector} but the table has {count}: the snapshot's \
         state file is damaged"
    )]
    Vector {
        /// The vector number.
        vector: u16,
        /// Table size.
        count: usize,
    },
    /// MSI-X control bits differ between the configuration space and the MSI-X state.
    #[error(
        "the snapshot's MSI-X enable and mask bits differ between the PCI configuration space \
         and the MSI-X state: the snapshot's state file is damaged"
    )]
    MsixControl,
    /// The PCI configuration space or MSI-X table.
    #[error(transparent)]
    Pci(#[from] PciStateError),
    /// The restored device could not start serving.
    #[error("cannot restart the restored {device}: {source}")]
    Activate {
        /// Device name.
        device: &'static str,
        /// Why.
        source: crate::ActivateError,
    },
}

impl StateError {
    /// What a device without save/restore answers (the default of
    /// [`VirtioDevice::save_state`](crate::VirtioDevice::save_state)).
    pub fn unsupported(device_type: u32) -> Self {
        let (why, what_to_do) = match device_type {
            device_type::P9 => ("open fids", "snapshot a VM without --share"),
            _ => (
                "not implemented for this device",
                "snapshot a VM without it",
            ),
        };
        StateError::Unsupported {
            device: device_name(device_type),
            why,
            what_to_do,
        }
    }

    /// The checks every device makes before it takes a saved state: it must not be serving
    /// yet, and the features the saved driver acked must be ones it offers.
    pub fn check_restore(
        device_type: u32,
        active: bool,
        acked: u64,
        offered: u64,
    ) -> Result<(), Self> {
        if active {
            return Err(Self::device_state(
                device_type,
                "the device is already serving; restore into a new device",
            ));
        }
        if acked & !offered != 0 {
            return Err(StateError::AckedFeatures { acked, offered });
        }
        Ok(())
    }

    /// The worker of `device_type` panicked.
    pub fn worker_lost(device_type: u32) -> Self {
        StateError::WorkerLost {
            device: device_name(device_type),
        }
    }

    /// A device state that does not fit, for `device_type`.
    pub fn device_state(device_type: u32, reason: impl Into<String>) -> Self {
        StateError::DeviceState {
            device: device_name(device_type),
            reason: reason.into(),
        }
    }
}

/// Decodes a device's saved state (a JSON value), refusing unknown or missing fields.
pub fn decode<T: serde::de::DeserializeOwned>(
    device_type: u32,
    state: &serde_json::Value,
) -> Result<T, StateError> {
    T::deserialize(state).map_err(|e| {
        StateError::device_state(
            device_type,
            format!("{e} (the snapshot's state file is damaged or from another densevm version)"),
        )
    })
}

/// Encodes a device's state as a JSON value.
pub fn encode<T: Serialize>(device_type: u32, state: &T) -> Result<serde_json::Value, StateError> {
    serde_json::to_value(state)
        .map_err(|e| StateError::device_state(device_type, format!("cannot encode it: {e}")))
}
