//! virtio-net against mock queues: a datagram socketpair stands in for the tap (one
//! datagram a frame, header first), and one test uses a real tap.

use super::*;
use crate::interrupt::RecordingInterrupt;
use crate::testing::{guest_memory, MockQueue};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};

const MEM: usize = 8 << 20;
const RX_BASE: u64 = 0;
const TX_BASE: u64 = 0x40_0000;

/// A tap stand-in and the far end of it.
fn socket_tap() -> (Tap, OwnedFd) {
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
    assert_eq!(r, 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: socketpair returned two new descriptors that nothing else owns.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    (Tap::from_socket(a, "sock"), b)
}

fn send(peer: &OwnedFd, data: &[u8]) {
    // SAFETY: `data` is valid for its length during the call.
    let n = unsafe { libc::write(peer.as_raw_fd(), data.as_ptr().cast(), data.len()) };
    assert_eq!(
        n,
        data.len() as isize,
        "{}",
        std::io::Error::last_os_error()
    );
}

fn recv(peer: &OwnedFd) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 70000];
    // SAFETY: `buf` is valid and writable for its length during the call.
    let n = unsafe { libc::read(peer.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

/// A frame with a zero header: `len` bytes after the header, a pattern from `seed`.
fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f = vec![0u8; HDR_LEN];
    f.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    f
}

fn stats() -> NetStats {
    NetStats::default()
}

fn rx_mock() -> (MockQueue, Queue) {
    let mq = MockQueue::new(guest_memory(MEM), RX_BASE, QUEUE_SIZE);
    let q = mq.queue();
    (mq, q)
}

#[test]
fn rx_one_frame_per_buffer_with_num_buffers_1() {
    let (mut mq, mut q) = rx_mock();
    let (tap, peer) = socket_tap();
    let irq = RecordingInterrupt::default();
    let mut st = rx::RxState::new();
    let (h1, o1) = mq.add_request(&[], &[2048]);
    let (h2, o2) = mq.add_request(&[], &[2048]);
    let (f1, f2) = (frame(100, 1), frame(1500, 2));
    send(&peer, &f1);
    send(&peer, &f2);
    let s = stats();
    let e = rx::receive(&mut q, &mq.mem, &irq, &tap, &mut st, false, &s).unwrap();
    assert!(e.is_none());
    assert_eq!(mq.used(), vec![(u32::from(h1), 112), (u32::from(h2), 1512)]);
    let got = mq.read(o1[0], 112);
    assert_eq!(&got[10..12], &[1, 0], "num_buffers");
    assert_eq!(&got[12..], &f1[12..]);
    assert_eq!(&mq.read(o2[0], 1512)[12..], &f2[12..]);
    assert_eq!(
        *irq.queues.lock().unwrap(),
        vec![0],
        "one interrupt for the batch"
    );
    assert_eq!(NetStats::get(&s.rx_packets), 2);
    assert_eq!(NetStats::get(&s.rx_bytes), 1600);
}

#[test]
fn rx_mergeable_buffers_take_a_large_frame() {
    let (mut mq, mut q) = rx_mock();
    let (tap, peer) = socket_tap();
    let irq = RecordingInterrupt::default();
    let mut st = rx::RxState::new();
    let mut outs = Vec::new();
    for _ in 0..20 {
        let (h, o) = mq.add_request(&[], &[4096]);
        outs.push((h, o[0]));
    }
    let big = frame(MAX_FRAME, 7);
    send(&peer, &big);
    let s = stats();
    rx::receive(&mut q, &mq.mem, &irq, &tap, &mut st, true, &s).unwrap();
    let used = mq.used();
    let total = HDR_LEN + MAX_FRAME;
    let n = total.div_ceil(4096);
    assert_eq!(used.len(), n);
    let mut got = Vec::new();
    for (i, &(id, len)) in used.iter().enumerate() {
        assert_eq!(id, u32::from(outs[i].0));
        got.extend(mq.read(outs[i].1, len as usize));
    }
    assert_eq!(got.len(), total);
    assert_eq!(
        u16::from_le_bytes([got[10], got[11]]) as usize,
        n,
        "num_buffers"
    );
    assert_eq!(&got[12..], &big[12..]);
    assert_eq!(NetStats::get(&s.rx_packets), 1);
}

#[test]
fn rx_waits_for_buffers_then_delivers() {
    let (mut mq, mut q) = rx_mock();
    q.set_event_idx(true);
    let (tap, peer) = socket_tap();
    let irq = RecordingInterrupt::default();
    let mut st = rx::RxState::new();
    let s = stats();
    // Mergeable: 2 buffers of 1000 bytes are not enough for 2500; they stay in the ring.
    mq.add_request(&[], &[1000]);
    mq.add_request(&[], &[1000]);
    let f = frame(2500, 3);
    send(&peer, &f);
    rx::receive(&mut q, &mq.mem, &irq, &tap, &mut st, true, &s).unwrap();
    assert!(
        mq.used().is_empty(),
        "nothing used while the frame does not fit"
    );
    assert!(st.has_pending());
    assert_eq!(q.next_avail(), 0, "the chains were given back");
    let (_, _, used_ring) = mq.ring_addresses();
    let avail_event = mq.read(used_ring + 4 + 8 * u64::from(QUEUE_SIZE), 2);
    assert_eq!(
        avail_event,
        [2, 0],
        "a notification is asked for the next new buffer"
    );
    let (h3, o3) = mq.add_request(&[], &[1000]);
    rx::receive(&mut q, &mq.mem, &irq, &tap, &mut st, true, &s).unwrap();
    let used = mq.used();
    assert_eq!(used.len(), 3);
    assert_eq!(used[2], (u32::from(h3), 512));
    assert_eq!(mq.read(o3[0], 512), f[2000..]);
    assert!(!st.has_pending());
}

#[test]
fn rx_without_mergeable_drops_a_frame_too_large_for_one_buffer() {
    let (mut mq, mut q) = rx_mock();
    let (tap, peer) = socket_tap();
    let irq = RecordingInterrupt::default();
    let mut st = rx::RxState::new();
    let s = stats();
    let (h, _) = mq.add_request(&[], &[1526]);
    send(&peer, &frame(4000, 1));
    send(&peer, &frame(60, 2));
    rx::receive(&mut q, &mq.mem, &irq, &tap, &mut st, false, &s).unwrap();
    assert_eq!(
        mq.used(),
        vec![(u32::from(h), 72)],
        "the small frame got the buffer"
    );
    assert_eq!(NetStats::get(&s.rx_dropped), 1);
}

#[test]
fn rx_hostile_chains_are_completed_unused_and_the_frame_goes_on() {
    let (mut mq, mut q) = rx_mock();
    let (tap, peer) = socket_tap();
    let irq = RecordingInterrupt::default();
    let mut st = rx::RxState::new();
    let s = stats();
    let a = mq.alloc(2048);
    let readable = mq.add_chain(&[(a, 2048, false)]);
    let t = mq.alloc(8);
    let tiny = mq.add_chain(&[(t, 8, true)]);
    let outside = mq.add_chain(&[(MEM as u64 - 100, 2048, true)]);
    // A chain that loops onto itself: descriptor 10 -> 10.
    let b = mq.alloc(64);
    mq.set_desc(
        10,
        b,
        64,
        (VRING_DESC_F_WRITE | VRING_DESC_F_NEXT) as u16,
        10,
    );
    mq.publish(10);
    let (good, o) = {
        // Descriptors after the loop's index so add_request does not overwrite it.
        let c = mq.alloc(2048);
        mq.set_desc(11, c, 2048, VRING_DESC_F_WRITE as u16, 0);
        mq.publish(11);
        (11u16, c)
    };
    let f = frame(300, 9);
    send(&peer, &f);
    rx::receive(&mut q, &mq.mem, &irq, &tap, &mut st, true, &s).unwrap();
    assert_eq!(
        mq.used(),
        vec![
            (u32::from(readable), 0),
            (u32::from(tiny), 0),
            (u32::from(outside), 0),
            (10, 0),
            (u32::from(good), 312)
        ]
    );
    assert_eq!(mq.read(o + 12, 300), f[12..]);
    assert_eq!(NetStats::get(&s.bad_chains), 4);
    assert_eq!(irq.resets.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[test]
fn rx_oversized_and_runt_frames_from_the_tap_are_dropped() {
    let (mut mq, mut q) = rx_mock();
    let (tap, peer) = socket_tap();
    let irq = RecordingInterrupt::default();
    let mut st = rx::RxState::new();
    let s = stats();
    for _ in 0..20 {
        mq.add_request(&[], &[4096]);
    }
    send(&peer, &frame(MAX_FRAME + 1, 1));
    send(&peer, &[0u8; 5]);
    send(&peer, &frame(MAX_FRAME, 2));
    rx::receive(&mut q, &mq.mem, &irq, &tap, &mut st, true, &s).unwrap();
    assert_eq!(NetStats::get(&s.rx_dropped), 2);
    assert_eq!(
        NetStats::get(&s.rx_packets),
        1,
        "the largest legal frame goes"
    );
    assert_eq!(
        mq.used().iter().map(|&(_, l)| l as usize).sum::<usize>(),
        HDR_LEN + MAX_FRAME
    );
}

#[test]
fn rx_a_ring_too_small_for_a_frame_drops_it_instead_of_waiting_forever() {
    let mq = MockQueue::new(guest_memory(MEM), RX_BASE, 4);
    let mut mq = mq;
    let mut q = mq.queue();
    let (tap, peer) = socket_tap();
    let irq = RecordingInterrupt::default();
    let mut st = rx::RxState::new();
    let s = stats();
    for _ in 0..4 {
        mq.add_request(&[], &[100]);
    }
    send(&peer, &frame(1000, 1));
    send(&peer, &frame(50, 2));
    rx::receive(&mut q, &mq.mem, &irq, &tap, &mut st, true, &s).unwrap();
    assert_eq!(NetStats::get(&s.rx_dropped), 1);
    assert_eq!(mq.used().len(), 1, "the small frame fits in one buffer");
    assert!(!st.has_pending());
}

fn tx_chain(mq: &mut MockQueue, pkt: &[u8]) -> u16 {
    // Header and frame in two buffers, as Linux sends them.
    let (h, _) = mq.add_request(&[&pkt[..HDR_LEN], &pkt[HDR_LEN..]], &[]);
    h
}

fn run_tx(mq: &MockQueue, q: &mut Queue, tap: &Tap, acked: u64, s: &NetStats) {
    let irq = RecordingInterrupt::default();
    let mut buf = Vec::new();
    crate::queue::drain(q, 1, &mq.mem, &irq, |chain| {
        tx::send_chain(chain, &mq.mem, &mut buf, tap, acked, s, false).unwrap();
        0
    })
    .unwrap();
}

#[test]
fn tx_sends_each_frame_with_its_header() {
    let mut mq = MockQueue::new(guest_memory(MEM), TX_BASE, QUEUE_SIZE);
    let mut q = mq.queue();
    let (tap, peer) = socket_tap();
    let s = stats();
    let f1 = frame(60, 1);
    let mut f2 = frame(9000, 2);
    // A TSOv4 segment with a partial checksum at 34 + 16.
    f2[0] = 1;
    f2[1] = 1;
    f2[6..8].copy_from_slice(&34u16.to_le_bytes());
    f2[8..10].copy_from_slice(&16u16.to_le_bytes());
    let h1 = tx_chain(&mut mq, &f1);
    let h2 = tx_chain(&mut mq, &f2);
    let acked = net_features::CSUM | net_features::HOST_TSO4;
    run_tx(&mq, &mut q, &tap, acked, &s);
    assert_eq!(mq.used(), vec![(u32::from(h1), 0), (u32::from(h2), 0)]);
    assert_eq!(recv(&peer).unwrap(), f1);
    assert_eq!(recv(&peer).unwrap(), f2);
    assert_eq!(NetStats::get(&s.tx_packets), 2);
}

#[test]
fn tx_offloads_not_negotiated_are_refused() {
    let mut mq = MockQueue::new(guest_memory(MEM), TX_BASE, QUEUE_SIZE);
    let mut q = mq.queue();
    let (tap, peer) = socket_tap();
    let s = stats();
    let mut csum = frame(100, 1);
    csum[0] = 1;
    csum[6] = 34;
    csum[8] = 16;
    let mut tso = frame(100, 2);
    tso[1] = 1;
    let mut udp = frame(100, 3);
    udp[1] = 3;
    let mut csum_outside = frame(100, 4);
    csum_outside[0] = 1;
    csum_outside[6] = 99;
    for p in [&csum, &tso, &udp] {
        tx_chain(&mut mq, p);
    }
    run_tx(&mq, &mut q, &tap, 0, &s);
    tx_chain(&mut mq, &csum_outside);
    tx_chain(&mut mq, &udp);
    run_tx(&mq, &mut q, &tap, net_features::OFFERED, &s);
    assert_eq!(mq.used().len(), 5, "every chain completed");
    assert!(recv(&peer).is_none(), "nothing sent");
    assert_eq!(NetStats::get(&s.tx_dropped), 5);
    // With the features, the same checksum frame goes.
    tx_chain(&mut mq, &csum);
    run_tx(&mq, &mut q, &tap, net_features::CSUM, &s);
    assert_eq!(recv(&peer).unwrap(), csum);
}

#[test]
fn tx_hostile_chains_are_dropped_and_completed() {
    let mut mq = MockQueue::new(guest_memory(MEM), TX_BASE, QUEUE_SIZE);
    let mut q = mq.queue();
    let (tap, peer) = socket_tap();
    let s = stats();
    let hdr = [0u8; HDR_LEN];
    // Write-only buffer in a transmit chain.
    mq.add_request(&[&hdr], &[64]);
    // Too short: a header alone.
    mq.add_request(&[&hdr], &[]);
    // Oversized: header + 65551 bytes.
    let big = vec![0u8; MAX_FRAME + 1];
    mq.add_request(&[&hdr, &big], &[]);
    // Outside guest memory.
    mq.add_chain(&[(MEM as u64 - 10, 100, false)]);
    // A loop: 200 -> 201 -> 200.
    let a = mq.alloc(100);
    mq.set_desc(200, a, 100, VRING_DESC_F_NEXT as u16, 201);
    mq.set_desc(201, a, 100, VRING_DESC_F_NEXT as u16, 200);
    mq.publish(200);
    // A next index outside the table.
    mq.set_desc(202, a, 100, VRING_DESC_F_NEXT as u16, 4000);
    mq.publish(202);
    run_tx(&mq, &mut q, &tap, net_features::OFFERED, &s);
    assert_eq!(mq.used().len(), 6);
    assert!(mq.used().iter().all(|&(_, len)| len == 0));
    assert!(recv(&peer).is_none(), "nothing sent");
    assert_eq!(NetStats::get(&s.tx_dropped), 6);
    assert_eq!(NetStats::get(&s.bad_chains), 6);
    // The largest legal frame goes.
    let max = frame(MAX_FRAME, 5);
    tx_chain(&mut mq, &max);
    run_tx(&mq, &mut q, &tap, net_features::OFFERED, &s);
    assert_eq!(recv(&peer).unwrap().len(), HDR_LEN + MAX_FRAME);
}

/// A small xorshift generator (no dependency; the seed is printed on failure).
struct Rand(u64);
impl Rand {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn randomized_descriptor_tables_never_panic_and_complete_every_chain() {
    let seed = 0x5eed_1234_u64 ^ u64::from(std::process::id());
    let mut r = Rand(seed | 1);
    for round in 0..200 {
        let size = 16u16;
        let mut mq = MockQueue::new(guest_memory(1 << 20), 0, size);
        let rx_side = round % 2 == 0;
        let mut q = mq.queue();
        let data = mq.alloc(64 << 10);
        let heads = 1 + r.below(8) as u16;
        for i in 0..size {
            let addr = match r.below(10) {
                0 => r.next(),
                1 => (1 << 20) - r.below(4096),
                _ => data + r.below(60 << 10),
            };
            let len = match r.below(6) {
                0 => 0,
                1 => r.next() as u32,
                _ => r.below(9000) as u32,
            };
            let mut flags = 0u16;
            if r.below(2) == 0 {
                flags |= VRING_DESC_F_WRITE as u16;
            }
            if r.below(3) == 0 {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            mq.set_desc(i, addr, len, flags, r.below(u64::from(size) + 2) as u16);
        }
        for _ in 0..heads {
            mq.publish(r.below(u64::from(size)) as u16);
        }
        let s = stats();
        let irq = RecordingInterrupt::default();
        let (tap, peer) = socket_tap();
        if rx_side {
            let mut st = rx::RxState::new();
            for _ in 0..4 {
                send(&peer, &frame(r.below(20000) as usize, round as u8));
            }
            rx::receive(&mut q, &mq.mem, &irq, &tap, &mut st, r.below(2) == 0, &s)
                .unwrap_or_else(|e| panic!("seed {seed:#x} round {round}: {e}"));
            assert!(mq.used().len() <= usize::from(heads), "seed {seed:#x}");
        } else {
            run_tx(&mq, &mut q, &tap, net_features::OFFERED, &s);
            assert_eq!(mq.used().len(), usize::from(heads), "seed {seed:#x}");
        }
    }
}

/// The device end to end on its worker thread: frames both ways over the socketpair,
/// quiesce/resume and the saved state.
#[test]
fn device_serves_both_queues_on_its_worker() {
    let mem = guest_memory(MEM);
    let mut rxq = MockQueue::new(mem.clone(), RX_BASE, QUEUE_SIZE);
    let mut txq = MockQueue::new(mem.clone(), TX_BASE, QUEUE_SIZE);
    let (tap, peer) = socket_tap();
    let mac = [6, 0, 0xac, 0x10, 0, 2];
    let mut net = Net::new(tap, mac);
    let mut cfg = [0u8; 10];
    net.read_config(0, &mut cfg);
    assert_eq!(&cfg[..6], &mac);
    assert_eq!(&cfg[6..8], &[1, 0], "link up");
    net.ack_features(features::COMMON | net_features::OFFERED);
    let irq = Arc::new(RecordingInterrupt::default());
    let (_, outs) = rxq.add_request(&[], &[4096]);
    net.activate(
        mem.clone(),
        irq.clone(),
        vec![rxq.device_queue(), txq.device_queue()],
    )
    .unwrap();
    let f = frame(200, 4);
    send(&peer, &f);
    let t = Instant::now();
    while rxq.used().is_empty() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(rxq.used().len(), 1, "the tap's frame reached the guest");
    assert_eq!(mem_read(&rxq, outs[0] + 12, 200), f[12..]);
    // Transmit: the queue's notification comes from the worker's start-up call here.
    let positions = net.quiesce().unwrap();
    assert_eq!(positions.len(), 2);
    let g = frame(80, 5);
    tx_chain(&mut txq, &g);
    net.resume().unwrap();
    let t = Instant::now();
    let mut got = None;
    while got.is_none() && t.elapsed() < Duration::from_secs(5) {
        got = recv(&peer);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(got.unwrap(), g);
    let state = net.save_state().unwrap();
    net.reset();
    assert!(!net.is_active());
    let (tap2, _peer2) = socket_tap();
    let mut again = Net::new(tap2, mac);
    again.restore_state(&state).unwrap();
    assert_eq!(again.acked, net.acked);
    let (tap3, _peer3) = socket_tap();
    let mut other = Net::new(tap3, [6, 0, 0, 0, 0, 9]);
    let e = other.restore_state(&state).unwrap_err().to_string();
    assert!(e.contains("MAC"), "{e}");
}

fn mem_read(mq: &MockQueue, addr: u64, len: usize) -> Vec<u8> {
    mq.read(addr, len)
}

#[test]
fn offloads_follow_the_guests_receive_features() {
    use net_features::*;
    assert_eq!(
        tap_offloads(GUEST_TSO4 | MRG_RXBUF),
        0,
        "no TSO without GUEST_CSUM"
    );
    assert_eq!(tap_offloads(GUEST_CSUM), libc::TUN_F_CSUM);
    assert_eq!(
        tap_offloads(GUEST_CSUM | GUEST_TSO4 | GUEST_TSO6 | GUEST_ECN),
        libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN
    );
    assert_eq!(tap_offloads(GUEST_CSUM | GUEST_ECN), libc::TUN_F_CSUM);
}

#[test]
fn macs_are_parsed_and_checked() {
    assert_eq!(
        parse_mac("06:00:ac:10:00:02").unwrap(),
        [6, 0, 0xac, 0x10, 0, 2]
    );
    for bad in [
        "06:00:ac:10:00",
        "06:00:ac:10:00:02:03",
        "0g:00:00:00:00:01",
        "6:0:0:0:0:1",
    ] {
        assert!(
            parse_mac(bad).unwrap_err().contains("six hex bytes"),
            "{bad}"
        );
    }
    assert!(parse_mac("01:00:5e:00:00:01")
        .unwrap_err()
        .contains("multicast"));
    assert!(parse_mac("00:00:00:00:00:00").is_err());
    let m = random_mac();
    assert_eq!(m[0] & 3, 2, "locally administered unicast");
    assert_eq!(format_mac(&[6, 0, 0xac, 0x10, 0, 2]), "06:00:ac:10:00:02");
}

mod real_tap;
