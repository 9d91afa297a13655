//! Saving and restoring a virtio-blk device (snapshots): the worker is parked between two
//! requests and the disk flushed; the saved state is what the driver negotiated plus the
//! disk's identity, checked on restore so a snapshot never resumes over another disk.
//!
//! The device has no writable configuration (no `VIRTIO_BLK_F_CONFIG_WCE`): whether writes
//! are flushed one by one follows from the accepted features alone.

use super::Block;
use crate::state::{decode, encode};
use crate::{device_type, QueuePosition, StateError, VirtioDevice};
use serde::{Deserialize, Serialize};
use virtio_bindings::bindings::virtio_blk::VIRTIO_BLK_ID_BYTES;
use virtio_queue::QueueT;

const BLK: u32 = device_type::BLOCK;

/// What a snapshot holds of a virtio-blk device (its queue is saved by the transport).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockState {
    /// Features the driver accepted.
    pub acked_features: u64,
    /// Disk size in sectors (must match on restore).
    pub capacity: u64,
    /// Read-only disk (must match on restore).
    pub readonly: bool,
    /// The GET_ID answer, hex. Restored as it was (an image copied for a clone has another
    /// inode), so the guest keeps seeing the same disk ID.
    pub serial: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; VIRTIO_BLK_ID_BYTES as usize]> {
    let mut out = [0u8; VIRTIO_BLK_ID_BYTES as usize];
    if s.len() != 2 * out.len() || !s.is_ascii() {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

impl Block {
    /// Parks the worker after the requests it popped completed, then flushes the disk, so
    /// that what the guest saw written is in the image before a snapshot is taken. On a
    /// failed flush the worker runs again and the error is returned.
    pub(super) fn quiesce_worker(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        let position = match self.worker.quiesce() {
            Ok(Some(handler)) => Some(QueuePosition {
                next_avail: handler.queue.next_avail(),
                next_used: handler.queue.next_used(),
            }),
            Ok(None) => None,
            Err(_) => return Err(StateError::worker_lost(BLK)),
        };
        if let Err(source) = self.flush() {
            let _ = self.resume_worker();
            return Err(StateError::Host {
                device: "virtio-blk",
                op: "flush the disk before the snapshot",
                source,
            });
        }
        Ok(position.into_iter().collect())
    }

    pub(super) fn resume_worker(&mut self) -> Result<(), StateError> {
        self.worker.resume().map_err(|source| StateError::Host {
            device: "virtio-blk",
            op: "restart the worker thread",
            source,
        })
    }

    pub(super) fn state(&self) -> Result<serde_json::Value, StateError> {
        encode(
            BLK,
            &BlockState {
                acked_features: self.acked,
                capacity: self.capacity,
                readonly: self.readonly,
                serial: hex(&self.serial),
            },
        )
    }

    pub(super) fn apply_state(&mut self, state: &serde_json::Value) -> Result<(), StateError> {
        let s: BlockState = decode(BLK, state)?;
        let refuse = |reason: String| Err(StateError::device_state(BLK, reason));
        if self.is_active() {
            return refuse("the device is already serving; restore into a new device".into());
        }
        if s.capacity != self.capacity {
            return refuse(format!(
                "the disk has {} sectors, the snapshot's had {}: restore with the snapshot's disk \
                 image",
                self.capacity, s.capacity
            ));
        }
        if s.readonly != self.readonly {
            return refuse(format!(
                "the snapshot's disk was {}, this one is {}: attach it as the snapshot's VM did",
                if s.readonly { "read-only" } else { "writable" },
                if self.readonly {
                    "read-only"
                } else {
                    "writable"
                },
            ));
        }
        let Some(serial) = unhex(&s.serial) else {
            return refuse(format!(
                "serial {:?} is not {} hex-encoded bytes: the snapshot's state file is damaged",
                s.serial,
                self.serial.len()
            ));
        };
        if s.acked_features & !self.features() != 0 {
            return Err(StateError::AckedFeatures {
                acked: s.acked_features,
                offered: self.features(),
            });
        }
        self.acked = s.acked_features;
        self.serial = serial;
        Ok(())
    }
}
