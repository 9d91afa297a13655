//! Saving and restoring virtio-pci functions, from a driver's side: `round_trip.rs` runs
//! virtio-blk and virtio-rng across a save and a restore over the same guest memory; this
//! file holds the mock driver, the JSON round trip, every refused state and the devices that
//! cannot be saved yet.

mod round_trip;

use super::*;
use crate::rng::Rng;
use crate::testing::{guest_memory, MockQueue};
use crate::StateError;
use densevm_devices::pci::{MsiMessage, PciStateError};
use std::time::{Duration, Instant};

const BAR: u32 = 0xd000_0000;
const MEM: usize = 4 << 20;
/// MSI messages the driver programs: vector 0 (configuration) and 1 (queue 0).
const MSG: [(u32, u32); 2] = [(0xfee0_0000, 0x40), (0xfee0_1000, 0x41)];

use crate::testing::RecordingRoutes as Routes;

/// A function and what the VMM would hold for it.
struct Function {
    dev: VirtioPci,
    triggers: Vec<EventFd>,
    routes: Arc<Routes>,
    gsi_base: u32,
}

/// Vectors for `device` at GSIs from `gsi_base`, and their trigger eventfds.
fn vectors(device: &dyn VirtioDevice, gsi_base: u32) -> (Vec<MsixVector>, Vec<EventFd>) {
    (0..VirtioPci::vectors_needed(device))
        .map(|i| {
            let e = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            let t = e.try_clone().unwrap();
            let v = MsixVector {
                gsi: gsi_base + i as u32,
                trigger: e,
            };
            (v, t)
        })
        .unzip()
}

fn function(device: Box<dyn VirtioDevice>, mem: &Mem) -> Function {
    let (v, triggers) = vectors(device.as_ref(), 24);
    let routes = Arc::new(Routes::default());
    let dev = VirtioPci::new(device, mem.clone(), BAR, v, routes.clone()).unwrap();
    Function {
        dev,
        triggers,
        routes,
        gsi_base: 24,
    }
}

/// A function restored from `state`, at other GSIs than the saved one's (a new VM).
fn restored(
    device: Box<dyn VirtioDevice>,
    mem: &Mem,
    state: &VirtioPciState,
) -> Result<Function, StateError> {
    let (v, triggers) = vectors(device.as_ref(), 40);
    let routes = Arc::new(Routes::default());
    let dev = VirtioPci::restore(device, mem.clone(), BAR, v, routes.clone(), state)?;
    Ok(Function {
        dev,
        triggers,
        routes,
        gsi_base: 40,
    })
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

impl Function {
    fn w(&mut self, off: u64, v: &[u8]) {
        BusDevice::write(&mut self.dev, off, v);
    }
    fn r8(&mut self, off: u64) -> u8 {
        let mut b = [0u8; 1];
        BusDevice::read(&mut self.dev, off, &mut b);
        b[0]
    }
    fn msix_cap(&mut self) -> usize {
        let mut at = (self.dev.config_read(13) & 0xff) as usize;
        while at != 0 {
            let d = self.dev.config_read(at / 4);
            if d as u8 == CAP_ID_MSIX {
                return at;
            }
            at = (d >> 8 & 0xff) as usize;
        }
        panic!("no MSI-X capability");
    }
    /// What Linux's virtio_pci does: MSI-X on with two unmasked vectors, features, queue 0
    /// at `mq`'s rings on vector 1, configuration changes on vector 0, DRIVER_OK.
    fn set_up(&mut self, mq: &MockQueue, features: u64) {
        let msix = self.msix_cap();
        self.dev.config_write(msix / 4, 2, &0x8000u16.to_le_bytes());
        for (v, (addr, data)) in MSG.iter().enumerate() {
            let at = MSIX_TABLE + 16 * v as u64;
            self.w(at, &addr.to_le_bytes());
            self.w(at + 4, &0u32.to_le_bytes());
            self.w(at + 8, &data.to_le_bytes());
            self.w(at + 12, &0u32.to_le_bytes());
        }
        self.w(0x14, &[status::ACKNOWLEDGE | status::DRIVER]);
        for half in 0..2u32 {
            self.w(0x08, &half.to_le_bytes());
            self.w(0x0c, &((features >> (32 * half)) as u32).to_le_bytes());
        }
        let ok = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
        self.w(0x14, &[ok]);
        assert_eq!(self.r8(0x14), ok, "features accepted");
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
        self.w(0x14, &[ok | status::DRIVER_OK]);
        assert!(self.dev.is_active());
    }
    /// The driver notifies queue 0 (through the BAR: no ioeventfd here).
    fn notify(&mut self) {
        self.w(NOTIFY_CFG, &0u16.to_le_bytes());
    }
    /// Whether queue 0's vector fired since the last call.
    fn queue_interrupt(&self) -> bool {
        self.triggers[1].read().is_ok()
    }
    /// The last route programmed for each vector that has one, by vector.
    fn routed(&self) -> Vec<(u32, MsiMessage)> {
        let mut last = std::collections::BTreeMap::new();
        for &(gsi, m) in self.routes.0.lock().unwrap().iter() {
            last.insert(gsi - self.gsi_base, m);
        }
        last.into_iter().collect()
    }
}

fn msg(v: usize) -> MsiMessage {
    MsiMessage {
        address: u64::from(MSG[v].0),
        data: MSG[v].1,
    }
}

/// A saved virtio-rng function that served one request.
fn saved_rng() -> (VirtioPciState, MockQueue) {
    let mut mq = MockQueue::new(guest_memory(MEM), 0, 16);
    let mut f = function(Box::new(Rng::new()), &mq.mem);
    f.set_up(&mq, features::VERSION_1 | features::RING_EVENT_IDX);
    mq.add_request(&[], &[32]);
    f.notify();
    assert!(wait_for(|| mq.used().len() == 1));
    let state = f.dev.save_state().unwrap();
    (state, mq)
}

#[test]
fn state_survives_json() {
    let (state, _mq) = saved_rng();
    let json = serde_json::to_string_pretty(&state).unwrap();
    let back: VirtioPciState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, state);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["device_type"], 4);
    assert_eq!(v["common"]["queues"][0]["next_used"], 1);
    assert_eq!(v["common"]["queues"][0]["event_idx"], true);
    assert_eq!(
        v["device"]["acked_features"],
        features::VERSION_1 | features::RING_EVENT_IDX
    );
    assert_eq!(v["msix"]["entries"][1][2], 0x41);
    let mut extra = v.clone();
    extra["common"]["surprise"] = 1.into();
    assert!(
        serde_json::from_value::<VirtioPciState>(extra).is_err(),
        "unknown fields refused"
    );
}

/// Restoring `state` into a new virtio-rng fails; returns the error.
fn refused(state: &VirtioPciState, mem: &Mem) -> StateError {
    match restored(Box::new(Rng::new()), mem, state) {
        Ok(_) => panic!("restored: {state:?}"),
        Err(e) => e,
    }
}

#[test]
fn inconsistent_states_are_refused_each_with_its_error() {
    let (good, mq) = saved_rng();
    let mem = &mq.mem;
    let edit = |f: &dyn Fn(&mut VirtioPciState)| {
        let mut s = good.clone();
        f(&mut s);
        refused(&s, mem)
    };
    let queue = |f: &dyn Fn(&mut QueueState)| edit(&|s| f(&mut s.common.queues[0]));

    for size in [512, 100, 0] {
        let e = queue(&|q| q.size = size);
        assert!(
            matches!(
                e,
                StateError::QueueSize {
                    queue: 0,
                    max: 256,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("powers of two up to 256"), "{e}");
    }
    let e = queue(&|q| q.desc = 1 << 40);
    assert!(
        matches!(e, StateError::RingOutsideMemory { queue: 0 }),
        "{e}"
    );
    let e = queue(&|q| q.used = MEM as u64 - 8);
    assert!(
        matches!(e, StateError::RingOutsideMemory { queue: 0 }),
        "{e}"
    );
    let e = queue(&|q| q.desc += 1);
    assert!(
        matches!(e, StateError::RingOutsideMemory { .. }),
        "misaligned: {e}"
    );
    let e = queue(&|q| q.ready = false);
    assert!(matches!(e, StateError::NoReadyQueue), "{e}");
    assert!(e.to_string().contains("DRIVER_OK"), "{e}");
    let e = queue(&|q| q.next_avail = q.next_used.wrapping_add(17));
    assert!(
        matches!(e, StateError::QueuePosition { in_flight: 17, .. }),
        "{e}"
    );
    let e = queue(&|q| q.event_idx = false);
    assert!(matches!(e, StateError::EventIdx { queue: 0 }), "{e}");
    let e = queue(&|q| q.msix_vector = 2);
    assert!(
        matches!(
            e,
            StateError::Vector {
                vector: 2,
                count: 2
            }
        ),
        "{e}"
    );

    let e = edit(&|s| s.msix.entries.push([0, 0, 0, 1]));
    assert!(
        matches!(
            e,
            StateError::Pci(PciStateError::MsixTableSize {
                saved: 3,
                current: 2
            })
        ),
        "{e}"
    );
    let e = edit(&|s| s.msix.function_masked = true);
    assert!(matches!(e, StateError::MsixControl), "{e}");
    let e = edit(&|s| s.config_space.regs[0] ^= 1);
    assert!(
        matches!(
            e,
            StateError::Pci(PciStateError::ReadOnlyBits { reg: 0, .. })
        ),
        "{e}"
    );
    let e = edit(&|s| s.config_space.regs.truncate(8));
    assert!(
        matches!(e, StateError::Pci(PciStateError::ConfigLength { got: 8 })),
        "{e}"
    );
    let e = edit(&|s| s.config_space.regs[4] = 0xe000_0000);
    assert!(
        matches!(e, StateError::Pci(PciStateError::BarMoved { .. })),
        "{e}"
    );
    let e = edit(&|s| s.common.device_features |= 1 << 5);
    assert!(matches!(e, StateError::Features { .. }), "{e}");
    let e = edit(&|s| s.common.driver_features |= 1 << 5);
    assert!(matches!(e, StateError::AckedFeatures { .. }), "{e}");
    let e = edit(&|s| s.common.queues.push(s.common.queues[0]));
    assert!(
        matches!(
            e,
            StateError::QueueCount {
                saved: 2,
                current: 1,
                ..
            }
        ),
        "{e}"
    );
    let e = edit(&|s| s.device = serde_json::json!({"acked_features": 1, "extra": 2}));
    assert!(
        matches!(
            e,
            StateError::DeviceState {
                device: "virtio-rng",
                ..
            }
        ),
        "{e}"
    );
    let e = edit(&|s| s.device = serde_json::json!({"acked_features": 1u64 << 40}));
    assert!(matches!(e, StateError::AckedFeatures { .. }), "{e}");
    let e = edit(&|s| s.device_type = crate::device_type::BLOCK);
    assert!(
        matches!(
            e,
            StateError::DeviceType {
                saved: 2,
                current: 4
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("virtio-blk here, this VM a virtio-rng"),
        "{e}"
    );

    // What the live transport can reach is accepted: a device that needed a reset keeps
    // waiting for one (its rings are not checked nor served), one before DRIVER_OK is not
    // started, and the untouched state restores.
    let mut s = good.clone();
    s.needs_reset = true;
    s.common.queues[0].desc = 1 << 40;
    let mut f = restored(Box::new(Rng::new()), mem, &s).unwrap();
    f.dev.resume().unwrap();
    assert!(!f.dev.is_active());
    assert_ne!(f.r8(0x14) & status::DEVICE_NEEDS_RESET, 0);
    f.w(0x14, &[0]);
    assert_eq!(f.r8(0x14), 0, "the driver's reset clears it");
    let mut s = good.clone();
    s.common.status &= !status::DRIVER_OK;
    let mut f = restored(Box::new(Rng::new()), mem, &s).unwrap();
    f.dev.resume().unwrap();
    assert!(!f.dev.is_active());
    let mut f = restored(Box::new(Rng::new()), mem, &good).unwrap();
    assert!(!f.dev.is_active(), "quiesced until resumed");
    f.dev.resume().unwrap();
    assert!(f.dev.is_active());
}

/// A device without save/restore (the trait's defaults): an rng under another type.
struct NoSave(Rng);

impl VirtioDevice for NoSave {
    fn device_type(&self) -> u32 {
        0x3f
    }
    fn queue_max_sizes(&self) -> &[u16] {
        self.0.queue_max_sizes()
    }
    fn features(&self) -> u64 {
        self.0.features()
    }
    fn ack_features(&mut self, features: u64) {
        self.0.ack_features(features)
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.0.read_config(offset, data)
    }
    fn activate(
        &mut self,
        mem: crate::Mem,
        interrupt: Arc<dyn crate::Interrupt>,
        queues: Vec<crate::device::DeviceQueue>,
    ) -> Result<(), crate::ActivateError> {
        self.0.activate(mem, interrupt, queues)
    }
    fn reset(&mut self) {
        self.0.reset()
    }
    fn is_active(&self) -> bool {
        self.0.is_active()
    }
}

#[test]
fn devices_without_save_are_refused_and_keep_serving() {
    let mq = MockQueue::new(guest_memory(MEM), 0, 16);
    let mut f = function(Box::new(NoSave(Rng::new())), &mq.mem);
    let e = f.dev.save_state().unwrap_err();
    assert!(
        matches!(
            e,
            StateError::Unsupported {
                device: "virtio device",
                ..
            }
        ),
        "{e}"
    );
    f.set_up(&mq, features::VERSION_1);
    let e = f.dev.save_state().unwrap_err();
    assert!(e.to_string().contains("snapshot a VM without it"), "{e}");
    assert!(f.dev.is_active(), "the refused device keeps serving");
}

/// Leaves of a JSON value, as JSON pointers.
fn leaves(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => m
            .iter()
            .for_each(|(k, v)| leaves(v, format!("{at}/{k}"), out)),
        serde_json::Value::Array(a) => {
            out.push(at.clone()); // the array itself: shortened or lengthened
            a.iter()
                .enumerate()
                .for_each(|(i, v)| leaves(v, format!("{at}/{i}"), out));
        }
        _ => out.push(at),
    }
}

#[test]
fn damaged_states_never_panic() {
    let (good, mq) = saved_rng();
    let good = serde_json::to_value(&good).unwrap();
    let mut paths = Vec::new();
    leaves(&good, String::new(), &mut paths);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut restored_ok, mut refused) = (0, 0);
    for _ in 0..400 {
        let mut v = good.clone();
        for _ in 0..1 + next() % 3 {
            let path = &paths[(next() % paths.len() as u64) as usize];
            let Some(leaf) = v.pointer_mut(path) else {
                continue;
            };
            let r = next();
            *leaf = match leaf {
                serde_json::Value::Array(a) if r % 2 == 0 => {
                    a.truncate(a.len().saturating_sub(1));
                    continue;
                }
                serde_json::Value::Array(a) => {
                    let last = a.last().cloned().unwrap_or_default();
                    a.push(last);
                    continue;
                }
                serde_json::Value::Bool(b) => (!*b).into(),
                _ => [0, 1, 0xff, 0xffff, 1 << 32, r >> (r % 64)][(r % 6) as usize].into(),
            };
        }
        let Ok(state) = serde_json::from_value::<VirtioPciState>(v) else {
            refused += 1;
            continue;
        };
        match restored(Box::new(Rng::new()), &mq.mem, &state) {
            Ok(mut f) => {
                restored_ok += 1;
                let _ = f.dev.resume();
            }
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    assert!(
        restored_ok > 0 && refused > 0,
        "{restored_ok} restored, {refused} refused"
    );
}
