use super::serve::POOL_THREADS;
use super::*;
use crate::interrupt::RecordingInterrupt;
use crate::testing::{guest_memory, MockQueue};
use densevm_9p::message::{kind, Request, NOTAG};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

const MEM: usize = 8 << 20;
const ROOM: u32 = 8192;
const CONTENT: &[u8] = b"the quick brown fox jumps over the lazy dog\n";

/// Holds requests of chosen tags on their pool thread until released, and records which
/// requests started.
#[derive(Default)]
struct Gate {
    /// Held tags, tags started, and whether the gate is open for good.
    state: Mutex<(HashSet<u16>, Vec<u16>, bool)>,
    cv: Condvar,
}

/// Opens the gate for good when dropped, so a failing test does not leave its device's
/// reset waiting for a held request forever.
struct GateGuard(Arc<Gate>);

impl std::ops::Deref for GateGuard {
    type Target = Gate;
    fn deref(&self) -> &Gate {
        &self.0
    }
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        s.2 = true;
        self.0.cv.notify_all();
    }
}

impl Gate {
    fn hold(&self, tag: u16) {
        self.state.lock().unwrap().0.insert(tag);
    }
    fn release(&self, tag: u16) {
        self.state.lock().unwrap().0.remove(&tag);
        self.cv.notify_all();
    }
    fn pass(&self, tag: u16) {
        let mut s = self.state.lock().unwrap();
        s.1.push(tag);
        self.cv.notify_all();
        while s.0.contains(&tag) && !s.2 {
            s = self.cv.wait(s).unwrap();
        }
    }
    fn wait_started(&self, tag: u16) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = self.state.lock().unwrap();
        while !s.1.contains(&tag) {
            assert!(Instant::now() < deadline, "request {tag} never started");
            s = self
                .cv
                .wait_timeout(s, Duration::from_millis(10))
                .unwrap()
                .0;
        }
    }
}

/// A parsed R-message.
#[derive(Debug)]
struct Reply {
    kind: u8,
    tag: u16,
    body: Vec<u8>,
}

impl Reply {
    fn errno(&self) -> Option<u32> {
        (self.kind == kind::RLERROR).then(|| u32::from_le_bytes(self.body[..4].try_into().unwrap()))
    }
    fn ok(self, kind: u8) -> Self {
        assert_eq!(self.kind, kind, "unexpected reply {self:?}");
        self
    }
}

fn frame(tag: u16, req: &Request<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    req.encode(tag, &mut v);
    v
}

fn share(readonly: bool) -> (tempfile::TempDir, ShareConfig) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), CONTENT).unwrap();
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("big"), big).unwrap();
    let mut cfg = ShareConfig::new(dir.path(), "share");
    cfg.server.readonly = readonly;
    (dir, cfg)
}

/// A mock driver in front of an activated device.
struct Guest {
    mq: MockQueue,
    kick: EventFd,
    irq: Arc<RecordingInterrupt>,
    /// Writable buffer of each chain, by head.
    outs: Vec<(u16, u64)>,
}

impl Guest {
    fn activate(dev: &mut P9) -> Guest {
        let mq = MockQueue::new(guest_memory(MEM), 0, QUEUE_SIZE);
        let dq = mq.device_queue();
        let kick = dq.event.try_clone().unwrap();
        let irq = Arc::new(RecordingInterrupt::default());
        dev.ack_features(dev.features());
        dev.activate(mq.mem.clone(), irq.clone(), vec![dq]).unwrap();
        Guest {
            mq,
            kick,
            irq,
            outs: Vec::new(),
        }
    }

    /// Publishes one request (no notification); returns its head.
    fn post(&mut self, tag: u16, req: &Request<'_>, room: u32) -> u16 {
        let f = frame(tag, req);
        let rooms: &[u32] = if room == 0 { &[] } else { &[room] };
        let (head, outs) = self.mq.add_request(&[&f], rooms);
        self.outs.push((head, outs.first().copied().unwrap_or(0)));
        head
    }

    fn notify(&self) {
        self.kick.write(1).unwrap();
    }

    /// Waits until `n` chains came back.
    fn wait_used(&self, n: usize) -> Vec<(u32, u32)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let used = self.mq.used();
            if used.len() >= n {
                return used;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {n} chains came back: {used:?}",
                used.len()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until every chain of `heads` came back; returns the used ring.
    fn wait_heads(&self, heads: &[u16]) -> Vec<(u32, u32)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let used = self.mq.used();
            if heads
                .iter()
                .all(|&h| used.iter().any(|&(x, _)| x == u32::from(h)))
            {
                return used;
            }
            assert!(
                Instant::now() < deadline,
                "chains {heads:?} did not all come back: {used:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The used length of the chain at `head` (None while it is out).
    fn used_len(&self, head: u16) -> Option<u32> {
        self.mq
            .used()
            .into_iter()
            .find(|&(h, _)| h == u32::from(head))
            .map(|(_, l)| l)
    }

    /// The reply the chain at `head` got.
    fn reply(&self, head: u16) -> Reply {
        let len = self.used_len(head).expect("chain not returned") as usize;
        assert!(len >= 7, "chain {head} returned without a reply");
        let addr = self.outs.iter().find(|&&(h, _)| h == head).unwrap().1;
        parse(&self.mq.read(addr, len))
    }

    /// Posts, notifies, waits for and parses one request.
    fn call(&mut self, tag: u16, req: &Request<'_>) -> Reply {
        let head = self.post(tag, req, ROOM);
        self.notify();
        self.wait_heads(&[head]);
        let r = self.reply(head);
        assert_eq!(r.tag, tag);
        r
    }

    fn version_attach(&mut self) {
        let r = self
            .call(
                NOTAG,
                &Request::Version {
                    msize: 65536,
                    version: b"9P2000.L",
                },
            )
            .ok(kind::TVERSION + 1);
        assert_eq!(u32::from_le_bytes(r.body[..4].try_into().unwrap()), 65536);
        self.call(1, &attach(0)).ok(kind::TATTACH + 1);
    }

    /// Walks fid 0 to `name` as `fid` and opens it read-only.
    fn open(&mut self, fid: u32, name: &str) {
        self.call(2, &walk(0, fid, name)).ok(kind::TWALK + 1);
        self.call(3, &Request::Lopen { fid, flags: 0 })
            .ok(kind::TLOPEN + 1);
    }
}

fn parse(bytes: &[u8]) -> Reply {
    let size = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    assert_eq!(size, bytes.len(), "R-message size and used length disagree");
    Reply {
        kind: bytes[4],
        tag: u16::from_le_bytes([bytes[5], bytes[6]]),
        body: bytes[7..].to_vec(),
    }
}

fn attach(fid: u32) -> Request<'static> {
    Request::Attach {
        fid,
        afid: u32::MAX,
        uname: b"root",
        aname: b"",
        n_uname: 0,
    }
}

fn walk(fid: u32, newfid: u32, name: &str) -> Request<'_> {
    Request::Walk {
        fid,
        newfid,
        names: vec![name.as_bytes()],
    }
}

fn getattr(fid: u32) -> Request<'static> {
    Request::Getattr { fid, mask: 0x7ff }
}

/// size field of an Rgetattr body: valid[8] qid[13] mode[4] uid[4] gid[4] nlink[8] rdev[8].
fn getattr_size(r: &Reply) -> u64 {
    u64::from_le_bytes(r.body[49..57].try_into().unwrap())
}

fn read_data(r: &Reply) -> &[u8] {
    let n = u32::from_le_bytes(r.body[..4].try_into().unwrap()) as usize;
    &r.body[4..4 + n]
}

fn device(readonly: bool) -> (tempfile::TempDir, P9) {
    let (dir, cfg) = share(readonly);
    (dir, P9::new(cfg).unwrap())
}

fn gated(dev: &mut P9) -> GateGuard {
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    dev.set_hook(Arc::new(move |tag| g.pass(tag)));
    GateGuard(gate)
}

#[test]
fn identity_features_and_config_space() {
    let (_dir, dev) = device(false);
    assert_eq!(dev.device_type(), 9);
    assert_eq!(dev.queue_max_sizes(), &[QUEUE_SIZE]);
    assert_eq!(dev.features(), features::COMMON | 1);
    let mut cfg = [0xffu8; 12];
    dev.read_config(0, &mut cfg);
    assert_eq!(&cfg, b"\x05\x00share\0\0\0\0\0");
    let mut tail = [0xffu8; 4];
    dev.read_config(4, &mut tail);
    assert_eq!(&tail, b"are\0");
    dev.read_config(u64::MAX, &mut tail);
    assert_eq!(tail, [0; 4]);
    assert_eq!(dev.tag(), "share");
}

#[test]
fn new_refuses_bad_shares() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let err = |root: &std::path::Path, tag: &str| P9::new(ShareConfig::new(root, tag)).err();
    assert!(matches!(
        err(&dir.path().join("nope"), "t"),
        Some(P9Error::Missing(_))
    ));
    assert!(matches!(err(&file, "t"), Some(P9Error::NotADirectory(_))));
    assert!(matches!(err(dir.path(), ""), Some(P9Error::EmptyTag)));
    assert!(matches!(err(dir.path(), "a\0b"), Some(P9Error::TagNul(_))));
    let long = "x".repeat(MAX_TAG_LEN + 1);
    assert!(matches!(
        err(dir.path(), &long),
        Some(P9Error::TagTooLong { .. })
    ));
    assert!(err(dir.path(), &"x".repeat(MAX_TAG_LEN)).is_none());
    let mut cfg = ShareConfig::new(dir.path(), "t");
    cfg.server.max_msize = 100;
    assert!(matches!(P9::new(cfg).err(), Some(P9Error::Server(_))));
    // The messages name the problem.
    let msg = err(&dir.path().join("nope"), "t").unwrap().to_string();
    assert!(msg.contains("no such directory"), "{msg}");
}

#[test]
fn serves_a_session() {
    let (_dir, mut dev) = device(false);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.open(1, "hello.txt");
    let r = g
        .call(
            4,
            &Request::Read {
                fid: 1,
                offset: 4,
                count: 1000,
            },
        )
        .ok(kind::TREAD + 1);
    assert_eq!(read_data(&r), &CONTENT[4..]);
    let r = g.call(5, &getattr(1)).ok(kind::TGETATTR + 1);
    assert_eq!(getattr_size(&r), CONTENT.len() as u64);
    let r = g.call(6, &walk(0, 2, "missing"));
    assert_eq!(r.errno(), Some(libc::ENOENT as u32));
    assert!(!g.irq.queues.lock().unwrap().is_empty());
    assert_eq!(g.irq.resets.load(Ordering::SeqCst), 0);
    dev.reset();
}

#[test]
fn reply_spread_over_several_buffers() {
    // Linux's zero-copy reads: an 11-byte buffer for the Rread header, then the data pages.
    let (_dir, mut dev) = device(false);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.open(1, "big");
    let f = frame(
        7,
        &Request::Read {
            fid: 1,
            offset: 0,
            count: 10000,
        },
    );
    let (head, outs) = g.mq.add_request(&[&f], &[11, 4096, 4096, 4096]);
    g.notify();
    g.wait_heads(&[head]);
    assert_eq!(g.used_len(head), Some(11 + 10000));
    let hdr = g.mq.read(outs[0], 11);
    assert_eq!(hdr[4], kind::TREAD + 1);
    assert_eq!(u32::from_le_bytes(hdr[7..11].try_into().unwrap()), 10000);
    let mut data = Vec::new();
    for (&addr, len) in outs[1..].iter().zip([4096, 4096, 10000 - 8192]) {
        data.extend(g.mq.read(addr, len));
    }
    let want: Vec<u8> = (0..10000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(data, want);
}

#[test]
fn reply_larger_than_its_buffers() {
    let (_dir, mut dev) = device(false);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.open(1, "big");
    let read = Request::Read {
        fid: 1,
        offset: 0,
        count: 4096,
    };
    // Room for an Rlerror: EMSGSIZE.
    let small = g.post(8, &read, 64);
    // Not even that: no reply.
    let tiny = g.post(9, &read, 8);
    // No room at all: not served.
    let none = g.post(10, &read, 0);
    g.notify();
    g.wait_heads(&[small, tiny, none]);
    let r = g.reply(small);
    assert_eq!((r.tag, r.errno()), (8, Some(libc::EMSGSIZE as u32)));
    assert_eq!(g.used_len(tiny), Some(0));
    assert_eq!(g.used_len(none), Some(0));
    // The session goes on.
    g.call(11, &getattr(1)).ok(kind::TGETATTR + 1);
}

#[test]
fn request_over_msize_is_refused_unread() {
    let (_dir, mut dev) = device(false);
    let mut g = Guest::activate(&mut dev);
    g.call(
        NOTAG,
        &Request::Version {
            msize: 4096,
            version: b"9P2000.L",
        },
    )
    .ok(kind::TVERSION + 1);
    g.call(1, &attach(0)).ok(kind::TATTACH + 1);
    g.call(2, &walk(0, 1, "hello.txt")).ok(kind::TWALK + 1);
    g.call(3, &Request::Lopen { fid: 1, flags: 2 })
        .ok(kind::TLOPEN + 1);
    let data = vec![b'z'; 8192];
    let r = g.call(
        4,
        &Request::Write {
            fid: 1,
            offset: 0,
            data: &data,
        },
    );
    assert_eq!(r.errno(), Some(libc::EMSGSIZE as u32));
    let r = g.call(5, &getattr(1)).ok(kind::TGETATTR + 1);
    assert_eq!(getattr_size(&r), CONTENT.len() as u64, "the write happened");
}

#[test]
fn readonly_share_refuses_writes() {
    let (dir, mut dev) = device(true);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    let r = g.call(
        2,
        &Request::Mkdir {
            dfid: 0,
            name: b"d",
            mode: 0o755,
            gid: 0,
        },
    );
    assert_eq!(r.errno(), Some(libc::EROFS as u32));
    g.call(3, &walk(0, 1, "hello.txt")).ok(kind::TWALK + 1);
    let r = g.call(4, &Request::Lopen { fid: 1, flags: 1 });
    assert_eq!(r.errno(), Some(libc::EROFS as u32));
    assert!(!dir.path().join("d").exists());
    // Reading is fine.
    g.call(5, &Request::Lopen { fid: 1, flags: 0 })
        .ok(kind::TLOPEN + 1);
}

#[test]
fn several_requests_in_one_notification() {
    let (_dir, mut dev) = device(false);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    let heads: Vec<u16> = (0..20u16)
        .map(|t| g.post(100 + t, &getattr(0), ROOM))
        .collect();
    g.notify();
    g.wait_heads(&heads);
    for (t, &h) in heads.iter().enumerate() {
        let r = g.reply(h).ok(kind::TGETATTR + 1);
        assert_eq!(r.tag, 100 + t as u16);
    }
}

#[test]
fn slow_request_does_not_block_the_others() {
    let (_dir, mut dev) = device(false);
    let gate = gated(&mut dev);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.open(1, "hello.txt");
    gate.hold(100);
    let slow = g.post(
        100,
        &Request::Read {
            fid: 1,
            offset: 0,
            count: 100,
        },
        ROOM,
    );
    g.notify();
    gate.wait_started(100);
    // A stat storm behind it, over several notifications.
    let mut fast = Vec::new();
    for t in 0..50u16 {
        fast.push(g.post(200 + t, &getattr(1), ROOM));
        if t % 10 == 9 {
            g.notify();
        }
    }
    g.wait_heads(&fast);
    assert_eq!(g.used_len(slow), None, "the held request came back");
    for &h in &fast {
        g.reply(h).ok(kind::TGETATTR + 1);
    }
    gate.release(100);
    g.wait_heads(&[slow]);
    let r = g.reply(slow).ok(kind::TREAD + 1);
    assert_eq!(read_data(&r), CONTENT);
    // Its chain came back after all of the others.
    assert_eq!(g.mq.used().last().unwrap().0, u32::from(slow));
}

#[test]
fn flush_of_a_running_request_answers_after_it() {
    let (_dir, mut dev) = device(false);
    let gate = gated(&mut dev);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    gate.hold(100);
    let slow = g.post(100, &getattr(0), ROOM);
    g.notify();
    gate.wait_started(100);
    let flush = g.post(101, &Request::Flush { oldtag: 100 }, ROOM);
    let other = g.post(102, &getattr(0), ROOM);
    g.notify();
    // Other requests go on; the Rflush waits for the flushed request.
    g.wait_heads(&[other]);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(g.used_len(flush), None, "Rflush before the flushed request");
    assert!(g.used_len(other).is_some());
    gate.release(100);
    let used = g.wait_heads(&[slow, flush]);
    let pos = |h: u16| used.iter().position(|&(x, _)| x == u32::from(h)).unwrap();
    assert!(pos(slow) < pos(flush), "{used:?}");
    g.reply(slow).ok(kind::TGETATTR + 1);
    assert_eq!(g.reply(flush).ok(kind::TFLUSH + 1).tag, 101);
}

#[test]
fn flush_of_a_queued_request_cancels_it() {
    let (_dir, mut dev) = device(false);
    let gate = gated(&mut dev);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    // Every pool thread held.
    let held: Vec<u16> = (0..POOL_THREADS as u16).map(|i| 100 + i).collect();
    let mut held_heads = Vec::new();
    for &t in &held {
        gate.hold(t);
        held_heads.push(g.post(t, &getattr(0), ROOM));
    }
    g.notify();
    for &t in &held {
        gate.wait_started(t);
    }
    // Queued behind them, then flushed.
    let n = g.mq.used().len();
    let queued = g.post(200, &walk(0, 9, "hello.txt"), ROOM);
    let flush = g.post(201, &Request::Flush { oldtag: 200 }, ROOM);
    g.notify();
    let used = g.wait_used(n + 2);
    assert_eq!(
        &used[n..],
        &[(u32::from(queued), 0), (u32::from(flush), 7)],
        "cancelled request, then the Rflush"
    );
    g.reply(flush).ok(kind::TFLUSH + 1);
    for &t in &held {
        gate.release(t);
    }
    g.wait_heads(&held_heads);
    // The cancelled walk never ran: fid 9 does not exist.
    let r = g.call(300, &getattr(9));
    assert_eq!(r.errno(), Some(libc::EBADF as u32));
}

#[test]
fn flush_of_an_unknown_tag_answers_at_once() {
    let (_dir, mut dev) = device(false);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.call(5, &Request::Flush { oldtag: 77 })
        .ok(kind::TFLUSH + 1);
}

#[test]
fn reset_waits_for_requests_and_the_next_activation_starts_afresh() {
    let (_dir, mut dev) = device(false);
    let gate = gated(&mut dev);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    g.call(2, &walk(0, 1, "hello.txt")).ok(kind::TWALK + 1);
    g.call(3, &getattr(1)).ok(kind::TGETATTR + 1);
    gate.hold(100);
    let held = g.post(100, &getattr(1), ROOM);
    g.notify();
    gate.wait_started(100);
    let (tx, rx) = std::sync::mpsc::channel();
    let resetter = std::thread::spawn(move || {
        dev.reset();
        tx.send(()).unwrap();
        dev
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "reset returned with a request in flight"
    );
    gate.release(100);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("reset did not finish");
    let mut dev = resetter.join().unwrap();
    assert!(!dev.is_active());
    // The request in flight was finished and returned.
    g.reply(held).ok(kind::TGETATTR + 1);
    // A fresh session: fid 1 is gone (no Tversion needed to forget it).
    let mut g2 = Guest::activate(&mut dev);
    let r = g2.call(4, &getattr(1));
    assert_eq!(r.errno(), Some(libc::EBADF as u32));
    g2.call(5, &attach(1)).ok(kind::TATTACH + 1);
    dev.reset();
}

#[test]
fn hostile_chains_are_returned_empty_and_serving_goes_on() {
    let (_dir, mut dev) = device(false);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    let f = frame(50, &getattr(0));
    let req = g.mq.alloc(f.len() as u32);
    g.mq.write(req, &f);
    let out = g.mq.alloc(ROOM);
    let mut bad = vec![
        // Request outside guest memory.
        g.mq.add_chain(&[(MEM as u64 - 4, 64, false), (out, ROOM, true)]),
        // Reply buffer outside guest memory.
        g.mq.add_chain(&[(req, f.len() as u32, false), (MEM as u64, ROOM, true)]),
        // Readable after writable.
        g.mq.add_chain(&[(out, ROOM, true), (req, f.len() as u32, false)]),
        // No writable buffer.
        g.mq.add_chain(&[(req, f.len() as u32, false)]),
    ];
    // A loop of readable buffers: 240 -> 241 -> 240.
    g.mq.set_desc(240, req, f.len() as u32, 1, 241);
    g.mq.set_desc(241, req, f.len() as u32, 1, 240);
    g.mq.publish(240);
    bad.push(240);
    // A loop in the writable part: 245 -> 246 -> 247 -> 246.
    g.mq.set_desc(245, req, f.len() as u32, 1, 246);
    g.mq.set_desc(246, out, 16, 1 | 2, 247);
    g.mq.set_desc(247, out, 16, 1 | 2, 246);
    g.mq.publish(245);
    bad.push(245);
    // A `next` past the table.
    g.mq.set_desc(252, req, f.len() as u32, 1, 999);
    g.mq.publish(252);
    bad.push(252);
    // Empty readable part: the server answers Rlerror to NOTAG.
    let empty = g.mq.add_chain(&[(out, ROOM, true)]);
    g.outs.push((empty, out));
    g.notify();
    bad.push(empty);
    let used = g.wait_heads(&bad);
    bad.pop();
    for &h in &bad {
        assert_eq!(g.used_len(h), Some(0), "chain {h}: {used:?}");
    }
    let r = g.reply(empty);
    assert_eq!((r.kind, r.tag), (kind::RLERROR, NOTAG));
    assert_eq!(g.irq.resets.load(Ordering::SeqCst), 0);
    g.call(51, &getattr(0)).ok(kind::TGETATTR + 1);
}

#[test]
fn avail_index_far_ahead_needs_reset() {
    let (_dir, mut dev) = device(false);
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
    let before = g.mq.used().len();
    g.mq.set_avail_idx(g.mq.used().len() as u16 + QUEUE_SIZE + 10);
    g.notify();
    let deadline = Instant::now() + Duration::from_secs(10);
    while g.irq.resets.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no needs_reset");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Serving stopped.
    g.notify();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(g.mq.used().len(), before);
    assert_eq!(g.irq.resets.load(Ordering::SeqCst), 1);
    // A reset and a new activation serve again.
    dev.reset();
    let mut g = Guest::activate(&mut dev);
    g.version_attach();
}

#[test]
fn process_queue_serves_synchronously() {
    let (_dir, dev) = device(false);
    let session = dev.session();
    let mut mq = MockQueue::new(guest_memory(MEM), 0, QUEUE_SIZE);
    let mut q = mq.queue();
    let irq = RecordingInterrupt::default();
    let reqs = [
        frame(
            NOTAG,
            &Request::Version {
                msize: 65536,
                version: b"9P2000.L",
            },
        ),
        frame(1, &attach(0)),
        frame(2, &walk(0, 1, "hello.txt")),
        frame(3, &Request::Lopen { fid: 1, flags: 0 }),
        frame(
            4,
            &Request::Read {
                fid: 1,
                offset: 0,
                count: 4096,
            },
        ),
        frame(5, &Request::Flush { oldtag: 4 }),
    ];
    let posted: Vec<(u16, u64)> = reqs
        .iter()
        .map(|f| {
            let (h, outs) = mq.add_request(&[f], &[ROOM]);
            (h, outs[0])
        })
        .collect();
    assert_eq!(
        process_queue(&session, &mut q, &mq.mem, &irq).unwrap(),
        reqs.len()
    );
    let used = mq.used();
    assert_eq!(used.len(), reqs.len());
    let replies: Vec<Reply> = used
        .iter()
        .zip(&posted)
        .map(|(&(h, len), &(head, addr))| {
            assert_eq!(h, u32::from(head));
            parse(&mq.read(addr, len as usize))
        })
        .collect();
    let kinds: Vec<u8> = replies.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        [
            kind::TVERSION + 1,
            kind::TATTACH + 1,
            kind::TWALK + 1,
            kind::TLOPEN + 1,
            kind::TREAD + 1,
            kind::TFLUSH + 1
        ]
    );
    assert_eq!(read_data(&replies[4]), CONTENT);
    // A ring error is reported, not hidden.
    mq.set_avail_idx(reqs.len() as u16 + QUEUE_SIZE + 1);
    assert!(process_queue(&session, &mut q, &mq.mem, &irq).is_err());
}

#[path = "state_tests.rs"]
mod state_tests;
