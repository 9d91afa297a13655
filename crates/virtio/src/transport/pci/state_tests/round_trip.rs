//! Devices across a save and a restore over the same guest memory: the restored function
//! continues the driver's rings where the saved one stopped (no request lost or completed
//! twice), its interrupts arrive on the saved vectors, and the source serves on after a save.

use super::*;
use crate::block::{Block, BlockConfig, ImageFormat};
use virtio_bindings::bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};

const SECTOR: usize = 512;

fn header(kind: u32, sector: u64) -> Vec<u8> {
    let mut h = kind.to_le_bytes().to_vec();
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&sector.to_le_bytes());
    h
}

fn sector_data(seed: u8) -> Vec<u8> {
    (0..SECTOR).map(|i| seed ^ (i as u8)).collect()
}

/// A request in the ring: its head and the addresses to check once it completes.
struct Request {
    head: u16,
    /// Status byte address.
    status: u64,
    /// Data read (IN requests).
    data: Option<u64>,
}

fn write(mq: &mut MockQueue, sector: u64, seed: u8) -> Request {
    let (head, outs) = mq.add_request(
        &[&header(VIRTIO_BLK_T_OUT, sector), &sector_data(seed)],
        &[1],
    );
    Request {
        head,
        status: outs[0],
        data: None,
    }
}

fn read(mq: &mut MockQueue, sector: u64) -> Request {
    let (head, outs) = mq.add_request(&[&header(VIRTIO_BLK_T_IN, sector)], &[SECTOR as u32, 1]);
    Request {
        head,
        status: outs[1],
        data: Some(outs[0]),
    }
}

/// Waits until `n` chains are used; checks the last ones are `reqs`, in order, completed OK.
fn completed(mq: &MockQueue, n: usize, reqs: &[&Request]) {
    assert!(wait_for(|| mq.used().len() >= n), "{n} requests complete");
    std::thread::sleep(Duration::from_millis(20));
    let used = mq.used();
    assert_eq!(used.len(), n, "nothing completed twice");
    for (u, r) in used[n - reqs.len()..].iter().zip(reqs) {
        let len = if r.data.is_some() { SECTOR + 1 } else { 1 };
        assert_eq!(*u, (u32::from(r.head), len as u32));
        assert_eq!(mq.read(r.status, 1), [VIRTIO_BLK_S_OK as u8]);
    }
}

fn open(path: &std::path::Path) -> Box<Block> {
    let cfg = BlockConfig {
        path: path.to_path_buf(),
        readonly: false,
        format: ImageFormat::Raw,
    };
    Box::new(Block::open(cfg).unwrap())
}

#[test]
fn blk_continues_on_a_restored_function_and_on_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.raw");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(1 << 20))
        .unwrap();
    let mut mq = MockQueue::new(guest_memory(MEM), 0, 16);
    let mut a = function(open(&disk), &mq.mem);
    a.set_up(&mq, features::VERSION_1 | 1 << VIRTIO_BLK_F_FLUSH);
    assert_eq!(a.routed(), [(0, msg(0)), (1, msg(1))]);

    let w0 = write(&mut mq, 0, 1);
    let w8 = write(&mut mq, 8, 2);
    a.notify();
    completed(&mq, 2, &[&w0, &w8]);
    let r0 = read(&mut mq, 0);
    a.notify();
    completed(&mq, 3, &[&r0]);
    assert_eq!(mq.read(r0.data.unwrap(), SECTOR), sector_data(1));
    assert!(a.queue_interrupt());

    // Save while idle; the source resumes and serves on.
    let first = a.dev.save_state().unwrap();
    let q = first.common.queues[0];
    assert_eq!((q.next_avail, q.next_used), (3, 3));
    a.dev.resume().unwrap();
    let w16 = write(&mut mq, 16, 3);
    a.notify();
    completed(&mq, 4, &[&w16]);
    assert!(a.queue_interrupt());

    // Save again and leave the source parked: a request the driver makes available now
    // (its notification reaches the parked source) is served by the restored function.
    let state = a.dev.save_state().unwrap();
    assert_eq!(state.common.queues[0].next_used, 4);
    let state: VirtioPciState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let r8 = read(&mut mq, 8);
    a.notify();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(mq.used().len(), 4, "a quiesced device serves nothing");

    let mut b = restored(open(&disk), &mq.mem, &state).unwrap();
    let ok = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK;
    assert_eq!(b.r8(0x14), ok, "no reset seen by the driver");
    assert_eq!(
        b.routed(),
        [(0, msg(0)), (1, msg(1))],
        "both vectors routed again, at the new VM's GSIs"
    );
    b.notify();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(mq.used().len(), 4, "nothing served before resume");
    assert!(!b.queue_interrupt());
    b.dev.resume().unwrap();
    assert!(b.dev.is_active());
    completed(&mq, 5, &[&r8]);
    assert_eq!(mq.read(r8.data.unwrap(), SECTOR), sector_data(2));
    assert!(wait_for(|| b.queue_interrupt()), "on the saved vector 1");

    let w24 = write(&mut mq, 24, 4);
    let r16 = read(&mut mq, 16);
    b.notify();
    completed(&mq, 7, &[&w24, &r16]);
    assert_eq!(
        mq.read(r16.data.unwrap(), SECTOR),
        sector_data(3),
        "the source's write"
    );
    assert!(wait_for(|| b.queue_interrupt()));
    assert!(!a.queue_interrupt(), "the parked source raised nothing");
    let heads: Vec<u32> = mq.used().iter().map(|u| u.0).collect();
    let want: Vec<u32> = [&w0, &w8, &r0, &w16, &r8, &w24, &r16]
        .iter()
        .map(|r| u32::from(r.head))
        .collect();
    assert_eq!(heads, want, "every request once, in ring order");

    // The restored device's state is the disk's too: another size is refused.
    std::fs::File::options()
        .write(true)
        .open(&disk)
        .and_then(|f| f.set_len(2 << 20))
        .unwrap();
    let e = restored(open(&disk), &mq.mem, &state).err().unwrap();
    assert!(
        matches!(
            e,
            StateError::DeviceState {
                device: "virtio-blk",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("snapshot's disk image"), "{e}");
}

#[test]
fn rng_continues_on_a_restored_function() {
    let (state, mut mq) = saved_rng();
    let mut b = restored(Box::new(Rng::new()), &mq.mem, &state).unwrap();
    assert_eq!(
        b.dev.save_state().unwrap(),
        state,
        "a restored function, saved before it ran, saves what it was restored from"
    );
    b.dev.resume().unwrap();
    assert!(b.dev.is_active());
    // EVENT_IDX: the driver asks for an interrupt after the next used entry.
    mq.set_used_event(1);
    let (head, outs) = mq.add_request(&[], &[64]);
    b.notify();
    assert!(wait_for(|| mq.used().len() == 2));
    assert_eq!(
        mq.used()[1],
        (u32::from(head), 64),
        "used index continues at 1"
    );
    assert!(mq.read(outs[0], 64).iter().any(|&x| x != 0));
    assert!(
        wait_for(|| b.queue_interrupt()),
        "interrupt on the saved vector"
    );
    // Saved again from the restored function: positions went on.
    let again = b.dev.save_state().unwrap();
    assert_eq!(again.common.queues[0].next_used, 2);
    assert_eq!(again.msix, state.msix);
}
