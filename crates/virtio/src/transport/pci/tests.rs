//! A driver's-eye test of the transport: discovery through config space, negotiation,
//! queue setup and MSI-X through BAR 0, a request served by a real device, reset, and a
//! driver that programs rings outside guest memory.

use super::*;
use crate::pmem::{FlushFn, Pmem};
use crate::testing::{guest_memory, MockQueue};
use densevm_devices::pci::MsiMessage;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const BAR: u32 = 0xd000_0000;

use crate::testing::RecordingRoutes as Routes;

struct Driver {
    dev: VirtioPci,
    triggers: Vec<EventFd>,
    routes: Arc<Routes>,
    flushes: Arc<AtomicU32>,
}

fn driver(mq: &MockQueue) -> Driver {
    let flushes = Arc::new(AtomicU32::new(0));
    let n = flushes.clone();
    let flush: FlushFn = Arc::new(move || {
        n.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let device = Box::new(Pmem::new(1 << 32, 1 << 30, flush));
    let nvec = VirtioPci::vectors_needed(device.as_ref());
    assert_eq!(nvec, 2);
    let mut vectors = Vec::new();
    let mut triggers = Vec::new();
    for i in 0..nvec {
        let e = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        triggers.push(e.try_clone().unwrap());
        vectors.push(MsixVector {
            gsi: 24 + i as u32,
            trigger: e,
        });
    }
    let routes = Arc::new(Routes::default());
    let dev = VirtioPci::new(device, mq.mem.clone(), BAR, vectors, routes.clone()).unwrap();
    Driver {
        dev,
        triggers,
        routes,
        flushes,
    }
}

impl Driver {
    fn w(&mut self, off: u64, v: &[u8]) {
        BusDevice::write(&mut self.dev, off, v);
    }
    fn r32(&mut self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        BusDevice::read(&mut self.dev, off, &mut b);
        u32::from_le_bytes(b)
    }
    fn r8(&mut self, off: u64) -> u8 {
        let mut b = [0u8; 1];
        BusDevice::read(&mut self.dev, off, &mut b);
        b[0]
    }
    /// Capabilities as (id, config offset, cfg_type or 0).
    fn caps(&mut self) -> Vec<(u8, usize, u8)> {
        let mut out = Vec::new();
        let mut at = (self.dev.config_read(13) & 0xff) as usize;
        while at != 0 && out.len() < 16 {
            let d = self.dev.config_read(at / 4);
            let id = d as u8;
            let cfg_type = (d >> 24) as u8;
            out.push((id, at, if id == CAP_ID_VENDOR { cfg_type } else { 0 }));
            at = (d >> 8 & 0xff) as usize;
        }
        out
    }
    fn negotiate_and_setup(&mut self, mq: &MockQueue) {
        let msix = self
            .caps()
            .into_iter()
            .find(|c| c.0 == CAP_ID_MSIX)
            .unwrap()
            .1;
        self.dev.config_write(msix / 4, 2, &0x8000u16.to_le_bytes());
        // Vector 1 → message 0xfee00000/0x41, unmasked.
        self.w(MSIX_TABLE + 16, &0xfee0_0000u32.to_le_bytes());
        self.w(MSIX_TABLE + 20, &0u32.to_le_bytes());
        self.w(MSIX_TABLE + 24, &0x41u32.to_le_bytes());
        self.w(MSIX_TABLE + 28, &0u32.to_le_bytes());
        self.w(0x14, &[status::ACKNOWLEDGE | status::DRIVER]);
        self.w(0x00, &1u32.to_le_bytes());
        assert_eq!(self.r32(0x04) & 1, 1, "VERSION_1 offered");
        self.w(0x08, &1u32.to_le_bytes());
        self.w(0x0c, &1u32.to_le_bytes());
        self.w(
            0x14,
            &[status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK],
        );
        assert_ne!(self.r8(0x14) & status::FEATURES_OK, 0);
        let (desc, avail, used) = mq.ring_addresses();
        self.w(0x16, &0u16.to_le_bytes());
        self.w(0x18, &16u16.to_le_bytes());
        self.w(0x1a, &1u16.to_le_bytes());
        for (off, addr) in [(0x20, desc), (0x28, avail), (0x30, used)] {
            self.w(off, &(addr as u32).to_le_bytes());
            self.w(off + 4, &((addr >> 32) as u32).to_le_bytes());
        }
        self.w(0x1c, &1u16.to_le_bytes());
        self.w(0x10, &0u16.to_le_bytes());
    }
    fn driver_ok(&mut self) {
        self.w(
            0x14,
            &[status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK],
        );
    }
}

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

#[test]
fn a_driver_finds_sets_up_uses_and_resets_the_device() {
    let mut mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
    let mut d = driver(&mq);
    assert_eq!(
        d.dev.config_read(0),
        0x105b_1af4,
        "virtio vendor, modern pmem device id"
    );
    let caps = d.caps();
    let types: Vec<u8> = caps
        .iter()
        .filter(|c| c.0 == CAP_ID_VENDOR)
        .map(|c| c.2)
        .collect();
    assert_eq!(types, [CAP_COMMON, CAP_ISR, CAP_DEVICE, CAP_NOTIFY]);
    let notify = caps.iter().find(|c| c.2 == CAP_NOTIFY).unwrap().1;
    assert_eq!(d.dev.config_read(notify / 4 + 4), NOTIFY_MULTIPLIER);
    let msix = caps.iter().find(|c| c.0 == CAP_ID_MSIX).unwrap().1;
    assert_eq!(
        d.dev.config_read(msix / 4) >> 16 & 0x7ff,
        1,
        "two vectors (size - 1)"
    );
    // Device config through the BAR: start and size.
    assert_eq!(d.r32(DEVICE_CFG + 4), 1, "start = 4 GiB (high dword)");

    d.negotiate_and_setup(&mq);
    assert_eq!(
        d.routes.0.lock().unwrap().last(),
        Some(&(
            25,
            MsiMessage {
                address: 0xfee0_0000,
                data: 0x41
            }
        ))
    );
    d.driver_ok();
    assert!(d.dev.is_active());
    let (head, out) = mq.add_request(&[&0u32.to_le_bytes()], &[4]);
    mq.write(out[0], &[0xff; 4]);
    // Notify through the BAR (where no ioeventfd catches it).
    d.w(NOTIFY_CFG, &0u16.to_le_bytes());
    assert!(wait_for(|| mq.used().len() == 1), "the request completes");
    assert_eq!(mq.used()[0], (u32::from(head), 4));
    assert_eq!(mq.read(out[0], 4), [0; 4]);
    assert_eq!(d.flushes.load(Ordering::SeqCst), 1);
    assert!(
        wait_for(|| d.triggers[1].read().is_ok()),
        "queue vector 1 raised"
    );
    assert_eq!(d.r8(ISR_CFG) & 1, 1, "ISR says queue");
    assert_eq!(d.r8(ISR_CFG), 0, "reading ISR clears it");

    d.w(0x14, &[0]);
    assert!(!d.dev.is_active(), "reset stops the device");
    assert_eq!(d.r8(0x14), 0);
    d.w(0x16, &0u16.to_le_bytes());
    assert_eq!(d.r32(0x1a) & 0xffff, u32::from(NO_VECTOR));
    // The device comes back after a reset.
    d.negotiate_and_setup(&mq);
    d.driver_ok();
    assert!(d.dev.is_active());
}

#[test]
fn rings_outside_guest_memory_make_the_device_need_a_reset() {
    let mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
    let mut d = driver(&mq);
    d.negotiate_and_setup(&mq);
    d.w(0x1c, &0u16.to_le_bytes()); // an enabled queue cannot be changed: start over
    d.w(0x14, &[0]);
    d.negotiate_and_setup(&mq);
    d.w(0x14, &[0]);
    d.w(0x14, &[status::ACKNOWLEDGE | status::DRIVER]);
    d.w(0x08, &1u32.to_le_bytes());
    d.w(0x0c, &1u32.to_le_bytes());
    d.w(
        0x14,
        &[status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK],
    );
    d.w(0x16, &0u16.to_le_bytes());
    d.w(0x20, &0u32.to_le_bytes());
    d.w(0x24, &0x100u32.to_le_bytes()); // 1 TiB: no guest memory there
    d.w(0x1c, &1u16.to_le_bytes());
    d.driver_ok();
    assert!(!d.dev.is_active());
    assert_ne!(d.r8(0x14) & status::DEVICE_NEEDS_RESET, 0);
    d.w(0x14, &[0]);
    assert_eq!(d.r8(0x14), 0, "a reset clears DEVICE_NEEDS_RESET");
}

#[test]
fn hostile_register_accesses_are_harmless() {
    let mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
    let mut d = driver(&mq);
    d.w(0x1a, &7u16.to_le_bytes()); // vector beyond the table
    d.dev.config_write(0, 0, &[0; 4]);
    assert_eq!(
        d.r32(0x1a) & 0xffff,
        u32::from(NO_VECTOR),
        "unusable vector reads NO_VECTOR"
    );
    d.w(NOTIFY_CFG + 4 * 100, &0u16.to_le_bytes()); // a queue that does not exist
    d.w(MSIX_TABLE + 4096, &[1; 4]);
    d.w(0x7ffc, &[1; 4]);
    let mut big = [0u8; 8];
    BusDevice::read(&mut d.dev, 0x20, &mut big);
    BusDevice::read(&mut d.dev, DEVICE_CFG + 0xffc, &mut big[..4]);
    for reg in 0..70 {
        d.dev.config_write(reg, 0, &[0xff; 4]);
        d.dev.config_read(reg);
    }
    assert_eq!(d.dev.config_read(0), 0x105b_1af4);
    assert_eq!(
        d.dev.config_read(4),
        !(BAR_SIZE - 1),
        "all ones written: sizing"
    );
    d.dev.config_write(4, 0, &0x1234_0000u32.to_le_bytes());
    assert_eq!(d.dev.config_read(4), BAR, "BAR stays put");
}

#[test]
fn a_configuration_change_raises_the_config_vector_and_moves_the_generation() {
    let mq = MockQueue::new(guest_memory(4 << 20), 0, 16);
    let mut d = driver(&mq);
    d.negotiate_and_setup(&mq);
    // Vector 0 → a message, unmasked; the configuration-change vector is 0.
    d.w(MSIX_TABLE, &0xfee0_0000u32.to_le_bytes());
    d.w(MSIX_TABLE + 8, &0x42u32.to_le_bytes());
    d.w(MSIX_TABLE + 12, &0u32.to_le_bytes());
    d.w(0x10, &0u16.to_le_bytes());
    assert_eq!(d.r32(0x10) & 0xffff, 0, "msix_config = 0");
    d.driver_ok();
    let generation = d.r8(0x15);
    let _ = d.triggers[0].read();
    // What a device does when its configuration changes (virtio-balloon's target).
    crate::Interrupt::notify_config(&*d.dev.interrupt);
    assert!(d.triggers[0].read().is_ok(), "config vector 0 raised");
    assert!(d.triggers[1].read().is_err(), "not the queue's vector");
    assert_eq!(d.r8(0x15), generation.wrapping_add(1), "generation moved");
    let mut word = [0u8; 4];
    BusDevice::read(&mut d.dev, 0x14, &mut word);
    assert_eq!(word[1], generation.wrapping_add(1), "also in a wider read");
    assert_eq!(d.r8(ISR_CFG), 2, "ISR says configuration");
    assert_eq!(d.r8(ISR_CFG), 0, "reading ISR clears it");
    // The snapshot keeps the generation the driver saw.
    let state = d.dev.save_state().unwrap();
    assert_eq!(state.common.config_generation, generation.wrapping_add(1));
    d.dev.resume().unwrap();
}
