//! What the VMM keeps of a balloon ([`BalloonHandle`]) and the state it shares with the
//! device (configuration accesses on vCPU threads) and the device's worker.

use super::config::BalloonConfig;
use super::stats::{BalloonStats, GuestStats};
use super::{CONFIG_LEN, PAGES_PER_MIB, PAGE_SIZE};
use crate::Interrupt;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use thiserror::Error;
use vmm_sys_util::eventfd::EventFd;

/// Why a balloon request was refused.
#[derive(Debug, Error)]
pub enum BalloonError {
    /// A target in MiB that does not fit the 32-bit page count of the configuration space.
    #[error("a balloon of {mib} MiB is more than the device can express (at most {max} MiB)")]
    TargetTooLarge {
        /// The MiB asked for.
        mib: u32,
        /// The largest target.
        max: u32,
    },
    /// Statistics were asked of a device created without them.
    #[error(
        "this balloon was created without statistics (stats_polling_interval_s = 0): \
         statistics cannot be turned on while the VM runs; start it with an interval"
    )]
    StatsDisabled,
    /// The wake-up eventfd could not be created or signalled.
    #[error("balloon: {0}")]
    Host(#[from] std::io::Error),
}

/// What the device has done since it was created, for metrics (all totals, in 4 KiB pages
/// where named so).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonCounters {
    /// Pages in the balloon by the device's own count (inflated minus deflated, never
    /// below zero), whatever the driver writes to `actual`.
    pub inflated_pages: u64,
    /// Pages the guest gave through the inflate queue (every valid PFN, once per request).
    pub pages_inflated: u64,
    /// Pages the guest took back through the deflate queue.
    pub pages_deflated: u64,
    /// Pages the guest reported free (free page reporting).
    pub pages_reported: u64,
    /// Bytes handed to [`super::BalloonMemory::release`] without an error.
    pub bytes_released: u64,
    /// Pages named by a request that are not guest RAM (outside memory, over a hole):
    /// skipped.
    pub invalid_pages: u64,
    /// Requests or descriptors the driver got wrong (direction, size, alignment): skipped
    /// in part or whole.
    pub malformed: u64,
    /// Release or reclaim calls that failed.
    pub release_errors: u64,
    /// Statistics buffers parsed.
    pub stats_updates: u64,
    /// Statistics buffers refused (bad size, outside memory).
    pub stats_errors: u64,
}

/// The guest's latest statistics and when they arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsReport {
    /// Target, actual and the guest's values (Firecracker's `GET /balloon/statistics`).
    pub stats: BalloonStats,
    /// When the guest's buffer arrived.
    pub updated: Instant,
}

impl StatsReport {
    /// How old the guest's values are.
    pub fn age(&self) -> Duration {
        self.updated.elapsed()
    }
}

/// The interrupt of an active device, and whether configuration interrupts must wait.
#[derive(Default)]
struct Link {
    interrupt: Option<Arc<dyn Interrupt>>,
    /// Quiesced for a snapshot: a configuration change is remembered, raised at resume.
    held: bool,
    pending: bool,
}

#[derive(Default)]
pub(super) struct Counters {
    pub inflated_pages: AtomicU64,
    pub pages_inflated: AtomicU64,
    pub pages_deflated: AtomicU64,
    pub pages_reported: AtomicU64,
    pub bytes_released: AtomicU64,
    pub invalid_pages: AtomicU64,
    pub malformed: AtomicU64,
    pub release_errors: AtomicU64,
    pub stats_updates: AtomicU64,
    pub stats_errors: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The deflated pages leave the balloon's own count (never below zero).
    pub fn deflated(&self, pages: u64) {
        Self::add(&self.pages_deflated, pages);
        let _ = self
            .inflated_pages
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(pages))
            });
    }

    pub fn inflated(&self, pages: u64) {
        Self::add(&self.pages_inflated, pages);
        Self::add(&self.inflated_pages, pages);
    }

    fn snapshot(&self) -> BalloonCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BalloonCounters {
            inflated_pages: get(&self.inflated_pages),
            pages_inflated: get(&self.pages_inflated),
            pages_deflated: get(&self.pages_deflated),
            pages_reported: get(&self.pages_reported),
            bytes_released: get(&self.bytes_released),
            invalid_pages: get(&self.invalid_pages),
            malformed: get(&self.malformed),
            release_errors: get(&self.release_errors),
            stats_updates: get(&self.stats_updates),
            stats_errors: get(&self.stats_errors),
        }
    }
}

/// State shared by the device, its handles and its worker.
pub(super) struct Shared {
    num_pages: AtomicU32,
    actual: AtomicU32,
    poison_val: AtomicU32,
    deflate_on_oom: bool,
    free_page_reporting: bool,
    /// The device offers the statistics queue.
    stats_offered: bool,
    stats_interval_s: AtomicU32,
    /// Statistics asked for on demand: the worker returns the held buffer at its next tick.
    stats_requested: AtomicBool,
    stats: Mutex<Option<(GuestStats, Instant)>>,
    pub counters: Counters,
    link: Mutex<Link>,
    /// Wakes the worker (interval changed, statistics asked for).
    wake: EventFd,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn new(config: &BalloonConfig) -> Result<Self, BalloonError> {
        Ok(Self {
            num_pages: AtomicU32::new(mib_to_pages(config.amount_mib)?),
            actual: AtomicU32::new(0),
            poison_val: AtomicU32::new(0),
            deflate_on_oom: config.deflate_on_oom,
            free_page_reporting: config.free_page_reporting,
            stats_offered: config.stats_polling_interval_s > 0,
            stats_interval_s: AtomicU32::new(u32::from(config.stats_polling_interval_s)),
            stats_requested: AtomicBool::new(false),
            stats: Mutex::new(None),
            counters: Counters::default(),
            link: Mutex::new(Link::default()),
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    pub fn config_bytes(&self) -> [u8; CONFIG_LEN] {
        let mut c = [0u8; CONFIG_LEN];
        let words = [
            self.num_pages.load(Ordering::Acquire),
            self.actual.load(Ordering::Acquire),
            0, // free_page_hint_cmd_id: FREE_PAGE_HINT is never offered
            self.poison_val.load(Ordering::Acquire),
        ];
        for (chunk, w) in c.chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        c
    }

    pub fn num_pages(&self) -> u32 {
        self.num_pages.load(Ordering::Acquire)
    }

    pub fn set_num_pages(&self, pages: u32) {
        self.num_pages.store(pages, Ordering::Release);
    }

    pub fn actual(&self) -> u32 {
        self.actual.load(Ordering::Acquire)
    }

    pub fn set_actual(&self, pages: u32) {
        self.actual.store(pages, Ordering::Release);
    }

    pub fn poison_val(&self) -> u32 {
        self.poison_val.load(Ordering::Acquire)
    }

    pub fn set_poison_val(&self, v: u32) {
        self.poison_val.store(v, Ordering::Release);
    }

    pub fn stats_interval_s(&self) -> u16 {
        self.stats_interval_s.load(Ordering::Acquire) as u16
    }

    pub fn set_stats_interval_s(&self, s: u16) {
        self.stats_interval_s.store(u32::from(s), Ordering::Release);
    }

    pub fn stats_offered(&self) -> bool {
        self.stats_offered
    }

    /// Whether statistics were asked for since the last call.
    pub fn take_stats_request(&self) -> bool {
        self.stats_requested.swap(false, Ordering::AcqRel)
    }

    pub fn store_stats(&self, stats: GuestStats) {
        *lock(&self.stats) = Some((stats, Instant::now()));
        Counters::add(&self.counters.stats_updates, 1);
    }

    pub fn wake_event(&self) -> std::io::Result<EventFd> {
        self.wake.try_clone()
    }

    fn wake_worker(&self) -> std::io::Result<()> {
        self.wake.write(1)
    }

    /// The device is active and raises interrupts through `interrupt`.
    pub fn connect(&self, interrupt: Arc<dyn Interrupt>) {
        let mut link = lock(&self.link);
        link.interrupt = Some(interrupt);
        link.held = false;
        link.pending = false;
    }

    /// The device stopped (reset, dropped, worker lost): no interrupts any more.
    pub fn disconnect(&self) {
        *lock(&self.link) = Link::default();
        let _ = self.wake.read();
    }

    /// Holds configuration interrupts while quiesced (`true`); releasing them (`false`)
    /// raises the one that waited.
    pub fn hold(&self, held: bool) {
        let mut link = lock(&self.link);
        link.held = held;
        if !held && std::mem::take(&mut link.pending) {
            if let Some(i) = &link.interrupt {
                i.notify_config();
            }
        }
    }

    /// Tells the driver the configuration changed (now, or at resume when quiesced; not at
    /// all before activation: the driver reads the target when it starts).
    pub fn raise_config(&self) {
        let mut link = lock(&self.link);
        if link.held {
            link.pending = link.interrupt.is_some();
        } else if let Some(i) = &link.interrupt {
            i.notify_config();
        }
    }
}

fn mib_to_pages(mib: u32) -> Result<u32, BalloonError> {
    mib.checked_mul(PAGES_PER_MIB)
        .ok_or(BalloonError::TargetTooLarge {
            mib,
            max: u32::MAX / PAGES_PER_MIB,
        })
}

/// The VMM's and its API's hold on a balloon device (cheap to clone, usable from any
/// thread). Targets and sizes are in 4 KiB balloon pages unless named MiB.
#[derive(Clone)]
pub struct BalloonHandle {
    shared: Arc<Shared>,
}

impl BalloonHandle {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Asks the guest for a balloon of `pages` 4 KiB pages (memory taken from it): updates
    /// `num_pages` and raises a configuration interrupt when the device is active (a driver
    /// that starts later reads the target itself).
    pub fn set_target_pages(&self, pages: u32) {
        let old = self.shared.num_pages.swap(pages, Ordering::AcqRel);
        if old != pages {
            self.shared.raise_config();
        }
    }

    /// [`set_target_pages`](Self::set_target_pages) in MiB (Firecracker's `amount_mib`).
    pub fn set_target_mib(&self, mib: u32) -> Result<(), BalloonError> {
        self.set_target_pages(mib_to_pages(mib)?);
        Ok(())
    }

    /// [`set_target_pages`](Self::set_target_pages) in bytes, rounded down to whole pages.
    pub fn set_target_bytes(&self, bytes: u64) -> Result<(), BalloonError> {
        let pages = u32::try_from(bytes / PAGE_SIZE).map_err(|_| BalloonError::TargetTooLarge {
            mib: u32::try_from(bytes >> 20).unwrap_or(u32::MAX),
            max: u32::MAX / PAGES_PER_MIB,
        })?;
        self.set_target_pages(pages);
        Ok(())
    }

    /// The target in pages (`num_pages`).
    pub fn target_pages(&self) -> u32 {
        self.shared.num_pages()
    }

    /// The balloon's size as the driver last wrote it (`actual`, pages).
    pub fn actual_pages(&self) -> u32 {
        self.shared.actual()
    }

    /// The target in bytes.
    pub fn target_bytes(&self) -> u64 {
        u64::from(self.target_pages()) * PAGE_SIZE
    }

    /// `actual` in bytes.
    pub fn actual_bytes(&self) -> u64 {
        u64::from(self.actual_pages()) * PAGE_SIZE
    }

    /// The configuration as `GET /balloon` shows it (the current target, rounded down to
    /// MiB, and interval).
    pub fn config(&self) -> BalloonConfig {
        BalloonConfig {
            amount_mib: self.target_pages() / PAGES_PER_MIB,
            deflate_on_oom: self.shared.deflate_on_oom,
            stats_polling_interval_s: self.shared.stats_interval_s(),
            free_page_reporting: self.shared.free_page_reporting,
        }
    }

    /// The guest's latest statistics with the current target and `actual`; `None` until the
    /// guest sent a buffer (or when the device has no statistics queue).
    pub fn stats(&self) -> Option<StatsReport> {
        let (guest, updated) = (*lock(&self.shared.stats))?;
        Some(StatsReport {
            stats: BalloonStats::new(self.target_pages(), self.actual_pages(), guest),
            updated,
        })
    }

    /// The polling interval in seconds (0: not polled).
    pub fn stats_interval(&self) -> u16 {
        self.shared.stats_interval_s()
    }

    /// Changes how often the device asks the guest for statistics; 0 stops polling (the
    /// device keeps the buffer until asked again). Refused when the device was created
    /// without statistics.
    pub fn set_stats_interval(&self, seconds: u16) -> Result<(), BalloonError> {
        if !self.shared.stats_offered() {
            return Err(BalloonError::StatsDisabled);
        }
        self.shared.set_stats_interval_s(seconds);
        self.shared.wake_worker()?;
        Ok(())
    }

    /// Asks the guest for fresh statistics now (they arrive asynchronously: watch
    /// [`StatsReport::updated`]). Refused when the device was created without statistics.
    pub fn request_stats(&self) -> Result<(), BalloonError> {
        if !self.shared.stats_offered() {
            return Err(BalloonError::StatsDisabled);
        }
        self.shared.stats_requested.store(true, Ordering::Release);
        self.shared.wake_worker()?;
        Ok(())
    }

    /// What the device has done so far.
    pub fn counters(&self) -> BalloonCounters {
        self.shared.counters.snapshot()
    }
}
