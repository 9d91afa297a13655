//! virtio-pmem (virtio 1.2 §5.19): a guest-physical range the guest maps directly (here a
//! pcow region, served by the `densevm-pmem` mapping service) and one queue on which the
//! guest asks the host to make its writes durable. Linux sends a flush for every `fsync` on
//! a DAX filesystem there (and for REQ_PREFLUSH/FUA on the block device); the request
//! completes only after the host's flush returned, so what the guest synced survives the VMM
//! being killed.

use crate::device::{ActivateError, DeviceQueue, VirtioDevice};
use crate::queue;
use crate::state::{decode, encode, QueuePosition, StateError};
use crate::worker::{QueueHandler, Service};
use crate::{device_type, features, Interrupt, Mem};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use virtio_queue::{DescriptorChain, Queue, QueueT};

#[cfg(any(test, feature = "test-utils"))]
pub mod fuzz;

/// Makes everything the guest wrote to the range durable (pcow: data, then metadata).
pub type FlushFn = Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>;

const QUEUE_SIZE: u16 = 64;
const REQ_TYPE_FLUSH: u32 = 0;
const RESP_OK: u32 = 0;
const RESP_EIO: u32 = 1;

/// A virtio-pmem device.
pub struct Pmem {
    start: u64,
    size: u64,
    flush: FlushFn,
    acked: u64,
    worker: Service<Handler>,
}

/// What a snapshot holds of a virtio-pmem device (its queue is saved by the transport; the
/// region's contents are the pcow image, flushed when the device is quiesced).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PmemState {
    /// Features the driver accepted.
    pub acked_features: u64,
    /// Guest-physical start of the range.
    pub start: u64,
    /// Size of the range in bytes.
    pub size: u64,
}

impl Pmem {
    /// A device for `size` bytes of guest-physical memory at `start`, flushed by `flush`.
    pub fn new(start: u64, size: u64, flush: FlushFn) -> Self {
        Self {
            start,
            size,
            flush,
            acked: 0,
            worker: Service::default(),
        }
    }
}

/// Serves the flush queue (also the synchronous entry point for tests and fuzzing).
pub struct Handler {
    /// Guest memory.
    pub mem: Mem,
    /// The request queue.
    pub queue: Queue,
    /// Where interrupts go.
    pub interrupt: Arc<dyn Interrupt>,
    /// The host flush.
    pub flush: FlushFn,
    broken: bool,
}

impl Handler {
    /// A handler for `queue`.
    pub fn new(mem: Mem, queue: Queue, interrupt: Arc<dyn Interrupt>, flush: FlushFn) -> Self {
        Self {
            mem,
            queue,
            interrupt,
            flush,
            broken: false,
        }
    }

    fn serve(flush: &FlushFn, mem: &Mem, chain: DescriptorChain<&Mem>) -> u32 {
        let (mut reader, mut writer) = match (chain.clone().reader(mem), chain.writer(mem)) {
            (Ok(r), Ok(w)) => (r, w),
            _ => return 0,
        };
        // No room for the response: nothing to do (and no flush nobody could see complete).
        if writer.available_bytes() < 4 {
            return 0;
        }
        let ret = match reader.read_obj::<u32>() {
            Ok(t) if u32::from_le(t) == REQ_TYPE_FLUSH => match flush() {
                Ok(()) => RESP_OK,
                Err(e) => {
                    tracing::error!("virtio-pmem: flush failed: {e}");
                    RESP_EIO
                }
            },
            // Unknown request types and short requests are errors.
            _ => RESP_EIO,
        };
        match writer.write_obj(ret.to_le()) {
            Ok(()) => 4,
            Err(_) => 0,
        }
    }
}

impl QueueHandler for Handler {
    fn handle_queue(&mut self, _index: usize) {
        if self.broken {
            return;
        }
        let flush = self.flush.clone();
        let result = queue::drain(
            &mut self.queue,
            0,
            &self.mem,
            self.interrupt.as_ref(),
            |c| Self::serve(&flush, &self.mem, c),
        );
        queue::check_ring(result, "virtio-pmem", &mut self.broken, &*self.interrupt);
    }
}

impl VirtioDevice for Pmem {
    fn device_type(&self) -> u32 {
        device_type::PMEM
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

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut cfg = [0u8; 16];
        cfg[..8].copy_from_slice(&self.start.to_le_bytes());
        cfg[8..].copy_from_slice(&self.size.to_le_bytes());
        crate::device::read_config_bytes(&cfg, offset, data);
    }

    fn activate(
        &mut self,
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        queues: Vec<DeviceQueue>,
    ) -> Result<(), ActivateError> {
        self.reset();
        let DeviceQueue { queue, event } = crate::device::single_queue(queues, &mem, self.acked)?;
        let handler = Handler::new(mem, queue, interrupt, self.flush.clone());
        self.worker.start("virtio-pmem", vec![event], handler)?;
        Ok(())
    }

    fn reset(&mut self) {
        drop(self.worker.stop());
    }

    fn is_active(&self) -> bool {
        self.worker.is_active()
    }

    /// Stops the worker between two requests, then makes the region durable: a snapshot
    /// refers to the pcow image, which then holds everything the guest wrote.
    fn quiesce(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        let positions = match self.worker.quiesce() {
            Ok(handler) => handler
                .map(|h| QueuePosition {
                    next_avail: h.queue.next_avail(),
                    next_used: h.queue.next_used(),
                })
                .into_iter()
                .collect(),
            Err(_) => return Err(StateError::worker_lost(device_type::PMEM)),
        };
        (self.flush)().map_err(|source| StateError::Host {
            device: "virtio-pmem",
            op: "flush the pcow image",
            source,
        })?;
        Ok(positions)
    }

    fn resume(&mut self) -> Result<(), StateError> {
        self.worker.resume().map_err(|source| StateError::Host {
            device: "virtio-pmem",
            op: "restart the worker thread",
            source,
        })
    }

    fn save_state(&self) -> Result<serde_json::Value, StateError> {
        encode(
            device_type::PMEM,
            &PmemState {
                acked_features: self.acked,
                start: self.start,
                size: self.size,
            },
        )
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), StateError> {
        let s: PmemState = decode(device_type::PMEM, state)?;
        StateError::check_restore(
            device_type::PMEM,
            self.is_active(),
            s.acked_features,
            self.features(),
        )?;
        if (s.start, s.size) != (self.start, self.size) {
            return Err(StateError::device_state(
                device_type::PMEM,
                format!(
                    "the saved range is {:#x}+{:#x} but the image is placed at {:#x}+{:#x}: the pmem image is not the one snapshotted",
                    s.start, s.size, self.start, self.size
                ),
            ));
        }
        self.acked = s.acked_features;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interrupt::RecordingInterrupt;
    use crate::testing::{guest_memory, MockQueue};
    use std::sync::atomic::{AtomicU32, Ordering};

    fn counting_flush(fail: bool) -> (FlushFn, Arc<AtomicU32>) {
        let n = Arc::new(AtomicU32::new(0));
        let c = n.clone();
        let f: FlushFn = Arc::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
            if fail {
                Err(std::io::Error::other("disk gone"))
            } else {
                Ok(())
            }
        });
        (f, n)
    }

    fn handler(mq: &MockQueue, flush: FlushFn, irq: &Arc<RecordingInterrupt>) -> Handler {
        Handler::new(mq.mem.clone(), mq.queue(), irq.clone(), flush)
    }

    #[test]
    fn a_flush_request_flushes_before_it_completes() {
        let mut mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
        let (flush, n) = counting_flush(false);
        let irq = Arc::new(RecordingInterrupt::default());
        let mut h = handler(&mq, flush, &irq);
        let (head, out) = mq.add_request(&[&0u32.to_le_bytes()], &[4]);
        let (head2, out2) = mq.add_request(&[&7u32.to_le_bytes()], &[4]);
        mq.write(out[0], &[0xff; 4]);
        h.handle_queue(0);
        assert_eq!(
            n.load(Ordering::SeqCst),
            1,
            "one flush, for the one flush request"
        );
        assert_eq!(mq.used(), vec![(u32::from(head), 4), (u32::from(head2), 4)]);
        assert_eq!(mq.read(out[0], 4), 0u32.to_le_bytes());
        assert_eq!(
            mq.read(out2[0], 4),
            1u32.to_le_bytes(),
            "unknown type: error"
        );
        assert_eq!(*irq.queues.lock().unwrap(), vec![0]);
    }

    #[test]
    fn a_failed_host_flush_is_reported_to_the_guest() {
        let mut mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
        let (flush, _) = counting_flush(true);
        let irq = Arc::new(RecordingInterrupt::default());
        let mut h = handler(&mq, flush, &irq);
        let (_, out) = mq.add_request(&[&0u32.to_le_bytes()], &[4]);
        h.handle_queue(0);
        assert_eq!(mq.read(out[0], 4), 1u32.to_le_bytes());
    }

    #[test]
    fn hostile_requests_do_not_flush_or_panic() {
        let mut mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
        let (flush, n) = counting_flush(false);
        let irq = Arc::new(RecordingInterrupt::default());
        let mut h = handler(&mq, flush, &irq);
        // Request buffer outside guest memory.
        mq.add_chain(&[(1 << 40, 4, false), (0x20_0000, 4, true)]);
        // No writable buffer for the response.
        let a = mq.alloc(4);
        mq.add_chain(&[(a, 4, false)]);
        // A descriptor that points at itself.
        mq.set_desc(
            10,
            a,
            4,
            virtio_bindings::bindings::virtio_ring::VRING_DESC_F_NEXT as u16,
            10,
        );
        mq.publish(10);
        h.handle_queue(0);
        assert_eq!(mq.used().len(), 3, "each chain is returned");
        assert!(mq.used().iter().all(|&(_, len)| len == 0));
        assert_eq!(n.load(Ordering::SeqCst), 0);
        // An available index far ahead of the ring: the device needs a reset and stops.
        mq.set_avail_idx(1000);
        h.handle_queue(0);
        assert_eq!(irq.resets.load(Ordering::SeqCst), 1);
        h.handle_queue(0);
        assert_eq!(irq.resets.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn activation_serves_on_a_worker_and_reset_stops_it() {
        let mut mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
        let (flush, n) = counting_flush(false);
        let mut dev = Pmem::new(4 << 30, 256 << 20, flush);
        let mut cfg = [0u8; 16];
        dev.read_config(0, &mut cfg);
        assert_eq!(u64::from_le_bytes(cfg[..8].try_into().unwrap()), 4 << 30);
        assert_eq!(u64::from_le_bytes(cfg[8..].try_into().unwrap()), 256 << 20);
        let irq = Arc::new(RecordingInterrupt::default());
        let dq = mq.device_queue();
        let evt = dq.event.try_clone().unwrap();
        dev.activate(mq.mem.clone(), irq.clone(), vec![dq]).unwrap();
        assert!(dev.is_active());
        mq.add_request(&[&0u32.to_le_bytes()], &[4]);
        evt.write(1).unwrap();
        let t = std::time::Instant::now();
        while mq.used().is_empty() && t.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(mq.used().len(), 1);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        dev.reset();
        assert!(!dev.is_active());
    }

    #[test]
    fn quiesce_flushes_and_the_state_round_trips_into_a_device_at_the_same_place() {
        let mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
        let (flush, n) = counting_flush(false);
        let mut dev = Pmem::new(4 << 30, 256 << 20, flush.clone());
        dev.ack_features(features::COMMON);
        let irq = Arc::new(RecordingInterrupt::default());
        dev.activate(mq.mem.clone(), irq, vec![mq.device_queue()])
            .unwrap();
        let positions = dev.quiesce().unwrap();
        assert_eq!(positions.len(), 1);
        assert_eq!(
            n.load(Ordering::SeqCst),
            1,
            "quiesce makes the image durable"
        );
        let saved = dev.save_state().unwrap();
        dev.resume().unwrap();
        assert!(dev.is_active());

        let mut same = Pmem::new(4 << 30, 256 << 20, flush.clone());
        same.restore_state(&saved).unwrap();
        assert_eq!(same.acked, features::COMMON);

        let mut moved = Pmem::new(5 << 30, 256 << 20, flush.clone());
        let err = moved.restore_state(&saved).unwrap_err().to_string();
        assert!(err.contains("not the one snapshotted"), "{err}");
        let mut bigger = Pmem::new(4 << 30, 512 << 20, flush);
        assert!(bigger.restore_state(&saved).is_err());
        assert!(
            dev.restore_state(&saved).is_err(),
            "a serving device is not restored"
        );
    }

    #[test]
    fn a_failed_flush_fails_the_quiesce() {
        let mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
        let (flush, _) = counting_flush(true);
        let mut dev = Pmem::new(4 << 30, 256 << 20, flush);
        let irq = Arc::new(RecordingInterrupt::default());
        dev.activate(mq.mem.clone(), irq, vec![mq.device_queue()])
            .unwrap();
        let err = dev.quiesce().unwrap_err().to_string();
        assert!(err.contains("flush"), "{err}");
        dev.resume().unwrap();
    }
}
