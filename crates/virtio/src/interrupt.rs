//! How a device tells the driver something happened, without knowing how interrupts are
//! delivered (the virtio-pci transport turns these into MSI-X messages through irqfds).

/// Interrupts a device can raise.
pub trait Interrupt: Send + Sync {
    /// The device put buffers in the used ring of queue `queue`.
    fn notify_queue(&self, queue: u16);
    /// The device's configuration space changed.
    fn notify_config(&self);
    /// The device hit an error it cannot recover from (a malformed ring, guest memory it
    /// cannot reach): it stops serving until the driver resets it. The transport sets
    /// `DEVICE_NEEDS_RESET` in the device status and raises a configuration interrupt.
    fn needs_reset(&self);
}

/// An [`Interrupt`] that records what was raised, for tests.
#[derive(Debug, Default)]
pub struct RecordingInterrupt {
    /// Queue notifications, in order.
    pub queues: std::sync::Mutex<Vec<u16>>,
    /// Configuration interrupts.
    pub config: std::sync::atomic::AtomicU32,
    /// needs_reset calls.
    pub resets: std::sync::atomic::AtomicU32,
}

impl Interrupt for RecordingInterrupt {
    fn notify_queue(&self, queue: u16) {
        self.queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(queue);
    }
    fn notify_config(&self) {
        self.config
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn needs_reset(&self) {
        self.resets
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}
