//! Receive: frames from the tap into the driver's receive buffers.

use super::tap::Tap;
use super::{NetStats, HDR_LEN, MAX_FRAME};
use crate::queue::{self, RingError};
use crate::{Interrupt, Mem};
use std::io;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};

/// The receive side's own state: a frame buffer and the frame waiting for buffers.
pub struct RxState {
    buf: Vec<u8>,
    pending: Option<usize>,
}

impl Default for RxState {
    fn default() -> Self {
        Self::new()
    }
}

impl RxState {
    /// No frame waiting.
    pub fn new() -> Self {
        RxState {
            // One byte more than the largest frame: a read that fills it was oversized.
            buf: vec![0; HDR_LEN + MAX_FRAME + 1],
            pending: None,
        }
    }

    /// Whether a frame read from the tap waits for receive buffers.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }
}

/// One receive chain: its device-writable buffers.
struct Target {
    head: u16,
    regions: Vec<(GuestAddress, usize)>,
    cap: usize,
}

/// What became of one frame.
enum Placed {
    Delivered,
    Dropped,
    /// The ring ran dry; the chains taken were given back. `seen` is the available index
    /// the device got to: buffers published from there on are new.
    NoBuffers {
        seen: u16,
    },
}

/// The writable buffers of a receive chain, or its head when the chain breaks the rules:
/// a driver-readable buffer, a buffer outside guest memory, room for less than the header.
fn target(chain: DescriptorChain<&Mem>, mem: &Mem) -> Result<Target, u16> {
    let head = chain.head_index();
    let mut t = Target {
        head,
        regions: Vec::new(),
        cap: 0,
    };
    let mut cut = false;
    for d in chain {
        // A chain whose last descriptor still points on was cut short by the walk: it
        // loops or names a descriptor outside the table.
        cut = d.has_next();
        if !d.is_write_only() {
            return Err(head);
        }
        let len = d.len() as usize;
        if len == 0 {
            continue;
        }
        if !mem.check_range(d.addr(), len, Permissions::Write) {
            return Err(head);
        }
        t.regions.push((d.addr(), len));
        t.cap += len;
    }
    if cut || t.cap < HDR_LEN {
        return Err(head);
    }
    Ok(t)
}

/// Puts one frame (header first) into receive chains: one chain, or with mergeable
/// buffers as many as it takes (`num_buffers` in the first one's header). When the ring
/// runs dry first, the chains taken are given back (the available index rewound) and the
/// frame waits. A frame that no buffer can hold is dropped.
fn place(
    q: &mut Queue,
    mem: &Mem,
    frame: &mut [u8],
    mrg: bool,
    stats: &NetStats,
    used: &mut usize,
) -> Result<Placed, RingError> {
    let need = frame.len();
    let mut start = q.next_avail();
    let mut popped = 0usize;
    let mut targets: Vec<Target> = Vec::new();
    let mut late_bad: Vec<u16> = Vec::new();
    let mut have = 0usize;
    while have < need && (mrg || targets.is_empty()) {
        if popped >= usize::from(q.size()) {
            // Every buffer of the ring together is too small: this frame can never fit.
            q.set_next_avail(start);
            NetStats::add(&stats.rx_dropped, 1);
            return Ok(Placed::Dropped);
        }
        let Some(chain) = queue::pop(q, mem)? else {
            let seen = q.next_avail();
            q.set_next_avail(start);
            return Ok(Placed::NoBuffers { seen });
        };
        popped += 1;
        match target(chain, mem) {
            Ok(t) => {
                have += t.cap;
                targets.push(t);
            }
            Err(head) => {
                NetStats::add(&stats.bad_chains, 1);
                tracing::debug!("virtio-net rx: chain {head} is malformed; completed unused");
                if targets.is_empty() {
                    q.add_used(mem, head, 0)?;
                    *used += 1;
                    start = q.next_avail();
                    popped = 0;
                } else {
                    late_bad.push(head);
                }
            }
        }
    }
    if have < need {
        // One buffer (no mergeable buffers) smaller than the frame: drop the frame, keep
        // the buffer for the next one.
        q.set_next_avail(start);
        NetStats::add(&stats.rx_dropped, 1);
        return Ok(Placed::Dropped);
    }
    let n = targets.len() as u16;
    frame[10..12].copy_from_slice(&n.to_le_bytes());
    let mut off = 0usize;
    for t in &targets {
        let mut written = 0usize;
        for &(addr, len) in &t.regions {
            if off >= need {
                break;
            }
            let k = len.min(need - off);
            if mem.write_slice(&frame[off..off + k], addr).is_err() {
                // Checked against guest memory above; nothing else can fail.
                NetStats::add(&stats.bad_chains, 1);
            }
            off += k;
            written += k;
        }
        q.add_used(mem, t.head, written as u32)?;
        *used += 1;
    }
    for head in late_bad {
        q.add_used(mem, head, 0)?;
        *used += 1;
    }
    NetStats::add(&stats.rx_packets, 1);
    NetStats::add(&stats.rx_bytes, (need - HDR_LEN) as u64);
    Ok(Placed::Delivered)
}

/// Moves frames from `tap` to the receive queue until the tap has none (`EAGAIN`) or the
/// receive buffers run out (the frame then waits in `st`; receive notifications are
/// enabled so the driver's next buffers bring the worker back). Raises one interrupt for
/// the batch when the driver wants it.
///
/// Returns the tap's read error (other than `EAGAIN`), if any, or the ring error after
/// which the device needs a reset.
pub fn receive(
    q: &mut Queue,
    mem: &Mem,
    interrupt: &dyn Interrupt,
    tap: &Tap,
    st: &mut RxState,
    mrg: bool,
    stats: &NetStats,
) -> Result<Option<io::Error>, RingError> {
    let mut used = 0usize;
    let mut tap_err = None;
    let result = (|| -> Result<(), RingError> {
        q.disable_notification(mem)?;
        loop {
            let len = match st.pending.take() {
                Some(n) => n,
                None => match tap.read(&mut st.buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tap_err = Some(e);
                        return Ok(());
                    }
                },
            };
            if !(HDR_LEN..=HDR_LEN + MAX_FRAME).contains(&len) {
                // A runt without a header, or a frame over MAX_FRAME (cut by the read).
                NetStats::add(&stats.rx_dropped, 1);
                continue;
            }
            match place(q, mem, &mut st.buf[..len], mrg, stats, &mut used)? {
                Placed::Delivered | Placed::Dropped => {}
                Placed::NoBuffers { seen } => {
                    st.pending = Some(len);
                    // Ask for a notification once the driver publishes past what was seen
                    // (with EVENT_IDX, avail_event = seen), and check for buffers that came
                    // meanwhile; the available index itself stays where the frame starts.
                    let start = q.next_avail();
                    q.set_next_avail(seen);
                    let more = q.enable_notification(mem);
                    q.set_next_avail(start);
                    if more? {
                        // Buffers came while notifications were off: go on.
                        q.disable_notification(mem)?;
                        continue;
                    }
                    return Ok(());
                }
            }
        }
    })();
    if used > 0 && q.needs_notification(mem).unwrap_or(true) {
        interrupt.notify_queue(0);
    }
    result.map(|()| tap_err)
}
