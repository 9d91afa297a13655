//! The `balloon` fuzz target's entry point (`fuzz/`), also replayed over the
//! seed files (`fuzz/corpus/balloon`) by a plain test: the input lays out one
//! queue of the balloon (inflate, deflate, statistics or reporting) with its descriptors,
//! available ring and buffer contents, and the device's worker handler serves it on the
//! calling thread, then runs its timer with a statistics request. Whatever the bytes: no
//! panic, no hang, no more chains returned than were made available, and every range handed
//! to [`BalloonMemory`] is page aligned, non-empty and inside one guest memory region.
//!
//! Input layout (missing bytes read as zero; integers little-endian):
//!
//! | bytes | meaning |
//! | --- | --- |
//! | 1 | bit 0 `STATS_VQ` accepted, bit 1 `REPORTING` accepted, bit 2 `VIRTIO_RING_F_EVENT_IDX`, bits 4-5 the queue (0 inflate, 1 deflate, 2 statistics, 3 reporting; one not accepted means inflate), bit 6 ask for statistics before the tick |
//! | 1 | queue size `2 << (b % 8)` (2..256) |
//! | 1 | descriptors that follow: `b % (size + 1)` |
//! | 16 each | descriptor: addr u64, len u32, flags u16, next u16 ([`guest_addr`], [`guest_len`]) |
//! | 1 | chains made available: `b % (size + 1)` |
//! | 2 each | their head indices |
//! | 1 | bit 7: the available index is then overwritten by the next 2 bytes |
//! | rest | buffer contents (PFN arrays, statistics), at [`DATA_BASE`] |
//!
//! Guest memory is `[0, DATA_BASE + DATA_LEN)`, a hole of [`HOLE_LEN`], and a second region
//! of [`HOLE_LEN`] bytes: PFNs and reports land in RAM, in the hole and beyond the end.

use super::handle::Shared;
use super::serve::Handler;
use super::{feature, BalloonConfig, BalloonMemory, QueueLayout, PAGE_SIZE};
use crate::block::fuzz::{guest_addr, guest_len, DATA_BASE, DATA_LEN};
use crate::interrupt::RecordingInterrupt;
use crate::testing::MockQueue;
use crate::worker::QueueHandler;
use crate::{features, Mem};
use std::sync::{Arc, Mutex};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

/// Size of the hole after the first region, and of the region after it.
pub const HOLE_LEN: u64 = 0x1_0000;

/// The fuzzed guest memory.
pub fn guest_memory() -> Mem {
    let end = DATA_BASE + DATA_LEN;
    Mem::from_ranges(&[
        (GuestAddress(0), end as usize),
        (GuestAddress(end + HOLE_LEN), HOLE_LEN as usize),
    ])
    .expect("fuzz guest memory")
}

/// A [`BalloonMemory`] that checks the device's promise about every range.
struct Checked {
    mem: Mem,
    calls: Mutex<u64>,
}

impl Checked {
    fn check(&self, gpa: u64, len: u64) {
        assert!(len > 0, "empty range at {gpa:#x}");
        assert_eq!(gpa % PAGE_SIZE, 0, "unaligned start {gpa:#x}");
        assert_eq!(len % PAGE_SIZE, 0, "unaligned length {len:#x}");
        let region = self
            .mem
            .find_region(GuestAddress(gpa))
            .unwrap_or_else(|| panic!("{gpa:#x} is not guest memory"));
        let end = region.start_addr().0 + region.len();
        assert!(gpa + len <= end, "{gpa:#x}+{len:#x} leaves its region");
        *self.calls.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }
}

impl BalloonMemory for Checked {
    fn release(&self, gpa: u64, len: u64) -> std::io::Result<()> {
        self.check(gpa, len);
        Ok(())
    }
    fn reclaim(&self, gpa: u64, len: u64) -> std::io::Result<()> {
        self.check(gpa, len);
        Ok(())
    }
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = self.0.len().min(N);
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
}

/// Builds the queue `data` describes and has the balloon serve it.
pub fn balloon(data: &[u8]) {
    let mut input = Input(data);
    let flags = input.u8();
    let mut acked = features::COMMON;
    if flags & 1 != 0 {
        acked |= feature::STATS_VQ;
    }
    if flags & 2 != 0 {
        acked |= feature::REPORTING;
    }
    if flags & 4 == 0 {
        acked &= !features::RING_EVENT_IDX;
    }
    let layout = QueueLayout::for_features(acked);
    let index = match (flags >> 4) & 3 {
        1 => QueueLayout::DEFLATE,
        2 => layout.stats.unwrap_or(QueueLayout::INFLATE),
        3 => layout.reporting.unwrap_or(QueueLayout::INFLATE),
        _ => QueueLayout::INFLATE,
    };
    let size: u16 = 2 << (input.u8() % 8);
    let mem = guest_memory();
    let mq = MockQueue::new(mem.clone(), 0, size);
    let descs = u16::from(input.u8()) % (size + 1);
    for i in 0..descs {
        let (addr, len) = (guest_addr(input.u64()), guest_len(input.u32()));
        mq.set_desc(i, addr, len, input.u16(), input.u16());
    }
    let chains = u16::from(input.u8()) % (size + 1);
    for _ in 0..chains {
        mq.publish(input.u16());
    }
    let mut published = usize::from(chains);
    if input.u8() & 0x80 != 0 {
        let idx = input.u16();
        mq.set_avail_idx(idx);
        published = usize::from(idx);
    }
    mq.write(DATA_BASE, &input.0[..input.0.len().min(DATA_LEN as usize)]);

    let queues = (0..layout.count())
        .map(|i| {
            let mut q = if i == index {
                mq.queue()
            } else {
                Queue::new(size).expect("queue size")
            };
            q.set_event_idx(acked & features::RING_EVENT_IDX != 0);
            q
        })
        .collect();
    let config = BalloonConfig {
        amount_mib: 0,
        deflate_on_oom: false,
        stats_polling_interval_s: 1,
        free_page_reporting: true,
    };
    let Ok(shared) = Shared::new(&config) else {
        return;
    };
    let shared = Arc::new(shared);
    let memory = Arc::new(Checked {
        mem: mem.clone(),
        calls: Mutex::new(0),
    });
    let irq = Arc::new(RecordingInterrupt::default());
    let mut handler = Handler::new(mem, irq, memory, shared.clone(), queues, layout);
    // The handler's event index of queue `index` is its role order, which is the queue
    // index itself (inflate, deflate, then the accepted optional queues in order).
    handler.handle_queue(index);
    handler.handle_queue(index);
    if flags & 0x40 != 0 {
        let _ = super::BalloonHandle::new(shared).request_stats();
    }
    let _ = handler.tick();
    let used = mq.used().len();
    assert!(
        used <= published,
        "returned {used} chains, {published} were made available"
    );
}
