//! The host side of virtio-vsock on unix sockets ("hybrid vsock", as Firecracker does it):
//! host programs connect to the device's socket and write `CONNECT <port>\n`; once the
//! guest accepts they read `OK <local port>\n` and the stream is the connection. A guest
//! connecting to host port P reaches the unix socket `<path>_P`.
//!
//! [`Muxer`] owns the listener, the connections and an epoll set of their sockets; the
//! device's worker calls it when a queue is notified or that epoll set is readable. It is
//! synchronous and thread-free, so tests drive it directly against mock queues.

use super::conn::{rst_reply, Conn, State, Verdict};
use super::packet::{self, Header, Op, RxBuffer, HOST_CID, TYPE_STREAM};
use crate::queue::{self, RingError};
use crate::{Interrupt, Mem};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// Queue indices.
pub const RX: u16 = 0;
/// Transmit queue.
pub const TX: u16 = 1;
/// Event queue.
pub const EVENT: u16 = 2;

/// Most connections at once (guest- and host-initiated); more are refused.
pub const MAX_CONNS: usize = 1024;
/// Most host peers that connected but have not sent their `CONNECT` line yet.
const MAX_HANDSHAKES: usize = 64;
/// Most resets queued for the guest (for packets without a connection); more are dropped.
const MAX_RST_QUEUE: usize = 256;
/// Longest `CONNECT <port>\n` line.
const MAX_CONNECT_LINE: usize = 32;
/// How long a host peer's connection waits for the guest to accept.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// First local port given to host-initiated connections.
const FIRST_LOCAL_PORT: u32 = 1 << 30;

const LISTENER_TOKEN: u64 = 0;

/// `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`.
pub const EVENT_TRANSPORT_RESET: u32 = 0;

/// Counters, for tests and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Transmitted packets dropped as malformed.
    pub dropped_tx: u64,
    /// Receive chains returned empty as malformed.
    pub dropped_rx: u64,
    /// Resets sent.
    pub resets: u64,
}

/// A host peer that has not sent its `CONNECT` line yet.
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
}

enum Entry {
    Handshake(Handshake),
    Conn((u32, u32)),
}

/// The host side of one vsock device.
pub struct Muxer {
    guest_cid: u64,
    uds: PathBuf,
    listener: UnixListener,
    epoll: Epoll,
    /// By (local port, guest port).
    conns: HashMap<(u32, u32), Conn>,
    tokens: HashMap<u64, Entry>,
    next_token: u64,
    next_local_port: u32,
    rst_queue: VecDeque<Header>,
    /// Where the next search for a packet starts among the connections (round robin).
    next_turn: usize,
    /// A transport-reset event is owed (after a snapshot restore).
    pub reset_event_pending: bool,
    /// Counters.
    pub counters: Counters,
    scratch: Vec<u8>,
}

fn event_set_for_conn() -> EventSet {
    EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED
}

impl Muxer {
    /// A muxer over `listener` (non-blocking; bound at `uds`) for the guest `guest_cid`.
    pub fn new(listener: UnixListener, uds: &Path, guest_cid: u64) -> std::io::Result<Self> {
        listener.set_nonblocking(true)?;
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            listener.as_raw_fd(),
            EpollEvent::new(EventSet::IN, LISTENER_TOKEN),
        )?;
        Ok(Muxer {
            guest_cid,
            uds: uds.to_path_buf(),
            listener,
            epoll,
            conns: HashMap::new(),
            tokens: HashMap::new(),
            next_token: 1,
            next_local_port: FIRST_LOCAL_PORT,
            rst_queue: VecDeque::new(),
            next_turn: 0,
            reset_event_pending: false,
            counters: Counters::default(),
            scratch: Vec::new(),
        })
    }

    /// The epoll set of the listener and every host socket: readable when there is work.
    pub fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Connections open.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Bytes buffered for host peers, over all connections.
    pub fn buffered(&self) -> usize {
        self.conns.values().map(Conn::buffered).sum()
    }

    fn register(&mut self, fd: RawFd, entry: Entry, events: EventSet) -> std::io::Result<u64> {
        let token = self.next_token;
        self.next_token += 1;
        self.epoll
            .ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))?;
        self.tokens.insert(token, entry);
        Ok(token)
    }

    fn remove_conn(&mut self, key: (u32, u32)) {
        if let Some(c) = self.conns.remove(&key) {
            let _ = self.epoll.ctl(
                ControlOperation::Delete,
                c.stream.as_raw_fd(),
                EpollEvent::default(),
            );
            self.tokens
                .retain(|_, e| !matches!(e, Entry::Conn(k) if *k == key));
        }
    }

    fn queue_rst(&mut self, hdr: Header) {
        if self.rst_queue.len() < MAX_RST_QUEUE {
            self.rst_queue.push_back(hdr);
        }
    }

    /// Resets a connection: RST to the guest, the host socket closed.
    fn reset_conn(&mut self, key: (u32, u32)) {
        if let Some(c) = self.conns.get_mut(&key) {
            let rst = c.header(Op::Rst, 0, 0);
            self.queue_rst(rst);
        }
        self.remove_conn(key);
    }

    /// Handles what the host sockets report (new peers, readable or writable streams).
    pub fn handle_host_events(&mut self) {
        let mut ready = [EpollEvent::default(); 32];
        // Until nothing is ready: a peer accepted here may have sent its CONNECT line
        // already. Bounded, so a flood of peers cannot keep the worker from its queues.
        for _ in 0..64 {
            let n = match self.epoll.wait(0, &mut ready) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("virtio-vsock: epoll_wait failed: {e}");
                    return;
                }
            };
            if n == 0 {
                return;
            }
            for ev in &ready[..n] {
                self.handle_event(ev.data(), ev.event_set());
            }
        }
    }

    fn handle_event(&mut self, token: u64, events: EventSet) {
        if token == LISTENER_TOKEN {
            self.accept_all();
            return;
        }
        match self.tokens.get_mut(&token) {
            Some(Entry::Handshake(_)) => self.read_connect_line(token),
            Some(Entry::Conn(key)) => {
                let key = *key;
                let Some(c) = self.conns.get_mut(&key) else {
                    return;
                };
                // A hang-up or an error shows when reading (EOF or a failure).
                if events.intersects(
                    EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP | EventSet::ERROR,
                ) {
                    c.readable = true;
                }
                if c.flush_to_host().is_err() || c.finished() {
                    self.reset_conn(key);
                }
            }
            None => {}
        }
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let handshakes = self
                        .tokens
                        .values()
                        .filter(|e| matches!(e, Entry::Handshake(_)))
                        .count();
                    if handshakes >= MAX_HANDSHAKES || self.conns.len() >= MAX_CONNS {
                        tracing::warn!("virtio-vsock: too many host connections; refusing one");
                        continue;
                    }
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let fd = stream.as_raw_fd();
                    let entry = Entry::Handshake(Handshake {
                        stream,
                        line: Vec::new(),
                    });
                    if let Err(e) = self.register(fd, entry, EventSet::IN) {
                        tracing::warn!("virtio-vsock: cannot watch a host connection: {e}");
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    /// Reads a host peer's `CONNECT <port>\n` one byte at a time (so no data after it is
    /// taken) and opens the connection towards the guest.
    fn read_connect_line(&mut self, token: u64) {
        let Some(Entry::Handshake(h)) = self.tokens.get_mut(&token) else {
            return;
        };
        let mut byte = [0u8; 1];
        let port = loop {
            match h.stream.read(&mut byte) {
                Ok(1) if byte[0] == b'\n' => break parse_connect(&h.line),
                Ok(1) if h.line.len() < MAX_CONNECT_LINE => h.line.push(byte[0]),
                Ok(_) => break None,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => break None,
            }
        };
        let Some(Entry::Handshake(h)) = self.tokens.remove(&token) else {
            return;
        };
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            h.stream.as_raw_fd(),
            EpollEvent::default(),
        );
        let Some(port) = port else {
            tracing::debug!("virtio-vsock: a host peer sent no valid CONNECT line; closed");
            return;
        };
        if self.conns.len() >= MAX_CONNS {
            return;
        }
        let Some(local) = self.alloc_local_port(port) else {
            return;
        };
        let mut c = Conn::new(h.stream, self.guest_cid, local, port, State::Connecting);
        c.deadline = Some(Instant::now() + CONNECT_TIMEOUT);
        self.add_conn(c);
    }

    fn alloc_local_port(&mut self, peer_port: u32) -> Option<u32> {
        for _ in 0..=MAX_CONNS {
            let p = self.next_local_port;
            self.next_local_port = self.next_local_port.wrapping_add(1).max(FIRST_LOCAL_PORT);
            if !self.conns.contains_key(&(p, peer_port)) {
                return Some(p);
            }
        }
        None
    }

    fn add_conn(&mut self, c: Conn) {
        let key = (c.local_port, c.peer_port);
        let fd = c.stream.as_raw_fd();
        self.conns.insert(key, c);
        if let Err(e) = self.register(fd, Entry::Conn(key), event_set_for_conn()) {
            tracing::warn!("virtio-vsock: cannot watch a connection: {e}");
            self.reset_conn(key);
        }
    }

    /// Ends host-initiated connections the guest did not accept in time; returns how long
    /// until the next deadline.
    pub fn expire(&mut self, now: Instant) -> Option<Duration> {
        let expired: Vec<_> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(k, _)| *k)
            .collect();
        for key in expired {
            tracing::debug!(
                "virtio-vsock: the guest did not accept port {} in time",
                key.1
            );
            self.reset_conn(key);
        }
        self.conns
            .values()
            .filter_map(|c| c.deadline)
            .min()
            .map(|d| d.saturating_duration_since(now))
    }

    /// A packet from the guest.
    fn on_guest_packet(&mut self, hdr: Header, payload: &[u8]) {
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID {
            self.counters.dropped_tx += 1;
            tracing::debug!(
                "virtio-vsock: dropped a packet from CID {} to CID {}",
                hdr.src_cid,
                hdr.dst_cid
            );
            return;
        }
        let key = (hdr.dst_port, hdr.src_port);
        if hdr.type_ != TYPE_STREAM {
            if hdr.op != Op::Rst {
                self.queue_rst(rst_reply(&hdr));
            }
            return;
        }
        let Some(c) = self.conns.get_mut(&key) else {
            match hdr.op {
                Op::Request => self.guest_connect(&hdr),
                Op::Rst => {}
                _ => self.queue_rst(rst_reply(&hdr)),
            }
            return;
        };
        match c.on_guest_packet(&hdr, payload) {
            Verdict::Keep => {
                if c.finished() {
                    self.reset_conn(key);
                }
            }
            Verdict::Reset => self.reset_conn(key),
            Verdict::Drop => self.remove_conn(key),
        }
    }

    /// A guest's REQUEST to host port `dst_port`: connects `<uds>_<port>`.
    fn guest_connect(&mut self, hdr: &Header) {
        if self.conns.len() >= MAX_CONNS {
            self.queue_rst(rst_reply(hdr));
            return;
        }
        let mut path = self.uds.clone().into_os_string();
        path.push(format!("_{}", hdr.dst_port));
        let stream = match connect_nonblocking(Path::new(&path)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(
                    "virtio-vsock: guest connection to port {}: {e}",
                    hdr.dst_port
                );
                self.queue_rst(rst_reply(hdr));
                return;
            }
        };
        let mut c = Conn::new(
            stream,
            self.guest_cid,
            hdr.dst_port,
            hdr.src_port,
            State::Established,
        );
        // Takes the guest's credit from the REQUEST.
        c.on_guest_packet(
            &Header {
                op: Op::CreditUpdate,
                ..*hdr
            },
            &[],
        );
        self.add_conn(c);
    }

    /// Serves every packet the guest transmitted. Returns the chains served, or the ring
    /// error after which the device needs a reset.
    pub fn process_tx(
        &mut self,
        queue: &mut Queue,
        mem: &Mem,
        interrupt: &dyn Interrupt,
    ) -> Result<usize, RingError> {
        let mut payload = std::mem::take(&mut self.scratch);
        let r = queue::drain(queue, TX, mem, interrupt, |chain| {
            match packet::read_tx(chain, mem, &mut payload) {
                Ok(hdr) => self.on_guest_packet(hdr, &payload),
                Err(e) => {
                    self.counters.dropped_tx += 1;
                    tracing::debug!("virtio-vsock: dropped a transmitted packet: {e}");
                }
            }
            0
        });
        self.scratch = payload;
        r
    }

    /// The next packet for the guest that fits `capacity` payload bytes, with its payload
    /// in `buf`: a queued reset, a connection's control packet, or data within the guest's
    /// credit. Connections whose host socket failed are reset on the way.
    fn next_packet(&mut self, buf: &mut Vec<u8>, capacity: usize) -> Option<Header> {
        buf.clear();
        if let Some(h) = self.rst_queue.pop_front() {
            self.counters.resets += 1;
            return Some(h);
        }
        let mut failed = Vec::new();
        let mut found = None;
        // Round robin: start after the connection served last, so one busy stream does
        // not keep the others from the receive queue.
        let keys: Vec<(u32, u32)> = self.conns.keys().copied().collect();
        let start = self.next_turn % keys.len().max(1);
        for (i, key) in keys.iter().cycle().skip(start).take(keys.len()).enumerate() {
            let Some(c) = self.conns.get_mut(key) else {
                continue;
            };
            self.next_turn = start + i + 1;
            c.poll_credit();
            if let Some(h) = c.take_control() {
                found = Some((*key, h));
                break;
            }
            if c.wants_to_send_data() {
                match c.read_host(buf, capacity) {
                    Ok(Some(h)) => {
                        found = Some((*key, h));
                        break;
                    }
                    Ok(None) => {
                        if let Some(h) = c.take_control() {
                            found = Some((*key, h));
                            break;
                        }
                    }
                    Err(_) => failed.push(*key),
                }
            }
        }
        for key in failed {
            self.reset_conn(key);
        }
        if let Some((key, h)) = found {
            if self.conns.get(&key).is_some_and(Conn::finished) {
                self.reset_conn(key);
            }
            return Some(h);
        }
        // Resets queued by failures above.
        let h = self.rst_queue.pop_front()?;
        self.counters.resets += 1;
        Some(h)
    }

    /// Fills receive buffers with whatever the guest is owed: resets, control packets,
    /// data within the guest's credit. Returns the chains used.
    pub fn process_rx(
        &mut self,
        queue: &mut Queue,
        mem: &Mem,
        interrupt: &dyn Interrupt,
    ) -> Result<usize, RingError> {
        let mut buf = std::mem::take(&mut self.scratch);
        let mut used = 0usize;
        let result = (|| loop {
            let Some(chain) = queue.iter(mem)?.next() else {
                // Out of buffers: ask for a notification when the driver adds some
                // (with VIRTIO_RING_F_EVENT_IDX this moves avail_event), then look again
                // for buffers added meanwhile.
                if queue.enable_notification(mem)? {
                    continue;
                }
                return Ok(());
            };
            let head = chain.head_index();
            let rx = match RxBuffer::new(chain, mem) {
                Ok(rx) => rx,
                Err(e) => {
                    self.counters.dropped_rx += 1;
                    tracing::debug!("virtio-vsock: unusable receive buffer: {e}");
                    queue.add_used(mem, head, 0)?;
                    used += 1;
                    continue;
                }
            };
            let Some(hdr) = self.next_packet(&mut buf, rx.capacity()) else {
                queue.go_to_previous_position();
                return Ok(());
            };
            let len = rx.write(&hdr, &buf).unwrap_or(0);
            queue.add_used(mem, head, len)?;
            used += 1;
        })();
        self.scratch = buf;
        if used > 0 && queue.needs_notification(mem).unwrap_or(true) {
            interrupt.notify_queue(RX);
        }
        result.map(|()| used)
    }

    /// Sends the transport-reset event if one is owed and the driver gave an event buffer.
    pub fn process_event(
        &mut self,
        queue: &mut Queue,
        mem: &Mem,
        interrupt: &dyn Interrupt,
    ) -> Result<(), RingError> {
        if !self.reset_event_pending {
            return Ok(());
        }
        let chain = match queue::pop(queue, mem)? {
            Some(c) => c,
            // No buffer yet: ask to be notified when there is one.
            None if !queue.enable_notification(mem)? => return Ok(()),
            None => match queue::pop(queue, mem)? {
                Some(c) => c,
                None => return Ok(()),
            },
        };
        let head = chain.head_index();
        let written = match chain.writer(mem) {
            Ok(mut w) if w.available_bytes() >= 4 => {
                use std::io::Write;
                w.write_all(&EVENT_TRANSPORT_RESET.to_le_bytes()).is_ok()
            }
            _ => false,
        };
        if written {
            self.reset_event_pending = false;
        }
        queue::complete(
            queue,
            EVENT,
            mem,
            interrupt,
            head,
            if written { 4 } else { 0 },
        )
    }
}

/// Connects to the unix socket `path` without blocking the worker: a listener whose
/// backlog is full refuses at once (`EAGAIN`) instead of stalling every connection of the
/// device. The stream is non-blocking.
pub fn connect_nonblocking(path: &Path) -> std::io::Result<UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let mut addr = libc::sockaddr_un {
        sun_family: libc::AF_UNIX as libc::sa_family_t,
        sun_path: [0; 108],
    };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            "socket path too long for a unix socket",
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket(2) takes no pointers; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket just created here and owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: `addr` is a live, initialized sockaddr_un; `len` covers its family, the path
    // and its terminating NUL, within the structure.
    let r = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
            len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(UnixStream::from(sock))
}

/// `CONNECT <port>` (without the newline) → the port.
fn parse_connect(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    let s = s.strip_suffix('\r').unwrap_or(s);
    let port = s.strip_prefix("CONNECT ")?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

#[cfg(test)]
#[test]
fn connect_lines() {
    assert_eq!(parse_connect(b"CONNECT 52"), Some(52));
    assert_eq!(parse_connect(b"CONNECT 52\r"), Some(52));
    assert_eq!(parse_connect(b"CONNECT "), None);
    assert_eq!(parse_connect(b"CONNECT -1"), None);
    assert_eq!(parse_connect(b"CONNECT 99999999999"), None);
    assert_eq!(parse_connect(b"connect 52"), None);
    assert_eq!(parse_connect(&[0xff, 0xfe]), None);
}
