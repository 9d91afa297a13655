//! The `virtio_pmem` fuzz target's entry point (`fuzz/fuzz_targets/virtio_pmem.rs`), also
//! replayed by `cargo test`: a hostile driver's script against the flush queue's worker
//! handler — well-formed requests (any type, any response room) and raw descriptors — with
//! a host flush that fails when the script says so. The handler must not panic or hang,
//! must pass the [`Audit`] (no more chains returned than offered, used lengths within the
//! writable bytes, no guest memory written outside the writable buffers offered), must
//! return every chain with 0 or 4 bytes, and must flush the host no more often than it
//! completed requests.
//!
//! Input layout (missing bytes read as zero; integers little-endian): 1 byte (bit 0
//! `VIRTIO_RING_F_EVENT_IDX`), a queue size byte (`2 << (b % 8)`), then up to 64 steps, a
//! byte `op % 4` and its operands: 0 raw descriptors ([`Driver::hostile`]); 1 requests:
//! `1 + b % 4` chains of a u32 request type (bit 7 of the count byte: the type is cut to
//! `b % 4` bytes) and a writable buffer of `b % 8` bytes; 2 the worker serves the queue;
//! 3 the host flush fails from now on (bit 0) or works.

use super::{FlushFn, Handler};
use crate::fuzzing::{Audit, Buf, Driver, Input};
use crate::interrupt::RecordingInterrupt;
use crate::testing::guest_memory;
use crate::worker::QueueHandler;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use virtio_queue::QueueT;

const DATA: u64 = 0x2000;
const DATA_LEN: u64 = 0x4000;
const STEPS: usize = 64;

/// Runs the script `data` describes.
pub fn pmem(data: &[u8]) {
    run(data);
}

/// Runs the script; returns the host flushes.
fn run(data: &[u8]) -> u64 {
    let mut input = Input(data);
    let event_idx = input.u8() & 1 != 0;
    let mem = guest_memory((DATA + DATA_LEN) as usize);
    let mut d = Driver::new(&mem, 0, input.u8(), DATA, DATA_LEN);
    let flushes = Arc::new(AtomicU64::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let (n, f) = (flushes.clone(), fail.clone());
    let flush: FlushFn = Arc::new(move || {
        n.fetch_add(1, Ordering::Relaxed);
        if f.load(Ordering::Relaxed) {
            Err(std::io::Error::other("fuzz: the host flush fails"))
        } else {
            Ok(())
        }
    });
    let irq = Arc::new(RecordingInterrupt::default());
    let mut h = Handler::new(mem.clone(), d.queue(event_idx), irq, flush);
    let mut completed = 0u64;
    let serve = |h: &mut Handler| {
        let a = Audit::before(&mem, &h.queue);
        let next_used = h.queue.next_used();
        h.handle_queue(0);
        for (head, len) in a.after(&mem, &h.queue, "virtio-pmem") {
            assert!(
                len == 0 || len == 4,
                "virtio-pmem: head {head} returned with {len} bytes"
            );
        }
        u64::from(h.queue.next_used().wrapping_sub(next_used))
    };
    for _ in 0..STEPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 4 {
            0 => d.hostile(&mut input),
            1 => {
                let b = input.u8();
                for _ in 0..1 + b % 4 {
                    let mut req = input.u32().to_le_bytes().to_vec();
                    let room = input.u8();
                    if b & 0x80 != 0 {
                        req.truncate(usize::from(room % 4));
                    }
                    d.chain(&[Buf::Read(req), Buf::Write(u32::from(room % 8))]);
                }
            }
            2 => completed += serve(&mut h),
            _ => fail.store(input.u8() & 1 != 0, Ordering::Relaxed),
        }
        assert!(
            flushes.load(Ordering::Relaxed) <= completed,
            "virtio-pmem: {} host flushes for {completed} requests completed",
            flushes.load(Ordering::Relaxed)
        );
    }
    completed += serve(&mut h);
    let n = flushes.load(Ordering::Relaxed);
    assert!(n <= completed);
    n
}

/// Seeds: flushes that work and fail, unknown and short requests, no room for a response.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let req = |v: &mut Vec<u8>, ty: u32, room: u8| {
        v.extend_from_slice(&ty.to_le_bytes());
        v.push(room);
    };
    let mut out = Vec::new();
    let mut v = vec![1, 5, 1, 3];
    for _ in 0..4 {
        req(&mut v, 0, 4);
    }
    v.extend_from_slice(&[2, 3, 1, 1, 0]);
    req(&mut v, 0, 4);
    v.push(2);
    out.push(("flushes", v));
    let mut v = vec![0, 2, 1, 3];
    req(&mut v, 1, 4);
    req(&mut v, 0, 0);
    req(&mut v, 0xffff_ffff, 7);
    req(&mut v, 0, 3);
    v.extend_from_slice(&[1, 0x81]);
    req(&mut v, 0, 4);
    req(&mut v, 0, 6);
    v.push(2);
    out.push(("odd_requests", v));
    let mut v = vec![1, 3, 0, 2];
    for (i, addr, len, flags, next) in [
        (0u8, 0u64, 4u32, 1u16, 0u16),
        (1, 1 << 63 | 1 << 40, 4, 2, 0),
    ] {
        v.push(i);
        v.extend_from_slice(&addr.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(&flags.to_le_bytes());
        v.extend_from_slice(&next.to_le_bytes());
    }
    v.extend_from_slice(&[2, 0, 0, 1, 0, 0]);
    v.extend_from_slice(&[0; 5]);
    v.push(2);
    out.push(("hostile", v));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_seeds_flush() {
        assert!(super::run(&super::seeds()[0].1) >= 5);
    }

    #[test]
    fn corpus_seeds_and_mutations_pass_the_audit() {
        crate::fuzzing::replay("virtio_pmem", &super::seeds(), 2000, super::pmem);
    }
}
