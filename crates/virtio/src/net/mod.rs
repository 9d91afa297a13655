//! virtio-net over a tap device (`--net tap=NAME[,mac=MAC]`).
//!
//! Two queues, receive (0) and transmit (1); no control queue. Every frame on both queues
//! and on the tap carries the 12-byte virtio 1.x header (`virtio_net_hdr_v1`), so frames go
//! between the rings and the tap without rewriting: the tap is opened with `IFF_VNET_HDR` and
//! `TUNSETVNETHDRSZ` 12. Offloads: the device offers checksum offload both ways and TSO4/6
//! (+ECN) both ways; what the driver accepts for its receive side is handed to the tap with
//! `TUNSETOFFLOAD` at activation, so the kernel gives the guest partial checksums or large
//! segments only when the guest takes them. Mergeable receive buffers
//! (`VIRTIO_NET_F_MRG_RXBUF`) let a 64 KiB segment span several small buffers.
//!
//! The worker ([`rx`], [`tx`]) waits on both queues' eventfds and on the tap (edge-triggered):
//! it reads frames until the tap says `EAGAIN` or receive buffers run out (the frame then
//! waits, and the driver's next receive notification resumes), and sends every transmit
//! chain available before raising one interrupt. A chain that breaks the rules (a buffer
//! in the wrong direction, one too small for the header, a frame over [`MAX_FRAME`] bytes,
//! memory outside the guest) is dropped and completed, and counted in [`NetStats`]. A tap
//! that fails (deleted under the VM) is logged once, counted, and reported to the guest as
//! link down (`VIRTIO_NET_F_STATUS`); the guest's packets are dropped from then on.

#[cfg(any(test, feature = "test-utils"))]
pub mod fuzz;
pub mod rx;
pub mod tap;
pub mod tx;

use crate::device::{ActivateError, DeviceQueue, VirtioDevice};
use crate::state::{decode, encode, QueuePosition, StateError};
use crate::worker::{QueueHandler, Service};
use crate::{device_type, features, Interrupt, Mem};
use serde::{Deserialize, Serialize};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use tap::Tap;
use virtio_queue::{Queue, QueueT};

/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// The virtio 1.x net header (`virtio_net_hdr_v1`, `num_buffers` included).
pub const HDR_LEN: usize = 12;
/// The largest Ethernet frame the device moves, header excluded (a 64 KiB GSO segment plus
/// its Ethernet header: what Linux sends with TSO and what the spec's 65550 bytes allow).
pub const MAX_FRAME: usize = 65550;

/// Feature bits of virtio-net (virtio 1.2 §5.1.3).
pub mod net_features {
    /// The device takes packets with partial checksums.
    pub const CSUM: u64 = 1 << 0;
    /// The driver takes packets with partial checksums.
    pub const GUEST_CSUM: u64 = 1 << 1;
    /// The device has a MAC address in its configuration.
    pub const MAC: u64 = 1 << 5;
    /// The driver takes TSOv4 segments.
    pub const GUEST_TSO4: u64 = 1 << 7;
    /// The driver takes TSOv6 segments.
    pub const GUEST_TSO6: u64 = 1 << 8;
    /// The driver takes TSO with ECN.
    pub const GUEST_ECN: u64 = 1 << 9;
    /// The device takes TSOv4 segments.
    pub const HOST_TSO4: u64 = 1 << 11;
    /// The device takes TSOv6 segments.
    pub const HOST_TSO6: u64 = 1 << 12;
    /// The device takes TSO with ECN.
    pub const HOST_ECN: u64 = 1 << 13;
    /// Mergeable receive buffers.
    pub const MRG_RXBUF: u64 = 1 << 15;
    /// The configuration has a link status.
    pub const STATUS: u64 = 1 << 16;
    /// What densevm offers.
    pub const OFFERED: u64 = CSUM
        | GUEST_CSUM
        | MAC
        | GUEST_TSO4
        | GUEST_TSO6
        | GUEST_ECN
        | HOST_TSO4
        | HOST_TSO6
        | HOST_ECN
        | MRG_RXBUF
        | STATUS;
}

/// `status` in the configuration: the link is up.
const LINK_UP: u16 = 1;

/// The `TUN_F_*` offloads for the tap from the features the driver accepted: what the
/// guest's receive side takes (TSO only with checksum offload, as the kernel requires).
pub fn tap_offloads(acked: u64) -> u32 {
    use net_features::*;
    if acked & GUEST_CSUM == 0 {
        return 0;
    }
    let mut f = libc::TUN_F_CSUM;
    if acked & GUEST_TSO4 != 0 {
        f |= libc::TUN_F_TSO4;
    }
    if acked & GUEST_TSO6 != 0 {
        f |= libc::TUN_F_TSO6;
    }
    if acked & GUEST_ECN != 0 && acked & (GUEST_TSO4 | GUEST_TSO6) != 0 {
        f |= libc::TUN_F_TSO_ECN;
    }
    f
}

/// What a net device has done and dropped (read by tests, logs and later the API).
#[derive(Debug, Default)]
pub struct NetStats {
    /// Frames given to the guest.
    pub rx_packets: AtomicU64,
    /// Their bytes (headers excluded).
    pub rx_bytes: AtomicU64,
    /// Frames from the tap dropped (no buffer could ever hold them).
    pub rx_dropped: AtomicU64,
    /// Frames sent to the tap.
    pub tx_packets: AtomicU64,
    /// Their bytes (headers excluded).
    pub tx_bytes: AtomicU64,
    /// Guest frames dropped (malformed chain, oversized, refused by the tap).
    pub tx_dropped: AtomicU64,
    /// Chains that broke the rules (wrong direction, too small, outside memory).
    pub bad_chains: AtomicU64,
    /// Tap reads and writes that failed (other than `EAGAIN`).
    pub tap_errors: AtomicU64,
}

impl NetStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// State shared by the device (configuration reads on vCPU threads) and its worker.
#[derive(Debug)]
pub struct Shared {
    /// Counters.
    pub stats: NetStats,
    /// The configuration's `status` (link up until the tap fails).
    status: AtomicU16,
}

/// The virtio-net device.
pub struct Net {
    tap: Arc<Tap>,
    mac: [u8; 6],
    acked: u64,
    shared: Arc<Shared>,
    worker: Service<Handler>,
}

/// What a snapshot holds of a virtio-net device (its queues are saved by the transport; a
/// frame waiting for a receive buffer is dropped, as a network may).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetState {
    /// Features the driver accepted.
    pub acked_features: u64,
    /// The MAC address the guest saw.
    pub mac: [u8; 6],
}

impl Net {
    /// A device on an open tap with this MAC address, not yet activated.
    pub fn new(tap: Tap, mac: [u8; 6]) -> Self {
        Net {
            tap: Arc::new(tap),
            mac,
            acked: 0,
            shared: Arc::new(Shared {
                stats: NetStats::default(),
                status: AtomicU16::new(LINK_UP),
            }),
            worker: Service::default(),
        }
    }

    /// The counters (shared with the worker).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// The tap's name.
    pub fn tap_name(&self) -> &str {
        self.tap.name()
    }

    fn config(&self) -> [u8; 10] {
        let mut c = [0u8; 10];
        c[..6].copy_from_slice(&self.mac);
        c[6..8].copy_from_slice(&self.shared.status.load(Ordering::Relaxed).to_le_bytes());
        c[8..10].copy_from_slice(&1u16.to_le_bytes()); // max_virtqueue_pairs
        c
    }
}

/// The worker's state: both queues, the tap, the frame waiting for receive buffers.
struct Handler {
    mem: Mem,
    interrupt: Arc<dyn Interrupt>,
    rx_queue: Queue,
    tx_queue: Queue,
    tap: Arc<Tap>,
    shared: Arc<Shared>,
    acked: u64,
    rx: rx::RxState,
    tx_buf: Vec<u8>,
    broken: bool,
    tap_dead: bool,
}

impl Handler {
    /// The tap failed: drop its traffic from now on and tell the guest the link is down.
    fn tap_failed(&mut self, what: &str, e: &std::io::Error) {
        NetStats::add(&self.shared.stats.tap_errors, 1);
        if matches!(
            e.raw_os_error(),
            Some(libc::EBADFD) | Some(libc::ENODEV) | Some(libc::ENXIO) | Some(libc::EIO)
        ) && !self.tap_dead
        {
            tracing::error!(
                "virtio-net: tap '{}' failed on {what} ({e}); the guest's link is down and its packets are dropped (was the tap deleted?)",
                self.tap.name()
            );
            self.tap_dead = true;
            self.shared.status.store(0, Ordering::Relaxed);
            self.interrupt.notify_config();
        } else if NetStats::get(&self.shared.stats.tap_errors) <= 10 {
            tracing::warn!("virtio-net: tap '{}': {what}: {e}", self.tap.name());
        }
    }

    fn handle_rx(&mut self) {
        if self.tap_dead {
            return;
        }
        let mrg = self.acked & net_features::MRG_RXBUF != 0;
        let result = rx::receive(
            &mut self.rx_queue,
            &self.mem,
            &*self.interrupt,
            &self.tap,
            &mut self.rx,
            mrg,
            &self.shared.stats,
        );
        match result {
            Ok(None) => {}
            Ok(Some(e)) => self.tap_failed("read", &e),
            Err(e) => crate::queue::check_ring(
                Err(e),
                "virtio-net rx",
                &mut self.broken,
                &*self.interrupt,
            ),
        }
    }

    fn handle_tx(&mut self) {
        let mut failure = None;
        let dead = self.tap_dead;
        let tap = &self.tap;
        let shared = &self.shared;
        let acked = self.acked;
        let buf = &mut self.tx_buf;
        let mem = &self.mem;
        let result = crate::queue::drain(
            &mut self.tx_queue,
            1,
            &self.mem,
            &*self.interrupt,
            |chain| {
                if let Err(e) = tx::send_chain(chain, mem, buf, tap, acked, &shared.stats, dead) {
                    failure.get_or_insert(e);
                }
                0
            },
        );
        crate::queue::check_ring(result, "virtio-net tx", &mut self.broken, &*self.interrupt);
        if let Some(e) = failure {
            self.tap_failed("write", &e);
        }
    }
}

impl QueueHandler for Handler {
    fn handle_queue(&mut self, index: usize) {
        if self.broken {
            return;
        }
        match index {
            1 => self.handle_tx(),
            // 0: new receive buffers; 2: the tap has frames.
            _ => self.handle_rx(),
        }
    }

    fn poll_fds(&self) -> Vec<std::os::fd::RawFd> {
        vec![self.tap.as_raw_fd()]
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        device_type::NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        features::COMMON | net_features::OFFERED
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features & self.features();
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::device::read_config_bytes(&self.config(), offset, data);
    }

    fn activate(
        &mut self,
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        queues: Vec<DeviceQueue>,
    ) -> Result<(), ActivateError> {
        self.reset();
        if queues.len() != 2 {
            return Err(ActivateError::QueueCount {
                want: 2,
                got: queues.len(),
            });
        }
        let event_idx = self.acked & features::RING_EVENT_IDX != 0;
        let mut events = Vec::with_capacity(2);
        let mut qs = Vec::with_capacity(2);
        for (i, DeviceQueue { mut queue, event }) in queues.into_iter().enumerate() {
            if !queue.is_valid(&mem) {
                return Err(ActivateError::InvalidQueue(i));
            }
            queue.set_event_idx(event_idx);
            events.push(event);
            qs.push(queue);
        }
        let offloads = tap_offloads(self.acked);
        if let Err(e) = self.tap.set_offload(offloads) {
            // The tap keeps its previous offloads (none): the guest still works, with
            // checksums and segmentation done by the host kernel.
            tracing::warn!(
                "virtio-net: tap '{}': TUNSETOFFLOAD {offloads:#x}: {e}",
                self.tap.name()
            );
        }
        self.shared.status.store(LINK_UP, Ordering::Relaxed);
        let tx_queue = qs.pop().expect("two queues");
        let rx_queue = qs.pop().expect("two queues");
        let handler = Handler {
            mem,
            interrupt,
            rx_queue,
            tx_queue,
            tap: self.tap.clone(),
            shared: self.shared.clone(),
            acked: self.acked,
            rx: rx::RxState::new(),
            tx_buf: Vec::new(),
            broken: false,
            tap_dead: false,
        };
        self.worker.start("virtio-net", events, handler)?;
        Ok(())
    }

    fn reset(&mut self) {
        drop(self.worker.stop());
    }

    fn is_active(&self) -> bool {
        self.worker.is_active()
    }

    fn quiesce(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        match self.worker.quiesce() {
            Ok(handler) => Ok(handler
                .map(|h| {
                    [&h.rx_queue, &h.tx_queue]
                        .map(|q| QueuePosition {
                            next_avail: q.next_avail(),
                            next_used: q.next_used(),
                        })
                        .to_vec()
                })
                .unwrap_or_default()),
            Err(_) => Err(StateError::worker_lost(device_type::NET)),
        }
    }

    fn resume(&mut self) -> Result<(), StateError> {
        self.worker.resume().map_err(|source| StateError::Host {
            device: "virtio-net",
            op: "restart the worker thread",
            source,
        })
    }

    fn save_state(&self) -> Result<serde_json::Value, StateError> {
        encode(
            device_type::NET,
            &NetState {
                acked_features: self.acked,
                mac: self.mac,
            },
        )
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), StateError> {
        let s: NetState = decode(device_type::NET, state)?;
        StateError::check_restore(
            device_type::NET,
            self.is_active(),
            s.acked_features,
            self.features(),
        )?;
        if s.mac != self.mac {
            return Err(StateError::device_state(
                device_type::NET,
                format!(
                    "the snapshot's MAC address is {}, this device's {}: restore with the snapshot's --net options",
                    format_mac(&s.mac),
                    format_mac(&self.mac)
                ),
            ));
        }
        self.acked = s.acked_features;
        Ok(())
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff`; refuses multicast (and broadcast) addresses, which no
/// interface may have.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let mut mac = [0u8; 6];
    let ok = parts.len() == 6
        && parts
            .iter()
            .zip(mac.iter_mut())
            .all(|(p, b)| p.len() == 2 && u8::from_str_radix(p, 16).map(|v| *b = v).is_ok());
    if !ok {
        return Err(format!(
            "'{s}' is not a MAC address: give six hex bytes, e.g. 06:00:ac:10:00:02"
        ));
    }
    if mac[0] & 1 != 0 {
        return Err(format!(
            "{s} is a multicast address: the first byte must be even (e.g. 06:00:ac:10:00:02)"
        ));
    }
    if mac == [0; 6] {
        return Err(format!("{s} is all zeros: give a unicast address"));
    }
    Ok(mac)
}

/// A random locally administered unicast MAC address (first byte `x6`/`xa`-style: bit 1
/// set, bit 0 clear).
pub fn random_mac() -> [u8; 6] {
    let mut mac = [0u8; 6];
    // SAFETY: `mac` is a valid writable buffer of 6 bytes for the duration of the call.
    let n = unsafe { libc::getrandom(mac.as_mut_ptr().cast(), mac.len(), 0) };
    if n != 6 {
        // No entropy: a fixed address from the process id (still locally administered).
        mac[2..6].copy_from_slice(&std::process::id().to_be_bytes());
    }
    mac[0] = (mac[0] & 0xfc) | 0x02;
    mac
}

#[cfg(test)]
mod tests;
