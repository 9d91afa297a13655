//! virtio-blk tests, through the mock driver ([`MockQueue`]) on raw files and pcow images in
//! temporary directories. `requests.rs`: the request types; `hostile.rs`: malformed chains
//! and rings; `device.rs`: opening, configuration space, the worker, reset.

mod device;
mod hostile;
mod requests;

use super::backend::{Backend, MemDisk};
use super::*;
use crate::interrupt::RecordingInterrupt;
use crate::testing::{guest_memory, MockQueue};
use std::os::unix::fs::FileExt;
use std::path::Path;
use virtio_bindings::bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;
const IN: u32 = VIRTIO_BLK_T_IN;
const OUT: u32 = VIRTIO_BLK_T_OUT;
const FLUSH: u32 = VIRTIO_BLK_T_FLUSH;
const GET_ID: u32 = VIRTIO_BLK_T_GET_ID;
const DISCARD: u32 = VIRTIO_BLK_T_DISCARD;
const WRITE_ZEROES: u32 = VIRTIO_BLK_T_WRITE_ZEROES;
const UNMAP: u32 = VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;
/// Written into every device-writable buffer before a request, to see what the device wrote.
const POISON: u8 = 0xa5;

/// A request header.
fn header(kind: u32, sector: u64) -> Vec<u8> {
    let mut h = kind.to_le_bytes().to_vec();
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&sector.to_le_bytes());
    h
}

/// Discard / write-zeroes segments.
fn segments(segs: &[(u64, u32, u32)]) -> Vec<u8> {
    let mut v = Vec::new();
    for &(sector, n, flags) in segs {
        v.extend_from_slice(&sector.to_le_bytes());
        v.extend_from_slice(&n.to_le_bytes());
        v.extend_from_slice(&flags.to_le_bytes());
    }
    v
}

/// Deterministic, sector-distinct test data.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(37).wrapping_add((i / 7) as u8) ^ (i / 512) as u8)
        .collect()
}

/// A disk file in its own temporary directory.
struct TestDisk {
    _dir: tempfile::TempDir,
    path: PathBuf,
    format: ImageFormat,
}

impl TestDisk {
    /// A sparse raw file of `size` bytes.
    fn raw(size: u64) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("disk.raw");
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(size))
            .expect("raw disk");
        Self {
            _dir: dir,
            path,
            format: ImageFormat::Raw,
        }
    }

    /// An empty pcow image of `size` bytes with 64 KiB clusters.
    fn pcow(size: u64) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("disk.pcow");
        create_pcow(&path, size, None);
        Self {
            _dir: dir,
            path,
            format: ImageFormat::Pcow,
        }
    }

    fn of(format: ImageFormat, size: u64) -> Self {
        match format {
            ImageFormat::Raw => Self::raw(size),
            ImageFormat::Pcow => Self::pcow(size),
        }
    }

    fn open(&self, readonly: bool) -> Block {
        Block::open(BlockConfig {
            path: self.path.clone(),
            readonly,
            format: self.format,
        })
        .expect("open test disk")
    }

    /// What the disk holds at `offset`, read behind the device's back.
    fn contents(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        match self.format {
            ImageFormat::Raw => std::fs::File::open(&self.path)
                .and_then(|f| f.read_exact_at(&mut v, offset))
                .expect("read raw disk"),
            ImageFormat::Pcow => pcow::Chain::open(&self.path, pcow::OpenOptions::default())
                .and_then(|c| c.read(offset, &mut v))
                .expect("read pcow disk"),
        }
        v
    }

    /// 512-byte blocks the file occupies on the host.
    fn host_blocks(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path).expect("stat").blocks()
    }
}

fn create_pcow(path: &Path, size: u64, backing: Option<&str>) {
    let opts = pcow::CreateOptions {
        virtual_size: size,
        cluster_size: 64 << 10,
        backing: backing.map(str::to_string),
    };
    pcow::create_file(path, &opts).expect("create pcow image");
}

/// What the device wrote back for one chain.
struct Reply {
    /// Each device-writable buffer, in order, after the request.
    outs: Vec<Vec<u8>>,
    /// The used-ring length.
    len: u32,
}

impl Reply {
    /// The last byte of the last writable buffer.
    fn status(&self) -> u8 {
        self.outs
            .last()
            .and_then(|b| b.last().copied())
            .expect("a writable buffer")
    }
    /// The data buffers (all writable buffers, the last one's status byte dropped).
    fn data(&self) -> Vec<u8> {
        let mut v: Vec<u8> = self.outs.concat();
        v.pop();
        v
    }
}

/// A mock driver: guest memory with one queue at 0.
struct Driver {
    mq: MockQueue,
    queue: Queue,
    irq: RecordingInterrupt,
    /// Writable buffers of each submitted chain, by submission order.
    pending: Vec<(u16, Vec<(u64, u32)>)>,
}

impl Driver {
    fn new() -> Self {
        Self::with(8 << 20, QUEUE_SIZE)
    }

    fn with(mem_size: usize, size: u16) -> Self {
        let mq = MockQueue::new(guest_memory(mem_size), 0, size);
        let queue = mq.queue();
        Self {
            mq,
            queue,
            irq: RecordingInterrupt::default(),
            pending: Vec::new(),
        }
    }

    /// Makes a chain available: driver-readable buffers `ins`, then device-writable
    /// buffers of `outs` bytes (poisoned).
    fn submit(&mut self, ins: &[&[u8]], outs: &[u32]) -> u16 {
        let (head, addrs) = self.mq.add_request(ins, outs);
        for (&a, &n) in addrs.iter().zip(outs) {
            self.mq.write(a, &vec![POISON; n as usize]);
        }
        self.pending
            .push((head, addrs.into_iter().zip(outs.iter().copied()).collect()));
        head
    }

    /// Serves the queue on this thread; returns how many chains were served.
    fn serve(&mut self, block: &Block) -> usize {
        block
            .process_queue(&self.mq.mem, &mut self.queue, &self.irq)
            .expect("the ring is sound")
    }

    /// The replies to every submitted chain, in submission order, checked against the used
    /// ring (which must hold exactly them, in order).
    fn replies(&mut self) -> Vec<Reply> {
        let used = self.mq.used();
        assert_eq!(used.len(), self.pending.len(), "every chain returned once");
        used.iter()
            .zip(&self.pending)
            .map(|(&(head, len), (want, outs))| {
                assert_eq!(head, u32::from(*want), "used ring in submission order");
                Reply {
                    outs: outs
                        .iter()
                        .map(|&(a, n)| self.mq.read(a, n as usize))
                        .collect(),
                    len,
                }
            })
            .collect()
    }

    /// Submits one request, serves it, returns its reply.
    fn request(&mut self, block: &Block, ins: &[&[u8]], outs: &[u32]) -> Reply {
        self.submit(ins, outs);
        assert_eq!(self.serve(block), 1);
        self.replies().pop().expect("a reply")
    }

    /// Writes `data` at `sector`; returns the status.
    fn write(&mut self, block: &Block, sector: u64, data: &[u8]) -> u8 {
        let r = self.request(block, &[&header(OUT, sector), data], &[1]);
        assert_eq!(r.len, 1, "a write returns only its status");
        r.status()
    }

    /// Reads `len` bytes at `sector`; returns the status and the data.
    fn read(&mut self, block: &Block, sector: u64, len: u32) -> (u8, Vec<u8>) {
        let r = self.request(block, &[&header(IN, sector)], &[len, 1]);
        if r.status() == OK {
            assert_eq!(r.len, len + 1, "a read returns its data and status");
        }
        (r.status(), r.data())
    }

    /// A discard or write-zeroes request; returns the status.
    fn dwz(&mut self, block: &Block, kind: u32, segs: &[(u64, u32, u32)]) -> u8 {
        self.request(block, &[&header(kind, 0), &segments(segs)], &[1])
            .status()
    }
}

/// A device over an in-memory disk of `sectors` sectors.
fn mem_block(sectors: usize, readonly: bool) -> Block {
    let disk: Box<dyn Backend> = Box::new(MemDisk::new(sectors * 512));
    Block::from_backend(disk, readonly, *b"mem-disk-serial\0\0\0\0\0")
}

/// Runs `f` once on a raw file and once on a pcow image.
fn both(f: impl Fn(ImageFormat)) {
    f(ImageFormat::Raw);
    f(ImageFormat::Pcow);
}
