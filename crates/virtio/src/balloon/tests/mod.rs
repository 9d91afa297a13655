//! Balloon tests against the mock driver: a fake [`BalloonMemory`] records every range, so
//! each test asserts exactly what was released.
//!
//! - `requests.rs` — inflate/deflate coalescing, PFNs outside RAM, hostile chains, free page
//!   reports;
//! - `device.rs` — queue numbering, activation, configuration space and interrupt, statistics,
//!   save/restore, the device behind the virtio-pci transport, the fuzz seeds.

mod device;
mod requests;

use super::handle::Shared;
use super::serve::Handler;
use super::*;
use crate::interrupt::RecordingInterrupt;
use crate::testing::MockQueue;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use vm_memory::GuestAddress;

/// What the device asked of the VMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    Release(u64, u64),
    Reclaim(u64, u64),
}

/// Records every call; fails them when told to.
#[derive(Default)]
pub(super) struct FakeMemory {
    pub calls: Mutex<Vec<Call>>,
    pub fail: AtomicBool,
}

impl FakeMemory {
    pub fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
    fn record(&self, c: Call) -> std::io::Result<()> {
        self.calls.lock().unwrap().push(c);
        if self.fail.load(Ordering::SeqCst) {
            Err(std::io::Error::from_raw_os_error(libc::EINVAL))
        } else {
            Ok(())
        }
    }
}

impl BalloonMemory for FakeMemory {
    fn release(&self, gpa: u64, len: u64) -> std::io::Result<()> {
        self.record(Call::Release(gpa, len))
    }
    fn reclaim(&self, gpa: u64, len: u64) -> std::io::Result<()> {
        self.record(Call::Reclaim(gpa, len))
    }
}

pub(super) const MIB: u64 = 1 << 20;

/// Guest memory from `(start, len)` ranges.
pub(super) fn memory(ranges: &[(u64, u64)]) -> Mem {
    let r: Vec<_> = ranges
        .iter()
        .map(|&(s, l)| (GuestAddress(s), l as usize))
        .collect();
    Mem::from_ranges(&r).unwrap()
}

pub(super) fn config(stats_s: u16, reporting: bool) -> BalloonConfig {
    BalloonConfig {
        amount_mib: 0,
        deflate_on_oom: true,
        stats_polling_interval_s: stats_s,
        free_page_reporting: reporting,
    }
}

/// Where queue `i` of a rig lives (its buffers start 1 MiB above).
pub(super) fn queue_base(i: usize) -> u64 {
    i as u64 * 0x4_0000
}

/// The worker's handler over mock queues, served synchronously.
pub(super) struct Rig {
    pub queues: Vec<MockQueue>,
    pub handler: Handler,
    pub handle: BalloonHandle,
    pub memory: Arc<FakeMemory>,
    pub irq: Arc<RecordingInterrupt>,
    pub layout: QueueLayout,
}

impl Rig {
    /// A handler for `acked` balloon features (plus the common ones) over `mem`.
    pub fn new(acked: u64, mem: Mem) -> Self {
        let layout = QueueLayout::for_features(acked);
        let queues: Vec<MockQueue> = (0..layout.count())
            .map(|i| MockQueue::new(mem.clone(), queue_base(i), 64))
            .collect();
        let cfg = config(5, acked & feature::REPORTING != 0);
        let shared = Arc::new(Shared::new(&cfg).unwrap());
        let memory = Arc::new(FakeMemory::default());
        let irq = Arc::new(RecordingInterrupt::default());
        shared.connect(irq.clone());
        let handler = Handler::new(
            mem,
            irq.clone(),
            memory.clone(),
            shared.clone(),
            queues.iter().map(|q| q.queue()).collect(),
            layout,
        );
        Self {
            queues,
            handler,
            handle: BalloonHandle::new(shared),
            memory,
            irq,
            layout,
        }
    }

    /// Publishes a chain of one readable buffer of `pfns` on queue `q`; returns its head.
    pub fn pfns(&mut self, q: usize, pfns: &[u32]) -> u16 {
        let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.queues[q].add_request(&[&bytes], &[]).0
    }

    /// Serves queue `q` as a notification would.
    pub fn serve(&mut self, q: usize) {
        crate::worker::QueueHandler::handle_queue(&mut self.handler, q);
    }

    pub fn used(&self, q: usize) -> Vec<(u32, u32)> {
        self.queues[q].used()
    }

    pub fn counters(&self) -> BalloonCounters {
        self.handle.counters()
    }
}
