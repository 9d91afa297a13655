//! The device side: hostile descriptor chains, a packet in one descriptor, transport
//! reset, the device's options and saved state, the worker thread and its fairness.

use super::*;

#[test]
fn hostile_transmit_chains_are_dropped() {
    let mut r = rig();
    let _host = r.guest_connect(1234, 64 << 10);
    let good = hdr(Op::Rw, 5000, 1234, 0);
    let mut dropped = 0;
    let mut check = |r: &mut Rig, what: &str| {
        r.process_tx();
        dropped += 1;
        assert_eq!(r.mux.counters.dropped_tx, dropped, "{what}");
    };
    // A header cut short.
    r.tx.add_request(&[&good.to_bytes()[..20]], &[]);
    check(&mut r, "short");
    // Longer than the maximum payload.
    let h = Header {
        len: MAX_PAYLOAD as u32 + 1,
        ..good
    };
    r.tx.add_request(&[&h.to_bytes(), &vec![0u8; MAX_PAYLOAD + 1]], &[]);
    check(&mut r, "oversized");
    // Longer than the chain.
    let h = Header { len: 100, ..good };
    r.tx.add_request(&[&h.to_bytes(), &[0u8; 10]], &[]);
    check(&mut r, "truncated");
    // Length near u32::MAX.
    let h = Header {
        len: u32::MAX,
        ..good
    };
    r.tx.add_request(&[&h.to_bytes()], &[]);
    check(&mut r, "huge");
    // Unknown operation.
    let mut raw = good.to_bytes();
    raw[30] = 42;
    r.tx.add_request(&[&raw], &[]);
    check(&mut r, "unknown op");
    // A device-writable buffer in a transmit chain.
    r.tx.add_request(&[&good.to_bytes()], &[64]);
    check(&mut r, "wrong direction");
    // A buffer outside guest memory.
    let addr = r.tx.alloc(HDR_LEN as u32);
    r.tx.write(addr, &good.to_bytes());
    r.tx.add_chain(&[(addr, HDR_LEN as u32, false), (MEM as u64 - 8, 64, false)]);
    check(&mut r, "outside memory");
    // Another guest's CID, and a packet for another host.
    let h = Header { src_cid: 9, ..good };
    r.tx.add_request(&[&h.to_bytes()], &[]);
    check(&mut r, "spoofed source");
    let h = Header { dst_cid: 7, ..good };
    r.tx.add_request(&[&h.to_bytes()], &[]);
    check(&mut r, "other destination");
    // Payload on a control packet.
    let h = Header {
        op: Op::CreditUpdate,
        len: 4,
        ..good
    };
    r.tx.add_request(&[&h.to_bytes(), b"abcd"], &[]);
    check(&mut r, "control payload");
    // None of these touched the connection or got an answer.
    r.post_rx(2);
    assert!(r.recv().is_empty());
    assert_eq!(r.mux.connections(), 1);
    assert_eq!(r.irq.resets.load(std::sync::atomic::Ordering::SeqCst), 0);
    // A seqpacket REQUEST is refused with a reset.
    let h = Header {
        type_: 2,
        ..hdr(Op::Request, 6000, 1234, 0)
    };
    r.send(h, &[]);
    assert_eq!(ops(&r.recv()), [Op::Rst]);
}

#[test]
fn hostile_receive_chains_are_returned_empty() {
    let mut r = rig();
    r.send(hdr(Op::Request, 5000, 1, 0), &[]); // owes a RST
                                               // A readable buffer in a receive chain, a chain shorter than a header, one outside
                                               // guest memory: each returned with length 0, then a good one gets the RST.
    let a = r.rx.add_request(&[&[0u8; 64]], &[HDR_LEN as u32]).0;
    let b = r.rx.add_request(&[], &[20]).0;
    let c = r.rx.add_chain(&[(MEM as u64 - 8, 64, true)]);
    let (d, outs) = r.rx.add_request(&[], &[HDR_LEN as u32 + 16]);
    r.mux.process_rx(&mut r.rxq, &r.rx.mem, &r.irq).unwrap();
    let used = r.rx.used();
    assert_eq!(
        used,
        vec![
            (u32::from(a), 0),
            (u32::from(b), 0),
            (u32::from(c), 0),
            (u32::from(d), HDR_LEN as u32)
        ]
    );
    let raw: [u8; HDR_LEN] = r.rx.read(outs[0], HDR_LEN).try_into().unwrap();
    assert_eq!(Header::parse(&raw).unwrap().op, Op::Rst);
    assert_eq!(r.mux.counters.dropped_rx, 3);
}

#[test]
fn a_packet_in_one_descriptor_works_too() {
    // Linux 6.2+ puts header and payload in one buffer.
    let mut r = rig();
    let mut host = r.guest_connect(1234, 64 << 10);
    let h = hdr(Op::Rw, 5000, 1234, 2);
    let mut one = h.to_bytes().to_vec();
    one.extend_from_slice(b"hi");
    r.tx.add_request(&[&one], &[]);
    r.process_tx();
    let mut b = [0u8; 2];
    host.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hi");
    host.write_all(b"yo").unwrap();
    let (head, outs) = r.rx.add_request(&[], &[HDR_LEN as u32 + 100]);
    r.mux.handle_host_events();
    r.mux.process_rx(&mut r.rxq, &r.rx.mem, &r.irq).unwrap();
    assert_eq!(
        r.rx.used().last(),
        Some(&(u32::from(head), HDR_LEN as u32 + 2))
    );
    assert_eq!(r.rx.read(outs[0] + HDR_LEN as u64, 2), b"yo");
}

#[test]
fn transport_reset_event() {
    let mut r = rig();
    let (head, outs) = r.ev.add_request(&[], &[4]);
    r.ev.write(outs[0], &[0xff; 4]);
    r.mux.process_event(&mut r.evq, &r.ev.mem, &r.irq).unwrap();
    assert!(r.ev.used().is_empty(), "nothing owed");
    r.mux.reset_event_pending = true;
    r.mux.process_event(&mut r.evq, &r.ev.mem, &r.irq).unwrap();
    assert_eq!(r.ev.used(), vec![(u32::from(head), 4)]);
    assert_eq!(r.ev.read(outs[0], 4), [0, 0, 0, 0]);
    assert!(!r.mux.reset_event_pending);
    assert!(r.irq.queues.lock().unwrap().contains(&2));
    let _ = &r.dir;
}

fn cfg(dir: &Path, cid: u64) -> VsockConfig {
    VsockConfig {
        guest_cid: cid,
        uds: dir.join("dev.sock"),
    }
}

#[test]
fn options_are_checked_when_the_device_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    for cid in [0, 1, 2, u32::MAX as u64, u64::MAX] {
        let e = Vsock::open(cfg(dir.path(), cid)).err().unwrap();
        assert!(matches!(e, VsockError::Cid(_)), "{e}");
    }
    std::fs::write(dir.path().join("dev.sock"), b"x").unwrap();
    let e = Vsock::open(cfg(dir.path(), 3)).err().unwrap().to_string();
    assert!(e.contains("remove it"), "{e}");
    std::fs::remove_file(dir.path().join("dev.sock")).unwrap();
    let dev = Vsock::open(cfg(dir.path(), 3)).unwrap();
    let e = Vsock::open(cfg(dir.path(), 4)).err().unwrap().to_string();
    assert!(e.contains("in use"), "{e}");
    let mut c = [0u8; 8];
    dev.read_config(0, &mut c);
    assert_eq!(u64::from_le_bytes(c), 3);
    drop(dev);
    assert!(!dir.path().join("dev.sock").exists(), "removed on drop");
    // A stale socket (its VM was killed) is replaced.
    drop(UnixListener::bind(dir.path().join("dev.sock")).unwrap());
    assert!(dir.path().join("dev.sock").exists());
    Vsock::open(cfg(dir.path(), 3)).unwrap();
    let e = Vsock::open(VsockConfig {
        guest_cid: 3,
        uds: "/nonexistent/dir/v.sock".into(),
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("writable directory"), "{e}");
}

#[test]
fn saved_state_round_trip_and_checks() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = Vsock::open(cfg(dir.path(), 7)).unwrap();
    dev.ack_features(features::COMMON);
    let saved = dev.save_state().unwrap();
    drop(dev);
    let mut dev = Vsock::open(cfg(dir.path(), 7)).unwrap();
    dev.restore_state(&saved).unwrap();
    assert_eq!(dev.acked, features::COMMON);
    assert!(dev.reset_event_on_activate);
    drop(dev);
    let mut other = Vsock::open(cfg(dir.path(), 8)).unwrap();
    let e = other.restore_state(&saved).unwrap_err().to_string();
    assert!(e.contains("same --vsock cid"), "{e}");
    let bad = serde_json::json!({"acked_features": 1u64 << 60, "guest_cid": 8});
    assert!(other.restore_state(&bad).is_err());
    assert!(other.restore_state(&serde_json::json!({"x": 1})).is_err());
}

#[test]
fn the_worker_serves_host_connections() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = Vsock::open(cfg(dir.path(), 3)).unwrap();
    let mem = guest_memory(MEM);
    let mut rx = MockQueue::new(mem.clone(), 0, QUEUE_SIZE);
    let tx = MockQueue::new(mem.clone(), 4 << 20, QUEUE_SIZE);
    let ev = MockQueue::new(mem.clone(), 8 << 20, QUEUE_SIZE);
    rx.add_request(&[], &[HDR_LEN as u32, RX_BUF]);
    let irq = Arc::new(RecordingInterrupt::default());
    dev.ack_features(features::COMMON);
    dev.activate(
        mem,
        irq.clone(),
        vec![rx.device_queue(), tx.device_queue(), ev.device_queue()],
    )
    .unwrap();
    let mut s = UnixStream::connect(dir.path().join("dev.sock")).unwrap();
    s.write_all(b"CONNECT 52\n").unwrap();
    let t = Instant::now();
    while rx.used().is_empty() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(rx.used().len(), 1, "the REQUEST reached the guest");
    assert_eq!(dev.quiesce().unwrap().len(), 3);
    dev.resume().unwrap();
    dev.reset();
    assert!(!dev.is_active());
    // The reset closed the host side.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    assert!(buf.is_empty());
}

#[test]
fn an_empty_receive_ring_asks_for_a_notification() {
    // With VIRTIO_RING_F_EVENT_IDX the driver kicks only when its available index passes
    // avail_event: the device must move it when it runs out of buffers.
    let mut r = rig();
    r.rxq.set_event_idx(true);
    let (_desc, _avail, used) = r.rx.ring_addresses();
    let avail_event = used + 4 + 8 * u64::from(QUEUE_SIZE);
    let read_event = |r: &Rig| u16::from_le_bytes(r.rx.read(avail_event, 2).try_into().unwrap());
    r.post_rx(3);
    for port in 1..=3 {
        r.send(hdr(Op::Request, 5000, port, 0), &[]); // three resets owed
    }
    assert_eq!(ops(&r.recv()), [Op::Rst, Op::Rst, Op::Rst]);
    assert_eq!(
        read_event(&r),
        3,
        "avail_event = next_avail once the ring is empty"
    );
}

#[test]
fn busy_connections_take_turns() {
    let mut r = rig();
    let mut a = r.guest_connect(1234, 1 << 20);
    let mut b = r.guest_connect(1235, 1 << 20);
    a.write_all(&[b'a'; 4 * RX_BUF as usize]).unwrap();
    b.write_all(&[b'b'; 4 * RX_BUF as usize]).unwrap();
    r.post_rx(4);
    let got = r.recv();
    let ports: Vec<u32> = got.iter().map(|(h, _)| h.src_port).collect();
    assert_eq!(ports.len(), 4);
    assert!(
        ports.windows(2).all(|w| w[0] != w[1]),
        "one stream held the queue: {ports:?}"
    );
}

#[test]
fn a_host_listener_with_a_full_backlog_refuses_without_stalling() {
    let mut r = rig();
    let path = format!("{}_77", r.uds.display());
    let _l = UnixListener::bind(&path).unwrap(); // never accepts
    let mut pending = Vec::new();
    loop {
        match super::muxer::connect_nonblocking(Path::new(&path)) {
            Ok(s) => pending.push(s),
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
                break;
            }
        }
        assert!(pending.len() < 100_000, "the backlog never filled");
    }
    let t = Instant::now();
    r.send(hdr(Op::Request, 5000, 77, 0), &[]);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "the worker waited on connect"
    );
    r.post_rx(1);
    assert_eq!(ops(&r.recv()), [Op::Rst]);
    let long = "x".repeat(200);
    assert!(super::muxer::connect_nonblocking(Path::new(&long)).is_err());
}
