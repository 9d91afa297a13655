//! The `virtio_net` fuzz target's entry point (`fuzz/fuzz_targets/virtio_net.rs`), also
//! replayed by `cargo test`: the input is a script that a hostile driver and a peer on the
//! tap play against the device's worker handler — receive and transmit buffers (well-formed
//! or raw descriptors), frames arriving from the tap (up to past [`MAX_FRAME`]), header
//! fields, the features the driver accepted, and when the worker runs. A datagram
//! socketpair stands in for the tap. Whatever the script, the device must not panic or
//! hang, must pass the [`Audit`] on each queue it serves (no more chains returned than
//! offered, used lengths within the chain's writable bytes, no guest memory written outside
//! the writable buffers offered), and every frame it puts on the tap has a header and an
//! Ethernet header, is at most [`MAX_FRAME`] long and has a header the accepted features
//! allow.
//!
//! Input layout (missing bytes read as zero; integers little-endian):
//!
//! | bytes | meaning |
//! | --- | --- |
//! | 1 | bit 0 `VIRTIO_RING_F_EVENT_IDX` |
//! | 2 | the features accepted: bit `i` keeps the `i`-th bit of [`net_features::OFFERED`] |
//! | 1, 1 | receive and transmit queue size: `2 << (b % 8)` |
//! | then, until the input ends (at most 64 steps) | one step: a byte `op % 8` and its operands |
//!
//! Steps: 0 raw receive descriptors, 1 raw transmit descriptors ([`Driver::hostile`]);
//! 2 well-formed receive chains (count `1 + b % 4`; each `1 + b % 3` writable buffers of a
//! u16 length); 3 a well-formed transmit chain holding a frame ([`frame`]) in `1 + b % 3`
//! buffers; 4 the peer sends a frame to the tap; 5 the worker serves the receive side;
//! 6 the worker serves the transmit queue; 7 new accepted features (u16, as above).

use super::rx::RxState;
use super::tap::Tap;
use super::tx::check_header;
use super::{net_features, Handler, NetStats, Shared, HDR_LEN, LINK_UP, MAX_FRAME};
use crate::fuzzing::{Audit, Buf, Driver, Input};
use crate::interrupt::RecordingInterrupt;
use crate::testing::guest_memory;
use crate::worker::QueueHandler;
use crate::{features, Mem};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU16;
use std::sync::Arc;

const RX_BASE: u64 = 0;
const TX_BASE: u64 = 0x2000;
const DATA: u64 = 0x4000;
/// Room for one largest frame (a chain that needs more wraps and overlaps its buffers).
const DATA_LEN: u64 = 0x1_1000;
const STEPS: usize = 64;

/// The features accepted, from 16 input bits over the offered ones.
fn acked(bits: u16, event_idx: bool) -> u64 {
    let mut acked = features::VERSION_1;
    if event_idx {
        acked |= features::RING_EVENT_IDX;
    }
    let mut i = 0;
    for b in 0..64 {
        if net_features::OFFERED & (1 << b) != 0 {
            if bits & (1 << i) != 0 {
                acked |= 1 << b;
            }
            i += 1;
        }
    }
    acked
}

/// A frame with its virtio-net header, from the input: 12 header bytes, then a u16 `L`.
/// With bit 15 of `L` set the frame is made, not read: `MAX_FRAME - 64 + (L & 0x7f)` bytes
/// after the header (up to 63 bytes over [`MAX_FRAME`]); otherwise `L % 2048` bytes follow.
pub fn frame(input: &mut Input) -> Vec<u8> {
    let mut f = input.bytes::<HDR_LEN>().to_vec();
    let l = input.u16();
    if l & 0x8000 != 0 {
        let n = MAX_FRAME - 64 + usize::from(l & 0x7f);
        f.extend((0..n).map(|i| (i as u8).wrapping_mul(13)));
    } else {
        f.extend_from_slice(input.take(usize::from(l % 2048)));
    }
    f
}

fn socket_tap() -> Option<(Tap, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for socketpair to fill.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: socketpair returned two new descriptors that nothing else owns.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Some((Tap::from_socket(a, "fuzz"), b))
}

/// Frames the device sent to the tap, as the peer reads them.
fn drain_peer(peer: &OwnedFd, acked: u64) {
    let mut buf = vec![0u8; HDR_LEN + MAX_FRAME + 64];
    loop {
        // SAFETY: `buf` is valid and writable for its length during the call.
        let n = unsafe { libc::read(peer.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return;
        }
        let n = n as usize;
        assert!(
            (HDR_LEN + 14..=HDR_LEN + MAX_FRAME).contains(&n),
            "a {n}-byte frame (header included) went to the tap"
        );
        assert!(
            check_header(&buf[..n], acked).is_ok(),
            "a frame whose header the accepted features refuse went to the tap"
        );
    }
}

fn serve(h: &mut Handler, index: usize, mem: &Mem) {
    let (q, what) = if index == 1 {
        (&h.tx_queue, "virtio-net tx")
    } else {
        (&h.rx_queue, "virtio-net rx")
    };
    let audit = Audit::before(mem, q);
    h.handle_queue(index);
    let q = if index == 1 { &h.tx_queue } else { &h.rx_queue };
    audit.after(mem, q, what);
}

/// Runs the script `data` describes.
pub fn net(data: &[u8]) {
    run(data);
}

/// Runs the script; returns the frames received and sent.
fn run(data: &[u8]) -> (u64, u64) {
    let mut input = Input(data);
    let event_idx = input.u8() & 1 != 0;
    let mut acked = acked(input.u16(), event_idx);
    let mem = guest_memory((DATA + DATA_LEN) as usize);
    let mut rx = Driver::new(&mem, RX_BASE, input.u8(), DATA, DATA_LEN);
    let mut tx = Driver::new(&mem, TX_BASE, input.u8(), DATA, DATA_LEN);
    let Some((tap, peer)) = socket_tap() else {
        return (0, 0);
    };
    let irq = Arc::new(RecordingInterrupt::default());
    let mut h = Handler {
        mem: mem.clone(),
        interrupt: irq,
        rx_queue: rx.queue(event_idx),
        tx_queue: tx.queue(event_idx),
        tap: Arc::new(tap),
        shared: Arc::new(Shared {
            stats: NetStats::default(),
            status: AtomicU16::new(LINK_UP),
        }),
        acked,
        rx: RxState::new(),
        tx_buf: Vec::new(),
        broken: false,
        tap_dead: false,
    };
    for _ in 0..STEPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 8 {
            0 => rx.hostile(&mut input),
            1 => tx.hostile(&mut input),
            2 => {
                for _ in 0..1 + input.u8() % 4 {
                    let bufs: Vec<Buf> = (0..1 + input.u8() % 3)
                        .map(|_| Buf::Write(u32::from(input.u16())))
                        .collect();
                    rx.chain(&bufs);
                }
            }
            3 => {
                let parts = 1 + usize::from(input.u8() % 3);
                let f = frame(&mut input);
                let step = f.len().div_ceil(parts).max(1);
                let bufs: Vec<Buf> = f.chunks(step).map(|c| Buf::Read(c.to_vec())).collect();
                tx.chain(&bufs);
            }
            4 => {
                let f = frame(&mut input);
                // SAFETY: `f` is valid for its length during the call. A full socket
                // buffer drops the frame, as a busy tap would.
                unsafe { libc::write(peer.as_raw_fd(), f.as_ptr().cast(), f.len()) };
            }
            5 => serve(&mut h, if input.u8() & 1 != 0 { 2 } else { 0 }, &mem),
            6 => {
                serve(&mut h, 1, &mem);
                drain_peer(&peer, h.acked);
            }
            _ => {
                acked = self::acked(input.u16(), event_idx);
                h.acked = acked;
            }
        }
    }
    serve(&mut h, 1, &mem);
    drain_peer(&peer, h.acked);
    serve(&mut h, 0, &mem);
    let s = &h.shared.stats;
    (NetStats::get(&s.rx_packets), NetStats::get(&s.tx_packets))
}

/// Seeds, each a script a driver might run (and some a hostile one would).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let all = 0x7ffu16.to_le_bytes();
    let mut out = Vec::new();
    let head = |idx: bool, feats: [u8; 2]| {
        let mut v = vec![u8::from(idx)];
        v.extend_from_slice(&feats);
        v.extend_from_slice(&[7, 7]);
        v
    };
    let tx_frame = |v: &mut Vec<u8>, parts: u8, hdr: [u8; 12], len: u16| {
        v.extend_from_slice(&[3, parts]);
        v.extend_from_slice(&hdr);
        v.extend_from_slice(&len.to_le_bytes());
        if len & 0x8000 == 0 {
            v.extend((0..len % 2048).map(|i| i as u8));
        }
    };
    let peer_frame = |v: &mut Vec<u8>, hdr: [u8; 12], len: u16| {
        v.push(4);
        v.extend_from_slice(&hdr);
        v.extend_from_slice(&len.to_le_bytes());
        if len & 0x8000 == 0 {
            v.extend((0..len % 2048).map(|i| (i * 7) as u8));
        }
    };
    let rx_bufs = |v: &mut Vec<u8>, lens: &[u16]| {
        v.extend_from_slice(&[2, 0, lens.len() as u8 - 1]);
        for l in lens {
            v.extend_from_slice(&l.to_le_bytes());
        }
    };
    // Ping-sized frames both ways.
    let mut v = head(true, all);
    rx_bufs(&mut v, &[1526]);
    peer_frame(&mut v, [0; 12], 98);
    v.extend_from_slice(&[5, 0]);
    tx_frame(&mut v, 0, [0; 12], 98);
    v.push(6);
    out.push(("ping", v));
    // A 64 KiB TSO segment over mergeable buffers and a frame over MAX_FRAME.
    let mut v = head(true, all);
    for _ in 0..6 {
        rx_bufs(&mut v, &[4096, 4096, 4096]);
    }
    peer_frame(&mut v, [0; 12], 0x8000 | 64);
    peer_frame(&mut v, [0; 12], 0x8000 | 0x7f);
    v.extend_from_slice(&[5, 1]);
    let mut tso = [0u8; 12];
    tso[0] = 1; // NEEDS_CSUM
    tso[1] = 1; // TCPV4
    tso[6] = 34; // csum_start
    tso[8] = 16; // csum_offset
    tx_frame(&mut v, 2, tso, 0x8000 | 64);
    tx_frame(&mut v, 1, tso, 0x8000 | 0x7f);
    v.push(6);
    out.push(("tso_and_oversized", v));
    // Without mergeable buffers or offloads: a big frame cannot fit one small buffer, and
    // a transmit with an offload the driver did not accept is dropped.
    let mut v = head(false, 0x20u16.to_le_bytes());
    rx_bufs(&mut v, &[256]);
    peer_frame(&mut v, [0; 12], 1500);
    peer_frame(&mut v, [0; 12], 60);
    v.extend_from_slice(&[5, 0]);
    tx_frame(&mut v, 0, tso, 200);
    tx_frame(&mut v, 0, [0; 12], 1);
    v.push(6);
    out.push(("no_offloads", v));
    // Raw descriptors: a loop, a readable receive buffer, a buffer outside memory.
    let mut v = head(true, all);
    v.extend_from_slice(&[0, 3]);
    for (i, addr, len, flags, next) in [
        (0u8, 0u64, 2048u32, 3u16, 1u16),
        (1, 4096, 2048, 3, 0),
        (2, 1 << 63 | 1 << 40, 4096, 2, 0),
    ] {
        v.push(i);
        v.extend_from_slice(&addr.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(&flags.to_le_bytes());
        v.extend_from_slice(&next.to_le_bytes());
    }
    v.extend_from_slice(&[3, 0, 0, 2, 0, 1, 0]);
    v.extend_from_slice(&[0; 5]);
    peer_frame(&mut v, [0; 12], 100);
    v.extend_from_slice(&[5, 0, 1, 1]);
    v.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0]);
    v.extend_from_slice(&[2, 0, 2, 0, 0, 0, 0, 5, 0]);
    v.extend_from_slice(&[0x80, 0x10, 0, 0, 0, 0, 0]);
    v.push(6);
    out.push(("hostile_descriptors", v));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_seeds_move_frames_both_ways() {
        let seeds = super::seeds();
        assert_eq!(super::run(&seeds[0].1), (1, 1), "ping");
        assert_eq!(super::run(&seeds[1].1), (1, 1), "tso_and_oversized");
    }

    #[test]
    fn corpus_seeds_and_mutations_pass_the_audit() {
        crate::fuzzing::replay("virtio_net", &super::seeds(), 1500, super::net);
    }
}
