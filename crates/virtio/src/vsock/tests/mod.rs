//! The vsock device against mock queues and real unix sockets: the connection state
//! machine, credit and half-close here; hostile chains, options and saved state in
//! `device.rs`.

use super::conn::BUF_ALLOC;
use super::muxer::{Muxer, CONNECT_TIMEOUT};
use super::packet::*;
use super::*;
use crate::interrupt::RecordingInterrupt;
use crate::testing::{guest_memory, MockQueue};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

const CID: u64 = 3;
const MEM: usize = 16 << 20;
/// Payload room of each receive buffer (as Linux 6.1 posts them: header, then 4 KiB).
const RX_BUF: u32 = 4096;

struct Rig {
    dir: tempfile::TempDir,
    uds: PathBuf,
    rx: MockQueue,
    tx: MockQueue,
    ev: MockQueue,
    rxq: Queue,
    txq: Queue,
    evq: Queue,
    mux: Muxer,
    irq: RecordingInterrupt,
    rx_bufs: HashMap<u16, (u64, u64)>,
    rx_seen: usize,
    tx_seen: usize,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let mem = guest_memory(MEM);
    let rx = MockQueue::new(mem.clone(), 0, QUEUE_SIZE);
    let tx = MockQueue::new(mem.clone(), 4 << 20, QUEUE_SIZE);
    let ev = MockQueue::new(mem, 8 << 20, QUEUE_SIZE);
    let (rxq, txq, evq) = (rx.queue(), tx.queue(), ev.queue());
    let mux = Muxer::new(UnixListener::bind(&uds).unwrap(), &uds, CID).unwrap();
    Rig {
        dir,
        uds,
        rx,
        tx,
        ev,
        rxq,
        txq,
        evq,
        mux,
        irq: RecordingInterrupt::default(),
        rx_bufs: HashMap::new(),
        rx_seen: 0,
        tx_seen: 0,
    }
}

/// A guest packet header for a stream between guest port `src` and host port `dst`.
fn hdr(op: Op, src: u32, dst: u32, len: u32) -> Header {
    Header {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port: src,
        dst_port: dst,
        len,
        type_: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc: 64 << 10,
        fwd_cnt: 0,
    }
}

impl Rig {
    /// Transmits one packet (header and payload in two descriptors, as Linux does).
    fn send(&mut self, h: Header, payload: &[u8]) {
        let bytes = h.to_bytes();
        let parts: Vec<&[u8]> = if payload.is_empty() {
            vec![&bytes]
        } else {
            vec![&bytes, payload]
        };
        self.tx.add_request(&parts, &[]);
        self.process_tx();
    }

    fn process_tx(&mut self) {
        self.mux
            .process_tx(&mut self.txq, &self.tx.mem, &self.irq)
            .unwrap();
        let used = self.tx.used();
        assert!(used[self.tx_seen..].iter().all(|&(_, len)| len == 0));
        self.tx_seen = used.len();
    }

    /// Posts `n` receive buffers.
    fn post_rx(&mut self, n: usize) {
        for _ in 0..n {
            let (head, outs) = self.rx.add_request(&[], &[HDR_LEN as u32, RX_BUF]);
            self.rx_bufs.insert(head, (outs[0], outs[1]));
        }
    }

    /// Runs the host side and the receive queue; returns the packets the guest got since
    /// the last call.
    fn recv(&mut self) -> Vec<(Header, Vec<u8>)> {
        self.mux.handle_host_events();
        self.mux
            .process_rx(&mut self.rxq, &self.rx.mem, &self.irq)
            .unwrap();
        let used = self.rx.used();
        let mut out = Vec::new();
        for &(head, len) in &used[self.rx_seen..] {
            let (h_addr, d_addr) = self.rx_bufs[&(head as u16)];
            let raw: [u8; HDR_LEN] = self.rx.read(h_addr, HDR_LEN).try_into().unwrap();
            let h = Header::parse(&raw).unwrap();
            assert_eq!(len as usize, HDR_LEN + h.len as usize, "used length");
            out.push((h, self.rx.read(d_addr, h.len as usize)));
        }
        self.rx_seen = used.len();
        out
    }

    /// A host program's connection to guest port `port`, through to the guest's REQUEST
    /// and our RESPONSE; returns the stream and the host side's local port.
    fn host_connect(&mut self, port: u32) -> (UnixStream, u32) {
        let mut s = UnixStream::connect(&self.uds).unwrap();
        s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
        self.post_rx(1);
        let got = self.recv();
        assert_eq!(got.len(), 1, "{got:?}");
        let req = got[0].0;
        assert_eq!(req.op, Op::Request);
        assert_eq!(
            (req.src_cid, req.dst_cid, req.dst_port),
            (HOST_CID, CID, port)
        );
        assert_eq!(req.buf_alloc, BUF_ALLOC);
        self.send(hdr(Op::Response, port, req.src_port, 0), &[]);
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while b[0] != b'\n' {
            s.read_exact(&mut b).unwrap();
            line.push(b[0]);
        }
        assert_eq!(line, format!("OK {}\n", req.src_port).as_bytes());
        (s, req.src_port)
    }

    /// A guest connection from guest port 5000 to host port `port`, served by a listener at
    /// `<uds>_<port>`; returns the host side's stream.
    fn guest_connect(&mut self, port: u32, buf_alloc: u32) -> UnixStream {
        let l = UnixListener::bind(format!("{}_{port}", self.uds.display())).unwrap();
        self.send(
            Header {
                buf_alloc,
                ..hdr(Op::Request, 5000, port, 0)
            },
            &[],
        );
        self.post_rx(1);
        let got = self.recv();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0.op, Op::Response);
        assert_eq!((got[0].0.src_port, got[0].0.dst_port), (port, 5000));
        l.accept().unwrap().0
    }
}

fn ops(p: &[(Header, Vec<u8>)]) -> Vec<Op> {
    p.iter().map(|(h, _)| h.op).collect()
}

#[test]
fn header_round_trip_and_unknown_op() {
    let h = Header {
        flags: 3,
        fwd_cnt: 77,
        ..hdr(Op::Shutdown, 1, 2, 0)
    };
    assert_eq!(Header::parse(&h.to_bytes()).unwrap(), h);
    let mut raw = h.to_bytes();
    raw[30] = 99;
    assert_eq!(Header::parse(&raw), Err(PacketError::UnknownOp(99)));
    raw[30] = 0;
    assert_eq!(Header::parse(&raw), Err(PacketError::UnknownOp(0)));
}

#[test]
fn guest_connection_to_a_port_nobody_serves_is_reset() {
    let mut r = rig();
    r.send(hdr(Op::Request, 5000, 1234, 0), &[]);
    r.post_rx(2);
    let got = r.recv();
    assert_eq!(ops(&got), [Op::Rst]);
    let h = got[0].0;
    assert_eq!(
        (h.src_cid, h.dst_cid, h.src_port, h.dst_port),
        (2, CID, 1234, 5000)
    );
    assert_eq!(r.mux.connections(), 0);
    // Data for a connection that does not exist is reset too; a RST is not answered.
    r.send(hdr(Op::Rw, 5000, 1234, 3), b"abc");
    r.send(hdr(Op::Rst, 5000, 1234, 0), &[]);
    assert_eq!(ops(&r.recv()), [Op::Rst]);
}

#[test]
fn guest_connection_carries_data_both_ways() {
    let mut r = rig();
    let mut host = r.guest_connect(1234, 64 << 10);
    r.send(hdr(Op::Rw, 5000, 1234, 5), b"hello");
    let mut b = [0u8; 5];
    host.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    host.write_all(b"world!").unwrap();
    r.post_rx(1);
    let got = r.recv();
    assert_eq!(ops(&got), [Op::Rw]);
    assert_eq!(got[0].1, b"world!");
    let h = got[0].0;
    assert_eq!(
        (h.src_port, h.dst_port, h.buf_alloc),
        (1234, 5000, BUF_ALLOC)
    );
    assert_eq!(
        h.fwd_cnt, 5,
        "our fwd_cnt counts what reached the host socket"
    );
    // Nothing more: the buffer posted stays available.
    r.post_rx(1);
    assert!(r.recv().is_empty());
    assert_eq!(r.mux.counters.dropped_tx, 0);
}

#[test]
fn hybrid_handshake_and_data_sent_before_the_ok() {
    let mut r = rig();
    let mut s = UnixStream::connect(&r.uds).unwrap();
    // The host program writes right after its CONNECT line, before the guest accepted.
    s.write_all(b"CONNECT 52\nearly").unwrap();
    r.post_rx(1);
    let req = r.recv()[0].0;
    assert_eq!((req.op, req.dst_port), (Op::Request, 52));
    assert!(req.src_port >= 1 << 30);
    r.send(hdr(Op::Response, 52, req.src_port, 0), &[]);
    let mut line = [0u8; 14];
    s.read_exact(&mut line).unwrap();
    assert_eq!(&line, format!("OK {}\n", req.src_port).as_bytes());
    r.post_rx(1);
    let got = r.recv();
    assert_eq!(ops(&got), [Op::Rw]);
    assert_eq!(got[0].1, b"early", "bytes after CONNECT are data, not lost");
    // A second host connection to the same guest port gets another local port.
    let (_s2, p2) = r.host_connect(52);
    assert_ne!(p2, req.src_port);
    assert_eq!(r.mux.connections(), 2);
}

#[test]
fn a_guest_that_refuses_closes_the_host_socket() {
    let mut r = rig();
    let mut s = UnixStream::connect(&r.uds).unwrap();
    s.write_all(b"CONNECT 52\n").unwrap();
    r.post_rx(1);
    let req = r.recv()[0].0;
    r.send(hdr(Op::Rst, 52, req.src_port, 0), &[]);
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    assert!(buf.is_empty(), "no OK line: {buf:?}");
    assert_eq!(r.mux.connections(), 0);
}

#[test]
fn bad_connect_lines_close_the_host_socket() {
    for line in [&b"HELLO\n"[..], b"CONNECT x\n", &[b'C'; 40]] {
        let mut r = rig();
        let mut s = UnixStream::connect(&r.uds).unwrap();
        s.write_all(line).unwrap();
        r.post_rx(1);
        assert!(r.recv().is_empty());
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Closed: EOF, or a reset when it closed with our bytes unread.
        let mut buf = Vec::new();
        match s.read_to_end(&mut buf) {
            Ok(_) => assert!(buf.is_empty()),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
        }
        assert_eq!(r.mux.connections(), 0);
    }
}

#[test]
fn a_guest_that_never_answers_times_out() {
    let mut r = rig();
    let mut s = UnixStream::connect(&r.uds).unwrap();
    s.write_all(b"CONNECT 52\n").unwrap();
    // No receive buffers: the driver is not there.
    assert!(r.recv().is_empty());
    assert_eq!(r.mux.connections(), 1);
    let wait = r.mux.expire(Instant::now()).expect("a deadline");
    assert!(wait <= CONNECT_TIMEOUT);
    assert!(r.mux.expire(Instant::now() + CONNECT_TIMEOUT).is_none());
    assert_eq!(r.mux.connections(), 0);
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    assert!(buf.is_empty());
}

#[test]
fn host_data_never_exceeds_the_guest_credit() {
    let mut r = rig();
    let mut host = r.guest_connect(1234, 1000);
    host.write_all(&[7u8; 5000]).unwrap();
    r.post_rx(10);
    let got = r.recv();
    let data: usize = got
        .iter()
        .filter(|(h, _)| h.op == Op::Rw)
        .map(|p| p.1.len())
        .sum();
    assert_eq!(data, 1000, "{:?}", ops(&got));
    assert_eq!(
        ops(&got).last(),
        Some(&Op::CreditRequest),
        "asks once for credit"
    );
    assert_eq!(
        ops(&got)
            .iter()
            .filter(|&&o| o == Op::CreditRequest)
            .count(),
        1
    );
    assert!(r.recv().is_empty(), "no repeated requests");
    // The guest read 600 bytes: 600 more may come.
    r.send(
        Header {
            buf_alloc: 1000,
            fwd_cnt: 600,
            ..hdr(Op::CreditUpdate, 5000, 1234, 0)
        },
        &[],
    );
    let got = r.recv();
    let data: usize = got
        .iter()
        .filter(|(h, _)| h.op == Op::Rw)
        .map(|p| p.1.len())
        .sum();
    assert_eq!(data, 600);
    // A bigger buffer: the rest.
    r.send(
        Header {
            buf_alloc: 1 << 20,
            fwd_cnt: 1600,
            ..hdr(Op::CreditUpdate, 5000, 1234, 0)
        },
        &[],
    );
    r.post_rx(10);
    let got = r.recv();
    let data: usize = got
        .iter()
        .filter(|(h, _)| h.op == Op::Rw)
        .map(|p| p.1.len())
        .sum();
    assert_eq!(data, 3400);
    assert!(got
        .iter()
        .all(|(h, p)| h.op != Op::Rw || p.len() <= RX_BUF as usize));
}

#[test]
fn a_host_peer_that_stops_reading_is_not_buffered_without_bound() {
    let mut r = rig();
    let _host = r.guest_connect(1234, 64 << 10); // never read
    let chunk = vec![1u8; 60 << 10];
    let mut sent = 0usize;
    let mut reset = false;
    r.post_rx(4);
    while sent < 16 << 20 {
        r.send(hdr(Op::Rw, 5000, 1234, chunk.len() as u32), &chunk);
        sent += chunk.len();
        assert!(
            r.mux.buffered() <= BUF_ALLOC as usize,
            "buffered {}",
            r.mux.buffered()
        );
        let got = r.recv();
        if got.iter().any(|(h, _)| h.op == Op::Rst) {
            reset = true;
            break;
        }
        // Reuse descriptors and memory: the tx queue is a ring of 256.
        if r.tx_seen > 200 {
            break;
        }
    }
    assert!(
        reset,
        "a guest sending past its credit is reset (sent {sent})"
    );
    assert_eq!(r.mux.connections(), 0);
    assert_eq!(r.mux.buffered(), 0);
}

#[test]
fn credit_updates_follow_forwarded_bytes_and_requests() {
    let mut r = rig();
    let mut host = r.guest_connect(1234, 64 << 10);
    let chunk = vec![9u8; 32 << 10];
    for _ in 0..3 {
        r.send(hdr(Op::Rw, 5000, 1234, chunk.len() as u32), &chunk);
    }
    let mut b = vec![0u8; 96 << 10];
    host.read_exact(&mut b).unwrap();
    r.post_rx(2);
    let got = r.recv();
    assert_eq!(
        ops(&got),
        [Op::CreditUpdate],
        "unasked after a quarter of the buffer"
    );
    assert_eq!(got[0].0.fwd_cnt, 96 << 10);
    r.send(hdr(Op::CreditRequest, 5000, 1234, 0), &[]);
    let got = r.recv();
    assert_eq!(ops(&got), [Op::CreditUpdate]);
    assert_eq!(
        (got[0].0.buf_alloc, got[0].0.fwd_cnt),
        (BUF_ALLOC, 96 << 10)
    );
}

#[test]
fn half_close_each_way() {
    let mut r = rig();
    let mut host = r.guest_connect(1234, 64 << 10);
    r.send(hdr(Op::Rw, 5000, 1234, 3), b"abc");
    r.send(
        Header {
            flags: SHUTDOWN_SEND,
            ..hdr(Op::Shutdown, 5000, 1234, 0)
        },
        &[],
    );
    // The host reads the data, then EOF, and may still write.
    let mut buf = Vec::new();
    host.read_to_end(&mut buf).unwrap();
    assert_eq!(buf, b"abc");
    host.write_all(b"reply").unwrap();
    r.post_rx(4);
    let got = r.recv();
    assert_eq!(ops(&got), [Op::Rw]);
    assert_eq!(got[0].1, b"reply");
    // The guest may not send after its SHUTDOWN(SEND).
    // The host stops sending too: the guest hears SHUTDOWN(SEND), then a reset ends it.
    host.shutdown(std::net::Shutdown::Write).unwrap();
    let got = r.recv();
    assert_eq!(ops(&got), [Op::Shutdown, Op::Rst]);
    assert_eq!(got[0].0.flags, SHUTDOWN_SEND);
    assert_eq!(r.mux.connections(), 0);
}

#[test]
fn full_shutdown_from_the_guest_is_answered_with_rst_after_the_data() {
    let mut r = rig();
    let mut host = r.guest_connect(1234, 64 << 10);
    r.send(hdr(Op::Rw, 5000, 1234, 4), b"last");
    r.send(
        Header {
            flags: SHUTDOWN_SEND | SHUTDOWN_RCV,
            ..hdr(Op::Shutdown, 5000, 1234, 0)
        },
        &[],
    );
    r.post_rx(2);
    assert_eq!(ops(&r.recv()), [Op::Rst]);
    let mut buf = Vec::new();
    host.read_to_end(&mut buf).unwrap();
    assert_eq!(buf, b"last");
    assert_eq!(r.mux.connections(), 0);
}

#[test]
fn guest_data_after_its_shutdown_resets() {
    let mut r = rig();
    let _host = r.guest_connect(1234, 64 << 10);
    r.send(
        Header {
            flags: SHUTDOWN_SEND,
            ..hdr(Op::Shutdown, 5000, 1234, 0)
        },
        &[],
    );
    r.send(hdr(Op::Rw, 5000, 1234, 1), b"x");
    r.post_rx(2);
    assert_eq!(ops(&r.recv()), [Op::Rst]);
}

#[test]
fn a_host_peer_that_goes_away_resets_the_connection() {
    let mut r = rig();
    let host = r.guest_connect(1234, 64 << 10);
    drop(host);
    r.post_rx(2);
    // EOF: the host side will send nothing more.
    assert_eq!(ops(&r.recv()), [Op::Shutdown]);
    // Writing to it fails: reset.
    r.send(hdr(Op::Rw, 5000, 1234, 1), b"x");
    assert_eq!(ops(&r.recv()), [Op::Rst]);
    assert_eq!(r.mux.connections(), 0);
}

mod device;
