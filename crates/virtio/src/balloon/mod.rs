//! virtio-balloon (virtio 1.2 §5.5): the host asks the guest for memory back, and the guest
//! hands over pages it frees.
//!
//! - `mod.rs` — [`Balloon`]: features, configuration space, the queue layout, activation,
//!   reset, save/restore;
//! - `handle.rs` — [`BalloonHandle`], what the VMM and its API keep: the target, `actual`,
//!   statistics, counters; the state shared with the device and its worker;
//! - `config.rs` — [`BalloonConfig`] and the API-shaped update bodies (Firecracker's names);
//! - `stats.rs` — the statistics buffer (tags, parsing) and [`BalloonStats`];
//! - `request.rs` — the page queues: inflate/deflate PFN arrays and free page reports,
//!   checked against guest memory and coalesced into ranges for [`BalloonMemory`];
//! - `serve.rs` — the worker's handler: every queue, the held statistics buffer and its timer;
//! - `state.rs` — [`BalloonState`], what a snapshot holds.
//!
//! The device never touches host memory itself: the VMM implements [`BalloonMemory`]
//! (`MADV_DONTNEED`/`MADV_REMOVE` as each region's backing needs). Every range handed to it
//! is 4 KiB aligned, non-empty and inside one guest memory region.
//!
//! # Queue numbering (checked against Linux)
//! The spec lists inflateq 0, deflateq 1, statsq 2, free_page_vq 3, reporting_vq 4, each
//! of the last three existing only with its feature. Linux's `virtio_balloon.c`
//! (`init_vqs`, unchanged from 5.x through 6.1 and mainline) names a queue only when its
//! feature was negotiated, and the transports' `find_vqs` (`vp_find_vqs_msix`/`_intx` in
//! `virtio_pci_common.c`: `if (!name) continue; ... vp_setup_vq(vdev, queue_idx++, ...)`)
//! number the *named* queues consecutively. So the driver's queue indexes are: inflate 0,
//! deflate 1, then stats if `STATS_VQ` was negotiated, then free-page-hint if negotiated
//! (densevm never offers it), then reporting if `REPORTING` was negotiated — e.g. reporting
//! alone is queue 2. A 2024 patch ("virtio: fix vq # for balloon") proposed the fixed
//! numbering and was not merged; QEMU, Firecracker and cloud-hypervisor number as Linux
//! does. The device therefore offers `2 + stats + reporting` queues and, at activation,
//! derives the layout from the features the driver accepted ([`QueueLayout`]); queues past
//! the layout stay unused.
//!
//! # Guest behaviour that matters here (Linux 6.1)
//! - The driver writes `actual` after every inflate/deflate step; it reads `num_pages` at
//!   probe and on every configuration interrupt ([`BalloonHandle::set_target_pages`] raises
//!   one).
//! - The reporting queue must hold at least 32 entries (`PAGE_REPORTING_CAPACITY`) or the
//!   driver fails to probe; reports are device-writable buffers of whole free blocks
//!   (order ≥ 9 on x86: 2–4 MiB) and the driver waits for each batch to come back.
//! - A guest with page poisoning or `init_on_free` drops `REPORTING` unless `PAGE_POISON`
//!   is offered (densevm does not offer it: released pages read back as zeroes or as the
//!   clone template's data, which such a guest would notice).
//! - Without `DEFLATE_ON_OOM` the driver takes inflated pages out of its managed count;
//!   with it, its OOM notifier deflates 256 pages at a time through the deflate queue.

mod config;
#[cfg(any(test, feature = "test-utils"))]
pub mod fuzz;
mod handle;
mod request;
mod serve;
mod state;
pub mod stats;
#[cfg(test)]
mod tests;

pub use config::{BalloonConfig, BalloonStatsUpdate, BalloonUpdate};
pub use handle::{BalloonCounters, BalloonError, BalloonHandle, StatsReport};
pub use state::BalloonState;
pub use stats::{BalloonStats, GuestStats};

use crate::device::{read_config_bytes, ActivateError, DeviceQueue, VirtioDevice};
use crate::state::{QueuePosition, StateError};
use crate::worker::Service;
use crate::{device_type, features, Interrupt, Mem};
use handle::Shared;
use serve::Handler;
use std::sync::Arc;
use virtio_queue::QueueT;

/// Size of every queue (the reporting queue needs at least 32).
pub const QUEUE_SIZE: u16 = 256;

/// Bytes per balloon page: PFNs on the inflate and deflate queues count 4 KiB units
/// (`VIRTIO_BALLOON_PFN_SHIFT`), whatever the guest's page size.
pub const PAGE_SIZE: u64 = 4096;
/// log2 of [`PAGE_SIZE`].
pub const PFN_SHIFT: u32 = 12;
/// Balloon pages per MiB.
pub const PAGES_PER_MIB: u32 = 256;

/// Feature bits (virtio 1.2 §5.5.3).
pub mod feature {
    /// VIRTIO_BALLOON_F_MUST_TELL_HOST (never offered: the host needs no notice before
    /// the guest reuses a deflated page).
    pub const MUST_TELL_HOST: u64 = 1 << 0;
    /// VIRTIO_BALLOON_F_STATS_VQ: the statistics queue.
    pub const STATS_VQ: u64 = 1 << 1;
    /// VIRTIO_BALLOON_F_DEFLATE_ON_OOM: the guest deflates when it runs out of memory.
    pub const DEFLATE_ON_OOM: u64 = 1 << 2;
    /// VIRTIO_BALLOON_F_FREE_PAGE_HINT (never offered).
    pub const FREE_PAGE_HINT: u64 = 1 << 3;
    /// VIRTIO_BALLOON_F_PAGE_POISON (never offered).
    pub const PAGE_POISON: u64 = 1 << 4;
    /// VIRTIO_BALLOON_F_REPORTING: free page reporting.
    pub const REPORTING: u64 = 1 << 5;
}

/// Configuration space length: `num_pages`, `actual`, `free_page_hint_cmd_id`,
/// `poison_val`, each a little-endian u32.
pub const CONFIG_LEN: usize = 16;
const OFF_ACTUAL: usize = 4;
const OFF_POISON: usize = 12;

/// Which queue index serves what, for one set of accepted features (see the module
/// documentation on numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    /// The statistics queue's index, when `STATS_VQ` was accepted.
    pub stats: Option<usize>,
    /// The reporting queue's index, when `REPORTING` was accepted.
    pub reporting: Option<usize>,
}

impl QueueLayout {
    /// The inflate queue's index.
    pub const INFLATE: usize = 0;
    /// The deflate queue's index.
    pub const DEFLATE: usize = 1;

    /// The layout Linux sets up for `acked` features: named queues numbered consecutively.
    pub fn for_features(acked: u64) -> Self {
        let mut next = 2;
        let mut take = |wanted: bool| {
            wanted.then(|| {
                next += 1;
                next - 1
            })
        };
        let stats = take(acked & feature::STATS_VQ != 0);
        // FREE_PAGE_HINT would come here; it is never offered, so never accepted.
        let _ = take(acked & feature::FREE_PAGE_HINT != 0);
        let reporting = take(acked & feature::REPORTING != 0);
        Self { stats, reporting }
    }

    /// How many queues the driver uses.
    pub fn count(&self) -> usize {
        2 + usize::from(self.stats.is_some()) + usize::from(self.reporting.is_some())
    }
}

/// The virtio-balloon device.
pub struct Balloon {
    shared: Arc<Shared>,
    memory: Arc<dyn BalloonMemory>,
    offered: u64,
    acked: u64,
    queue_sizes: Vec<u16>,
    worker: Service<Handler>,
    /// Restored from a snapshot, applied at the next activation: the statistics buffer
    /// the device held.
    restored_stats_head: Option<u16>,
    /// Restored from a snapshot: the driver rereads the configuration once the device runs.
    restored: bool,
}

/// Where released guest memory goes: the VMM's side of the balloon.
///
/// Called on the device's worker thread. Every range is 4 KiB aligned, at least one page
/// long, and lies inside one guest memory region (the device checked it against the guest
/// memory it was activated with; pages outside it never get here). An error is counted
/// ([`BalloonCounters::release_errors`]) and logged; the guest is not told (it cannot do
/// anything about it).
pub trait BalloonMemory: Send + Sync {
    /// The guest gave `len` bytes at guest-physical `gpa` back: the host may drop them
    /// (the guest reads zeroes, or whatever the backing shows, when it uses them again).
    fn release(&self, gpa: u64, len: u64) -> std::io::Result<()>;
    /// The guest takes ballooned memory back (deflate). Usually nothing to do: the next
    /// touch faults a page in.
    fn reclaim(&self, _gpa: u64, _len: u64) -> std::io::Result<()> {
        Ok(())
    }
}

impl Balloon {
    /// A device for `config`, releasing memory through `memory`, and the handle the VMM
    /// keeps. `config.amount_mib` is the initial target.
    pub fn new(
        config: &BalloonConfig,
        memory: Arc<dyn BalloonMemory>,
    ) -> Result<(Self, BalloonHandle), BalloonError> {
        let mut offered = features::COMMON;
        if config.stats_polling_interval_s > 0 {
            offered |= feature::STATS_VQ;
        }
        if config.deflate_on_oom {
            offered |= feature::DEFLATE_ON_OOM;
        }
        if config.free_page_reporting {
            offered |= feature::REPORTING;
        }
        let shared = Arc::new(Shared::new(config)?);
        let queues = QueueLayout::for_features(offered).count();
        let device = Self {
            shared: shared.clone(),
            memory,
            offered,
            acked: 0,
            queue_sizes: vec![QUEUE_SIZE; queues],
            worker: Service::Idle,
            restored_stats_head: None,
            restored: false,
        };
        Ok((device, BalloonHandle::new(shared)))
    }

    /// Another handle on this device.
    pub fn handle(&self) -> BalloonHandle {
        BalloonHandle::new(self.shared.clone())
    }

    /// The configuration space as the driver reads it.
    fn config_bytes(&self) -> [u8; CONFIG_LEN] {
        self.shared.config_bytes()
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        device_type::BALLOON
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        self.offered
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features & self.offered;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config_bytes(), offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Only `actual` and `poison_val` are the driver's; bytes elsewhere are ignored.
        let mut c = self.config_bytes();
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        for (i, &b) in data.iter().enumerate() {
            let Some(at) = start.checked_add(i) else {
                break;
            };
            let writable = (OFF_ACTUAL..OFF_ACTUAL + 4).contains(&at)
                || (OFF_POISON..OFF_POISON + 4).contains(&at);
            if writable {
                c[at] = b;
            }
        }
        let word = |at: usize| u32::from_le_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]]);
        self.shared.set_actual(word(OFF_ACTUAL));
        self.shared.set_poison_val(word(OFF_POISON));
    }

    fn activate(
        &mut self,
        mem: Mem,
        interrupt: Arc<dyn Interrupt>,
        queues: Vec<DeviceQueue>,
    ) -> Result<(), ActivateError> {
        let stats_head = self.restored_stats_head.take();
        let restored = std::mem::take(&mut self.restored);
        self.reset();
        let layout = QueueLayout::for_features(self.acked);
        let want = layout.count();
        if queues.len() < want {
            return Err(ActivateError::QueueCount {
                want,
                got: queues.len(),
            });
        }
        let event_idx = self.acked & features::RING_EVENT_IDX != 0;
        let mut events = Vec::with_capacity(want + 1);
        let mut qs = Vec::with_capacity(queues.len());
        for (i, DeviceQueue { mut queue, event }) in queues.into_iter().enumerate() {
            if i < want {
                if !queue.ready() || !queue.is_valid(&mem) {
                    return Err(ActivateError::InvalidQueue(i));
                }
                queue.set_event_idx(event_idx);
                events.push(event);
            }
            qs.push(queue);
        }
        events.push(self.shared.wake_event()?);
        let mut handler = Handler::new(
            mem,
            interrupt.clone(),
            self.memory.clone(),
            self.shared.clone(),
            qs,
            layout,
        );
        handler.restore_stats_head(stats_head);
        self.shared.connect(interrupt);
        self.worker.start("virtio-balloon", events, handler)?;
        if restored {
            // The target may have changed while the snapshot was taken: let the driver
            // look again (a spare configuration interrupt is harmless).
            self.shared.raise_config();
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.shared.disconnect();
        drop(self.worker.stop());
        self.restored_stats_head = None;
        self.restored = false;
    }

    fn is_active(&self) -> bool {
        self.worker.is_active()
    }

    fn quiesce(&mut self) -> Result<Vec<QueuePosition>, StateError> {
        // Configuration interrupts wait while the worker is parked (see `Shared::hold`).
        self.shared.hold(true);
        match self.worker.quiesce() {
            Ok(handler) => Ok(handler.map(|h| h.positions()).unwrap_or_default()),
            Err(_) => {
                self.shared.disconnect();
                Err(StateError::worker_lost(device_type::BALLOON))
            }
        }
    }

    fn resume(&mut self) -> Result<(), StateError> {
        let result = self.worker.resume().map_err(|source| StateError::Host {
            device: "virtio-balloon",
            op: "restart the worker thread",
            source,
        });
        self.shared.hold(false);
        result
    }

    fn save_state(&self) -> Result<serde_json::Value, StateError> {
        state::save(self)
    }

    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), StateError> {
        state::restore(self, state)
    }
}

impl Drop for Balloon {
    fn drop(&mut self) {
        self.shared.disconnect();
    }
}
