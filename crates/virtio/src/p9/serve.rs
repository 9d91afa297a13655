//! Serving the 9p request queue.
//!
//! A chain's buffers are walked once, when it is popped ([`capture`]): the readable and
//! writable buffers are checked against guest memory and remembered with the request's tag.
//! Serving it ([`serve_chain`]) copies the T-message out of guest memory, runs it through the
//! [`Session`] and copies the R-message into the writable buffers.
//!
//! Two ways to drive that:
//! - [`process_queue`]: every available chain, in order, on the calling thread (no threads:
//!   for fuzzing and tests);
//! - the device: a [`Dispatcher`] on the queue's worker thread pops chains and queues them to
//!   a [`Pool`] of up to [`POOL_THREADS`] threads, spawned when there is work and ending
//!   after [`IDLE_EXIT`] without any. Each completes its chain under the pool's lock, which
//!   also guards the ring.
//!
//! Tflush: a flushed request that no thread has started is returned unanswered (used length
//! 0, which Linux reads as "cancelled") and the Rflush follows at once; a flushed request
//! being served keeps running and the Rflush waits for it, so the driver always sees the
//! flushed request's chain come back before the Rflush (Linux drops its request when the
//! Rflush arrives first).

use crate::queue::{self, RingError};
use crate::{Interrupt, Mem};
use densevm_9p::message::{kind, NOTAG};
use densevm_9p::server::MIN_MSIZE;
use densevm_9p::wire::HEADER_LEN;
use densevm_9p::Session;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};
use vmm_sys_util::eventfd::EventFd;

/// Most buffers one request chain may have (Linux uses at most 128); a longer chain is
/// returned unanswered. Bounds the host memory a hostile driver can make the device hold.
pub const MAX_CHAIN_DESCRIPTORS: usize = 256;

/// Most threads serving one device's requests.
pub(crate) const POOL_THREADS: usize = 4;

/// Stack of a pool thread: request and reply buffers live on the heap.
const POOL_STACK: usize = 256 << 10;

/// A pool thread with nothing to do for this long ends (an idle share costs no threads).
pub(crate) const IDLE_EXIT: Duration = Duration::from_secs(10);

/// Request/reply buffers larger than this are freed after the request, not kept.
const KEEP_BUFFER: usize = 64 << 10;

/// Rlerror: header, ecode[4].
const RLERROR_LEN: usize = HEADER_LEN + 4;

/// Test hook: called on the pool thread with a request's tag before it is served.
pub(crate) type Hook = Arc<dyn Fn(u16) + Send + Sync>;

/// One guest buffer.
#[derive(Debug, Clone, Copy)]
struct Region {
    addr: GuestAddress,
    len: u32,
}

/// One request chain, its buffers captured when it was popped.
#[derive(Debug)]
pub(crate) struct Chain {
    head: u16,
    readable: Vec<Region>,
    writable: Vec<Region>,
    /// Length of the T-message: the readable bytes, trimmed to the size its header declares.
    frame_len: u64,
    /// Room for the R-message.
    write_len: u64,
    /// The T-message's tag ([`NOTAG`] when the header is incomplete).
    tag: u16,
    /// `Some(oldtag)` for a Tflush.
    flush: Option<u16>,
}

/// Walks a chain once: its buffers (all within guest memory, readable ones first) and the
/// T-message's header. `Err(head)` for a chain that cannot be served: a buffer outside guest
/// memory, a readable buffer after a writable one, a chain cut short (a loop, a bad `next`
/// or indirect table) or longer than [`MAX_CHAIN_DESCRIPTORS`].
pub(crate) fn capture(chain: DescriptorChain<&Mem>, mem: &Mem) -> Result<Chain, u16> {
    let head = chain.head_index();
    let mut readable = Vec::new();
    let mut writable = Vec::new();
    let (mut read_len, mut write_len) = (0u64, 0u64);
    let mut seen_writable = false;
    // An empty chain (its head unreadable) counts as cut short.
    let mut cut_short = true;
    for (i, desc) in chain.enumerate() {
        if i >= MAX_CHAIN_DESCRIPTORS {
            return Err(head);
        }
        cut_short = desc.has_next();
        let region = Region {
            addr: desc.addr(),
            len: desc.len(),
        };
        if desc.is_write_only() {
            seen_writable = true;
        } else if seen_writable {
            return Err(head);
        }
        if region.len == 0 {
            continue;
        }
        let access = if desc.is_write_only() {
            Permissions::Write
        } else {
            Permissions::Read
        };
        if !mem.check_range(region.addr, region.len as usize, access) {
            return Err(head);
        }
        if desc.is_write_only() {
            write_len += u64::from(region.len);
            writable.push(region);
        } else {
            read_len += u64::from(region.len);
            readable.push(region);
        }
    }
    if cut_short {
        return Err(head);
    }
    // size[4] type[1] tag[2], and oldtag[2] for a Tflush.
    let mut hdr = [0u8; HEADER_LEN + 2];
    let have = hdr.len().min(read_len as usize);
    if !read_regions(mem, &readable, &mut hdr[..have]) {
        return Err(head);
    }
    let (mut frame_len, mut tag, mut flush) = (read_len, NOTAG, None);
    if have >= HEADER_LEN {
        let size = u64::from(u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]));
        tag = u16::from_le_bytes([hdr[5], hdr[6]]);
        // Slack after the message is ignored; a short or oversized declaration is passed on
        // whole for the server to refuse.
        if size >= HEADER_LEN as u64 && size < read_len {
            frame_len = size;
        }
        if hdr[4] == kind::TFLUSH && frame_len == hdr.len() as u64 {
            flush = Some(u16::from_le_bytes([hdr[7], hdr[8]]));
        }
    }
    Ok(Chain {
        head,
        readable,
        writable,
        frame_len,
        write_len,
        tag,
        flush,
    })
}

/// Fills `buf` from the start of `regions`; false when guest memory cannot be read.
fn read_regions(mem: &Mem, regions: &[Region], buf: &mut [u8]) -> bool {
    let mut done = 0;
    for r in regions {
        if done == buf.len() {
            break;
        }
        let n = (r.len as usize).min(buf.len() - done);
        if mem.read_slice(&mut buf[done..done + n], r.addr).is_err() {
            return false;
        }
        done += n;
    }
    done == buf.len()
}

/// Writes `data` from the start of `regions`; false when it does not fit or guest memory
/// cannot be written.
fn write_regions(mem: &Mem, regions: &[Region], data: &[u8]) -> bool {
    let mut done = 0;
    for r in regions {
        if done == data.len() {
            break;
        }
        let n = (r.len as usize).min(data.len() - done);
        if mem.write_slice(&data[done..done + n], r.addr).is_err() {
            return false;
        }
        done += n;
    }
    done == data.len()
}

/// A serving thread's buffers, reused from request to request.
#[derive(Default)]
pub(crate) struct Buffers {
    frame: Vec<u8>,
    reply: Vec<u8>,
}

impl Buffers {
    /// Frees buffers a large request grew, so idle threads pin little memory.
    fn trim(&mut self) {
        for b in [&mut self.frame, &mut self.reply] {
            if b.capacity() > KEEP_BUFFER {
                *b = Vec::new();
            }
        }
    }
}

/// Serves one captured chain: returns the used length (the R-message's size, or 0 when no
/// reply could be delivered).
///
/// A chain without room for even a header is not served at all. A T-message larger than the
/// negotiated msize gets Rlerror(EMSGSIZE) without being read; so does one whose reply does
/// not fit the writable buffers (its effects, if any, stand: the room should have been
/// there), or no reply at all when not even the Rlerror fits.
pub(crate) fn serve_chain(session: &Session, mem: &Mem, chain: &Chain, bufs: &mut Buffers) -> u32 {
    if chain.write_len < HEADER_LEN as u64 {
        tracing::debug!(tag = chain.tag, "9p request without room for a reply");
        return 0;
    }
    let reply = &mut bufs.reply;
    reply.clear();
    let limit = u64::from(session.msize().max(MIN_MSIZE));
    if chain.frame_len > limit {
        tracing::debug!(
            tag = chain.tag,
            len = chain.frame_len,
            limit,
            "9p request over msize"
        );
        Session::rlerror(reply, chain.tag, libc::EMSGSIZE as u32);
    } else {
        let frame = &mut bufs.frame;
        frame.clear();
        frame.resize(chain.frame_len as usize, 0);
        if !read_regions(mem, &chain.readable, frame) {
            bufs.trim();
            return 0;
        }
        session.handle(frame, reply);
    }
    if reply.len() as u64 > chain.write_len {
        let tag = reply
            .get(5..7)
            .map_or(chain.tag, |t| u16::from_le_bytes([t[0], t[1]]));
        tracing::debug!(
            tag,
            len = reply.len(),
            room = chain.write_len,
            "9p reply larger than its buffers"
        );
        reply.clear();
        if chain.write_len < RLERROR_LEN as u64 {
            bufs.trim();
            return 0;
        }
        Session::rlerror(reply, tag, libc::EMSGSIZE as u32);
    }
    let len = if write_regions(mem, &chain.writable, reply) {
        reply.len() as u32
    } else {
        0
    };
    bufs.trim();
    len
}

/// Serves every chain available on `queue`, in order, on the calling thread, and returns them
/// to the used ring; raises the queue's interrupt when the driver wants one. The synchronous,
/// thread-free entry point (fuzzing, tests): requests are never in flight together, so a
/// Tflush is answered at once.
///
/// Returns how many chains were served, or the ring error after which the device needs a
/// reset.
pub fn process_queue(
    session: &Session,
    queue: &mut Queue,
    mem: &Mem,
    interrupt: &dyn Interrupt,
) -> Result<usize, RingError> {
    let mut bufs = Buffers::default();
    queue::drain(queue, 0, mem, interrupt, |chain| {
        match capture(chain, mem) {
            Ok(chain) => serve_chain(session, mem, &chain, &mut bufs),
            Err(head) => {
                tracing::debug!(head, "malformed 9p request chain");
                0
            }
        }
    })
}

/// Requests of one tag that were popped and not yet returned.
#[derive(Default)]
struct TagState {
    /// Requests with this tag not returned yet (more than one only from a confused driver).
    pending: usize,
    /// Rflush chains (head, used length) to return once they are.
    flushes: Vec<(u16, u32)>,
}

/// What the pool's lock guards.
struct Inner {
    /// The ring: popped by the dispatcher, completed by whoever served the chain.
    queue: Queue,
    /// Chains waiting for a thread.
    jobs: VecDeque<Chain>,
    /// Tags of the chains popped and not returned (Tflush bookkeeping).
    tags: HashMap<u16, TagState>,
    /// Chains popped and not returned; the dispatcher stops at the ring size.
    outstanding: usize,
    /// The dispatcher stopped at that bound and waits for a kick.
    stalled: bool,
    /// Threads waiting for work.
    idle: usize,
    /// Threads running.
    live: usize,
    threads: Vec<JoinHandle<()>>,
    /// Reset: threads end after their current request.
    closed: bool,
    /// A ring error: nothing is served until the driver resets the device.
    broken: bool,
}

/// An activated device's serving state, shared by the dispatcher and the pool threads.
pub(crate) struct Pool {
    session: Session,
    mem: Mem,
    interrupt: Arc<dyn Interrupt>,
    /// The queue's notification eventfd: wakes the dispatcher when it stalled.
    kick: EventFd,
    inner: Mutex<Inner>,
    work: Condvar,
    /// Signalled when the last chain out comes back (or the ring breaks): quiesce waits on it.
    drained: Condvar,
    hook: Option<Hook>,
}

impl Pool {
    pub(crate) fn new(
        session: Session,
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        queue: Queue,
        kick: EventFd,
        hook: Option<Hook>,
    ) -> Self {
        Self {
            session,
            mem,
            interrupt,
            kick,
            inner: Mutex::new(Inner {
                queue,
                jobs: VecDeque::new(),
                tags: HashMap::new(),
                outstanding: 0,
                stalled: false,
                idle: 0,
                live: 0,
                threads: Vec::new(),
                closed: false,
                broken: false,
            }),
            work: Condvar::new(),
            drained: Condvar::new(),
            hook,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the ring broken and asks the driver for a reset (once).
    fn broke(&self, g: &mut Inner, e: &RingError) {
        if !g.broken {
            tracing::warn!("virtio-9p: ring error, the device needs a reset: {e}");
            g.broken = true;
            self.interrupt.needs_reset();
            self.work.notify_all();
            self.drained.notify_all();
        }
    }

    /// Returns chains to the used ring, in order.
    fn complete(&self, g: &mut Inner, chains: &[(u16, u32)]) {
        for &(head, len) in chains {
            if g.broken {
                return;
            }
            g.outstanding = g.outstanding.saturating_sub(1);
            if let Err(e) = queue::complete(&mut g.queue, 0, &self.mem, &*self.interrupt, head, len)
            {
                self.broke(g, &e);
            }
        }
        if g.stalled && g.outstanding < usize::from(g.queue.size()) {
            g.stalled = false;
            let _ = self.kick.write(1);
        }
        if g.outstanding == 0 {
            self.drained.notify_all();
        }
    }

    /// The session the pool serves.
    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    /// Waits until every chain popped is back in the used ring (interrupt raised), for at
    /// most `timeout`; call with the dispatcher parked, so none is popped meanwhile. Returns
    /// the queue's position, or `None` when a request was still being served at the
    /// deadline. A broken ring counts as drained (nothing more will come back).
    pub(crate) fn wait_drained(&self, timeout: Duration) -> Option<(u16, u16)> {
        let deadline = std::time::Instant::now() + timeout;
        let mut g = self.lock();
        while g.outstanding > 0 && !g.broken {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            g = self
                .drained
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Some((g.queue.next_avail(), g.queue.next_used()))
    }

    /// A served request is done: its chain goes back, then the Rflushes that waited for it.
    fn finish(&self, chain: &Chain, len: u32) {
        let mut g = self.lock();
        let mut done = vec![(chain.head, len)];
        if let Some(st) = g.tags.get_mut(&chain.tag) {
            st.pending = st.pending.saturating_sub(1);
            if st.pending == 0 {
                if let Some(st) = g.tags.remove(&chain.tag) {
                    done.extend(st.flushes);
                }
            }
        }
        self.complete(&mut g, &done);
    }

    /// Serves one request on this thread.
    fn run(&self, chain: Chain, bufs: &mut Buffers) {
        if let Some(hook) = &self.hook {
            hook(chain.tag);
        }
        let len = serve_chain(&self.session, &self.mem, &chain, bufs);
        self.finish(&chain, len);
    }

    /// A Tflush: cancels the flushed request if no thread has it yet, and returns the Rflush
    /// after the flushed request's chain.
    fn flush(&self, chain: Chain, oldtag: u16, bufs: &mut Buffers) {
        // The session only answers it: an Rflush (or an Rlerror for lack of room).
        let len = serve_chain(&self.session, &self.mem, &chain, bufs);
        let mut g = self.lock();
        let mut done = Vec::new();
        if let Some(mut st) = g.tags.remove(&oldtag) {
            let mut kept = VecDeque::with_capacity(g.jobs.len());
            for job in g.jobs.drain(..) {
                if job.tag == oldtag {
                    tracing::debug!(tag = oldtag, "9p request flushed before it started");
                    done.push((job.head, 0));
                    st.pending = st.pending.saturating_sub(1);
                } else {
                    kept.push_back(job);
                }
            }
            g.jobs = kept;
            if st.pending > 0 {
                st.flushes.push((chain.head, len));
                g.tags.insert(oldtag, st);
            } else {
                done.extend(st.flushes);
                done.push((chain.head, len));
            }
        } else {
            done.push((chain.head, len));
        }
        self.complete(&mut g, &done);
    }

    /// Queues a request for the pool, starting a thread when none is free.
    fn submit(self: &Arc<Self>, chain: Chain, bufs: &mut Buffers) {
        let mut g = self.lock();
        g.tags.entry(chain.tag).or_default().pending += 1;
        g.jobs.push_back(chain);
        if g.jobs.len() > g.idle && g.live < POOL_THREADS {
            g.threads.retain(|t| !t.is_finished());
            let pool = self.clone();
            let spawned = std::thread::Builder::new()
                .name("virtio-9p-io".into())
                .stack_size(POOL_STACK)
                .spawn(move || {
                    densevm_seccomp::enter(densevm_seccomp::ThreadKind::P9Io);
                    pool.serve_thread()
                });
            match spawned {
                Ok(t) => {
                    g.live += 1;
                    g.threads.push(t);
                }
                Err(e) => {
                    tracing::warn!("virtio-9p: cannot start a request thread: {e}");
                    if g.live == 0 {
                        // Nobody to hand it to: serve what is queued here.
                        while let Some(job) = g.jobs.pop_front() {
                            drop(g);
                            self.run(job, bufs);
                            g = self.lock();
                        }
                        return;
                    }
                }
            }
        }
        drop(g);
        self.work.notify_one();
    }

    /// A pool thread: serves queued requests until the device is reset or broken, or it has
    /// been idle for [`IDLE_EXIT`].
    fn serve_thread(&self) {
        let mut bufs = Buffers::default();
        loop {
            let chain = {
                let mut g = self.lock();
                loop {
                    if g.closed || g.broken {
                        g.live -= 1;
                        return;
                    }
                    if let Some(job) = g.jobs.pop_front() {
                        break job;
                    }
                    g.idle += 1;
                    let (woken, timeout) = self
                        .work
                        .wait_timeout(g, IDLE_EXIT)
                        .unwrap_or_else(|p| p.into_inner());
                    g = woken;
                    g.idle -= 1;
                    if timeout.timed_out() && g.jobs.is_empty() {
                        g.live -= 1;
                        return;
                    }
                }
            };
            self.run(chain, &mut bufs);
        }
    }

    /// Stops the pool: queued requests are dropped, the ones being served finish and are
    /// returned, every thread is joined.
    pub(crate) fn shutdown(&self) {
        let threads = {
            let mut g = self.lock();
            g.closed = true;
            g.jobs.clear();
            std::mem::take(&mut g.threads)
        };
        self.work.notify_all();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The queue worker's handler: pops chains and hands them to the pool.
pub(crate) struct Dispatcher {
    pool: Arc<Pool>,
    bufs: Buffers,
}

impl Dispatcher {
    pub(crate) fn new(pool: Arc<Pool>) -> Self {
        Self {
            pool,
            bufs: Buffers::default(),
        }
    }
}

impl Pool {
    /// The next chain to serve, `None` when the ring is empty (notifications re-enabled) or
    /// the dispatcher must wait (reset, broken ring, or as many chains out as the ring holds).
    fn next(&self) -> Option<DescriptorChain<&Mem>> {
        let pool = self;
        let mut g = pool.lock();
        loop {
            if g.closed || g.broken {
                return None;
            }
            // A driver never has more chains out than its ring holds; one that does waits
            // until some come back.
            if g.outstanding >= usize::from(g.queue.size()) {
                g.stalled = true;
                return None;
            }
            let popped = g
                .queue
                .disable_notification(&pool.mem)
                .and_then(|()| queue::pop(&mut g.queue, &pool.mem));
            match popped {
                Ok(Some(chain)) => {
                    g.outstanding += 1;
                    return Some(chain);
                }
                // Empty: re-enable notifications, and look again in case a chain slipped in.
                Ok(None) => match g.queue.enable_notification(&pool.mem) {
                    Ok(true) => continue,
                    Ok(false) => return None,
                    Err(e) => pool.broke(&mut g, &e),
                },
                Err(e) => pool.broke(&mut g, &e),
            }
        }
    }
}

impl crate::worker::QueueHandler for Dispatcher {
    fn handle_queue(&mut self, _index: usize) {
        let pool = self.pool.clone();
        while let Some(chain) = pool.next() {
            match capture(chain, &pool.mem) {
                Ok(chain) => match chain.flush {
                    Some(oldtag) => pool.flush(chain, oldtag, &mut self.bufs),
                    None => pool.submit(chain, &mut self.bufs),
                },
                Err(head) => {
                    tracing::debug!(head, "malformed 9p request chain");
                    let mut g = pool.lock();
                    pool.complete(&mut g, &[(head, 0)]);
                }
            }
        }
    }
}
