use super::*;
use crate::interrupt::RecordingInterrupt;
use crate::testing::{guest_memory, MockQueue};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const MEM: usize = 4 << 20;

fn mock() -> MockQueue {
    MockQueue::new(guest_memory(MEM), 0, QUEUE_SIZE)
}

#[test]
fn fills_writable_buffers_with_fresh_bytes() {
    let mut mq = mock();
    let mut q = mq.queue();
    let irq = RecordingInterrupt::default();
    let (h1, out1) = mq.add_request(&[], &[512]);
    let (h2, out2) = mq.add_request(&[], &[512]);
    assert_eq!(process_queue(&mut q, &mq.mem, &irq).unwrap(), 2);
    assert_eq!(mq.used(), vec![(u32::from(h1), 512), (u32::from(h2), 512)]);
    let a = mq.read(out1[0], 512);
    let b = mq.read(out2[0], 512);
    assert!(a.iter().any(|&x| x != 0), "all zero");
    assert_ne!(a, b, "two requests got the same bytes");
    assert_eq!(*irq.queues.lock().unwrap(), vec![0]);
}

#[test]
fn fills_every_writable_buffer_of_a_chain() {
    let mut mq = mock();
    let mut q = mq.queue();
    let irq = RecordingInterrupt::default();
    let (h, outs) = mq.add_request(&[], &[100, 300]);
    process_queue(&mut q, &mq.mem, &irq).unwrap();
    assert_eq!(mq.used(), vec![(u32::from(h), 400)]);
    // The last 64 bytes of each buffer: all zero with probability 2^-512.
    assert!(mq.read(outs[0] + 36, 64).iter().any(|&x| x != 0));
    assert!(mq.read(outs[1] + 236, 64).iter().any(|&x| x != 0));
}

#[test]
fn caps_bytes_per_request() {
    let mut mq = mock();
    let mut q = mq.queue();
    let irq = RecordingInterrupt::default();
    let (h, outs) = mq.add_request(&[], &[(MAX_PER_REQUEST * 2) as u32]);
    process_queue(&mut q, &mq.mem, &irq).unwrap();
    assert_eq!(mq.used(), vec![(u32::from(h), MAX_PER_REQUEST as u32)]);
    // Nothing past the cap was touched.
    assert!(mq
        .read(outs[0] + MAX_PER_REQUEST as u64, 4096)
        .iter()
        .all(|&x| x == 0));
}

#[test]
fn readable_only_chain_gets_nothing() {
    let mut mq = mock();
    let mut q = mq.queue();
    let irq = RecordingInterrupt::default();
    let data = [0xaau8; 64];
    let (h, _) = mq.add_request(&[&data], &[]);
    process_queue(&mut q, &mq.mem, &irq).unwrap();
    assert_eq!(mq.used(), vec![(u32::from(h), 0)]);
}

#[test]
fn buffer_outside_memory_gets_nothing_and_the_queue_goes_on() {
    let mut mq = mock();
    let mut q = mq.queue();
    let irq = RecordingInterrupt::default();
    let bad = mq.add_chain(&[(MEM as u64 - 16, 64, true)]);
    let (good, _) = mq.add_request(&[], &[32]);
    assert_eq!(process_queue(&mut q, &mq.mem, &irq).unwrap(), 2);
    assert_eq!(mq.used(), vec![(u32::from(bad), 0), (u32::from(good), 32)]);
    assert_eq!(irq.resets.load(Ordering::SeqCst), 0);
}

#[test]
fn avail_index_far_ahead_is_a_ring_error() {
    let mq = mock();
    let mut q = mq.queue();
    let irq = RecordingInterrupt::default();
    mq.set_avail_idx(QUEUE_SIZE + 5);
    assert!(process_queue(&mut q, &mq.mem, &irq).is_err());
    assert!(mq.used().is_empty());
}

fn wait_used(mq: &MockQueue, n: usize) -> Vec<(u32, u32)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let used = mq.used();
        if used.len() >= n {
            return used;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} chains came back",
            used.len()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn device_serves_on_its_worker_and_resets() {
    let mut mq = mock();
    let mut dev = Rng::new();
    assert_eq!(dev.device_type(), 4);
    assert_eq!(dev.queue_max_sizes(), &[QUEUE_SIZE]);
    assert_eq!(dev.features(), features::COMMON);
    dev.ack_features(dev.features());
    let dq = mq.device_queue();
    let kick = dq.event.try_clone().unwrap();
    let irq = Arc::new(RecordingInterrupt::default());
    dev.activate(mq.mem.clone(), irq.clone(), vec![dq]).unwrap();
    assert!(dev.is_active());
    let (h, _) = mq.add_request(&[], &[16]);
    kick.write(1).unwrap();
    assert_eq!(wait_used(&mq, 1), vec![(u32::from(h), 16)]);
    dev.reset();
    assert!(!dev.is_active());
    // Reset stopped serving: a new chain stays unanswered.
    mq.add_request(&[], &[16]);
    kick.write(1).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(mq.used().len(), 1);
}

#[test]
fn device_needs_reset_after_a_ring_error() {
    let mq = mock();
    let mut dev = Rng::new();
    let irq = Arc::new(RecordingInterrupt::default());
    mq.set_avail_idx(QUEUE_SIZE * 2);
    dev.activate(mq.mem.clone(), irq.clone(), vec![mq.device_queue()])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while irq.resets.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no needs_reset");
        std::thread::sleep(Duration::from_millis(2));
    }
    dev.reset();
    assert_eq!(irq.resets.load(Ordering::SeqCst), 1);
}

#[test]
fn activation_wants_one_queue() {
    let mq = mock();
    let mut dev = Rng::new();
    let irq = Arc::new(RecordingInterrupt::default());
    let err = dev
        .activate(
            mq.mem.clone(),
            irq,
            vec![mq.device_queue(), mq.device_queue()],
        )
        .unwrap_err();
    assert!(matches!(err, ActivateError::QueueCount { want: 1, got: 2 }));
    assert!(!dev.is_active());
}
