//! The `virtio_vsock` fuzz target's entry point (`fuzz/fuzz_targets/virtio_vsock.rs`), also
//! replayed by `cargo test`: the input is a script played against the device's [`Muxer`]
//! by a hostile driver (transmitted packets with any header fields, receive and event
//! buffers, raw descriptors) and by host programs on real unix sockets (peers that connect
//! and send a `CONNECT` line or garbage, programs listening on the ports the guest connects
//! to, writes, reads, half-closes and closes on either). Whatever the script, the muxer must
//! not panic or hang, every queue it serves passes the [`Audit`] (no more chains returned
//! than offered, used lengths within the writable bytes, no guest memory written outside
//! the writable buffers offered), a receive buffer comes back empty or holding at least a
//! header, and the connections stay within [`MAX_CONNS`].
//!
//! The sockets live in a fresh directory under the temp dir per input, removed after it.
//!
//! Input layout (missing bytes read as zero; integers little-endian): 1 byte (bit 0
//! `VIRTIO_RING_F_EVENT_IDX`), three queue size bytes (rx, tx, event: `2 << (b % 8)`), then
//! up to 64 steps, each a byte `op % 12` and its operands:
//!
//! | op | step |
//! | --- | --- |
//! | 0, 1, 2 | raw descriptors on rx, tx, event ([`Driver::hostile`]) |
//! | 3 | the guest transmits a packet ([`packet`]) and the muxer serves the tx queue |
//! | 4 | receive buffers: `1 + b % 4` chains, each a header buffer and a u16-long one (bit 7 of the count byte: one buffer) |
//! | 5 | host events are handled and the muxer fills receive buffers |
//! | 6 | a transport-reset event is owed, an event buffer of `b % 8` bytes is given, the event queue served |
//! | 7 | a host program connects to the device's socket and sends `CONNECT <port>\n` (bit 7: a raw line of `b % 40` bytes) |
//! | 8 | the programs listening on ports 5000 and 5001 accept what the guest connected |
//! | 9 | a host program writes `u16 % 8192` bytes |
//! | 10 | a host program reads what it was sent (bit 0), half-closes (bit 1) or closes (bit 2) |
//! | 11 | connection timeouts as at now + `u16 * 10` ms |

use super::muxer::{Muxer, MAX_CONNS};
use super::packet::{HDR_LEN, HOST_CID, TYPE_STREAM};
use crate::fuzzing::{Audit, Buf, Driver, Input};
use crate::interrupt::RecordingInterrupt;
use crate::testing::guest_memory;
use crate::Mem;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use virtio_queue::Queue;

/// The guest's CID.
pub const CID: u64 = 3;
const RX_BASE: u64 = 0;
const TX_BASE: u64 = 0x2000;
const EV_BASE: u64 = 0x4000;
const DATA: u64 = 0x6000;
const DATA_LEN: u64 = 0x8000;
const STEPS: usize = 64;
/// Host programs at once.
const STREAMS: usize = 8;
/// Ports host programs listen on (`<uds>_5000`, `<uds>_5001`); 5002 has none.
const PORTS: [u32; 2] = [5000, 5001];
/// The first local port the muxer gives host-initiated connections.
const FIRST_LOCAL_PORT: u32 = 1 << 30;

/// A directory of the input's sockets, removed when dropped.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir() -> Option<Dir> {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("dvm-vsock-fuzz-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).ok()?;
    Some(Dir(d))
}

/// A transmitted packet from the input: a mode byte, then the header's op, ports, flags,
/// credit and payload. Mode bits: 0 a raw length field (u32) instead of the payload's,
/// 1 a raw source CID (u64), 2 a raw destination CID (u64), 3 a raw type (u16), 4 the
/// header and payload in one buffer. Destination port byte `b`: with bit 7 a local port of
/// a host-initiated connection (`2^30 + b % 4`), else `5000 + b % 3`; source port
/// `1024 + b % 4`. Payload: `u16 % 4096` bytes from the input.
pub fn packet(input: &mut Input) -> (Vec<u8>, bool) {
    let mode = input.u8();
    let op = u16::from(input.u8() % 8);
    let src_port = 1024 + u32::from(input.u8() % 4);
    let d = input.u8();
    let dst_port = if d & 0x80 != 0 {
        FIRST_LOCAL_PORT + u32::from(d % 4)
    } else {
        5000 + u32::from(d % 3)
    };
    let flags = u32::from(input.u8() % 4);
    let (buf_alloc, fwd_cnt) = (input.u32(), input.u32());
    let n = usize::from(input.u16() % 4096);
    let payload = input.take(n).to_vec();
    let len = if mode & 1 != 0 {
        input.u32()
    } else {
        payload.len() as u32
    };
    let src_cid = if mode & 2 != 0 { input.u64() } else { CID };
    let dst_cid = if mode & 4 != 0 { input.u64() } else { HOST_CID };
    let type_ = if mode & 8 != 0 {
        input.u16()
    } else {
        TYPE_STREAM
    };
    let mut b = Vec::with_capacity(HDR_LEN + payload.len());
    b.extend_from_slice(&src_cid.to_le_bytes());
    b.extend_from_slice(&dst_cid.to_le_bytes());
    b.extend_from_slice(&src_port.to_le_bytes());
    b.extend_from_slice(&dst_port.to_le_bytes());
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&type_.to_le_bytes());
    b.extend_from_slice(&op.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&buf_alloc.to_le_bytes());
    b.extend_from_slice(&fwd_cnt.to_le_bytes());
    b.extend_from_slice(&payload);
    (b, mode & 16 != 0)
}

struct Rig {
    mem: Mem,
    mux: Muxer,
    irq: RecordingInterrupt,
    rxq: Queue,
    txq: Queue,
    evq: Queue,
}

impl Rig {
    fn tx(&mut self) {
        let a = Audit::before(&self.mem, &self.txq);
        let _ = self.mux.process_tx(&mut self.txq, &self.mem, &self.irq);
        for (head, len) in a.after(&self.mem, &self.txq, "virtio-vsock tx") {
            assert_eq!(
                len, 0,
                "virtio-vsock tx: head {head} returned with {len} bytes"
            );
        }
    }

    fn rx(&mut self) {
        self.mux.handle_host_events();
        let a = Audit::before(&self.mem, &self.rxq);
        let _ = self.mux.process_rx(&mut self.rxq, &self.mem, &self.irq);
        for (head, len) in a.after(&self.mem, &self.rxq, "virtio-vsock rx") {
            assert!(
                len == 0 || len as usize >= HDR_LEN,
                "virtio-vsock rx: head {head} returned with {len} bytes, less than a header"
            );
        }
    }

    fn event(&mut self) {
        let a = Audit::before(&self.mem, &self.evq);
        let _ = self.mux.process_event(&mut self.evq, &self.mem, &self.irq);
        a.after(&self.mem, &self.evq, "virtio-vsock event");
    }
}

/// Runs the script `data` describes.
pub fn vsock(data: &[u8]) {
    run(data);
}

/// Runs the script; returns the connections open before the end.
fn run(data: &[u8]) -> usize {
    let Some(dir) = dir() else { return 0 };
    let uds = dir.0.join("v.sock");
    let Ok(listener) = UnixListener::bind(&uds) else {
        return 0;
    };
    let Ok(mux) = Muxer::new(listener, &uds, CID) else {
        return 0;
    };
    let ports: Vec<UnixListener> = PORTS
        .iter()
        .filter_map(|p| {
            let l = UnixListener::bind(dir.0.join(format!("v.sock_{p}"))).ok()?;
            l.set_nonblocking(true).ok()?;
            Some(l)
        })
        .collect();
    let mut input = Input(data);
    let event_idx = input.u8() & 1 != 0;
    let mem = guest_memory((DATA + DATA_LEN) as usize);
    let mut rx = Driver::new(&mem, RX_BASE, input.u8(), DATA, DATA_LEN);
    let mut tx = Driver::new(&mem, TX_BASE, input.u8(), DATA, DATA_LEN);
    let mut ev = Driver::new(&mem, EV_BASE, input.u8(), DATA, DATA_LEN);
    let mut rig = Rig {
        mem: mem.clone(),
        mux,
        irq: RecordingInterrupt::default(),
        rxq: rx.queue(event_idx),
        txq: tx.queue(event_idx),
        evq: ev.queue(event_idx),
    };
    let mut streams: Vec<UnixStream> = Vec::new();
    let mut sink = vec![0u8; 16 << 10];
    let mut most = 0;
    for _ in 0..STEPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 12 {
            0 => rx.hostile(&mut input),
            1 => tx.hostile(&mut input),
            2 => ev.hostile(&mut input),
            3 => {
                let (p, one) = packet(&mut input);
                let bufs = if one || p.len() == HDR_LEN {
                    vec![Buf::Read(p)]
                } else {
                    vec![
                        Buf::Read(p[..HDR_LEN].to_vec()),
                        Buf::Read(p[HDR_LEN..].to_vec()),
                    ]
                };
                tx.chain(&bufs);
                rig.tx();
            }
            4 => {
                let b = input.u8();
                for _ in 0..1 + b % 4 {
                    let len = u32::from(input.u16());
                    if b & 0x80 != 0 {
                        rx.chain(&[Buf::Write(len)]);
                    } else {
                        rx.chain(&[Buf::Write(HDR_LEN as u32), Buf::Write(len)]);
                    }
                }
            }
            5 => rig.rx(),
            6 => {
                rig.mux.reset_event_pending = true;
                ev.chain(&[Buf::Write(u32::from(input.u8() % 8))]);
                rig.event();
            }
            7 => {
                let b = input.u8();
                let line = if b & 0x80 != 0 {
                    input.take(usize::from(b % 40)).to_vec()
                } else {
                    format!("CONNECT {}\n", 1024 + u32::from(b % 4)).into_bytes()
                };
                if streams.len() < STREAMS {
                    if let Ok(mut s) = UnixStream::connect(&uds) {
                        let _ = s.set_nonblocking(true);
                        let _ = s.write_all(&line);
                        streams.push(s);
                    }
                }
                rig.mux.handle_host_events();
            }
            8 => {
                for l in &ports {
                    while let Ok((s, _)) = l.accept() {
                        if streams.len() >= STREAMS {
                            break;
                        }
                        let _ = s.set_nonblocking(true);
                        streams.push(s);
                    }
                }
            }
            9 => {
                let (i, n) = (usize::from(input.u8()), usize::from(input.u16() % 8192));
                if !streams.is_empty() {
                    let bytes: Vec<u8> = (0..n).map(|k| k as u8).collect();
                    let k = i % streams.len();
                    let _ = streams[k].write(&bytes);
                }
                rig.mux.handle_host_events();
            }
            10 => {
                let (i, what) = (usize::from(input.u8()), input.u8());
                if !streams.is_empty() {
                    let i = i % streams.len();
                    if what & 1 != 0 {
                        while matches!(streams[i].read(&mut sink), Ok(n) if n > 0) {}
                    }
                    if what & 2 != 0 {
                        let _ = streams[i].shutdown(Shutdown::Write);
                    }
                    if what & 4 != 0 {
                        streams.swap_remove(i);
                    }
                }
                rig.mux.handle_host_events();
            }
            _ => {
                let ms = u64::from(input.u16()) * 10;
                rig.mux.expire(Instant::now() + Duration::from_millis(ms));
            }
        }
        most = most.max(rig.mux.connections());
        assert!(rig.mux.connections() <= MAX_CONNS);
    }
    rig.tx();
    rig.rx();
    most
}

/// Seeds: connections both ways with data, credit and shutdowns, and hostile packets.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    // A packet step (op 3) with mode 0: op, ports, flags, credit, payload.
    let pkt = |v: &mut Vec<u8>, op: u8, dst: u8, flags: u8, payload: &[u8]| {
        v.extend_from_slice(&[3, 0, op, 0, dst, flags]);
        v.extend_from_slice(&(64u32 << 10).to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&(payload.len() as u16).to_le_bytes());
        v.extend_from_slice(payload);
    };
    let rx_bufs = |v: &mut Vec<u8>, n: u8| {
        v.extend_from_slice(&[4, n - 1]);
        for _ in 0..n {
            v.extend_from_slice(&4096u16.to_le_bytes());
        }
    };
    let mut out = Vec::new();
    // The guest connects to host port 5000, sends data, the host answers, both close.
    let mut v = vec![1, 7, 7, 3];
    rx_bufs(&mut v, 4);
    pkt(&mut v, 1, 0, 0, b""); // REQUEST
    v.extend_from_slice(&[8, 5]); // accept; fill rx (RESPONSE)
    pkt(&mut v, 5, 0, 0, b"hello from the guest"); // RW
    v.extend_from_slice(&[10, 0, 1]); // host reads
    v.extend_from_slice(&[9, 0, 0, 2, 5]); // host writes 512 bytes; fill rx
    pkt(&mut v, 6, 0, 0, b""); // CREDIT_UPDATE
    pkt(&mut v, 7, 0, 0, b""); // CREDIT_REQUEST
    v.push(5);
    pkt(&mut v, 4, 0, 3, b""); // SHUTDOWN both
    v.extend_from_slice(&[10, 0, 7, 5]);
    pkt(&mut v, 3, 0, 0, b""); // RST
    out.push(("guest_connects", v));
    // A host program connects to guest port 1024; the guest accepts; data both ways.
    let mut v = vec![0, 5, 5, 2];
    rx_bufs(&mut v, 4);
    v.extend_from_slice(&[7, 0, 5]); // CONNECT 1024; fill rx (REQUEST)
    pkt(&mut v, 2, 0x80, 0, b""); // RESPONSE from guest port 1024 to local port 2^30
    v.extend_from_slice(&[9, 0, 0, 1, 5]); // host writes 256 bytes; fill rx
    pkt(&mut v, 5, 0x80, 0, b"reply");
    v.extend_from_slice(&[10, 0, 3, 5]);
    rx_bufs(&mut v, 2);
    v.extend_from_slice(&[11, 0xff, 0xff, 5]);
    out.push(("host_connects", v));
    // Garbage: a bad CONNECT line, a packet for nobody, a wrong CID, an unknown op, a
    // lying length, a reset event on a short buffer, a timeout.
    let mut v = vec![1, 3, 3, 1];
    rx_bufs(&mut v, 2);
    v.extend_from_slice(&[7, 0x80 | 12]);
    v.extend_from_slice(b"CONNECT xyz\n");
    pkt(&mut v, 5, 2, 0, b"nobody");
    v.extend_from_slice(&[
        3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0,
    ]);
    pkt(&mut v, 0, 0, 0, b"");
    v.extend_from_slice(&[3, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0]);
    v.extend_from_slice(&[6, 2, 6, 4, 5, 11, 0xff, 0x7f, 5]);
    out.push(("garbage", v));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_seeds_open_connections_both_ways() {
        let seeds = super::seeds();
        assert!(super::run(&seeds[0].1) >= 1, "guest_connects");
        assert!(super::run(&seeds[1].1) >= 1, "host_connects");
    }

    #[test]
    fn corpus_seeds_and_mutations_pass_the_audit() {
        crate::fuzzing::replay("virtio_vsock", &super::seeds(), 1000, super::vsock);
    }
}
