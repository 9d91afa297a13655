//! Taking requests off a virtqueue and giving them back: the one place densevm walks a
//! virtqueue's rings, all through rust-vmm's `virtio-queue` (which bounds chains to the
//! queue size, refuses an available index that runs ahead of the queue, and checks every
//! buffer against guest memory).

use crate::{Interrupt, Mem};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};

/// A ring the driver corrupted: the device stops until it is reset.
pub type RingError = virtio_queue::Error;

/// Serves every chain the driver made available on `queue`, in order: `serve` handles one
/// chain and returns the number of bytes it wrote into the chain's writable buffers. Each
/// chain is returned in the used ring; with `VIRTIO_RING_F_EVENT_IDX` notifications are
/// suppressed while serving and the queue is re-checked after re-enabling them, so no request
/// is left behind. Raises the queue's interrupt when the driver wants one.
///
/// Returns how many chains were served, or the ring error that makes the device need a reset
/// (the interrupt for the chains served before it is still raised).
pub fn drain(
    queue: &mut Queue,
    index: u16,
    mem: &Mem,
    interrupt: &dyn Interrupt,
    mut serve: impl FnMut(DescriptorChain<&Mem>) -> u32,
) -> Result<usize, RingError> {
    let mut served = 0usize;
    let result = (|| loop {
        queue.disable_notification(mem)?;
        while let Some(chain) = queue.iter(mem)?.next() {
            let head = chain.head_index();
            let len = serve(chain);
            queue.add_used(mem, head, len)?;
            served += 1;
        }
        if !queue.enable_notification(mem)? {
            return Ok(());
        }
    })();
    if served > 0 && queue.needs_notification(mem).unwrap_or(true) {
        interrupt.notify_queue(index);
    }
    result.map(|()| served)
}

/// Returns one chain served outside [`drain`] (a request completed later, e.g. on another
/// thread) and raises the interrupt when the driver wants one.
pub fn complete(
    queue: &mut Queue,
    index: u16,
    mem: &Mem,
    interrupt: &dyn Interrupt,
    head: u16,
    len: u32,
) -> Result<(), RingError> {
    queue.add_used(mem, head, len)?;
    if queue.needs_notification(mem).unwrap_or(true) {
        interrupt.notify_queue(index);
    }
    Ok(())
}

/// Pops the next available chain, or `None` when the ring is empty. Unlike
/// `Queue::pop_descriptor_chain`, a corrupt available index is an error, not "empty".
pub fn pop<'m>(
    queue: &mut Queue,
    mem: &'m Mem,
) -> Result<Option<DescriptorChain<&'m Mem>>, RingError> {
    Ok(queue.iter(mem)?.next())
}

/// What a device's worker does with the result of serving its ring: a ring error marks the
/// device broken (it serves nothing more until reset) and asks the driver for a reset.
pub fn check_ring(
    result: Result<usize, RingError>,
    device: &str,
    broken: &mut bool,
    interrupt: &dyn Interrupt,
) {
    if let Err(e) = result {
        tracing::warn!("{device}: the driver corrupted the queue ({e}); the device needs a reset");
        *broken = true;
        interrupt.needs_reset();
    }
}
