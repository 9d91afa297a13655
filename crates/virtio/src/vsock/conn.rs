//! One vsock stream connection between a guest socket and a host unix socket: its state,
//! the credit both ways, and the bytes on their way to the host.
//!
//! Credit (virtio 1.2 §5.10.6.3): each side tells the other its receive buffer size
//! (`buf_alloc`) and how many bytes it has consumed (`fwd_cnt`) in every header. The host
//! sends the guest at most `guest_buf_alloc - (sent - guest_fwd_cnt)` bytes; it grants the
//! guest [`BUF_ALLOC`] bytes and buffers at most that much for a host peer that does not
//! read: a guest that sends beyond its credit has its connection reset.

use super::packet::{Header, Op, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// The receive buffer the host side grants the guest per connection: what it buffers at
/// most when the host peer does not read.
pub const BUF_ALLOC: u32 = 256 << 10;

/// Forwarded bytes after which the host tells the guest its new credit unasked.
const CREDIT_UPDATE_THRESHOLD: u32 = BUF_ALLOC / 4;

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Opened by a host peer (`CONNECT <port>`): REQUEST sent or queued, waiting for the
    /// guest's RESPONSE.
    Connecting,
    /// Data flows.
    Established,
}

/// Control packets a connection owes the guest (at most one of each is pending).
#[derive(Debug, Default, Clone, Copy)]
pub struct Pending {
    /// The REQUEST of a host-initiated connection.
    pub request: bool,
    /// The RESPONSE to a guest's REQUEST.
    pub response: bool,
    /// Our credit changed.
    pub credit_update: bool,
    /// We ran out of the guest's credit.
    pub credit_request: bool,
    /// SHUTDOWN flags to send (the host peer stopped sending).
    pub shutdown: u32,
}

/// What happened when the connection took a packet from the guest.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go on.
    Keep,
    /// Reset the connection: send RST to the guest and drop it.
    Reset,
    /// The guest reset it: drop it without an answer.
    Drop,
}

/// The host socket of a connection failed (its peer is gone): reset the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostGone;

/// A connection.
pub struct Conn {
    /// The host unix socket.
    pub stream: UnixStream,
    /// The host side's port.
    pub local_port: u32,
    /// The guest side's port.
    pub peer_port: u32,
    /// The guest's CID.
    pub guest_cid: u64,
    /// Where it stands.
    pub state: State,
    /// Control packets owed.
    pub pending: Pending,
    /// When a host-initiated connection gives up waiting for the guest.
    pub deadline: Option<Instant>,
    /// The host stream has (or may have) bytes to read (edge-triggered: set on an event,
    /// cleared when a read would block).
    pub readable: bool,
    /// SHUTDOWN flags the guest sent.
    pub guest_shutdown: u32,
    /// The host peer stopped sending (EOF).
    pub host_eof: bool,
    /// A CREDIT_REQUEST went out and the guest has not given credit since.
    credit_requested: bool,
    guest_buf_alloc: u32,
    guest_fwd_cnt: u32,
    /// Bytes sent to the guest, ever (wrapping).
    sent: u32,
    /// Bytes received from the guest, ever (wrapping).
    received: u32,
    /// Bytes of them written to the host stream (our fwd_cnt).
    forwarded: u32,
    /// `forwarded` as last told to the guest.
    told_fwd_cnt: u32,
    /// Received but not yet written to the host stream (at most [`BUF_ALLOC`]).
    to_host: VecDeque<u8>,
}

impl Conn {
    /// A connection; `Connecting` ones owe the guest a REQUEST, `Established` ones (the
    /// guest asked) a RESPONSE.
    pub fn new(
        stream: UnixStream,
        guest_cid: u64,
        local_port: u32,
        peer_port: u32,
        state: State,
    ) -> Self {
        let pending = Pending {
            request: state == State::Connecting,
            response: state == State::Established,
            ..Pending::default()
        };
        Conn {
            stream,
            local_port,
            peer_port,
            guest_cid,
            state,
            pending,
            deadline: None,
            readable: false,
            guest_shutdown: 0,
            host_eof: false,
            credit_requested: false,
            guest_buf_alloc: 0,
            guest_fwd_cnt: 0,
            sent: 0,
            received: 0,
            forwarded: 0,
            told_fwd_cnt: 0,
            to_host: VecDeque::new(),
        }
    }

    /// A header from the host side of this connection, carrying our credit.
    pub fn header(&mut self, op: Op, len: u32, flags: u32) -> Header {
        self.told_fwd_cnt = self.forwarded;
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.local_port,
            dst_port: self.peer_port,
            len,
            type_: TYPE_STREAM,
            op,
            flags,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.forwarded,
        }
    }

    /// Bytes the guest can take now.
    pub fn guest_credit(&self) -> u32 {
        let in_flight = self.sent.wrapping_sub(self.guest_fwd_cnt);
        self.guest_buf_alloc.saturating_sub(in_flight)
    }

    /// Bytes buffered for a host peer that has not read them yet.
    pub fn buffered(&self) -> usize {
        self.to_host.len()
    }

    /// Whether the connection has data to send the guest now (and the guest room for it).
    pub fn wants_to_send_data(&self) -> bool {
        self.state == State::Established
            && self.readable
            && !self.host_eof
            && self.guest_shutdown & SHUTDOWN_RCV == 0
            && self.guest_credit() > 0
    }

    /// Owes the guest one CREDIT_REQUEST when host data waits for credit it does not have.
    pub fn poll_credit(&mut self) {
        if self.state == State::Established
            && self.readable
            && !self.host_eof
            && self.guest_shutdown & SHUTDOWN_RCV == 0
            && self.guest_credit() == 0
            && !self.credit_requested
        {
            self.credit_requested = true;
            self.pending.credit_request = true;
        }
    }

    /// The next control packet owed, clearing it.
    pub fn take_control(&mut self) -> Option<Header> {
        let p = &mut self.pending;
        let (op, flags) = if p.request {
            p.request = false;
            (Op::Request, 0)
        } else if p.response {
            p.response = false;
            (Op::Response, 0)
        } else if p.shutdown != 0 {
            let f = std::mem::take(&mut p.shutdown);
            (Op::Shutdown, f)
        } else if p.credit_request {
            p.credit_request = false;
            (Op::CreditRequest, 0)
        } else if p.credit_update {
            p.credit_update = false;
            (Op::CreditUpdate, 0)
        } else {
            return None;
        };
        Some(self.header(op, 0, flags))
    }

    /// Reads up to `max` bytes (within the guest's credit) from the host stream into
    /// `buf` for one RW packet. `None` when there is nothing now (the stream would block,
    /// or reached EOF: a SHUTDOWN is then pending); `Err` when the stream failed (reset the
    /// connection).
    pub fn read_host(&mut self, buf: &mut Vec<u8>, max: usize) -> Result<Option<Header>, HostGone> {
        let n = max.min(self.guest_credit() as usize);
        if n == 0 {
            self.poll_credit();
            return Ok(None);
        }
        buf.resize(n, 0);
        loop {
            match self.stream.read(&mut buf[..n]) {
                Ok(0) => {
                    self.readable = false;
                    self.host_eof = true;
                    self.pending.shutdown |= SHUTDOWN_SEND;
                    buf.clear();
                    return Ok(None);
                }
                Ok(got) => {
                    buf.truncate(got);
                    self.sent = self.sent.wrapping_add(got as u32);
                    return Ok(Some(self.header(Op::Rw, got as u32, 0)));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.readable = false;
                    buf.clear();
                    return Ok(None);
                }
                Err(_) => {
                    buf.clear();
                    return Err(HostGone);
                }
            }
        }
    }

    /// Writes buffered bytes to the host stream until it would block. `Err` when the
    /// host peer is gone. Owes the guest a credit update once enough was forwarded.
    pub fn flush_to_host(&mut self) -> Result<(), HostGone> {
        while !self.to_host.is_empty() {
            let (a, _) = self.to_host.as_slices();
            match self.stream.write(a) {
                Ok(0) => return Err(HostGone),
                Ok(n) => {
                    self.to_host.drain(..n);
                    self.forwarded = self.forwarded.wrapping_add(n as u32);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return Err(HostGone),
            }
        }
        if self.forwarded.wrapping_sub(self.told_fwd_cnt) >= CREDIT_UPDATE_THRESHOLD {
            self.pending.credit_update = true;
        }
        if self.to_host.is_empty() && self.guest_shutdown & SHUTDOWN_SEND != 0 {
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        Ok(())
    }

    /// Whether both directions are closed and nothing is left to forward: time for RST.
    pub fn finished(&self) -> bool {
        let guest_done = self.guest_shutdown == SHUTDOWN_RCV | SHUTDOWN_SEND
            || (self.guest_shutdown & SHUTDOWN_SEND != 0 && self.host_eof);
        guest_done && self.to_host.is_empty() && self.pending.shutdown == 0
    }

    /// Takes a packet from the guest for this connection.
    pub fn on_guest_packet(&mut self, hdr: &Header, payload: &[u8]) -> Verdict {
        self.guest_buf_alloc = hdr.buf_alloc;
        self.guest_fwd_cnt = hdr.fwd_cnt;
        if self.guest_credit() > 0 {
            self.credit_requested = false;
        }
        match hdr.op {
            Op::Rst => Verdict::Drop,
            // A second REQUEST for a connection in use.
            Op::Request => Verdict::Reset,
            Op::Response => {
                if self.state != State::Connecting {
                    return Verdict::Reset;
                }
                self.state = State::Established;
                self.deadline = None;
                // The hybrid-vsock acknowledgement goes ahead of any data.
                let ok = format!("OK {}\n", self.local_port);
                for (i, b) in ok.bytes().enumerate() {
                    self.to_host.insert(i, b);
                }
                // Not guest data: it does not count against the guest's credit.
                self.forwarded = self.forwarded.wrapping_sub(ok.len() as u32);
                self.told_fwd_cnt = self.forwarded;
                self.flush_or_reset()
            }
            Op::Rw => {
                if self.state != State::Established || self.guest_shutdown & SHUTDOWN_SEND != 0 {
                    return Verdict::Reset;
                }
                let outstanding = self.received.wrapping_sub(self.forwarded) as usize;
                if outstanding + payload.len() > BUF_ALLOC as usize {
                    tracing::debug!(
                        "virtio-vsock: the guest sent beyond its credit on port {}",
                        self.local_port
                    );
                    return Verdict::Reset;
                }
                self.received = self.received.wrapping_add(payload.len() as u32);
                self.to_host.extend(payload);
                self.flush_or_reset()
            }
            Op::Shutdown => {
                self.guest_shutdown |= hdr.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                self.flush_or_reset()
            }
            Op::CreditUpdate => Verdict::Keep,
            Op::CreditRequest => {
                self.pending.credit_update = true;
                Verdict::Keep
            }
        }
    }

    fn flush_or_reset(&mut self) -> Verdict {
        match self.flush_to_host() {
            Ok(()) => Verdict::Keep,
            Err(HostGone) => Verdict::Reset,
        }
    }
}

/// A reset from the host side for a guest packet `hdr` that has no connection.
pub fn rst_reply(hdr: &Header) -> Header {
    Header {
        src_cid: HOST_CID,
        dst_cid: hdr.src_cid,
        src_port: hdr.dst_port,
        dst_port: hdr.src_port,
        len: 0,
        type_: TYPE_STREAM,
        op: Op::Rst,
        flags: 0,
        buf_alloc: 0,
        fwd_cnt: 0,
    }
}
