//! The device as the transport and the VMM see it: queue numbering, activation,
//! configuration space and interrupt, statistics, save/restore, virtio-pci, fuzz seeds.

use super::*;
use crate::state::QueuePosition;
use crate::testing::RecordingRoutes;
use crate::transport::pci::VirtioPci;
use crate::worker::QueueHandler;
use crate::{features, DeviceQueue, VirtioDevice};
use densevm_devices::pci::{MsixVector, PciFunction, CAP_ID_MSIX};
use densevm_devices::BusDevice;
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

fn device(cfg: &BalloonConfig) -> (Balloon, BalloonHandle, Arc<FakeMemory>) {
    let memory = Arc::new(FakeMemory::default());
    let (d, h) = Balloon::new(cfg, memory.clone()).unwrap();
    (d, h, memory)
}

/// `n` mock queues over `mem`, and the device's side of each (the first `ready` enabled),
/// with a clone of each notification eventfd.
fn queues(mem: &Mem, n: usize, ready: usize) -> (Vec<MockQueue>, Vec<DeviceQueue>, Vec<EventFd>) {
    let mqs: Vec<MockQueue> = (0..n)
        .map(|i| MockQueue::new(mem.clone(), queue_base(i), 64))
        .collect();
    let mut dqs = Vec::new();
    let mut notify = Vec::new();
    for (i, mq) in mqs.iter().enumerate() {
        let mut dq = mq.device_queue();
        dq.queue.set_ready(i < ready);
        notify.push(dq.event.try_clone().unwrap());
        dqs.push(dq);
    }
    (mqs, dqs, notify)
}

fn pfn_bytes(pfns: &[u32]) -> Vec<u8> {
    pfns.iter().flat_map(|p| p.to_le_bytes()).collect()
}

#[test]
fn queue_numbering_follows_linux_for_every_feature_combination() {
    use feature::{FREE_PAGE_HINT as H, REPORTING as R, STATS_VQ as S};
    let cases = [
        (0, None, None, 2),
        (S, Some(2), None, 3),
        (R, None, Some(2), 3),
        (S | R, Some(2), Some(3), 4),
        // Never offered, but were it accepted it would sit between the two.
        (S | H | R, Some(2), Some(4), 4),
        (H | R, None, Some(3), 3),
    ];
    for (acked, stats, reporting, count) in cases {
        let l = QueueLayout::for_features(acked | features::COMMON);
        assert_eq!(
            (l.stats, l.reporting),
            (stats, reporting),
            "acked {acked:#x}"
        );
        if acked & H == 0 {
            assert_eq!(l.count(), count, "acked {acked:#x}");
        }
    }
    // What each configuration offers, and how many queues the transport presents.
    for (s, r, offered, n) in [
        (0, false, feature::DEFLATE_ON_OOM, 2),
        (5, false, feature::DEFLATE_ON_OOM | S, 3),
        (0, true, feature::DEFLATE_ON_OOM | R, 3),
        (5, true, feature::DEFLATE_ON_OOM | S | R, 4),
    ] {
        let (d, _, _) = device(&config(s, r));
        assert_eq!(d.features(), features::COMMON | offered);
        assert_eq!(d.queue_max_sizes(), vec![QUEUE_SIZE; n].as_slice());
        assert_eq!(d.device_type(), 5);
    }
    let (d, _, _) = device(&BalloonConfig::default());
    assert_eq!(d.features() & feature::DEFLATE_ON_OOM, 0);
}

#[test]
fn activation_serves_the_queues_the_accepted_features_imply() {
    let mem = memory(&[(0, 64 * MIB)]);
    for (s, r) in [(0, false), (5, false), (0, true), (5, true)] {
        let cfg = config(s, r);
        let optional = [
            0,
            feature::STATS_VQ,
            feature::REPORTING,
            feature::STATS_VQ | feature::REPORTING,
        ];
        for extra in optional {
            let (mut d, h, memory) = device(&cfg);
            if extra & !d.features() != 0 {
                continue;
            }
            d.ack_features(features::COMMON | feature::DEFLATE_ON_OOM | extra);
            let layout = QueueLayout::for_features(extra);
            let offered = d.queue_max_sizes().len();
            let (mut mqs, dqs, notify) = queues(&mem, offered, layout.count());
            let irq = Arc::new(RecordingInterrupt::default());
            d.activate(mem.clone(), irq.clone(), dqs).unwrap();
            assert!(d.is_active());
            // Inflate on queue 0, a report where the layout says.
            mqs[0].add_request(&[&pfn_bytes(&[9])], &[]);
            notify[0].write(1).unwrap();
            assert!(wait_for(|| mqs[0].used().len() == 1), "inflate served");
            assert_eq!(memory.take(), [Call::Release(9 * 4096, 4096)]);
            if let Some(q) = layout.reporting {
                mqs[q].add_chain(&[(32 * MIB, 2 << 20, true)]);
                notify[q].write(1).unwrap();
                assert!(wait_for(|| mqs[q].used().len() == 1), "report served");
                assert_eq!(memory.take(), [Call::Release(32 * MIB, 2 * MIB)]);
            }
            assert_eq!(h.counters().inflated_pages, 1);
            d.reset();
            assert!(!d.is_active());
        }
    }
}

#[test]
fn activation_refuses_missing_or_unready_queues() {
    let mem = memory(&[(0, 64 * MIB)]);
    let (mut d, _, _) = device(&config(5, true));
    d.ack_features(features::COMMON | feature::STATS_VQ | feature::REPORTING);
    let irq: Arc<dyn Interrupt> = Arc::new(RecordingInterrupt::default());
    let (_, dqs, _) = queues(&mem, 3, 3);
    assert!(matches!(
        d.activate(mem.clone(), irq.clone(), dqs),
        Err(ActivateError::QueueCount { want: 4, got: 3 })
    ));
    let (_, dqs, _) = queues(&mem, 4, 3);
    assert!(matches!(
        d.activate(mem.clone(), irq.clone(), dqs),
        Err(ActivateError::InvalidQueue(3))
    ));
    assert!(!d.is_active());
}

#[test]
fn configuration_space_reads_and_driver_writes() {
    let (mut d, h, _) = device(&BalloonConfig {
        amount_mib: 3,
        ..config(0, false)
    });
    let read = |d: &Balloon, off: u64, n: usize| {
        let mut b = vec![0u8; n];
        d.read_config(off, &mut b);
        b
    };
    let mut want = [0u8; 16];
    want[..4].copy_from_slice(&768u32.to_le_bytes());
    assert_eq!(read(&d, 0, 16), want);
    assert_eq!(read(&d, 14, 4), [0; 4], "past the end reads zero");
    assert_eq!(read(&d, u64::MAX, 4), [0; 4]);
    // actual: a dword, then one byte of it; num_pages and the command id are read-only.
    d.write_config(4, &300u32.to_le_bytes());
    d.write_config(5, &[2]);
    d.write_config(0, &7u32.to_le_bytes());
    d.write_config(8, &7u32.to_le_bytes());
    d.write_config(12, &0xaaaa_aaaau32.to_le_bytes());
    d.write_config(u64::MAX, &[1, 2]);
    assert_eq!(h.actual_pages(), 556, "300 with byte 1 = 2");
    assert_eq!(h.target_pages(), 768);
    assert_eq!(read(&d, 8, 8), [0, 0, 0, 0, 0xaa, 0xaa, 0xaa, 0xaa]);
    assert_eq!(h.actual_bytes(), 556 * 4096);
    assert_eq!(h.target_bytes(), 3 * MIB);
}

#[test]
fn a_new_target_raises_the_configuration_interrupt_when_the_driver_runs() {
    let mem = memory(&[(0, 64 * MIB)]);
    let (mut d, h, _) = device(&config(0, false));
    h.set_target_mib(8).unwrap();
    assert_eq!(h.target_pages(), 2048);
    assert!(matches!(
        h.set_target_mib(u32::MAX / 256 + 1),
        Err(BalloonError::TargetTooLarge { .. })
    ));
    assert_eq!(h.config().amount_mib, 8);
    h.set_target_bytes(8 * MIB + 4095).unwrap();
    assert_eq!(h.target_pages(), 2048, "bytes round down to pages");
    assert!(h.set_target_bytes(1 << 45).is_err());
    d.ack_features(features::COMMON);
    let irq = Arc::new(RecordingInterrupt::default());
    let (_, dqs, _) = queues(&mem, 2, 2);
    d.activate(mem.clone(), irq.clone(), dqs).unwrap();
    let config_irqs = || irq.config.load(Ordering::SeqCst);
    assert_eq!(
        config_irqs(),
        0,
        "the driver reads the target when it starts"
    );
    h.set_target_pages(100);
    assert_eq!(config_irqs(), 1);
    h.set_target_pages(100);
    assert_eq!(config_irqs(), 1, "no change, no interrupt");
    let mut buf = [0u8; 4];
    d.read_config(0, &mut buf);
    assert_eq!(u32::from_le_bytes(buf), 100);
    // Quiesced (a snapshot in progress): the interrupt waits for resume.
    assert_eq!(d.quiesce().unwrap().len(), 2);
    h.set_target_pages(200);
    assert_eq!(config_irqs(), 1);
    d.resume().unwrap();
    assert_eq!(config_irqs(), 2);
    d.reset();
    h.set_target_pages(300);
    assert_eq!(config_irqs(), 2, "reset: no interrupt");
}

/// A statistics buffer: `(tag, value)` entries.
fn stats_buf(entries: &[(u16, u64)]) -> Vec<u8> {
    entries
        .iter()
        .flat_map(|&(t, v)| t.to_le_bytes().into_iter().chain(v.to_le_bytes()))
        .collect()
}

#[test]
fn statistics_are_parsed_held_and_given_back_on_demand() {
    let mut r = Rig::new(feature::STATS_VQ, memory(&[(0, 64 * MIB)]));
    let q = r.layout.stats.unwrap();
    assert_eq!(q, 2);
    assert!(
        r.handle.stats().is_none(),
        "nothing before the guest's first buffer"
    );
    let all: Vec<(u16, u64)> = (0..16).map(|t| (t, 1000 + u64::from(t))).collect();
    let mut entries = all.clone();
    entries.push((99, 5)); // unknown: ignored
    let (head, _) = r.queues[q].add_request(&[&stats_buf(&entries)], &[]);
    r.serve(q);
    assert!(r.used(q).is_empty(), "the device holds the buffer");
    let report = r.handle.stats().expect("stats");
    let g = report.stats.guest;
    assert_eq!(g.swap_in, Some(1000));
    assert_eq!(g.available_memory, Some(1006));
    assert_eq!(g.hugetlb_failures, Some(1009));
    assert_eq!(g.oom_kill, Some(1010));
    assert_eq!(g.direct_reclaim, Some(1015));
    assert!(report.age() < Duration::from_secs(5));
    // On demand: the next tick gives the buffer back (used length 0) and interrupts.
    r.handle.request_stats().unwrap();
    assert!(r.handler.tick().is_some(), "polling every 5 s");
    assert_eq!(r.used(q), [(u32::from(head), 0)]);
    assert_eq!(*r.irq.queues.lock().unwrap(), [2]);
    // A truncated refill is refused (values kept) but held, like any buffer.
    let before = r.handle.stats().unwrap().stats;
    r.queues[q].add_request(&[&stats_buf(&[(4, 1)])[..9]], &[]);
    r.serve(q);
    assert_eq!(r.handle.stats().unwrap().stats, before);
    assert_eq!(r.counters().stats_errors, 1);
    // A second buffer while one is held: the older goes back at once.
    let (newer, _) = r.queues[q].add_request(&[&stats_buf(&[(4, 77)])], &[]);
    r.serve(q);
    assert_eq!(r.used(q).len(), 2);
    assert_eq!(r.handle.stats().unwrap().stats.guest.free_memory, Some(77));
    assert_eq!(
        r.handle.stats().unwrap().stats.guest.swap_in,
        None,
        "a whole new set"
    );
    // Too long, and device-writable: refused.
    let long: Vec<(u16, u64)> = (0..65).map(|i| (4, i)).collect();
    r.queues[q].add_request(&[&stats_buf(&long)], &[]);
    r.queues[q].add_request(&[], &[20]);
    r.serve(q);
    assert_eq!(r.counters().stats_errors, 3);
    assert_eq!(r.counters().stats_updates, 2);
    let _ = newer;
}

#[test]
fn statistics_json_has_firecrackers_shape() {
    let mut guest = GuestStats::default();
    assert!(guest.set(stats::tag::MEMFREE, 4096));
    assert!(!guest.set(42, 1));
    let s = BalloonStats::new(512, 256, guest);
    let v = serde_json::to_value(s).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"target_pages": 512, "actual_pages": 256, "target_mib": 2,
                           "actual_mib": 1, "free_memory": 4096})
    );
    assert_eq!(serde_json::from_value::<BalloonStats>(v).unwrap(), s);
    let c: BalloonConfig =
        serde_json::from_str(r#"{"amount_mib": 64, "deflate_on_oom": true}"#).unwrap();
    assert_eq!(
        (
            c.amount_mib,
            c.stats_polling_interval_s,
            c.free_page_reporting
        ),
        (64, 0, false)
    );
    assert!(serde_json::from_str::<BalloonConfig>(
        r#"{"amount_mib": 1, "deflate_on_oom": true, "x": 1}"#
    )
    .is_err());
    let u: BalloonUpdate = serde_json::from_str(r#"{"amount_mib": 3}"#).unwrap();
    assert_eq!(u.amount_mib, 3);
    let p: BalloonStatsUpdate = serde_json::from_str(r#"{"stats_polling_interval_s": 0}"#).unwrap();
    assert_eq!(p.stats_polling_interval_s, 0);
    assert_eq!(stats::parse(&[0; 11]), Err(stats::StatsError::Length(11)));
}

#[test]
fn the_worker_polls_statistics_on_its_interval() {
    let mem = memory(&[(0, 64 * MIB)]);
    let (mut d, h, _) = device(&config(1, false));
    d.ack_features(features::COMMON | feature::STATS_VQ);
    let (mut mqs, dqs, notify) = queues(&mem, 3, 3);
    // The driver primes the queue before DRIVER_OK.
    mqs[2].add_request(&[&stats_buf(&[(4, 1)])], &[]);
    let t = Instant::now();
    d.activate(mem.clone(), Arc::new(RecordingInterrupt::default()), dqs)
        .unwrap();
    assert!(wait_for(|| h.stats().is_some()), "first buffer parsed");
    assert!(
        wait_for(|| mqs[2].used().len() == 1),
        "given back after a second"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "not before the interval"
    );
    // The driver refills; polling stops at interval 0; on demand still works.
    mqs[2].add_request(&[&stats_buf(&[(4, 2)])], &[]);
    notify[2].write(1).unwrap();
    assert!(wait_for(
        || h.stats().unwrap().stats.guest.free_memory == Some(2)
    ));
    h.set_stats_interval(0).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(mqs[2].used().len(), 1, "not polled at interval 0");
    h.request_stats().unwrap();
    assert!(wait_for(|| mqs[2].used().len() == 2), "asked for");
    d.reset();
    let (_, h, _) = device(&config(0, false));
    assert!(matches!(
        h.set_stats_interval(1),
        Err(BalloonError::StatsDisabled)
    ));
    assert!(matches!(
        h.request_stats(),
        Err(BalloonError::StatsDisabled)
    ));
}

#[test]
fn save_and_restore_keep_target_accounting_and_the_held_statistics_buffer() {
    let mem = memory(&[(0, 64 * MIB)]);
    let cfg = config(30, true);
    let (mut d, h, _) = device(&cfg);
    let acked = features::COMMON | feature::STATS_VQ | feature::REPORTING;
    d.ack_features(acked);
    let (mut mqs, dqs, notify) = queues(&mem, 4, 4);
    let (stats_head, _) = mqs[2].add_request(&[&stats_buf(&[(4, 9)])], &[]);
    d.activate(mem.clone(), Arc::new(RecordingInterrupt::default()), dqs)
        .unwrap();
    assert!(wait_for(|| h.stats().is_some()));
    mqs[0].add_request(&[&pfn_bytes(&[1, 2, 3])], &[]);
    notify[0].write(1).unwrap();
    assert!(wait_for(|| mqs[0].used().len() == 1));
    h.set_target_pages(512);
    d.write_config(4, &3u32.to_le_bytes());
    let positions = d.quiesce().unwrap();
    assert_eq!(positions.len(), 4);
    assert_eq!(
        positions[0],
        QueuePosition {
            next_avail: 1,
            next_used: 1
        }
    );
    assert_eq!(
        positions[2],
        QueuePosition {
            next_avail: 1,
            next_used: 0
        },
        "one held"
    );
    let saved = d.save_state().unwrap();
    let s: BalloonState = serde_json::from_value(saved.clone()).unwrap();
    assert_eq!(
        s,
        BalloonState {
            acked_features: acked,
            num_pages: 512,
            actual: 3,
            poison_val: 0,
            inflated_pages: 3,
            stats_polling_interval_s: 30,
            stats_head: Some(stats_head),
        }
    );
    d.resume().unwrap();
    d.reset();

    // A new device from the state: the same state back, then it serves from the positions.
    let (mut r, rh, _) = device(&cfg);
    r.restore_state(&saved).unwrap();
    assert_eq!(r.save_state().unwrap(), saved);
    assert_eq!((rh.target_pages(), rh.actual_pages()), (512, 3));
    assert_eq!(rh.counters().inflated_pages, 3);
    let mut dqs = Vec::new();
    for (mq, p) in mqs.iter().zip(&positions) {
        let mut dq = mq.device_queue();
        dq.queue.set_next_avail(p.next_avail);
        dq.queue.set_next_used(p.next_used);
        dqs.push(dq);
    }
    let irq = Arc::new(RecordingInterrupt::default());
    r.activate(mem.clone(), irq.clone(), dqs).unwrap();
    assert_eq!(
        irq.config.load(Ordering::SeqCst),
        1,
        "the driver rereads the target"
    );
    rh.request_stats().unwrap();
    assert!(
        wait_for(|| mqs[2].used() == [(u32::from(stats_head), 0)]),
        "the held buffer goes back after the restore"
    );
    assert!(
        matches!(r.restore_state(&saved), Err(StateError::DeviceState { .. })),
        "active"
    );
    r.reset();

    // States that do not fit.
    let refuse =
        |cfg: &BalloonConfig, v: serde_json::Value| device(cfg).0.restore_state(&v).is_err();
    let mut v = saved.clone();
    v["acked_features"] = (acked | feature::FREE_PAGE_HINT).into();
    assert!(refuse(&cfg, v));
    let mut v = saved.clone();
    v["acked_features"] = (features::COMMON | feature::REPORTING).into();
    assert!(refuse(&cfg, v), "a held buffer without a statistics queue");
    let mut v = saved.clone();
    v["extra"] = 1.into();
    assert!(refuse(&cfg, v));
    let mut v = saved.clone();
    v["acked_features"] = features::COMMON.into();
    v["stats_head"] = serde_json::Value::Null;
    assert!(
        refuse(&config(0, true), v),
        "polling into a device without statistics"
    );
}

#[test]
fn behind_virtio_pci_a_new_target_reaches_the_driver() {
    const BAR: u32 = 0xd000_0000;
    let mem = memory(&[(0, 64 * MIB)]);
    let (d, h, memory) = device(&config(0, false));
    let mut triggers = Vec::new();
    let vectors = (0..3)
        .map(|i| {
            let e = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            triggers.push(e.try_clone().unwrap());
            MsixVector {
                gsi: 24 + i,
                trigger: e,
            }
        })
        .collect();
    let routes = Arc::new(RecordingRoutes::default());
    let mut pci = VirtioPci::new(Box::new(d), mem.clone(), BAR, vectors, routes).unwrap();
    assert_eq!(
        pci.config_read(0),
        0x1045_1af4,
        "virtio vendor, modern balloon id"
    );
    // MSI-X on: the capability's control word.
    let mut at = (pci.config_read(13) & 0xff) as usize;
    while pci.config_read(at / 4) as u8 != CAP_ID_MSIX {
        at = (pci.config_read(at / 4) >> 8 & 0xff) as usize;
    }
    pci.config_write(at / 4, 2, &0x8000u16.to_le_bytes());
    let mut w = |off: u64, v: &[u8]| {
        BusDevice::write(&mut pci, off, v);
    };
    w(0x4000, &0xfee0_0000u32.to_le_bytes()); // vector 0: address, data, unmasked
    w(0x4008, &0x30u32.to_le_bytes());
    w(0x400c, &0u32.to_le_bytes());
    w(0x10, &0u16.to_le_bytes()); // msix_config = 0
    w(0x14, &[1 | 2]);
    w(0x08, &1u32.to_le_bytes());
    w(0x0c, &1u32.to_le_bytes()); // VERSION_1
    w(0x14, &[1 | 2 | 8]);
    let mqs: Vec<MockQueue> = (0..2)
        .map(|i| MockQueue::new(mem.clone(), queue_base(i), 64))
        .collect();
    for (i, mq) in mqs.iter().enumerate() {
        let (desc, avail, used) = mq.ring_addresses();
        w(0x16, &(i as u16).to_le_bytes());
        w(0x18, &64u16.to_le_bytes());
        for (off, addr) in [(0x20, desc), (0x28, avail), (0x30, used)] {
            w(off, &(addr as u32).to_le_bytes());
            w(off + 4, &((addr >> 32) as u32).to_le_bytes());
        }
        w(0x1c, &1u16.to_le_bytes());
    }
    w(0x14, &[1 | 2 | 8 | 4]);
    assert!(pci.is_active());
    let r8 = |pci: &mut VirtioPci, off: u64| {
        let mut b = [0u8; 1];
        BusDevice::read(pci, off, &mut b);
        b[0]
    };
    let generation = r8(&mut pci, 0x15);
    let _ = triggers[0].read();
    h.set_target_mib(4).unwrap();
    assert!(triggers[0].read().is_ok(), "configuration vector raised");
    assert_eq!(r8(&mut pci, 0x1000), 2, "ISR: configuration change");
    assert_eq!(r8(&mut pci, 0x15), generation.wrapping_add(1));
    let mut b = [0u8; 4];
    BusDevice::read(&mut pci, 0x2000, &mut b);
    assert_eq!(u32::from_le_bytes(b), 1024, "num_pages through the BAR");
    BusDevice::write(&mut pci, 0x2004, &1024u32.to_le_bytes());
    assert_eq!(h.actual_pages(), 1024);
    // An inflate through the notification address (where no ioeventfd catches it).
    let mut q0 = MockQueue::new(mem.clone(), queue_base(0), 64);
    q0.add_request(&[&pfn_bytes(&[40, 41])], &[]);
    BusDevice::write(&mut pci, 0x3000, &0u16.to_le_bytes());
    assert!(wait_for(|| q0.used().len() == 1));
    assert_eq!(memory.take(), [Call::Release(40 * 4096, 2 * 4096)]);
    // The snapshot keeps the generation the driver saw, and the device's state.
    let state = pci.save_state().unwrap();
    assert_eq!(state.common.config_generation, generation.wrapping_add(1));
    assert_eq!(state.device["num_pages"], 1024);
    pci.resume().unwrap();
}

/// The fuzz seeds, and a sweep of pseudo-random inputs, through the fuzz entry point.
#[test]
fn fuzz_seeds_and_random_inputs_replay() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/balloon");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/balloon") {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        fuzz::balloon(&data);
        n += 1;
    }
    assert!(n >= 4, "only {n} seeds in {}", dir.display());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..500 {
        let mut data = vec![0u8; 64 + (x % 512) as usize];
        for b in &mut data {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        fuzz::balloon(&data);
    }
}
