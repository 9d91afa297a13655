//! The `virtqueue` fuzz target's entry point (`fuzz/fuzz_targets/virtqueue.rs`), also replayed
//! over the seed files by a plain test: an input byte string becomes a guest memory with a
//! split virtqueue (descriptor table, available ring, buffer contents) that a device then
//! serves through its synchronous entry point: virtio-blk ([`Block::process_queue`]),
//! virtio-rng ([`crate::rng::process_queue`]) or virtio-9p ([`crate::p9::process_queue`], on
//! a read-only export of a scratch directory). Whatever the bytes, serving must neither
//! panic nor hang, a read-only disk is never written, and no more chains are returned than
//! were made available.
//!
//! Input layout (missing bytes read as zero; integers little-endian):
//!
//! | bytes | meaning |
//! | --- | --- |
//! | 1 | bits 4-5 the device: 1 rng, 2 9p, else block; bit 2 `VIRTIO_RING_F_EVENT_IDX`; block: bit 0 read-only, bit 1 pcow backend (else an in-memory raw disk), bit 3 `VIRTIO_BLK_F_FLUSH` acked |
//! | 1 | queue size `2 << (b % 8)` (2..256) |
//! | 1 | descriptors that follow: `b % (size + 1)` |
//! | 16 each | descriptor `i`: addr u64, len u32, flags u16, next u16 (see [`guest_addr`]) |
//! | 1 | chains made available: `b % (size + 1)` |
//! | 2 each | their head indices |
//! | 1 | bit 7: the available index is then overwritten by the next 2 bytes |
//! | rest | buffer contents, at [`DATA_BASE`] (at most [`DATA_LEN`] bytes) |

use super::backend::{Backend, MemDisk, PcowDisk};
use super::{Block, SECTOR_SIZE};
use crate::interrupt::RecordingInterrupt;
use crate::queue::RingError;
use crate::testing::{guest_memory, MockQueue};
use crate::VirtioDevice;
use std::io;
use std::sync::Arc;
use virtio_bindings::bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;
use virtio_queue::Queue;

/// Where buffer contents go in guest memory (past the rings of a 256-entry queue at 0).
pub const DATA_BASE: u64 = 0x10_0000;
/// Bytes of buffer contents; guest memory ends right after them.
pub const DATA_LEN: u64 = 0x1_0000;
/// Size of the fuzzed disk.
pub const DISK_LEN: u64 = 0x1_0000;

/// Bit 63 of a descriptor address keeps it raw (usually outside guest memory); otherwise it
/// is folded into the data area, so most descriptors point at the fuzzer's bytes.
pub fn guest_addr(raw: u64) -> u64 {
    if raw & (1 << 63) != 0 {
        raw & !(1 << 63)
    } else {
        DATA_BASE + raw % DATA_LEN
    }
}

/// Bit 31 of a descriptor length keeps it raw; otherwise it is at most `DATA_LEN`.
pub fn guest_len(raw: u32) -> u32 {
    if raw & (1 << 31) != 0 {
        raw & !(1 << 31)
    } else {
        raw % (DATA_LEN as u32 + 1)
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

/// A disk that must not be written when read-only: the fuzz invariant.
struct Guarded<B> {
    inner: B,
    readonly: bool,
}

impl<B: Backend> Guarded<B> {
    fn check(&self, what: &str) -> io::Result<()> {
        assert!(!self.readonly, "a read-only disk got a {what}");
        Ok(())
    }
}

impl<B: Backend> Backend for Guarded<B> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, buf)
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check("write")?;
        self.inner.write(offset, data)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
    fn discard(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.check("discard")?;
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&mut self, offset: u64, len: u64, unmap: bool) -> io::Result<()> {
        self.check("write-zeroes")?;
        self.inner.write_zeroes(offset, len, unmap)
    }
    fn discard_granularity(&self) -> u64 {
        self.inner.discard_granularity()
    }
}

fn pcow_disk(readonly: bool) -> Option<PcowDisk> {
    let storage: Arc<dyn pcow::Storage> = Arc::new(pcow::MemStorage::new("fuzz"));
    let opts = pcow::CreateOptions {
        virtual_size: DISK_LEN,
        cluster_size: 4096,
        backing: None,
    };
    let header = pcow::new_header(&opts, [0; 16]).ok()?;
    pcow::Image::create(storage.clone(), header).ok()?;
    let image = pcow::Image::open(storage, !readonly).ok()?;
    pcow::Chain::from_images(vec![image], false)
        .ok()
        .map(PcowDisk::new)
}

/// Builds the queue `data` describes and has the device it names serve it.
pub fn virtqueue(data: &[u8]) {
    let mut input = Input(data);
    let flags = input.u8();
    let size: u16 = 2 << (input.u8() % 8);
    let mem = guest_memory((DATA_BASE + DATA_LEN) as usize);
    let mq = MockQueue::new(mem, 0, size);

    let descs = u16::from(input.u8()) % (size + 1);
    for i in 0..descs {
        let (addr, len) = (guest_addr(input.u64()), guest_len(input.u32()));
        mq.set_desc(i, addr, len, input.u16(), input.u16());
    }
    let chains = u16::from(input.u8()) % (size + 1);
    for _ in 0..chains {
        mq.publish(input.u16());
    }
    let mut published = u64::from(chains);
    if input.u8() & 0x80 != 0 {
        let idx = input.u16();
        mq.set_avail_idx(idx);
        published = u64::from(idx);
    }
    let contents = &input.0[..input.0.len().min(DATA_LEN as usize)];
    mq.write(DATA_BASE, contents);

    let mut queue = mq.queue();
    virtio_queue::QueueT::set_event_idx(&mut queue, flags & 4 != 0);
    let irq = &RecordingInterrupt::default();
    let mem = &mq.mem;
    let serve: &mut dyn FnMut(&mut Queue) -> Result<usize, RingError> = match (flags >> 4) & 3 {
        1 => &mut |q| crate::rng::process_queue(q, mem, irq),
        2 => {
            let session = P9_SHARE.with(|p9| p9.as_ref().map(|p9| p9.session()));
            let Some(session) = session else { return };
            &mut move |q| crate::p9::process_queue(&session, q, mem, irq)
        }
        _ => {
            let Some(block) = block(flags) else { return };
            &mut move |q| block.process_queue(mem, q, irq)
        }
    };
    let mut served = 0u64;
    for _ in 0..2 {
        match serve(&mut queue) {
            Ok(n) => served += n as u64,
            Err(_) => break,
        }
    }
    assert!(
        served <= published,
        "served {served} chains, {published} were made available"
    );
}

/// The block device of input flags `flags`.
fn block(flags: u8) -> Option<Block> {
    let readonly = flags & 1 != 0;
    let backend: Box<dyn Backend> = if flags & 2 != 0 {
        Box::new(Guarded {
            inner: pcow_disk(readonly)?,
            readonly,
        })
    } else {
        let mut disk = MemDisk::new(DISK_LEN as usize);
        for (i, b) in disk.data.iter_mut().enumerate() {
            *b = (i as u64 / SECTOR_SIZE) as u8;
        }
        Box::new(Guarded {
            inner: disk,
            readonly,
        })
    };
    let mut block = Block::from_backend(backend, readonly, *b"fuzz-serial-0123456\0");
    let mut acked = block.features();
    if flags & 8 == 0 {
        acked &= !(1 << VIRTIO_BLK_F_FLUSH);
    }
    block.ack_features(acked);
    Some(block)
}

thread_local! {
    /// A read-only 9p export of a small directory (a file `f`, a directory `d`), made once
    /// per thread: the fuzzer explores the transport, not the host file system. One fixed
    /// directory for every run (same contents), so runs leave nothing new behind.
    static P9_SHARE: Option<crate::p9::P9> = {
        let dir = std::env::temp_dir().join("densevm-virtio-fuzz-share");
        let made = std::fs::create_dir_all(dir.join("d")).and_then(|()| std::fs::write(dir.join("f"), b"fuzz"));
        made.ok().and_then(|()| {
            let mut cfg = crate::p9::ShareConfig::new(&dir, "fuzz");
            cfg.server.readonly = true;
            crate::p9::P9::new(cfg).ok()
        })
    };
}
