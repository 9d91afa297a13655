//! A mock driver for device tests and the fuzz target: guest memory, a split virtqueue laid
//! out by `virtio-queue`'s mock helpers, chains built from buffers, and the used ring read
//! back. Hostile layouts (loops, buffers outside memory, wrong directions) are built with
//! [`MockQueue::set_desc`] and [`MockQueue::publish`].

use crate::{DeviceQueue, Mem};
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// Guest memory of `size` bytes at guest-physical 0.
pub fn guest_memory(size: usize) -> Mem {
    Mem::from_ranges(&[(GuestAddress(0), size)]).expect("test guest memory")
}

/// One queue of a mock driver.
pub struct MockQueue {
    /// The guest memory the queue and its buffers live in.
    pub mem: Mem,
    base: GuestAddress,
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    next_desc: u16,
    next_data: u64,
}

/// Where buffers are allocated from: past the rings of any test queue.
const DATA_START: u64 = 0x10_0000;

impl MockQueue {
    /// A queue of `size` entries with its rings at `base` in `mem`, zeroed: the descriptor
    /// table, then the available ring, then the used ring (4-byte aligned), each with room
    /// for its event field. (`virtio-queue` 0.18's `MockSplitQueue` places the used ring
    /// `size` bytes after the available ring's entries instead of `2 * size + 2`, so it
    /// overlaps their second half and `used_event`.)
    pub fn new(mem: Mem, base: u64, size: u16) -> Self {
        let n = u64::from(size);
        let desc = base;
        let avail = desc + 16 * n;
        let used = (avail + 6 + 2 * n).next_multiple_of(4);
        let end = used + 6 + 8 * n;
        mem.write_slice(&vec![0u8; (end - base) as usize], GuestAddress(base))
            .expect("rings in memory");
        Self {
            mem,
            base: GuestAddress(base),
            size,
            desc,
            avail,
            used,
            next_desc: 0,
            next_data: DATA_START + base,
        }
    }

    /// Sets `used_event` (`VIRTIO_RING_F_EVENT_IDX`): the driver wants an interrupt once the
    /// used index passes `idx`.
    pub fn set_used_event(&self, idx: u16) {
        self.set_u16(self.avail + 4 + 2 * u64::from(self.size), idx);
    }

    fn u16_at(&self, addr: u64) -> u16 {
        self.mem
            .read_obj::<u16>(GuestAddress(addr))
            .expect("ring in memory")
    }

    fn set_u16(&self, addr: u64, v: u16) {
        self.mem
            .write_obj(v, GuestAddress(addr))
            .expect("ring in memory");
    }

    /// The device side of this queue, set up as a driver would.
    pub fn queue(&self) -> Queue {
        let mut q = Queue::new(self.size).expect("mock queue size");
        q.set_size(self.size);
        q.set_desc_table_address(Some(self.desc as u32), Some((self.desc >> 32) as u32));
        q.set_avail_ring_address(Some(self.avail as u32), Some((self.avail >> 32) as u32));
        q.set_used_ring_address(Some(self.used as u32), Some((self.used >> 32) as u32));
        q.set_ready(true);
        let _ = self.base;
        q
    }

    /// Where the descriptor table, available ring and used ring are.
    pub fn ring_addresses(&self) -> (u64, u64, u64) {
        (self.desc, self.avail, self.used)
    }

    /// The device side with a fresh notification eventfd.
    pub fn device_queue(&self) -> DeviceQueue {
        DeviceQueue {
            queue: self.queue(),
            event: EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
        }
    }

    /// Reserves `len` bytes of guest memory for a buffer (16-byte aligned).
    pub fn alloc(&mut self, len: u32) -> u64 {
        let addr = self.next_data;
        self.next_data = (addr + u64::from(len.max(1))).next_multiple_of(16);
        addr
    }

    /// Writes `data` into guest memory at `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) {
        self.mem
            .write_slice(data, GuestAddress(addr))
            .expect("write guest memory");
    }

    /// Reads `len` bytes of guest memory at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .read_slice(&mut v, GuestAddress(addr))
            .expect("read guest memory");
        v
    }

    /// Stores a raw descriptor at table index `index`.
    pub fn set_desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        assert!(index < self.size, "descriptor index within the table");
        let desc = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next));
        self.mem
            .write_obj(desc, GuestAddress(self.desc + 16 * u64::from(index)))
            .expect("descriptor table in memory");
    }

    /// Makes the chain starting at `head` available to the device.
    pub fn publish(&self, head: u16) {
        let idx = self.u16_at(self.avail + 2);
        self.set_u16(self.avail + 4 + 2 * u64::from(idx % self.size), head);
        self.set_u16(self.avail + 2, idx.wrapping_add(1));
    }

    /// Sets the available index directly (a driver that lies about it).
    pub fn set_avail_idx(&self, idx: u16) {
        self.set_u16(self.avail + 2, idx);
    }

    /// Builds a chain from `(addr, len, device_writable)` buffers at the next free
    /// descriptors and publishes it; returns its head index.
    pub fn add_chain(&mut self, bufs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, writable)) in bufs.iter().enumerate() {
            let index = (head + i as u16) % self.size;
            let mut flags = if writable { VRING_DESC_F_WRITE } else { 0 } as u16;
            let next = (index + 1) % self.size;
            if i + 1 < bufs.len() {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            self.set_desc(index, addr, len, flags, next);
        }
        self.next_desc = (head + bufs.len() as u16) % self.size;
        self.publish(head);
        head
    }

    /// Allocates a driver-readable buffer holding `data` and a device-writable buffer of
    /// `writable` bytes per entry of `out_lens`, chains them (readable first) and publishes
    /// the chain. Returns the head and the writable buffers' addresses.
    pub fn add_request(&mut self, data: &[&[u8]], out_lens: &[u32]) -> (u16, Vec<u64>) {
        let mut bufs = Vec::new();
        for d in data {
            let addr = self.alloc(d.len() as u32);
            self.write(addr, d);
            bufs.push((addr, d.len() as u32, false));
        }
        let mut outs = Vec::new();
        for &len in out_lens {
            let addr = self.alloc(len);
            outs.push(addr);
            bufs.push((addr, len, true));
        }
        (self.add_chain(&bufs), outs)
    }

    /// The used ring so far: `(head, bytes written)` per completed chain.
    pub fn used(&self) -> Vec<(u32, u32)> {
        let n = self.u16_at(self.used + 2);
        (0..n)
            .map(|i| {
                let at = GuestAddress(self.used + 4 + 8 * u64::from(i % self.size));
                let id = self.mem.read_obj::<u32>(at).expect("used ring in memory");
                let len = self
                    .mem
                    .read_obj::<u32>(GuestAddress(at.0 + 4))
                    .expect("used ring in memory");
                (id, len)
            })
            .collect()
    }
}

/// MSI routes that record every route the transport programs, in order (tests of the
/// virtio-pci transport and its saved state).
#[derive(Default)]
pub struct RecordingRoutes(pub std::sync::Mutex<Vec<(u32, densevm_devices::pci::MsiMessage)>>);

impl densevm_devices::pci::MsiRoutes for RecordingRoutes {
    fn set_route(&self, gsi: u32, msg: densevm_devices::pci::MsiMessage) -> std::io::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((gsi, msg));
        Ok(())
    }
}
