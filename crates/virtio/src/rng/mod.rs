//! virtio-rng: entropy for the guest from the host's `getrandom(2)`.
//!
//! One queue; the driver posts device-writable buffers and the device fills them (at most
//! [`MAX_PER_REQUEST`] bytes a chain), returning the number of bytes written. No feature
//! bits beyond the common ones, no configuration space.

use crate::device::{ActivateError, DeviceQueue, VirtioDevice};
use crate::queue::{self, RingError};
use crate::state::{decode, encode, QueuePosition, StateError};
use crate::worker::{QueueHandler, Service};
use crate::{device_type, features, Interrupt, Mem};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::Arc;
use virtio_queue::{DescriptorChain, Queue, QueueT};

/// Size of the queue.
pub const QUEUE_SIZE: u16 = 256;

/// Most bytes given for one chain (Linux asks for at most a few KiB at a time).
pub const MAX_PER_REQUEST: usize = 64 << 10;

/// Bytes drawn from the host per `getrandom` call (a stack buffer).
const CHUNK: usize = 4096;

/// The virtio-rng device.
#[derive(Default)]
pub struct Rng {
    acked: u64,
    worker: Service<Handler>,
}

/// What a snapshot holds of a virtio-rng device (its queue is saved by the transport).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RngState {
    /// Features the driver accepted.
    pub acked_features: u64,
}

impl Rng {
    /// A device, not yet activated.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Fills `buf` from the host's entropy pool; false if `getrandom` fails.
fn getrandom(buf: &mut [u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes for the duration of
        // the call; getrandom writes at most that many bytes into it.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::warn!("virtio-rng: getrandom failed: {err}");
            return false;
        }
        done += n as usize;
    }
    true
}

/// Fills one chain's writable buffers; returns the bytes written (0 for a chain without
/// writable buffers or with a buffer outside guest memory).
fn fill(chain: DescriptorChain<&Mem>, mem: &Mem) -> u32 {
    let Ok(mut writer) = chain.writer(mem) else {
        tracing::debug!("virtio-rng: chain with buffers outside guest memory");
        return 0;
    };
    let mut left = writer.available_bytes().min(MAX_PER_REQUEST);
    let mut chunk = [0u8; CHUNK];
    while left > 0 {
        let n = left.min(CHUNK);
        if !getrandom(&mut chunk[..n]) || writer.write_all(&chunk[..n]).is_err() {
            break;
        }
        left -= n;
    }
    // Entropy handed out must not linger on the host stack.
    chunk.fill(0);
    writer.bytes_written() as u32
}

/// Serves every chain available on `queue` on the calling thread, in order, and raises the
/// queue's interrupt when the driver wants one: the synchronous, thread-free entry point
/// (fuzzing, tests; the device's worker runs the same). Returns the number of chains served,
/// or the ring error after which the device needs a reset.
pub fn process_queue(
    queue: &mut Queue,
    mem: &Mem,
    interrupt: &dyn Interrupt,
) -> Result<usize, RingError> {
    queue::drain(queue, 0, mem, interrupt, |chain| fill(chain, mem))
}

/// The worker's state.
struct Handler {
    queue: Queue,
    mem: Mem,
    interrupt: Arc<dyn Interrupt>,
    broken: bool,
}

impl QueueHandler for Handler {
    fn handle_queue(&mut self, _index: usize) {
        if self.broken {
            return;
        }
        let result = process_queue(&mut self.queue, &self.mem, &*self.interrupt);
        crate::queue::check_ring(result, "virtio-rng", &mut self.broken, &*self.interrupt);
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        device_type::RNG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        features::COMMON
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features & self.features();
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn activate(
        &mut self,
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        queues: Vec<DeviceQueue>,
    ) -> Result<(), ActivateError> {
        self.reset();
        let DeviceQueue { queue, event } = crate::device::single_queue(queues, &mem, self.acked)?;
        let handler = Handler {
            queue,
            mem,
            interrupt,
            broken: false,
        };
        self.worker.start("virtio-rng", vec![event], handler)?;
        Ok(())
    }

    fn reset(&mut self) {
        drop(self.worker.stop());
    }

    fn is_active(&self) -> bool {
        self.worker.is_active()
    }

    fn quiesce(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        match self.worker.quiesce() {
            Ok(handler) => Ok(handler
                .map(|h| QueuePosition {
                    next_avail: h.queue.next_avail(),
                    next_used: h.queue.next_used(),
                })
                .into_iter()
                .collect()),
            Err(_) => Err(StateError::worker_lost(device_type::RNG)),
        }
    }

    fn resume(&mut self) -> Result<(), StateError> {
        self.worker.resume().map_err(|source| StateError::Host {
            device: "virtio-rng",
            op: "restart the worker thread",
            source,
        })
    }

    fn save_state(&self) -> Result<serde_json::Value, StateError> {
        encode(
            device_type::RNG,
            &RngState {
                acked_features: self.acked,
            },
        )
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), StateError> {
        let s: RngState = decode(device_type::RNG, state)?;
        StateError::check_restore(
            device_type::RNG,
            self.is_active(),
            s.acked_features,
            self.features(),
        )?;
        self.acked = s.acked_features;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
