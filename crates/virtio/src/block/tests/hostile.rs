//! A hostile driver: buffers outside guest memory, loops, overlong chains, wrong directions,
//! a lying available index, huge lengths. Nothing may panic, hang, or touch memory the
//! driver did not hand to the device; the fuzz seeds replay here too.

use super::*;
use std::time::{Duration, Instant};
use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};

const R: u16 = 0;
const W: u16 = VRING_DESC_F_WRITE as u16;
const NEXT: u16 = VRING_DESC_F_NEXT as u16;
const INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;
const MEM: usize = 8 << 20;

/// A driver, a 64-sector in-memory disk whose sector `i` is filled with `i`, a poisoned
/// status buffer and a header buffer for `kind` at sector 0.
struct Bench {
    d: Driver,
    block: Block,
    hdr: u64,
    status: u64,
}

fn bench(kind: u32, size: u16) -> Bench {
    let mut d = Driver::with(MEM, size);
    let block = mem_block(64, false);
    let hdr = d.mq.alloc(16);
    d.mq.write(hdr, &header(kind, 0));
    let status = d.mq.alloc(1);
    d.mq.write(status, &[POISON]);
    Bench {
        d,
        block,
        hdr,
        status,
    }
}

impl Bench {
    fn buffer(&mut self, len: u32) -> u64 {
        let a = self.d.mq.alloc(len);
        self.d.mq.write(a, &vec![POISON; len as usize]);
        a
    }
    /// Serves what was published; returns the used length of the one chain.
    fn serve_one(&mut self) -> u32 {
        assert_eq!(self.d.serve(&self.block), 1);
        self.d.mq.used()[0].1
    }
    fn status(&self) -> u8 {
        self.d.mq.read(self.status, 1)[0]
    }
    fn untouched(&self, addr: u64, len: usize) -> bool {
        self.d.mq.read(addr, len).iter().all(|&b| b == POISON)
    }
    fn disk_sector(&mut self, sector: u64) -> Vec<u8> {
        let (s, v) = Driver::new().read(&self.block, sector, 512);
        assert_eq!(s, OK);
        v
    }
}

#[test]
fn writable_buffer_outside_guest_memory() {
    for addr in [MEM as u64 - 256, MEM as u64, u64::MAX - 8] {
        let mut b = bench(IN, 16);
        b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
        b.d.mq.set_desc(1, addr, 512, W | NEXT, 2);
        b.d.mq.set_desc(2, b.status, 1, W, 0);
        b.d.mq.publish(0);
        assert_eq!(b.serve_one(), 0, "nowhere to put a status at {addr:#x}");
        assert_eq!(
            b.status(),
            POISON,
            "the status buffer is not written either"
        );
    }
}

#[test]
fn readable_buffer_outside_guest_memory() {
    // The header.
    let mut b = bench(IN, 16);
    b.d.mq.set_desc(0, MEM as u64 - 8, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, b.status, 1, W, 0);
    b.d.mq.publish(0);
    assert_eq!((b.serve_one(), b.status()), (1, IOERR));
    // A write's data.
    let mut b = bench(OUT, 16);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, MEM as u64 - 256, 512, R | NEXT, 2);
    b.d.mq.set_desc(2, b.status, 1, W, 0);
    b.d.mq.publish(0);
    assert_eq!((b.serve_one(), b.status()), (1, IOERR));
    assert_eq!(b.disk_sector(0), vec![0; 512], "nothing written");
}

#[test]
fn descriptor_loops_end() {
    // Two descriptors naming each other, and one naming itself.
    for (first_next, second_next) in [(1, 0), (0, 0)] {
        let mut b = bench(IN, 16);
        let data = b.buffer(512);
        b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, first_next);
        b.d.mq.set_desc(1, data, 512, W | NEXT, second_next);
        b.d.mq.publish(0);
        let start = Instant::now();
        assert_eq!(b.serve_one(), 0, "a loop is returned unserved");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(b.untouched(data, 512), "nothing written into the loop");
    }
}

#[test]
fn chain_longer_than_the_queue() {
    // Every entry of a 4-entry table chained, and then on again: 5 descriptors.
    let mut b = bench(IN, 4);
    let data = b.buffer(512);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    for i in 1..4 {
        b.d.mq.set_desc(i, data, 128, W | NEXT, (i + 1) % 4);
    }
    b.d.mq.publish(0);
    assert_eq!(b.serve_one(), 0);
    assert!(b.untouched(data, 512));
    // A next index past the table.
    let mut b = bench(IN, 4);
    let data = b.buffer(512);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, data, 512, W | NEXT, 9);
    b.d.mq.publish(0);
    assert_eq!(b.serve_one(), 0);
    assert!(b.untouched(data, 512));
    // A head past the table: the ring itself is broken.
    let mut b = bench(IN, 4);
    b.d.mq.publish(7);
    assert!(b
        .block
        .process_queue(&b.d.mq.mem, &mut b.d.queue, &b.d.irq)
        .is_err());
}

#[test]
fn status_without_a_writable_buffer() {
    // Every buffer readable: nowhere to answer.
    let mut b = bench(FLUSH, 16);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, b.status, 1, R, 0);
    b.d.mq.publish(0);
    assert_eq!(b.serve_one(), 0);
    assert_eq!(b.status(), POISON);
    // The status readable after a writable data buffer: out of order, refused; the answer
    // lands in the last writable byte, and nothing else is written.
    let mut b = bench(IN, 16);
    let data = b.buffer(512);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, data, 512, W | NEXT, 2);
    b.d.mq.set_desc(2, b.status, 1, R, 0);
    b.d.mq.publish(0);
    assert_eq!(b.serve_one(), 1);
    assert_eq!(b.d.mq.read(data + 511, 1), [IOERR]);
    assert!(b.untouched(data, 511), "no data read into it");
    assert_eq!(b.status(), POISON);
    // A flush with a readable buffer after its status: out of order, refused.
    let mut b = bench(FLUSH, 16);
    let extra = b.buffer(16);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, b.status, 1, W | NEXT, 2);
    b.d.mq.set_desc(2, extra, 16, R, 0);
    b.d.mq.publish(0);
    assert_eq!((b.serve_one(), b.status()), (1, IOERR));
}

#[test]
fn data_buffers_pointing_the_wrong_way() {
    // A read whose data buffer is device-readable.
    let mut b = bench(IN, 16);
    let data = b.buffer(512);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, data, 512, R | NEXT, 2);
    b.d.mq.set_desc(2, b.status, 1, W, 0);
    b.d.mq.publish(0);
    assert_eq!((b.serve_one(), b.status()), (1, IOERR));
    assert!(b.untouched(data, 512));
    // A write whose data buffer is device-writable.
    let mut b = bench(OUT, 16);
    let data = b.buffer(512);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, data, 512, W | NEXT, 2);
    b.d.mq.set_desc(2, b.status, 1, W, 0);
    b.d.mq.publish(0);
    assert_eq!((b.serve_one(), b.status()), (1, IOERR));
    assert!(b.untouched(data, 512), "the data buffer is not written");
    assert_eq!(b.disk_sector(0), vec![0; 512], "the disk is not written");
}

#[test]
fn available_index_far_ahead() {
    let mut b = bench(FLUSH, 16);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, b.status, 1, W, 0);
    b.d.mq.set_avail_idx(1000);
    let r = b.block.process_queue(&b.d.mq.mem, &mut b.d.queue, &b.d.irq);
    assert!(r.is_err(), "{r:?}");
    assert!(b.d.mq.used().is_empty());
    assert_eq!(b.status(), POISON);
}

#[test]
fn huge_lengths() {
    // A 4 GiB writable buffer inside memory only at its start.
    let mut b = bench(IN, 16);
    let data = b.buffer(512);
    b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
    b.d.mq.set_desc(1, data, u32::MAX, W | NEXT, 2);
    b.d.mq.set_desc(2, b.status, 1, W, 0);
    b.d.mq.publish(0);
    assert_eq!(b.serve_one(), 0);
    assert!(b.untouched(data, 512));
    // More than MAX_REQUEST_BYTES through 254 descriptors aliasing one 2 MiB buffer: refused
    // before any work (or allocation) is done.
    // The disk is large enough for the range check to pass: only the size cap refuses.
    let disk = TestDisk::raw(1 << 30);
    for kind in [IN, OUT] {
        let mut b = bench(kind, 256);
        b.block = disk.open(false);
        let big = b.buffer(2 << 20);
        let dir = if kind == IN { W } else { R };
        b.d.mq.set_desc(0, b.hdr, 16, R | NEXT, 1);
        for i in 1..255 {
            b.d.mq.set_desc(i, big, 2 << 20, dir | NEXT, i + 1);
        }
        b.d.mq.set_desc(255, b.status, 1, W, 0);
        b.d.mq.publish(0);
        const { assert!(254 * (2u64 << 20) > MAX_REQUEST_BYTES) };
        let start = Instant::now();
        assert_eq!((b.serve_one(), b.status()), (1, IOERR));
        assert!(start.elapsed() < Duration::from_secs(2), "refused at once");
        assert!(b.untouched(big, 2 << 20));
    }
}

/// Writes an indirect table of `(addr, len, flags, next)` at a fresh buffer.
fn indirect_table(b: &mut Bench, descs: &[(u64, u32, u16, u16)]) -> (u64, u32) {
    let mut t = Vec::new();
    for &(addr, len, flags, next) in descs {
        t.extend_from_slice(&addr.to_le_bytes());
        t.extend_from_slice(&len.to_le_bytes());
        t.extend_from_slice(&flags.to_le_bytes());
        t.extend_from_slice(&next.to_le_bytes());
    }
    let at = b.d.mq.alloc(t.len() as u32);
    b.d.mq.write(at, &t);
    (at, t.len() as u32)
}

#[test]
fn indirect_tables() {
    // A read through an indirect table works.
    let mut b = bench(IN, 16);
    let data = b.buffer(1024);
    let (hdr, status) = (b.hdr, b.status);
    let (t, len) = indirect_table(
        &mut b,
        &[
            (hdr, 16, R | NEXT, 1),
            (data, 1024, W | NEXT, 2),
            (status, 1, W, 0),
        ],
    );
    b.d.mq.set_desc(0, t, len, INDIRECT, 0);
    b.d.mq.publish(0);
    assert_eq!((b.serve_one(), b.status()), (1025, OK));
    assert_eq!(
        b.d.mq.read(data, 1024),
        vec![0; 1024],
        "the disk's first two sectors"
    );

    // An indirect descriptor inside an indirect table, a table whose chain runs past its end,
    // a table of 15 bytes: returned unserved.
    for bad in 0..3 {
        let mut b = bench(IN, 16);
        let data = b.buffer(512);
        let (hdr, status) = (b.hdr, b.status);
        let (inner, inner_len) = indirect_table(&mut b, &[(status, 1, W, 0)]);
        let descs: Vec<(u64, u32, u16, u16)> = match bad {
            0 => vec![
                (hdr, 16, R | NEXT, 1),
                (data, 512, W | NEXT, 2),
                (inner, inner_len, INDIRECT, 0),
            ],
            _ => vec![
                (hdr, 16, R | NEXT, 1),
                (data, 512, W | NEXT, 2),
                (status, 1, W | NEXT, 3),
            ],
        };
        let (t, len) = indirect_table(&mut b, &descs);
        b.d.mq
            .set_desc(0, t, if bad == 2 { 15 } else { len }, INDIRECT, 0);
        b.d.mq.publish(0);
        assert_eq!(b.serve_one(), 0, "bad table {bad}");
        assert!(b.untouched(data, 512));
        assert_eq!(b.status(), POISON);
    }
}

#[test]
fn fuzz_seeds_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/virtqueue");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/virtqueue") {
        let path = entry.expect("seed").path();
        let data = std::fs::read(&path).expect("read seed");
        super::super::fuzz::virtqueue(&data);
        n += 1;
    }
    assert!(n >= 4, "only {n} seeds in {}", dir.display());
}

#[test]
fn fuzz_entry_point_on_random_inputs() {
    // A cheap deterministic stand-in for the fuzzer, so `cargo test` walks odd layouts too.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..300 {
        let len = 16 + (round * 37) % 600;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        super::super::fuzz::virtqueue(&data);
    }
}
